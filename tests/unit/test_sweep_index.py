"""The sweep's index (`DecodedStates.due`): only due keys are decoded, and it never misses a due key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel

from streams.agents import DecodedStates

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
    due = states.due(_passed_at({1: T0 + timedelta(hours=2)}))
    assert [key for key, _ in due] == [b"1-99"]
    assert len(DECODES) == 1
    states.due(_passed_at({}))
    assert len(DECODES) == 1

    # Replaced bytes (new object) are looked at again: a newer time is no longer due.
    table[b"1-99"] = CountingValue(last=T0 + timedelta(hours=9)).model_dump_json().encode()
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
