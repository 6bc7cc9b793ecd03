"""Bytes -> validated input event, or a `DeadLetter` saying why not (never an exception)."""

from __future__ import annotations

import json

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from streams.dlq import DeadLetter, Reason
from streams.events import (
    INPUT_EVENT_TYPES,
    ClaimEvent,
    LlmResponse,
    OutcomeEvent,
    ToolInvocation,
    input_adapter,
)

__all__ = ["Decoded", "decode"]

Decoded = LlmResponse | ToolInvocation | ClaimEvent | OutcomeEvent

_REASON_BY_ERROR_TYPE: dict[str, Reason] = {
    "json_invalid": "invalid_json",
    "json_type": "invalid_json",
    "missing": "missing_field",
    "union_tag_invalid": "unknown_event_type",
    "union_tag_not_found": "missing_field",
    "model_type": "not_an_object",
    "model_attributes_type": "not_an_object",
    "finite_number": "non_finite_number",
    "greater_than_equal": "out_of_range",
    "less_than_equal": "out_of_range",
    "greater_than": "out_of_range",
    "less_than": "out_of_range",
    "literal_error": "invalid_value",
    "string_too_short": "invalid_value",
    "string_too_long": "oversized_field",
    "timezone_aware": "invalid_value",
    "outcome_invalid": "invalid_value",
    "claim_id_reserved": "invalid_value",
    "timestamp_out_of_range": "out_of_range",
}


def _reason(error: ErrorDetails) -> Reason:
    loc = error["loc"]
    if not loc and error["type"] == "dict_type":
        return "not_an_object"  # the record is JSON, but an array, string, number, null or boolean
    if loc and loc[-1] == "schema_version" and error["type"] != "missing":
        return "unsupported_schema_version"
    return _REASON_BY_ERROR_TYPE.get(error["type"], "wrong_type")


# pydantic's message for an unknown tag quotes the tag, an input value: replaced by this one.
_UNKNOWN_EVENT_TYPE = "event_type should be one of " + ", ".join(repr(t) for t in INPUT_EVENT_TYPES)


def _message(exc: ValidationError) -> str:
    # Never include input values: a wrong-typed token_logprobs would otherwise leak into the header.
    parts = []
    for error in exc.errors(include_url=False, include_input=False, include_context=False)[:5]:
        where = ".".join(str(p) for p in error["loc"]) or "<event>"
        message = _UNKNOWN_EVENT_TYPE if error["type"] == "union_tag_invalid" else error["msg"]
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


def decode(raw: bytes | None, max_event_bytes: int, max_array_items: int) -> Decoded | DeadLetter:
    """Validate one record's value against the input union and the size limits."""
    if raw is None:
        return DeadLetter(b"", "invalid_json", "EmptyRecord", "record has no value")
    if len(raw) > max_event_bytes:
        return DeadLetter(
            raw, "oversized_event", "OversizedEvent", f"event of {len(raw)} bytes exceeds {max_event_bytes}"
        )
    try:
        event = input_adapter.validate_json(raw)
    except ValidationError as exc:
        return DeadLetter(raw, _reason(exc.errors()[0]), type(exc).__name__, _message(exc))
    where = _non_finite_outside_logprobs(raw)
    if where is not None:
        return DeadLetter(
            raw,
            "non_finite_number",
            "NonFiniteNumber",
            f"{where}: NaN and Infinity are accepted only as token_logprobs entries (DESIGN 4b)",
        )
    for field, length in _array_lengths(event):
        if length > max_array_items:
            return DeadLetter(
                raw,
                "oversized_array",
                "OversizedArray",
                f"{field} has {length} entries, more than {max_array_items}",
            )
    return event


def _array_lengths(event: Decoded) -> tuple[tuple[str, int], ...]:
    if isinstance(event, LlmResponse):
        return (
            ("token_logprobs", len(event.token_logprobs or ())),
            ("retrieval", len(event.retrieval or ())),
        )
    if isinstance(event, ClaimEvent):
        return (
            ("provenance", len(event.provenance)),
            ("relationships", len(event.relationships)),
            ("derived_from", len(event.derived_from)),
        )
    return ()


# Stands for a NaN / Infinity literal while a record is searched for one.
_NON_FINITE = object()
_MAX_PATH_CHARS = 120


def _non_finite_outside_logprobs(raw: bytes) -> str | None:
    """Where a NaN / Infinity literal stands outside token_logprobs' entries, or None.

    pydantic rejects them in every field it reads, but its parser accepts them anywhere, so one in
    an unknown field (dropped unread) was let through. Records without those letters, nearly all of
    them, are not parsed a second time.
    """
    if b"NaN" not in raw and b"Infinity" not in raw:
        return None
    try:
        document = json.loads(raw, parse_constant=lambda _: _NON_FINITE)
    except (ValueError, RecursionError):
        return None  # pydantic read it, Python's parser cannot (e.g. a 5,000-digit integer): accept
    if not isinstance(document, dict):
        return None
    stack: list[tuple[str, object]] = []
    for key, value in document.items():
        if key == "token_logprobs" and isinstance(value, list):
            # Its entries may be non-finite; anything nested inside one is wrong-typed anyway.
            stack.extend((f"token_logprobs.{i}", v) for i, v in enumerate(value) if v is not _NON_FINITE)
        else:
            stack.append((key, value))
    while stack:
        path, value = stack.pop()
        if value is _NON_FINITE:
            return path[:_MAX_PATH_CHARS]  # key names only, never values
        if isinstance(value, dict):
            stack.extend((f"{path}.{k}", v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{path}.{i}", v) for i, v in enumerate(value))
    return None
