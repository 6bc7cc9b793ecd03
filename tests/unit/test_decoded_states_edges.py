"""`DecodedStates` (from a mutation review): a measured encoding is reused only for the very value
measured, and a skipped value is reported once, also across restores."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pydantic import BaseModel

from streams.decoded_states import DecodedStates

T0 = datetime(2026, 11, 1, tzinfo=UTC)


class Value(BaseModel):
    last: datetime


def _sweep_after(key: bytes, value: Value) -> tuple[int, datetime]:
    return int(key[:1]), value.last + timedelta(hours=1)


def test_encode_writes_the_value_given_not_one_measured_before() -> None:
    """A rejected input's value is measured but never written: the next write of the key is another value."""
    table: dict[bytes, bytes] = {}
    states = DecodedStates(table, Value)  # type: ignore[arg-type]
    measured = Value(last=T0)
    states.measure(b"0-k", measured)
    written = Value(last=T0 + timedelta(hours=3))
    assert states.encode(b"0-k", written) == written.model_dump_json().encode()
    assert states.encode(b"0-k", measured) == measured.model_dump_json().encode()


def test_a_skipped_value_is_reported_once_across_restores_of_the_same_bytes() -> None:
    table: dict[bytes, bytes] = {b"0-bad": b'{"last": "not a time"}'}
    skipped: list[str] = []
    states = DecodedStates(table, Value, sweep_after=_sweep_after, on_undecodable=skipped.append)  # type: ignore[arg-type]
    late = lambda partition, moment: moment < T0 + timedelta(hours=2)  # noqa: E731
    assert states.due(late) == []
    states.restored()  # a later recovery that left the very same value
    assert states.due(late) == []
    assert skipped == ["Value"]
