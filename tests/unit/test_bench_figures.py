"""The benchmark's own arithmetic: percentiles, what counts as an input's output, memory growth (unit).

`make bench` is never run by the tests (it takes minutes and its figures are the host's), but the
functions that turn its records into the figures the README quotes are pure and tested here.
"""

from __future__ import annotations

import orjson
import pytest
from aiokafka.structs import ConsumerRecord

from bench.pipeline import MemoryPoint, Produced, Tracker, _half_slopes, percentile

INPUT, SCORED, DLQ = "in", "scored", "dlq"


def record(
    topic: str, value: dict[str, object], timestamp: int, headers: list[tuple[str, bytes]] | None = None
) -> ConsumerRecord[bytes, bytes]:
    raw = orjson.dumps(value)
    return ConsumerRecord(topic, 0, 0, timestamp, 0, None, raw, None, 0, len(raw), headers or [])


def tracker(*event_ids: str) -> Tracker:
    produced = Produced()
    for offset, event_id in enumerate(event_ids):
        produced.timestamp_ms[event_id] = 1_000
        produced.place[(0, offset)] = event_id
    return Tracker(event_ids, produced, INPUT, DLQ)


def dead_letter(topic: str, offset: int) -> ConsumerRecord[bytes, bytes]:
    headers = [
        ("__connect.errors.topic", topic.encode()),
        ("__connect.errors.partition", b"0"),
        ("__connect.errors.offset", str(offset).encode()),
        ("__connect.errors.reason", b"invalid_json"),
    ]
    return record(DLQ, {}, 1_050, headers)


@pytest.mark.parametrize(
    ("values", "share", "expected"),
    [
        ([1, 2, 3, 4, 5], 0.5, 3),  # rounding half to even gave the 2nd value
        (list(range(1, 151)), 0.99, 149),  # ceil(148.5): round() gave 148
        (list(range(1, 101)), 0.99, 99),
        (list(range(1, 101)), 1.0, 100),
        ([7], 0.5, 7),
        ([3, 1, 2], 0.01, 1),
    ],
)
def test_percentile_is_the_nearest_rank(values: list[int], share: float, expected: int) -> None:
    assert percentile(values, share) == expected


def test_latency_is_to_arrival_and_to_creation() -> None:
    follow = tracker("e1")
    follow.add(record(SCORED, {"event_type": "RESPONSE_SCORED", "source_event_id": "e1"}, 1_030), 1_045)
    assert follow.done
    assert follow.latency_ms == {"RESPONSE_SCORED": [45]}  # producer timestamp to arrival here
    assert follow.created_ms == {"RESPONSE_SCORED": [30]}  # to the output's record timestamp


def test_a_dead_letter_of_an_internal_record_is_not_an_inputs_completion() -> None:
    follow = tracker("e0", "e1")
    follow.add(dead_letter("app-responses-by-agent", 1), 1_060)  # same partition and offset as e1
    assert follow.pending == {"e0", "e1"}
    follow.add(dead_letter(INPUT, 1), 1_060)
    assert follow.pending == {"e0"}
    assert follow.dead == 2


def test_a_dead_letter_on_a_clean_mix_fails_the_run() -> None:
    follow = tracker("e0")
    follow.check_clean()  # nothing dead-lettered: no error
    follow.add(dead_letter(INPUT, 0), 1_060)
    with pytest.raises(RuntimeError, match=r"1 dead letters .*invalid_json"):
        follow.check_clean()


def test_rescores_and_passthrough_copies_complete_only_their_own_input() -> None:
    follow = tracker("e0", "e1")
    rescore = {"event_type": "CLAIM_SCORED", "source_event_id": "e0", "cause": "neighbour"}
    follow.add(record(SCORED, rescore, 1_010), 1_020)
    assert follow.pending == {"e0", "e1"}
    follow.add(record(SCORED, {"event_type": "TOOL_INVOCATION", "event_id": "e1"}, 1_010), 1_020)
    assert follow.pending == {"e0"}


def points(rss: list[float]) -> list[MemoryPoint]:
    return [MemoryPoint(float(i), i * 10_000, value, {}) for i, value in enumerate(rss)]


def test_memory_growth_of_a_steady_leak_is_the_same_in_both_halves() -> None:
    # 300 MB base and 16 MB per 100k events: the end-vs-half ratio reads 1.02x, the slopes say 1.0x.
    leak = points([300 + 1.6 * i for i in range(11)])
    first, second = _half_slopes(leak, leak[5])
    assert first == pytest.approx(16.0)
    assert second == pytest.approx(16.0)


def test_memory_growth_that_levels_off_is_flat_in_the_second_half() -> None:
    level = points([100, 200, 260, 290, 300, 302, 301, 302, 303, 302, 302])
    first, second = _half_slopes(level, level[5])
    assert first > 300  # MB per 100k events while the tables fill
    assert abs(second) < first / 100
