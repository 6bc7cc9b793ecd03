"""Reading what a stage returned, and the batching check, for the unit tests of the table bounds
(trace state, claim node)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import orjson

from streams.stages import InputRecord, Record


def scored(records: list[Record]) -> list[dict[str, Any]]:
    """The outputs sent to scored-events, decoded."""
    return [orjson.loads(r.value) for r in records if r.topic == "scored-events"]


def outputs(records: list[Record]) -> list[tuple[str, bytes]]:
    """Scored and flagged records, without `scored_at` (processing time)."""
    return [
        (r.topic, orjson.dumps({k: v for k, v in orjson.loads(r.value).items() if k != "scored_at"}))
        for r in records
        if r.topic in ("scored-events", "flagged-events")
    ]


def dead(records: list[Record]) -> list[tuple[int, bytes]]:
    """(input offset, reason) of each dead letter."""
    letters = []
    for r in records:
        if r.topic == "agent-events-dlq":
            headers = dict(r.headers or [])
            letters.append((int(headers["__connect.errors.offset"]), headers["__connect.errors.reason"]))
    return letters


class BoundedStage(Protocol):
    """A stage over an in-memory table of encoded values, fed in batches of given sizes."""

    table: dict[bytes, bytes]
    largest_write: int  # bytes of the largest table value written

    def run(self, events: Sequence[dict[str, Any]], batches: Sequence[int]) -> list[Record]: ...


def check_batching_changes_nothing(
    make: Callable[[], BoundedStage],
    events: list[dict[str, Any]],
    batches: list[int],
    limit: int,
    reason: bytes,
) -> None:
    """One input per batch and the given batches send the same records and leave the same table; no
    value written passes `limit`; every dead letter has `reason`."""
    one_by_one, batched = make(), make()
    alone = one_by_one.run(events, [1] * len(events))
    together = batched.run(events, batches)

    assert outputs(together) == outputs(alone)
    assert dead(together) == dead(alone)
    assert one_by_one.table == batched.table
    assert max(one_by_one.largest_write, batched.largest_write) <= limit
    assert Counter(why for _, why in dead(alone)) <= Counter({reason: len(events)})


def keyed(record: InputRecord) -> InputRecord:
    """`record` keyed as producers key input events: by the event's trace_id (stage 1 dead-letters
    any other key, `wrong_key`). Left as it is when its value has no trace_id to key it by."""
    try:
        trace_id = orjson.loads(record.value or b"").get("trace_id")
    except (orjson.JSONDecodeError, AttributeError):
        return record
    return dataclasses.replace(record, key=trace_id.encode()) if isinstance(trace_id, str) else record
