"""Property tests of the decoder and the DLQ value: whatever the bytes, `decode` answers and never leaks.

`decode` must return a valid input event or a `DeadLetter` with a known reason, and never raise (a raise
would reach the stream). A dead letter's message and class never quote the input's logprobs (or any other
input value), and `strip_logprobs` removes every `token_logprobs` value, whatever surrounds it.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, get_args

import orjson
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from streams.decode import decode
from streams.dlq import DeadLetter, Reason, strip_logprobs
from streams.events import TIMESTAMP_YEARS, ClaimEvent, LlmResponse, ToolInvocation

MAX_BYTES = 64 * 1024
MAX_ITEMS = 50
REASONS = set(get_args(Reason))

# Every logprob drawn below reads "-0.NN8642097531": these digits must never survive into a dead letter.
MARKER = "8642097531"
# Planted in other fields, where they stay in the stored record: a message must never quote them either.
SECRET = "zq-s3cr3t-value"
OTHER_MARKER = "1357924689"

marked_logprob = st.integers(10, 99).map(lambda i: float(f"-0.{i}{MARKER}"))
# The wire format of token_logprobs entries: finite, null or a non-finite literal (DESIGN 4b).
logprob_entry = st.one_of(
    marked_logprob,
    st.none(),
    st.sampled_from([math.nan, math.inf, -math.inf]),
)
logprob_list = st.lists(logprob_entry, min_size=1, max_size=8).filter(
    lambda xs: any(isinstance(x, float) and math.isfinite(x) for x in xs)
)

json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_value = st.recursive(
    json_scalar,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(st.text(max_size=10), children, max_size=5),
    ),
    max_leaves=25,
)


def dumps(value: Any) -> bytes:
    """JSON as producers may write it, the non-finite literals (NaN, Infinity) included."""
    return json.dumps(value).encode()


def check_decoded(raw: bytes) -> LlmResponse | ToolInvocation | ClaimEvent | DeadLetter:
    """The contract every input must meet; returns the result for further checks."""
    result = decode(raw, MAX_BYTES, MAX_ITEMS)
    assert isinstance(result, LlmResponse | ToolInvocation | ClaimEvent | DeadLetter)
    if isinstance(result, DeadLetter):
        assert result.reason in REASONS
        assert result.message and result.error_class
        for text in (result.message, result.error_class):
            for secret in (MARKER, SECRET, OTHER_MARKER):
                assert secret not in text, text
        assert result.raw == raw
    stored = strip_logprobs(raw, MAX_BYTES)
    assert MARKER.encode() not in stored
    assert len(stored) <= MAX_BYTES
    return result


# --- (a) random bytes ---------------------------------------------------------------------------------


@given(st.binary(max_size=2048))
@example(b"")
@example(b"\xff\xfe\xfd")
@example(b"[" * 300 + b"]" * 300)  # deeper than orjson serialises, shallower than it parses
@example(b"[" * 1000 + b"]" * 1000)  # deeper than Python recurses by default
@example(b'{"token_logprobs": [-0.108642097531, NaN')
def test_random_bytes(raw: bytes) -> None:
    result = check_decoded(raw)
    if raw[:1] not in (b"{", b" ", b"\t", b"\n", b"\r"):
        assert isinstance(result, DeadLetter)


@given(st.binary(max_size=256), st.binary(max_size=256))
@example(b'"token_logprobs":', b"")  # a key whose malformed value swallows the real key
@example(b'{"token_logprobs": [[', b"], [-0.138642097531]], NaN}")  # nested arrays, textual path
def test_random_bytes_around_logprobs(prefix: bytes, suffix: bytes) -> None:
    raw = prefix + b'"token_logprobs": [-0.118642097531, -0.128642097531' + suffix
    check_decoded(raw)


# --- (b) random JSON values ---------------------------------------------------------------------------


@given(json_value)
def test_random_json_values(value: Any) -> None:
    result = check_decoded(dumps(value))
    if not isinstance(value, dict):
        assert isinstance(result, DeadLetter)


def _plant(value: Any, logprobs: list[float | None], path: list[int]) -> Any:
    """`value` with a `token_logprobs` key planted in some nested object (a new one if there is none)."""
    if isinstance(value, dict) and (not path or not value):
        return {**value, "token_logprobs": logprobs}
    if isinstance(value, dict):
        key = sorted(value)[path[0] % len(value)]
        return {**value, key: _plant(value[key], logprobs, path[1:])}
    if isinstance(value, list) and value:
        i = path[0] % len(value) if path else 0
        return [*value[:i], _plant(value[i], logprobs, path[1:]), *value[i + 1 :]]
    return {"wrapped": value, "token_logprobs": logprobs}


@given(
    json_value,
    logprob_list,
    st.lists(st.integers(0, 10), max_size=4),
    st.one_of(st.integers(0, 300), st.sampled_from([990, 1024, 1100])),
)
def test_logprobs_anywhere_in_random_json_never_leak(
    value: Any, logprobs: list[float | None], path: list[int], depth: int
) -> None:
    planted = _plant(value, logprobs, path)
    raw = dumps(planted)
    check_decoded(raw)
    # The same inside `depth` arrays: beyond what pydantic parses, orjson writes (254) or reads (1024).
    check_decoded(b"[" * depth + raw + b"]" * depth)


@given(json_value, logprob_list, st.data())
def test_truncated_records_never_leak(value: Any, logprobs: list[float | None], data: st.DataObject) -> None:
    raw = dumps({"event_type": "LLM_RESPONSE", "token_logprobs": logprobs, "rest": value})
    cut = data.draw(st.integers(0, len(raw)))
    result = check_decoded(raw[:cut])
    if cut < len(raw):
        assert isinstance(result, DeadLetter)


# --- (c) mutated valid events -------------------------------------------------------------------------

COMMON: dict[str, Any] = {
    "event_id": "e-1",
    "timestamp": "2026-11-22T10:00:00Z",
    "tenant_id": "t1",
    "trace_id": "tr-1",
    "agent_name": "planner-1",
    "agent_type": "planner",
    "schema_version": 1,
}
VALID: dict[str, dict[str, Any]] = {
    "LLM_RESPONSE": {
        **COMMON,
        "event_type": "LLM_RESPONSE",
        "request_id": "r-1",
        "model": "m",
        "endpoint": "/v1/chat",
        "role": "sub_call",
        "sub_call_id": "sub-a",
        "subtask": "s",
        "query": "q",
        "response": "Done.",
        "token_logprobs": [-0.108642097531, None, -0.118642097531],
        "retrieval": [{"similarity": 0.9, "source": "kb"}],
        "code_validation": {"code_exists": True, "syntax_valid": True},
    },
    "TOOL_INVOCATION": {
        **COMMON,
        "event_type": "TOOL_INVOCATION",
        "tool": "discovery",
        "target": "src/a.py",
        "phase": "primary",
        "status": "ok",
        "result_count": 3,
        "factors_found": 2,
        "build_passed": True,
        "tests_passed": True,
        "complete": False,
    },
    "CLAIM": {
        **COMMON,
        "event_type": "CLAIM",
        "claim_id": "c-1",
        "statement": "s",
        "source_id": "sub-a",
        "provenance": [{"source_type": "agent", "confidence": 0.8, "source_id": "x"}],
        "tier": "task",
        "staleness_at": "2026-11-23T10:00:00+02:00",
        "relationships": [{"type": "supports", "target": "c-2", "strength": 0.5}],
        "derived_from": ["c-0"],
        "assessed_upper": 0.9,
        "instance_trust": 1.0,
    },
}
REQUIRED: dict[str, set[str]] = {
    "LLM_RESPONSE": set(COMMON) | {"event_type", "request_id", "model", "endpoint", "response"},
    "TOOL_INVOCATION": set(COMMON) | {"event_type", "tool", "target", "status"},
    "CLAIM": set(COMMON) | {"event_type", "claim_id", "statement", "tier"},
}
# The JSON types each field accepts (strict decoding: no coercion between them; a float field takes ints).
STR, NULL_STR = {"str"}, {"str", "null"}
ACCEPTS: dict[str, set[str]] = {
    **{field: STR for field in COMMON},
    "schema_version": {"int"},
    "event_type": STR,
    "request_id": STR,
    "model": STR,
    "endpoint": STR,
    "role": STR,
    "sub_call_id": NULL_STR,
    "subtask": NULL_STR,
    "query": NULL_STR,
    "response": STR,
    "token_logprobs": {"list", "null"},
    "retrieval": {"list", "null"},
    "code_validation": {"object", "null"},
    "tool": STR,
    "target": STR,
    "phase": STR,
    "status": STR,
    "result_count": {"int", "null"},
    "factors_found": {"int", "null"},
    "build_passed": {"bool", "null"},
    "tests_passed": {"bool", "null"},
    "complete": {"bool", "null"},
    "claim_id": STR,
    "statement": STR,
    "source_id": NULL_STR,
    "provenance": {"list"},
    "tier": STR,
    "staleness_at": NULL_STR,
    "relationships": {"list"},
    "derived_from": {"list"},
    "assessed_upper": {"int", "float", "null"},
    "instance_trust": {"int", "float"},
}
VALUES_OF_TYPE: dict[str, st.SearchStrategy[Any]] = {
    "null": st.none(),
    "bool": st.booleans(),
    "int": st.integers(-(2**40), 2**40),
    "float": st.one_of(st.just(float(f"-0.1{OTHER_MARKER}")), st.floats(allow_nan=True, allow_infinity=True)),
    "str": st.one_of(st.just(SECRET), st.just(f"-0.12{OTHER_MARKER}"), st.text(max_size=10)),
    "list": st.lists(json_scalar, max_size=3),
    "object": st.dictionaries(st.text(max_size=5), json_scalar, max_size=3),
}
LITERALS = {"role", "phase", "status", "tier"}
# Unit-interval numbers, as (path into the event) -> value: non-finite or outside [0, 1] is bad input.
UNIT_PATHS: dict[str, list[tuple[str | int, ...]]] = {
    "LLM_RESPONSE": [("retrieval", 0, "similarity")],
    "TOOL_INVOCATION": [],
    "CLAIM": [
        ("provenance", 0, "confidence"),
        ("relationships", 0, "strength"),
        ("assessed_upper",),
        ("instance_trust",),
    ],
}

event_type = st.sampled_from(sorted(VALID))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, float) and value.is_integer():
        return "int"  # JSON Schema's integers include 3.0, and the decoder reads it as 3
    return {int: "int", float: "float", str: "str", list: "list", dict: "object"}[type(value)]


def _valid(kind: str, logprobs: list[float | None]) -> dict[str, Any]:
    event = json.loads(json.dumps(VALID[kind]))  # a deep copy
    # On a tool or claim event, token_logprobs is an unknown field: dropped, and it must not leak either.
    event["token_logprobs"] = logprobs
    return event


@given(event_type, logprob_list)
def test_valid_events_decode(kind: str, logprobs: list[float | None]) -> None:
    result = check_decoded(dumps(_valid(kind, logprobs)))
    assert not isinstance(result, DeadLetter), result
    assert result.event_type == kind


@given(event_type, logprob_list, st.data())
def test_dropping_a_required_field_is_missing_field(
    kind: str, logprobs: list[float | None], data: st.DataObject
) -> None:
    event = _valid(kind, logprobs)
    field = data.draw(st.sampled_from(sorted(REQUIRED[kind])))
    del event[field]
    result = check_decoded(dumps(event))
    assert isinstance(result, DeadLetter)
    assert result.reason == "missing_field"
    assert field in result.message


@given(event_type, logprob_list, st.data())
def test_dropping_an_optional_field_is_still_valid(
    kind: str, logprobs: list[float | None], data: st.DataObject
) -> None:
    event = _valid(kind, logprobs)
    optional = sorted(set(event) - REQUIRED[kind])
    field = data.draw(st.sampled_from(optional))
    del event[field]
    assert not isinstance(check_decoded(dumps(event)), DeadLetter)


@given(event_type, logprob_list, st.data())
def test_a_value_of_another_json_type_is_dead_lettered(
    kind: str, logprobs: list[float | None], data: st.DataObject
) -> None:
    event = _valid(kind, logprobs)
    typed = set(event) if kind == "LLM_RESPONSE" else set(event) - {"token_logprobs"}
    field = data.draw(st.sampled_from(sorted(typed)))
    wrong = sorted(set(VALUES_OF_TYPE) - ACCEPTS[field])
    value = data.draw(st.sampled_from(wrong).flatmap(lambda t: VALUES_OF_TYPE[t]))
    assume(_json_type(value) not in ACCEPTS[field])  # 3.0 is a JSON integer
    event[field] = value
    result = check_decoded(dumps(event))
    assert isinstance(result, DeadLetter), (field, value)
    if field == "event_type":
        assert result.reason == "unknown_event_type"
    elif field == "schema_version":
        assert result.reason == "unsupported_schema_version"
    elif field in LITERALS:
        assert result.reason == "invalid_value", result
    else:
        assert result.reason in {"wrong_type", "not_an_object", "non_finite_number"}, result


@given(event_type, logprob_list, st.data())
def test_any_value_in_any_field_is_handled(
    kind: str, logprobs: list[float | None], data: st.DataObject
) -> None:
    event = _valid(kind, logprobs)
    field = data.draw(st.sampled_from(sorted(event)))
    event[field] = data.draw(json_value)
    check_decoded(dumps(event))


@given(
    st.sampled_from(sorted(kind for kind, paths in UNIT_PATHS.items() if paths)),
    logprob_list,
    st.data(),
    st.one_of(
        st.sampled_from([math.nan, math.inf, -math.inf]),
        st.floats(max_value=-1e-12),
        st.floats(min_value=1.000000001, allow_infinity=False),
    ),
)
def test_unit_numbers_out_of_range_or_non_finite(
    kind: str, logprobs: list[float | None], data: st.DataObject, bad: float
) -> None:
    event = _valid(kind, logprobs)
    path = data.draw(st.sampled_from(UNIT_PATHS[kind]))
    target: Any = event
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = bad
    result = check_decoded(dumps(event))
    assert isinstance(result, DeadLetter)
    expected = "non_finite_number" if not math.isfinite(bad) else "out_of_range"
    assert result.reason == expected, (path, bad, result)


# String fields whose content is checked: a bad value must be named by its field, never quoted.
CHECKED_STRINGS: dict[str, tuple[str, ...]] = {
    "LLM_RESPONSE": ("event_type", "timestamp", "role", "schema_version"),
    "TOOL_INVOCATION": ("event_type", "timestamp", "phase", "status", "schema_version"),
    "CLAIM": ("event_type", "timestamp", "tier", "staleness_at", "schema_version"),
}


@given(event_type, logprob_list, st.data(), st.sampled_from([SECRET, f"-0.12{OTHER_MARKER}"]))
def test_bad_strings_are_never_quoted(
    kind: str, logprobs: list[float | None], data: st.DataObject, bad: str
) -> None:
    event = _valid(kind, logprobs)
    event[data.draw(st.sampled_from(CHECKED_STRINGS[kind]))] = bad
    assert isinstance(check_decoded(dumps(event)), DeadLetter)


@given(
    event_type,
    logprob_list,
    st.one_of(
        st.integers(-(10**13), 10**13).map(str),
        st.floats(allow_nan=False, allow_infinity=False).map(repr),
        st.dates().map(lambda d: d.isoformat()),
        st.integers(),
        st.floats(),
    ),
)
def test_timestamps_are_rfc3339_strings(kind: str, logprobs: list[float | None], bad: Any) -> None:
    # pydantic alone reads numbers and numeric strings as Unix times ("0" is 1970-01-01T00:00:00Z).
    event = {**_valid(kind, logprobs), "timestamp": bad}
    result = check_decoded(dumps(event))
    assert isinstance(result, DeadLetter)
    assert result.reason == "wrong_type"


@given(
    event_type, logprob_list, st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=-5))]))
)
def test_rfc3339_timestamps_from_1900_to_8999_are_accepted(
    kind: str, logprobs: list[float | None], when: datetime
) -> None:
    event = {**_valid(kind, logprobs), "timestamp": when.isoformat()}
    result = check_decoded(dumps(event))
    if TIMESTAMP_YEARS[0] <= when.year <= TIMESTAMP_YEARS[1]:  # the year as written, in its own offset
        assert not isinstance(result, DeadLetter), result
        assert result.timestamp == when
        # the standard library's zone (the stages' date arithmetic stays in C), with the same offset
        assert type(result.timestamp.tzinfo) is timezone
        assert result.timestamp.utcoffset() == when.utcoffset()
    else:  # date arithmetic (TTLs, windows) on such times could overflow
        assert isinstance(result, DeadLetter)
        assert result.reason == "out_of_range"


@given(st.sampled_from(["1", True, 1.5, 2.0, 2, 0, -1, None, [1], {"v": 1}, "one"]), logprob_list)
def test_schema_version_other_than_the_integer_one(version: Any, logprobs: list[float | None]) -> None:
    event = {**_valid("LLM_RESPONSE", logprobs), "schema_version": version}
    result = check_decoded(dumps(event))
    assert isinstance(result, DeadLetter)
    assert result.reason == "unsupported_schema_version"


# --- strip_logprobs -----------------------------------------------------------------------------------


@given(
    json_value,
    logprob_list,
    st.lists(st.integers(0, 10), max_size=4),
    st.booleans(),
    st.integers(1, MAX_BYTES),
)
def test_strip_logprobs_never_keeps_the_digits(
    value: Any, logprobs: list[float | None], path: list[int], not_json: bool, cap: int
) -> None:
    raw = dumps(_plant(value, logprobs, path))
    if not_json:
        raw = raw + b"\x00 trailing garbage"
    stored = strip_logprobs(raw, cap)
    assert MARKER.encode() not in stored
    assert len(stored) <= cap
    if not_json or cap < len(raw):
        return
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        return
    # JSON stays JSON (compact, so no longer than it was), the logprobs replaced wherever they were.
    assert b'"token_logprobs":"<removed>"' in stored
    orjson.loads(stored)


# What producers put in token_logprobs when they get it wrong: nested lists, OpenAI-style top-logprob
# objects, strings with brackets, quotes and backslashes, the key itself again.
logprob_shape = st.recursive(
    logprob_entry | st.sampled_from(["]", "}", "[", '"', "\\", ",", ":", "token_logprobs"]),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(
            st.sampled_from(["token", "logprob", "top_logprobs", "token_logprobs"]), children, max_size=3
        ),
    ),
    max_leaves=12,
)


@given(json_value, logprob_shape, st.booleans(), st.booleans(), st.data())
def test_strip_logprobs_of_any_shape_in_any_record(
    value: Any, shape: Any, escaped_key: bool, non_finite: bool, data: st.DataObject
) -> None:
    raw = dumps({"event_type": "LLM_RESPONSE", "a": value, "token_logprobs": shape, "z": value})
    if escaped_key:  # the same key to a JSON reader
        raw = raw.replace(b'"token_logprobs"', b'"token\\u005flogprobs"')
    if non_finite:  # orjson refuses the record: the textual path
        raw = raw[:-1] + b', "n": NaN}'
    cut = data.draw(st.integers(0, len(raw)))
    for record in (raw, raw[:cut], raw + b" trailing", b"[" * 300 + raw + b"]" * 300):
        assert MARKER.encode() not in strip_logprobs(record, MAX_BYTES), record


@pytest.mark.parametrize(
    ("leap", "read_as"),
    [
        ("2016-12-31T23:59:60Z", "2016-12-31T23:59:59.999999+00:00"),
        ("2016-12-31T23:59:60.5Z", "2016-12-31T23:59:59.999999+00:00"),
        ("2016-12-31T18:59:60-05:00", "2016-12-31T18:59:59.999999-05:00"),
        ("2016-12-31t23:59:60z", "2016-12-31T23:59:59.999999+00:00"),
    ],
)
def test_a_leap_second_is_the_last_microsecond_of_its_minute(leap: str, read_as: str) -> None:
    """RFC 3339 allows second 60 (a leap second); Python's datetime cannot hold it, and such an event
    was dead-lettered as `wrong_type`. It is read as 59.999999 (docs/DECISIONS.md)."""
    for kind in ("LLM_RESPONSE", "TOOL_INVOCATION", "CLAIM"):
        result = check_decoded(dumps({**_valid(kind, [-0.1]), "timestamp": leap}))
        assert not isinstance(result, DeadLetter), result
        assert result.timestamp == datetime.fromisoformat(read_as)
    assert isinstance(
        check_decoded(dumps({**_valid("CLAIM", [-0.1]), "timestamp": "2016-12-31T23:59:61Z"})), DeadLetter
    )
