"""Decoded date-times carry the standard library's zones, keep their offsets and serialise as before."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import orjson
import pytest
from pydantic import ValidationError

from streams.decode import decode
from streams.events import LlmResponse
from streams.scoring.times import standard_zone
from streams.state import TraceState
from tests.unit.test_decode import BASE


def _response(timestamp: str) -> bytes:
    return orjson.dumps({**BASE, "timestamp": timestamp})


def _decode(raw: bytes) -> object:
    return decode(raw, 10_000, 100)


@pytest.mark.parametrize(
    ("text", "offset"),
    [
        ("2026-11-27T10:00:00Z", timedelta(0)),
        ("2026-11-27T10:00:00.123456789Z", timedelta(0)),
        ("2026-11-27 10:00:00-00:00", timedelta(0)),
        ("2026-11-27T10:00:00+02:00", timedelta(hours=2)),
    ],
)
def test_input_timestamps_get_a_standard_zone(text: str, offset: timedelta) -> None:
    event = _decode(_response(text))
    assert isinstance(event, LlmResponse)
    assert type(event.timestamp.tzinfo) is timezone
    assert event.timestamp.utcoffset() == offset


def test_lower_case_separators_are_still_accepted() -> None:
    # datetime.fromisoformat refuses "t" and "z"; pydantic parses them as before
    event = _decode(_response("2026-11-27t10:00:00z"))
    assert isinstance(event, LlmResponse)
    assert event.timestamp == datetime(2026, 11, 27, 10, tzinfo=UTC)


def test_strings_the_standard_library_refuses_are_left_to_pydantic() -> None:
    assert standard_zone("2026-11-27T24:00:00Z") == "2026-11-27T24:00:00Z"
    assert standard_zone("2026-11-27T10:00:00") == "2026-11-27T10:00:00"  # no zone: pydantic says so
    assert standard_zone(17) == 17


def test_outputs_serialise_offsets_as_before() -> None:
    event = _decode(_response("2026-11-27T10:00:00+02:00"))
    assert isinstance(event, LlmResponse)
    assert orjson.loads(event.model_dump_json())["timestamp"] == "2026-11-27T10:00:00+02:00"
    utc = _decode(_response("2026-11-27T10:00:00.5Z"))
    assert isinstance(utc, LlmResponse)
    assert orjson.loads(utc.model_dump_json())["timestamp"] == "2026-11-27T10:00:00.500000Z"


def test_state_read_back_from_a_changelog_gets_a_standard_zone() -> None:
    raw = b'{"tenant_id": "t", "trace_id": "tr", "partition": 0, "last_event_time": "2026-11-27T10:00:00Z"}'
    state = TraceState.model_validate_json(raw)
    assert state.last_event_time.tzinfo is UTC


def test_state_without_a_time_zone_does_not_validate() -> None:
    """A naive time from another writer would raise at its first comparison with the clock, in the sweep."""
    raw = b'{"tenant_id": "t", "trace_id": "tr", "partition": 0, "last_event_time": "2026-11-27T10:00:00"}'
    with pytest.raises(ValidationError, match="timezone_aware"):
        TraceState.model_validate_json(raw)
