"""Reading what a stage returned, for the unit tests of the table bounds (trace state, claim node)."""

from __future__ import annotations

from typing import Any

import orjson

from streams.stages import Record


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
