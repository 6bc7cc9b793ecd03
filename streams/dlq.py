"""Dead letters as data: the decoder returns a `DeadLetter` instead of raising through the stream.

A dead letter keeps the raw record (with the value of every key naming logprobs removed: `token_logprobs`,
and also `top_logprobs` or `logprobs` that a producer adds), a short reason code and a sanitised message
(never an input value), and is written to the DLQ with Kafka Connect's error headers.
"""

from __future__ import annotations

import json
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
    "oversized_field",
    "processing_error",
    "trace_state_full",
    "claim_node_full",
    "claim_graph_too_complex",
    "oversized_output",
    "wrong_key",
]

# A key is removed with its value when its name mentions logprobs (`_MENTION`: "logprob" in any case,
# also `log_prob` or `log-prob`): raw logprobs never leave memory (DESIGN 1), whichever field a producer
# puts them in. A string value that mentions them cuts the record there (the event serialised twice,
# a provider's raw answer kept as a string).
_REMOVED = "<removed>"


def _letters(word: str) -> bytes:
    """A pattern of `word` with each letter also as a `\\u` escape: a mention hidden by escapes counts."""
    return b"".join(
        rb"(?:%s|\\u00%02x|\\u00%02x)" % (re.escape(c.encode()), ord(c.lower()), ord(c.upper())) for c in word
    )


# Also spelt with a separator (`token_log_probs`, `log-probs`), as producers do.
_MENTION = re.compile(_letters("log") + rb"(?:[_-]|\\u005f|\\u002d)?" + _letters("prob"), re.IGNORECASE)
# For bytes orjson cannot read or write back (not JSON, NaN / Infinity literals, deep nesting): each
# mention of logprobs is looked at in turn; when it lies inside a `"<key>":` whose key decodes to a
# logprobs name (escapes included), that key's value is removed, else the rest of the record is cut.
# A key is sought only at the quotes up to `_KEY_REACH` bytes before its mention, so the scan is linear
# however the record is made (trying a key at every quote took seconds on a megabyte of `\"`). Up to 96
# units (an escape's `\u` is one, its 4 digits four): "token_logprobs" written wholly as `\uXXXX`
# escapes takes 70. A longer key naming logprobs is not matched as a key: its mention cuts the rest.
_KEY = re.compile(rb'"((?:[^"\\]|\\.){0,96})"\s*:\s*', re.DOTALL)
_KEY_REACH = 2 * 96 + 1
_STRUCTURE = re.compile(rb'["\\\[\]{}]')
_QUOTE, _BACKSLASH = ord('"'), ord("\\")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that could not be decoded, with why."""

    raw: bytes
    reason: Reason
    error_class: str
    message: str


class _MentionInValue(Exception):
    """A string value of a JSON record mentions logprobs (the event serialised twice, a table whose
    column is named "logprob"): the record is cut at the mention, as text, not just that string."""


def _strip(value: object, removed: list[str]) -> object:
    """`value` with every logprobs key's value replaced; the keys replaced are added to `removed`."""
    if isinstance(value, dict):
        stripped: dict[str, object] = {}
        for key, item in value.items():
            if _names_logprobs(key):
                stripped[key] = _REMOVED
                removed.append(key)
            else:
                stripped[key] = _strip(item, removed)
        return stripped
    if isinstance(value, list):
        return [_strip(item, removed) for item in value]
    if isinstance(value, str) and _names_logprobs(value):
        raise _MentionInValue
    return value


def strip_logprobs(raw: bytes, max_bytes: int) -> bytes:
    """The record as stored in the DLQ: every logprobs key's value replaced, at most `max_bytes` long."""
    raw = _as_utf8(raw)
    if b"\x00" in raw and _MENTION.search(raw.replace(b"\x00", b"")):
        return b""  # NULs between its letters (UTF-16 no detection found) could hide a key: keep nothing
    try:
        removed: list[str] = []
        stripped = _strip(orjson.loads(raw), removed)
        stored = orjson.dumps(stripped) if removed else raw  # as sent, when nothing was removed
    except (orjson.JSONDecodeError, orjson.JSONEncodeError, RecursionError, _MentionInValue):
        # Not JSON, JSON with NaN / Infinity (which orjson rejects), nested deeper than orjson writes
        # (254 levels) or this module recurses, or mentioning logprobs in a value: cut textually.
        stored = _strip_text(raw)
    return _cut(stored, max_bytes)


def _as_utf8(raw: bytes) -> bytes:
    """JSON written in UTF-16 or UTF-32 (RFC 7159 allowed them) as UTF-8: in UTF-16 every letter of
    "logprobs" has a NUL beside it, and no pattern here would see the key."""
    encoding = json.detect_encoding(raw)
    if encoding in ("utf-8", "utf-8-sig"):
        return raw
    try:
        return raw.decode(encoding).encode()
    except UnicodeDecodeError:
        return raw  # not text in that encoding: its NULs are looked at by the caller


def _cut(data: bytes, max_bytes: int) -> bytes:
    """`data[:max_bytes]` without a split UTF-8 character at the end: a consumer that decodes the record as
    text would otherwise fail on all of it, not only on its last character."""
    end = max(0, min(len(data), max_bytes))
    floor = max(0, end - 3)  # a character is at most 4 bytes
    while end > floor and end < len(data) and data[end] & 0xC0 == 0x80:
        end -= 1  # the first byte left out continues a character: leave that character out whole
    return data[:end]


def _strip_text(raw: bytes) -> bytes:
    """Every logprobs key with its value replaced; any other mention cuts the rest of the record."""
    spans: list[tuple[int, int, bytes]] = []  # (start, end, replacement), by start, not overlapping
    for mention in _MENTION.finditer(raw):
        if spans and mention.start() < spans[-1][1]:
            continue  # inside a value already removed: a nested key goes with it
        key = _key_around(raw, mention.start(), mention.end())
        if key is None:
            spans.append((mention.start(), len(raw), _REMOVED.encode()))
            break
        end = _value_end(raw, key.end())
        spans.append((key.start(), end, key.group(0) + b'"' + _REMOVED.encode() + b'"'))
    parts, last = [], 0
    for start, end, replacement in spans:
        parts += [raw[last:start], replacement]
        last = end
    parts.append(raw[last:])
    return b"".join(parts)


def _key_around(raw: bytes, start: int, end: int) -> re.Match[bytes] | None:
    """The `"<key>":` naming logprobs whose key holds the mention at `start:end`, if there is one."""
    quote = start
    while (quote := raw.rfind(b'"', max(0, start - _KEY_REACH), quote)) != -1:
        key = _KEY.match(raw, quote)
        # A key that holds the mention names logprobs: decoding its escapes cannot take the mention away.
        if key is not None and key.end(1) >= end:
            return key
    return None


def _names_logprobs(text: str) -> bool:
    """Whether `text` mentions logprobs, also as written with `\\u` escapes (JSON inside a string)."""
    return _MENTION.search(text.encode("utf-8", "surrogatepass")) is not None


# A logprobs value is replaced only when it is one whole value followed by the record's next key, its
# closing bracket or its end; anything else (a tuple `(-0.7, -1.2)`, numbers without brackets, a
# comment before the array) cuts the rest of the record from its key, so no number of it is kept.
_SPACE = re.compile(rb"\s*")
_SCALAR = re.compile(rb"(?:-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|true|false|null|NaN|-?Infinity)")
_NEXT_KEY = rb'"(?:[^"\\]|\\.){0,96}"\s*:'
# After a closing bracket only brackets, commas and blanks may come before the next key or the end: in
# `{"logprobs": -0.5}, -0.12, -0.3]` the bracket closes nothing of the value's, and numbers follow it.
_FOLLOWED_WELL = re.compile(
    rb"\s*(?:,\s*" + _NEXT_KEY + rb"|[}\]][\s}\],{\[]*(?:" + _NEXT_KEY + rb"|\Z)|\Z)", re.DOTALL
)


def _value_end(raw: bytes, start: int) -> int:
    """Where the JSON-like value at `start` ends, if it is one whole value followed well (see above):
    after its closing bracket or quote (brackets inside strings do not count), or after a bare scalar.
    Otherwise, or if it is never closed, the end of the record."""
    space = _SPACE.match(raw, start)
    i = start if space is None else space.end()
    if i < len(raw) and raw[i] in b'[{"':
        end = _closing(raw, i)
    else:
        scalar = _SCALAR.match(raw, i)
        end = None if scalar is None else scalar.end()
    if end is None or not _FOLLOWED_WELL.match(raw, end):
        return len(raw)
    return end


def _closing(raw: bytes, start: int) -> int | None:
    """Past the bracket or quote that closes the one opened at `start`; None if none does."""
    depth, in_string, i = 0, False, start
    while (match := _STRUCTURE.search(raw, i)) is not None:
        i = match.start()
        char = raw[i]
        if in_string:
            if char == _BACKSLASH:
                i += 1  # skip the escaped character
            elif char == _QUOTE:
                in_string = False
                if depth == 0:
                    return i + 1
        elif char == _QUOTE:
            in_string = True
        elif char in b"[{":
            depth += 1
        elif char in b"]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


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
