"""`strip_logprobs`'s textual path on malformed records, to the byte (from a mutation review of dlq.py).

Records orjson cannot read are stripped by scanning the text (`_strip_text`, `_value_end`); the fuzz tests
check that no logprob digits survive, these pin exactly what is kept, where a value ends and where a
mention cuts the record.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from streams import dlq
from streams.dlq import strip_logprobs


@pytest.mark.parametrize(
    ("raw", "stored"),
    [
        # An escaped quote inside a logprobs string value does not end it: nothing of the value is kept.
        (
            b'{"top_logprobs": "\\"-0.0123456789", "x": NaN}',
            b'{"top_logprobs": "<removed>", "x": NaN}',
        ),
        # A value not followed by the next key, a closing bracket or the end is not trusted to have
        # ended: the rest of the record is cut from its key (thirtieth round; the mention after it cut
        # the rest before).
        (
            b'{"logprobs":"-0.5"logprob=-0.0123456789, NaN',
            b'{"logprobs":"<removed>"',
        ),
        # A string value ends at its closing quote: what follows it is kept as it was.
        (
            b'{"top_logprobs": "-0.5" , "x": NaN}',
            b'{"top_logprobs": "<removed>" , "x": NaN}',
        ),
        # A scalar ends at the bracket that closes its object, and the bracket is kept.
        (
            b'{"x": NaN, "top_logprobs": -0.5}',
            b'{"x": NaN, "top_logprobs": "<removed>"}',
        ),
        (
            b'[{"top_logprobs": 1}, {"a": 2, "b": NaN}]',
            b'[{"top_logprobs": "<removed>"}, {"a": 2, "b": NaN}]',
        ),
        # Two logprobs keys back to back (no comma): the first value is not followed well, so the rest
        # is cut from its key (before the thirtieth round each value was replaced on its own).
        (
            b'{"top_logprobs":"a""logprobs":"b","x":NaN}',
            b'{"top_logprobs":"<removed>"',
        ),
        # A key whose escape is not valid JSON names nothing: its value is kept.
        (
            b'{"a\\x": 5, "y": NaN}',
            b'{"a\\x": 5, "y": NaN}',
        ),
    ],
)
def test_the_textual_path_removes_exactly_the_logprobs_values(raw: bytes, stored: bytes) -> None:
    assert strip_logprobs(raw, 10_000) == stored


def test_a_negative_cap_stores_nothing() -> None:
    assert strip_logprobs(b'{"a": NaN}', -1) == b""


def serialised_wrong(values: tuple[float, float, float]) -> list[bytes]:
    """Logprobs in records a producer serialised wrongly: each was stored with its values until the
    thirtieth round."""
    v0, v1, v2 = values
    e0, e1, e2 = (repr(v).encode() for v in values)
    event = {"event_type": "LLM_RESPONSE", "response": 42, "token_logprobs": [v0, v1]}
    head = b'{"event_type": "LLM_RESPONSE", "response": 42'
    return [
        orjson.dumps(orjson.dumps(event).decode()),  # the event serialised twice: one JSON string
        orjson.dumps({**event, "token_logprobs": None, "raw": json.dumps({"logprobs": [{"logprob": v2}]})}),
        json.dumps(event).encode("utf-16-le"),  # RFC 7159 allowed UTF-16
        head + b', "token_logprobs": (' + e0 + b", " + e1 + b")}",  # a tuple's repr
        head + b', "token_logprobs": /* top-1, greedy */ [' + e2 + b"]}",  # a comment before the array
        head
        + b', "token_logprobs": [NaN], "'
        + b"x" * 90
        + b'_l\\u006fgprobs": ['
        + e1
        + b"]}",  # a long key
    ]


@pytest.mark.parametrize("case", range(6))
def test_records_serialised_wrongly_keep_no_logprob(case: int) -> None:
    """Review (thirtieth round): a JSON string holding the event, a provider's raw answer kept as a
    string, UTF-16, a tuple's repr, a comment before the array and a logprobs key longer than 96 units
    written with an escape each kept their values in the dead letter."""
    values = (-0.8264019375, -1.9350718264, -0.3719402856)
    stored = strip_logprobs(serialised_wrong(values)[case], 1_000_000)
    kept = [v for v in values if repr(v).lstrip("-").encode() in stored.replace(b"\x00", b"")]
    assert kept == [], stored
    assert stored, "only records that are not text at all are stored empty"


VALUE = b"1234567891"  # the ten decimals of every logprob below


def _kept(stored: bytes) -> bool:
    return VALUE in stored or VALUE in stored.replace(b"\x00", b"")


@pytest.mark.parametrize(
    "raw",
    [
        # Quoted numbers without brackets: `, "` was taken for the next key.
        b'{"token_logprobs": "-0.1", "-0.1234567891", "-0.3"}',
        # UTF-16 that json.detect_encoding reads as UTF-8 (no NUL in its first bytes).
        "€".encode("utf-16-le") + '{"token_logprobs":[-0.1234567891]}'.encode("utf-16-le"),
        b'{"x":"' + '{"token_logprobs":[-0.1234567891]}'.encode("utf-16-le") + b'"}',
        # Valid JSON whose string holds an event with an escaped key.
        json.dumps({"raw_response": '{"token_\\u006cogprobs": [-0.1234567891]}'}).encode(),
        # A table naming its column "logprob" (pandas' to_json(orient="split")), as JSON and not.
        orjson.dumps({"columns": ["token", "logprob"], "data": [["hi", -0.1234567891]]}),
        orjson.dumps({"columns": ["token", "logprob"], "data": [["hi", -0.1234567891]]}) + b"x",
        # A stray closing bracket after the value, and numbers after it.
        b'{"logprobs": -0.5}, -0.1234567891, -0.3]',
        b'{"token_logprobs": [-0.5]], [-0.1234567891]]',
        # Spelt with a separator.
        b'{"token_log_probs": [-0.1234567891]}',
        b'{"log-probs": [-0.1234567891], "x": NaN}',
    ],
)
def test_more_shapes_keep_no_logprob(raw: bytes) -> None:
    """Robustness review (thirtieth round): each of these kept its value after the first round of fixes."""
    assert not _kept(strip_logprobs(raw, 1_000_000))


def test_a_bad_record_without_logprobs_is_stored_as_sent() -> None:
    """A valid-JSON record was stored after an orjson round trip: a user reading an `out_of_range`
    dead letter saw 1.8446744073709552e+19 for the 18446744073709551616 that was refused."""
    raw = b'{"a": 18446744073709551616, "b": 1E2, "c": -0, "d": "\\u00e9"}'
    assert strip_logprobs(raw, 1_000_000) == raw


def test_the_textual_path_looks_at_each_key_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value removed with its key takes the keys nested in it along: scanning each nested key's value
    to the end again was quadratic (100 KB of `"logprob":[` took 68 s, stalling the worker past its
    session timeout). And a key is sought only near a mention: at every quote, 1 MB of `\\"` took 3 s.
    Counted, not timed."""
    calls = {"value_end": 0, "key": 0}
    value_end, key_around = dlq._value_end, dlq._key_around

    def counted_value_end(raw: bytes, start: int) -> int:
        calls["value_end"] += 1
        return value_end(raw, start)

    def counted_key_around(raw: bytes, start: int, end: int) -> Any:
        calls["key"] += 1
        return key_around(raw, start, end)

    monkeypatch.setattr(dlq, "_value_end", counted_value_end)
    monkeypatch.setattr(dlq, "_key_around", counted_key_around)
    assert strip_logprobs(b'"logprob":[' * 9_000, 1_000_000) == b'"logprob":"<removed>"'
    assert calls == {"value_end": 1, "key": 1}
    assert strip_logprobs(b'\\"' * 50_000, 1_000_000) == b'\\"' * 50_000
    assert calls == {"value_end": 1, "key": 1}  # no mention: no key sought


# --- From a mutation review of the thirtieth round's dlq.py ------------------------------------------

LONGEST_KEY = b"\\n" * 89 + b"logprob"  # 96 units in 185 bytes: the mention starts 179 bytes after the quote


@pytest.mark.parametrize(
    "raw",
    [
        # A mention nested in a removed value is skipped, not the end of the scan: the next key is removed.
        b'{"logprobs": {"logprob": -0.5}, "top_logprobs": [-0.1234567891], "x": NaN}',
        # An object ends at its own closing brace, not at the first bracket that closes inside it.
        b'{"logprobs": {"content": [{"token": "a"}], "top": [-0.1234567891]}, "x": NaN}',
        b'{"logprobs": {"a": [1], "b": -0.1234567891}, "x": NaN}',
        # An upper-case letter written as an escape (`\u004c` is "L") still mentions logprobs.
        b'{"top_\\u004cogprobs": [-0.1234567891], "x": NaN}',
    ],
)
def test_the_textual_path_keeps_no_logprob_after_a_nested_key_or_bracket(raw: bytes) -> None:
    stored = strip_logprobs(raw, 1_000_000)
    assert not _kept(stored), stored
    assert stored.endswith(b'"<removed>", "x": NaN}'), stored


@pytest.mark.parametrize(
    ("raw", "stored"),
    [
        # The longest key matched, every unit but the mention an escape: the mention is 179 bytes in.
        (
            b'{"' + LONGEST_KEY + b'": [-0.5], "x": NaN}',
            b'{"' + LONGEST_KEY + b'": "<removed>", "x": NaN}',
        ),
        # One unit longer is not matched as a key: its mention cuts the rest.
        (
            b'{"a' + LONGEST_KEY + b'": [-0.5], "x": NaN}',
            b'{"a' + b"\\n" * 89 + b"<removed>",
        ),
        # An escape of a newline (not JSON) in the key, and in the key after the value.
        (b'{"a\\\nlogprobs": [-0.5], "x": NaN}', b'{"a\\\nlogprobs": "<removed>", "x": NaN}'),
        (b'{"logprobs": 1, "a\\\nb": NaN}', b'{"logprobs": "<removed>", "a\\\nb": NaN}'),
        # Scalars in every form JSON and JavaScript write them end where they end.
        (b'{"logprobs": -Infinity, "x": NaN}', b'{"logprobs": "<removed>", "x": NaN}'),
        (b'{"logprobs": .5, "x": NaN}', b'{"logprobs": "<removed>", "x": NaN}'),
        (b'{"logprobs": -1.5E-5, "x": NaN}', b'{"logprobs": "<removed>", "x": NaN}'),
        # An object is a value too.
        (b'{"logprobs": {"a": 1}, "x": NaN}', b'{"logprobs": "<removed>", "x": NaN}'),
        # A value at the end of a truncated record: the blanks after it are kept.
        (b'{"x": NaN, "logprobs": [1] \n', b'{"x": NaN, "logprobs": "<removed>" \n'),
    ],
)
def test_the_textual_path_ends_a_value_exactly(raw: bytes, stored: bytes) -> None:
    assert strip_logprobs(raw, 1_000_000) == stored


def test_a_record_in_no_encoding_without_a_mention_is_stored_as_sent() -> None:
    """NULs as in UTF-16 but an odd length (not UTF-16 after all): with no mention, nothing to hide."""
    raw = '{"a": NaN}'.encode("utf-16-le") + b"!"
    assert strip_logprobs(raw, 1_000_000) == raw


class _CountedKey:
    def __init__(self, key: Any) -> None:
        self.key, self.calls = key, 0

    def match(self, raw: bytes, pos: int) -> Any:
        self.calls += 1
        return self.key.match(raw, pos)


def test_a_mention_that_is_no_key_looks_at_the_quotes_near_it_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mention after a megabyte of `\\"`: a key is tried at the quotes within `_KEY_REACH` bytes of it,
    not at every quote before it. Counted, not timed."""
    counted = _CountedKey(dlq._KEY)
    monkeypatch.setattr(dlq, "_KEY", counted)
    raw = b'\\"' * 50_000 + b"logprob"
    assert strip_logprobs(raw, 1_000_000) == b'\\"' * 50_000 + b"<removed>"
    assert 0 < counted.calls <= dlq._KEY_REACH
