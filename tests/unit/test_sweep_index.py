"""The sweep's index (`DecodedStates.due`): only due keys are decoded, and it never misses a due key.

Checked against a brute-force sweep (every key whose moment passed) over random writes, rewrites,
deletions, restores and advancing clocks.
"""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from streams.decoded_states import DecodedStates, UndecodableState

T0 = datetime(2026, 11, 1, tzinfo=UTC)


class Value(BaseModel):
    last: datetime


class CountingValue(Value):
    """Counts its decodes in DECODES."""

    @classmethod
    def model_validate_json(cls, *args: Any, **kwargs: Any) -> CountingValue:  # type: ignore[override]
        DECODES.append(1)
        return super().model_validate_json(*args, **kwargs)


DECODES: list[int] = []


def _sweep_after(key: bytes, value: Value) -> tuple[int, datetime]:
    return int(key[:1]), value.last + timedelta(hours=1)


def _passed_at(watermarks: dict[int, datetime]) -> Any:
    return lambda partition, moment: partition in watermarks and watermarks[partition] > moment


def test_due_keys_only_and_written_values_are_not_decoded_again() -> None:
    table: dict[bytes, bytes] = {}
    states = DecodedStates(table, CountingValue, sweep_after=_sweep_after)  # type: ignore[arg-type]
    for i in range(10):
        key = f"{i % 2}-{i}".encode()
        table[key] = states.encode(key, CountingValue(last=T0 + timedelta(hours=i)))
    DECODES.clear()
    # Partition 0 at T0+5h30: keys 0, 2 and 4 (last + 1 h < watermark) are due, 6 and 8 not; 1 at T0.
    due = states.due(_passed_at({0: T0 + timedelta(hours=5, minutes=30), 1: T0}))
    assert sorted(key for key, _ in due) == [b"0-0", b"0-2", b"0-4"]
    assert DECODES == []  # everything was written through encode: nothing decoded

    # A value that entered the table another way (a changelog restore) is decoded once, then indexed.
    table[b"1-99"] = CountingValue(last=T0).model_dump_json().encode()
    states.restored()  # what the table's recovery callback does
    due = states.due(_passed_at({1: T0 + timedelta(hours=2)}))
    assert [key for key, _ in due] == [b"1-99"]
    assert len(DECODES) == 1
    states.due(_passed_at({}))
    assert len(DECODES) == 1

    # Replaced bytes (new object) are looked at again: a newer time is no longer due.
    table[b"1-99"] = CountingValue(last=T0 + timedelta(hours=9)).model_dump_json().encode()
    states.restored()
    assert states.due(_passed_at({1: T0 + timedelta(hours=2)})) == []


def test_keys_that_left_the_table_leave_the_index() -> None:
    table: dict[bytes, bytes] = {}
    states = DecodedStates(table, Value, sweep_after=_sweep_after)  # type: ignore[arg-type]
    for i in range(5):
        key = f"0-{i}".encode()
        table[key] = states.encode(key, Value(last=T0))
    for i in range(3):
        del table[f"0-{i}".encode()]  # a revoked partition, without forget()
    due = states.due(_passed_at({0: T0 + timedelta(days=1)}))
    assert sorted(key for key, _ in due) == [b"0-3", b"0-4"]
    assert set(states._due) == {b"0-3", b"0-4"}


def test_never_due_when_sweep_after_is_none() -> None:
    table: dict[bytes, bytes] = {}
    states = DecodedStates(table, Value, sweep_after=lambda key, value: None)  # type: ignore[arg-type]
    table[b"0-a"] = states.encode(b"0-a", Value(last=T0))
    assert states.due(lambda partition, moment: True) == []


class RecoveringTable(dict[bytes, bytes]):
    """A table with Faust's `on_recover` registration, as the worker's tables have."""

    callbacks: list[Any]

    def on_recover(self, callback: Any) -> Any:
        self.callbacks = [*getattr(self, "callbacks", []), callback]
        return callback


async def test_a_recovery_makes_the_next_sweep_index_restored_values() -> None:
    table = RecoveringTable()
    states = DecodedStates(table, Value, sweep_after=_sweep_after)  # type: ignore[arg-type]
    states.due(_passed_at({}))  # the first sweep scans (nothing yet)
    table[b"0-restored"] = Value(last=T0).model_dump_json().encode()
    assert states.due(_passed_at({0: T0 + timedelta(days=1)})) == []  # not indexed: no recovery yet
    (callback,) = table.callbacks
    await callback()
    assert [key for key, _ in states.due(_passed_at({0: T0 + timedelta(days=1)}))] == [b"0-restored"]


@pytest.mark.parametrize("seed", range(4))
def test_due_matches_a_full_scan(seed: int) -> None:
    rng = random.Random(seed)
    table: dict[bytes, bytes] = {}
    states = DecodedStates(table, Value, sweep_after=_sweep_after)  # type: ignore[arg-type]
    values: dict[bytes, Value] = {}  # what the table holds, decoded (the reference)
    clocks = {0: T0, 1: T0}
    for step in range(3000):
        key = f"{rng.randrange(2)}-{rng.randrange(200)}".encode()
        action = rng.random()
        if action < 0.6:  # written by a stage
            values[key] = Value(last=T0 + timedelta(minutes=rng.randrange(600)))
            table[key] = states.encode(key, values[key])
        elif action < 0.7 and key in table:  # deleted by the sweep
            del table[key], values[key]
            states.forget(key)
        elif action < 0.75 and key in table:  # left with a revoked partition (no forget)
            del table[key], values[key]
        elif action < 0.78:  # restored from the changelog
            values[key] = Value(last=T0 + timedelta(minutes=rng.randrange(600)))
            table[key] = values[key].model_dump_json().encode()
            states.restored()
        if step % 25 == 0:
            partition = rng.randrange(2)
            clocks[partition] += timedelta(minutes=rng.randrange(30))
            passed = _passed_at(clocks)
            expected = {k for k, v in values.items() if passed(*_sweep_after(k, v))}
            due = states.due(passed)
            assert len(due) == len(expected)
            assert {k: v for k, v in due} == {k: values[k] for k in expected}
    assert states._indexed <= 2 * len(states._due) + 1024 + 1


def test_a_value_replaced_without_encode_is_judged_by_what_the_table_holds() -> None:
    table: dict[bytes, bytes] = {}
    states = DecodedStates(table, Value, sweep_after=_sweep_after)  # type: ignore[arg-type]
    states.due(_passed_at({}))
    table[b"0-k"] = states.encode(b"0-k", Value(last=T0))
    # Replaced behind the index's back (same time, new bytes): found when its old moment is due.
    table[b"0-k"] = Value(last=T0).model_dump_json().encode()
    assert [key for key, _ in states.due(_passed_at({0: T0 + timedelta(hours=2)}))] == [b"0-k"]
    assert [key for key, _ in states.due(_passed_at({0: T0 + timedelta(hours=2)}))] == [b"0-k"]
    # Replaced by a later time: not due until that time has passed.
    table[b"0-k"] = Value(last=T0 + timedelta(hours=5)).model_dump_json().encode()
    assert states.due(_passed_at({0: T0 + timedelta(hours=2)})) == []
    assert [key for key, _ in states.due(_passed_at({0: T0 + timedelta(hours=7)}))] == [b"0-k"]


class PartitionedValue(BaseModel):
    partition: int
    last: datetime


def test_a_value_changed_outside_encode_onto_a_new_partition_is_indexed_during_the_sweep() -> None:
    """Re-indexing such a value inside `due` added a partition's heap to the dict being iterated:
    RuntimeError. Not reachable with today's wiring (a trace's partition never changes); hardening."""
    table: dict[bytes, bytes] = {}
    states = DecodedStates(table, PartitionedValue, sweep_after=lambda k, v: (v.partition, v.last))  # type: ignore[arg-type]
    table[b"k"] = states.encode(b"k", PartitionedValue(partition=0, last=T0))
    assert states.due(lambda p, m: False) == []
    table[b"k"] = PartitionedValue(partition=7, last=T0).model_dump_json().encode()
    states.due(lambda p, m: True)  # re-indexed on partition 7 (a heap this sweep does not visit)
    assert [key for key, _ in states.due(lambda p, m: True)] == [b"k"]  # due on its new partition


def test_a_restored_value_that_does_not_validate_is_skipped_not_raised() -> None:
    """A changelog value another version (or another writer) left made every sweep raise, and the
    worker crashed after each restart: now the sweep skips it (reported), and only an input that
    needs it fails, with a class name that says why (dead-lettered by the stage's guard)."""
    table: dict[bytes, bytes] = {}
    skipped: list[str] = []
    states = DecodedStates(table, Value, sweep_after=_sweep_after, on_undecodable=skipped.append)  # type: ignore[arg-type]
    table[b"0-good"] = Value(last=T0).model_dump_json().encode()
    table[b"0-bad"] = b'{"last": "not a time"}'
    states.restored()
    late = _passed_at({0: T0 + timedelta(hours=2)})
    assert [key for key, _ in states.due(late)] == [b"0-good"]
    assert skipped == ["Value"]  # the table's name (a dict has none: the model's)
    assert [key for key, _ in states.due(late)] == [b"0-good"]  # reported once, not at every sweep
    assert skipped == ["Value"]
    with pytest.raises(
        UndecodableState, match=re.escape("not a valid Value (1 validation error, the first at last)")
    ) as raised:
        states.load(b"0-bad")
    assert "not a time" not in str(raised.value)  # names where, never the stored value

    # A key indexed from a good value whose bytes are then replaced by bad ones (a later restore).
    table[b"0-good"] = b"[]"
    assert states.due(late) == []
    assert skipped == ["Value", "Value"]
    # Rewritten through the worker's own code, a skipped key is indexed and swept again.
    table[b"0-bad"] = states.encode(b"0-bad", Value(last=T0))
    assert [key for key, _ in states.due(late)] == [b"0-bad"]


@pytest.mark.parametrize(
    ("key", "raw", "error"),
    [
        (b"x-not-a-partition", Value(last=T0).model_dump_json().encode(), "ValueError"),  # key unusable
        (b"0-overflow", b'{"last": "9999-12-31T23:30:00Z"}', "OverflowError"),  # + 1 h overflows
        (b"0-naive", b'{"last": "2026-11-01T00:00:00"}', "TypeError"),  # no time zone
    ],
)
def test_a_valid_value_whose_sweep_moment_cannot_be_computed_is_skipped(
    key: bytes, raw: bytes, error: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Validation is not enough: a value another writer left can still make the sweep moment raise."""
    table: dict[bytes, bytes] = {b"0-good": Value(last=T0).model_dump_json().encode(), key: raw}
    skipped: list[str] = []
    states = DecodedStates(table, Value, sweep_after=_sweep_after, on_undecodable=skipped.append)  # type: ignore[arg-type]
    states.restored()
    assert [k for k, _ in states.due(_passed_at({0: T0 + timedelta(hours=2)}))] == [b"0-good"]
    assert skipped == ["Value"]
    assert error in caplog.text and repr(key) in caplog.text
