"""Demo progress: plain lines off a terminal, live bars on one, and what the demo counts (unit)."""

from __future__ import annotations

import io
from collections import Counter

import orjson
from rich.console import Console

from streams.demo_runner import received_of
from streams.kafka_io import Consumed
from streams.progress import StepProgress
from tests.unit.conftest import Clock


def test_plain_lines_off_a_terminal(clock: Clock) -> None:
    out = io.StringIO()
    with StepProgress(Console(file=out, width=40), interval=1.0) as p:
        p.begin("worker", "starting the worker (web 127.0.0.1:6066, log /tmp/some/long/path/worker.log)")
        clock.now += 2.5
        p.finish("worker", "worker ready")
        p.begin("sent", "events sent", total=10)
        for n in range(1, 11):
            clock.now += 0.3  # one line at most per interval while counting
            p.update("sent", n)
        p.finish("sent")
    assert out.getvalue().splitlines() == [
        "progress: starting the worker (web 127.0.0.1:6066, log /tmp/some/long/path/worker.log)",
        "progress: worker ready (2.5s)",
        "progress: events sent 0/10",
        "progress: events sent 4/10",
        "progress: events sent 8/10",
        "progress: events sent 10/10 (3.0s)",
    ]


def test_an_unchanged_count_prints_nothing(clock: Clock) -> None:
    out = io.StringIO()
    with StepProgress(Console(file=out), interval=1.0) as p:
        p.begin("received", "outputs received", total=3)
        for _ in range(5):
            clock.now += 2
            p.update("received", 0)
    assert out.getvalue().splitlines() == ["progress: outputs received 0/3"]


def test_live_bars_on_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with StepProgress(console) as p:
        assert p.live is not None
        p.begin("worker", "starting the worker")
        p.finish("worker", "worker ready")
        p.begin("sent", "events sent", total=31)
        p.update("sent", 31)
        p.finish("sent")
    text = out.getvalue()
    assert "worker ready" in text and "31/31" in text and "✓" in text
    assert "progress:" not in text  # the plain lines are for logs and pipes only


def record(topic: str, value: dict[str, object] | None = None) -> Consumed:
    return Consumed(topic, 0, 0, None, orjson.dumps(value or {}), (), 0)


def test_received_counts_each_kind_up_to_what_the_demo_waits_for() -> None:
    expected = Counter({"RESPONSE_SCORED": 2, "CLAIM_SCORED": 2, "DLQ": 1})
    records = [
        record("scored", {"event_type": "RESPONSE_SCORED"}),
        record("scored", {"event_type": "RESPONSE_SCORED"}),
        record("scored", {"event_type": "RESPONSE_SCORED"}),  # a re-delivery: more than awaited
        record("scored", {"event_type": "CLAIM_SCORED"}),
        record("flagged", {"event_type": "CLAIM_SCORED"}),  # copies on flagged-events are not counted
        record("dlq"),
        record("dlq"),
    ]
    assert received_of(records, expected, "scored", "dlq") == 2 + 1 + 1
