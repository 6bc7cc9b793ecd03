"""Dead letters as data: the decoder returns a `DeadLetter` instead of raising through the stream.

A dead letter keeps the raw record (with every `token_logprobs` array removed), a short reason code and a
sanitised message (never an input value), and is written to the DLQ with Kafka Connect's error headers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import orjson

__all__ = ["DeadLetter", "Reason", "connect_headers", "strip_logprobs"]

Reason = Literal[
    "invalid_json",
    "not_an_object",
    "missing_field",
    "unknown_event_type",
    "unsupported_schema_version",
    "wrong_type",
    "invalid_value",
    "non_finite_number",
    "out_of_range",
    "oversized_event",
    "oversized_array",
    "processing_error",
]

LOGPROBS_KEY = "token_logprobs"
_REMOVED = "<removed>"
# For bytes that are not valid JSON: a token_logprobs array, closed or cut off at the end of the record.
_LOGPROBS_SPAN = re.compile(rb'"token_logprobs"\s*:\s*(\[[^\]]*\]?|[^,}]*)', re.DOTALL)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that could not be decoded, with why."""

    raw: bytes
    reason: Reason
    error_class: str
    message: str


def _strip(value: object) -> object:
    if isinstance(value, dict):
        return {k: (_REMOVED if k == LOGPROBS_KEY else _strip(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def strip_logprobs(raw: bytes, max_bytes: int) -> bytes:
    """The record as stored in the DLQ: every `token_logprobs` value replaced, at most `max_bytes` long."""
    try:
        stripped = orjson.dumps(_strip(orjson.loads(raw)))
    except orjson.JSONDecodeError:
        # Not JSON (or JSON with NaN/Infinity, which orjson rejects): cut the arrays out textually. A key
        # left open at the end of a truncated record takes the rest of the record with it.
        stripped = _LOGPROBS_SPAN.sub(b'"token_logprobs":"' + _REMOVED.encode() + b'"', raw)
        if b"token_logprobs" in stripped.replace(b'"token_logprobs":"<removed>"', b""):
            stripped = stripped[: stripped.find(b"token_logprobs")] + b"<removed>"
    return stripped[:max_bytes]


def connect_headers(letter: DeadLetter, topic: str, partition: int, offset: int) -> list[tuple[str, bytes]]:
    """Kafka Connect's DLQ error headers plus our short reason code."""
    return [
        ("__connect.errors.topic", topic.encode()),
        ("__connect.errors.partition", str(partition).encode()),
        ("__connect.errors.offset", str(offset).encode()),
        ("__connect.errors.exception.class.name", letter.error_class.encode()),
        ("__connect.errors.exception.message", letter.message.encode()),
        ("__connect.errors.reason", letter.reason.encode()),
    ]
