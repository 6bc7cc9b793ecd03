"""`stages.common` at its edges (from a mutation review): the expiry clock's comparisons at the exact
moment and idle span, bundles of exactly the byte cap, and long keys' partitions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from aiokafka.partitioner import DefaultPartitioner
from prometheus_client import CollectorRegistry

from streams import metrics
from streams.config import Settings, load_settings
from streams.dlq import DeadLetter
from streams.stages import InputRecord, Record
from streams.stages.common import (
    DEAD_LETTER_KEY_MAX_BYTES,
    ExpiryClock,
    Outputs,
    OversizedOutput,
    bundle,
    is_flagged,
    key_partition,
    without_scored_at,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


def test_a_moment_has_passed_only_once_the_clock_is_beyond_it() -> None:
    clock = ExpiryClock(max_ahead=HOUR)
    clock.saw(0, T0)
    assert not clock.passed(0, T0)  # at the moment, not past it
    assert clock.passed(0, T0 - timedelta(microseconds=1))


def test_the_start_up_grace_ends_after_exactly_the_idle_span() -> None:
    wall = [0.0]
    clock = ExpiryClock(max_ahead=HOUR, source_idle_seconds=60, monotonic=lambda: wall[0])
    clock.saw(0, T0)
    wall[0] = 59.5
    assert not clock.passed(0, T0 - HOUR)
    wall[0] = 60.0
    assert clock.passed(0, T0 - HOUR)


def test_a_source_heard_exactly_the_idle_span_ago_still_holds_the_watermark() -> None:
    wall = [0.0]
    clock = ExpiryClock(max_ahead=HOUR, source_idle_seconds=60, monotonic=lambda: wall[0])
    clock.saw(0, T0, source=1)
    wall[0] = 30.0
    clock.saw(0, T0 + 5 * HOUR, source=2)
    wall[0] = 60.0
    assert not clock.passed(0, T0 + HOUR)  # source 1 was heard 60 s ago: not yet idle
    wall[0] = 60.5
    assert clock.passed(0, T0 + HOUR)  # now it is: source 2's time counts alone


def test_long_keys_go_where_kafkas_default_partitioner_puts_them() -> None:
    """Keys past the cached length are hashed on another path; it must give the same partitions."""
    for n in range(40):
        key = b"%d-" % n + b"k" * 600
        for partitions in (3, 12):
            assert key_partition(key, partitions) == DefaultPartitioner()(key, list(range(partitions)), [])


def test_a_bundle_of_exactly_the_cap_stays_one_record() -> None:
    records = [
        Record("responses", b"k", b"a" * 10, partition=0),
        Record("responses", b"k", b"b" * 9, partition=0),
    ]
    assert [r.value for r in bundle(records, {"responses"}, max_bytes=20)] == [b"a" * 10 + b"\n" + b"b" * 9]
    assert [r.value for r in bundle(records, {"responses"}, max_bytes=19)] == [b"a" * 10, b"b" * 9]


def _dead_letter(settings: Settings, key: bytes, value: bytes) -> Record:
    out = Outputs(settings, metrics.create(CollectorRegistry()))
    letter = DeadLetter(value, "oversized_event", "OversizedEvent", "too large")
    out.dead_letter(letter, InputRecord("agent-events", 3, 123_456_789, 0.0, value, key))
    (record,) = out.records
    return record


def test_a_dead_letter_keeps_at_most_max_event_bytes_of_its_input() -> None:
    settings = load_settings().model_copy(update={"max_event_bytes": 1024, "max_record_bytes": 16_384})
    record = _dead_letter(settings, b"k", b"x" * 5000)
    assert record.value == b"x" * 1024


def test_a_dead_letter_with_the_longest_valid_key_fits_when_events_may_be_as_large_as_records() -> None:
    settings = load_settings().model_copy(update={"max_event_bytes": 16_384, "max_record_bytes": 16_384})
    key = b"k" * DEAD_LETTER_KEY_MAX_BYTES  # kept as it is, not hashed
    record = _dead_letter(settings, key, b"x" * 16_384)
    assert record.key == key
    headers = sum(len(name) + len(value) for name, value in record.headers or ())
    assert len(key) + len(record.value) + headers <= settings.max_record_bytes


def test_a_record_of_exactly_max_record_bytes_is_sent() -> None:
    settings = load_settings().model_copy(update={"max_record_bytes": 16_384})
    out = Outputs(settings, metrics.create(CollectorRegistry()))
    out.forward(Record("claims", b"k", b"x" * 16_383, partition=0))
    assert len(out.records) == 1
    with pytest.raises(OversizedOutput):
        out.forward(Record("claims", b"k", b"x" * 16_384, partition=0))


@pytest.mark.parametrize(
    ("output", "flagged"),
    [
        ({"event_type": "RESPONSE_SCORED", "action": "reject", "composite": {"should_block": False}}, True),
        ({"event_type": "RESPONSE_SCORED", "action": "allow", "composite": {"should_block": False}}, False),
        ({"event_type": "SYNTHESIS_SCORED", "warnings": [], "conflicts": [{"a": "c1", "b": "c2"}]}, True),
        ({"event_type": "SYNTHESIS_SCORED", "warnings": [], "conflicts": []}, False),
        ({"event_type": "CLAIM_SCORED", "interval": {"factors": {"contradiction_penalty": 1.0}}}, False),
        ({"event_type": "CLAIM_SCORED", "interval": {"factors": {"contradiction_penalty": 0.99}}}, True),
    ],
)
def test_the_flagged_rule_at_its_edges(output: dict[str, object], flagged: bool) -> None:
    assert is_flagged(output) is flagged


def test_without_scored_at_drops_only_scored_at() -> None:
    assert without_scored_at({"event_type": "TRACE_SCORED", "scored_at": "2026-11-01T00:00:00Z", "a": 1}) == {
        "event_type": "TRACE_SCORED",
        "a": 1,
    }
