"""`topics describe` pure parts: roles, lag, retention wording, the table (unit)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from streams.config import load_settings
from streams.describe import PartitionState, TopicState, human_ms, lag_of, roles, table_of, to_json
from streams.topics import topic_specs


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (None, "default"),
        (-1, "forever"),
        (3_600_000, "1h"),
        (604_800_000, "7d"),
        (120_000, "2m"),
        (90_000, "90s"),
        (1500, "1500 ms"),
        (0, "0 ms"),
    ],
)
def test_retention_wording(ms: int | None, text: str) -> None:
    assert human_ms(ms) == text


@pytest.mark.parametrize(
    ("role", "end", "committed", "beginning", "lag"),
    [
        ("input", 10, 7, 0, 3),
        ("input", 10, None, 0, 10),  # nothing committed: the group reads from the beginning
        # ...which retention moved: 100 records left of a million, not a million
        ("input", 1_000_000, None, 999_900, 100),
        ("input", 1_000_000, 5, 999_900, 100),  # committed before what retention deleted
        ("input", 10, 10, 0, 0),
        ("input", 1, 4, 0, 0),  # end offset behind the log (DESIGN 7): never a negative lag
        ("repartition", 5, 2, 0, 3),
        ("scored", 10, None, 0, None),  # outputs, DLQ and changelogs are not the group's to consume
        ("changelog", 10, None, 0, None),
        ("dlq", 3, None, 0, None),
    ],
)
def test_lag(role: str, end: int, committed: int | None, beginning: int, lag: int | None) -> None:
    assert lag_of(role, end, committed, beginning) == lag  # type: ignore[arg-type]


def test_roles_name_every_topic_the_service_creates_once_in_order() -> None:
    settings = load_settings(app_id="cs", input_topics="in-a,in-b")
    changelogs = ["cs-traces-changelog", "cs-claims-changelog"]
    named = roles(settings, changelogs)
    assert [name for name, _ in named] == [spec.name for spec in topic_specs(settings, changelogs)]
    role = dict(named)
    assert [role["in-a"], role["in-b"]] == ["input", "input"]
    assert [role["scored-events"], role["flagged-events"], role["agent-events-dlq"]] == [
        "scored",
        "flagged",
        "dlq",
    ]
    assert [role[name] for name in changelogs] == ["changelog", "changelog"]
    assert role["cs-responses-by-agent"] == role["cs-claims-by-tenant"] == "repartition"
    # Whatever else the service creates sits between stages.
    others = set(role) - {"in-a", "in-b", "scored-events", "flagged-events", "agent-events-dlq", *changelogs}
    assert {role[name] for name in others} == {"repartition"}


STATES = [
    TopicState(
        "agent-events",
        "input",
        True,
        3_600_000,
        None,
        (PartitionState(0, 12, 12, 0), PartitionState(1, 9, 5, 4)),
    ),
    TopicState(
        "cs-traces-changelog", "changelog", True, None, "compact", (PartitionState(0, 3, None, None),)
    ),
    TopicState("flagged-events", "flagged", False, None, None, ()),
]


def render(states: list[TopicState]) -> str:
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(table_of(states, "cs"))
    return out.getvalue()


def test_table_one_row_per_partition_and_missing_topics() -> None:
    text = render(STATES)
    rows = [line for line in text.splitlines() if line.startswith("│")]
    cells = [[c.strip() for c in row.strip("│").split("│")] for row in rows]
    assert cells == [
        ["agent-events", "input", "1h", "-", "0", "12", "12", "0"],
        ["", "", "", "", "1", "9", "5", "4"],
        ["cs-traces-changelog", "changelog", "default", "compact", "0", "3", "-", "-"],
        ["flagged-events", "flagged", "", "", "missing", "", "", ""],
    ]
    assert "topics of consumer group cs" in text
    assert "ListOffsets is behind" not in text


def test_table_says_when_end_offsets_are_behind_committed() -> None:
    behind = TopicState("in", "input", True, None, None, (PartitionState(0, 1, 4, 0),))
    assert "1 partition(s) report an end offset below the committed offset" in render([behind])


def test_json_totals() -> None:
    report = to_json(STATES, "cs", "broker:9092")
    topics = report["topics"]
    assert isinstance(topics, list)
    assert topics[0]["end_offsets_total"] == 21 and topics[0]["lag_total"] == 4
    assert topics[0]["partitions"][1] == {"partition": 1, "end_offset": 9, "committed": 5, "lag": 4}
    assert topics[1]["lag_total"] is None and topics[1]["cleanup_policy"] == "compact"
    assert topics[2]["exists"] is False and topics[2]["partition_count"] == 0
    assert (report["group"], report["bootstrap_servers"]) == ("cs", "broker:9092")
