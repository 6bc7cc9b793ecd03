"""Decoder and dead-letter unit tests: every bad-input kind of DESIGN section 6, and no logprob leaks."""

from __future__ import annotations

import orjson
import pytest

from streams.decode import decode
from streams.dlq import DeadLetter, connect_headers, strip_logprobs
from streams.events import ID_MAX_CHARS, ClaimEvent, LlmResponse, ToolInvocation

BASE = {
    "event_id": "e1",
    "event_type": "LLM_RESPONSE",
    "timestamp": "2026-11-22T10:00:00Z",
    "tenant_id": "t",
    "trace_id": "tr",
    "agent_name": "a",
    "agent_type": "planner",
    "schema_version": 1,
    "request_id": "r",
    "model": "m",
    "endpoint": "/e",
    "response": "ok",
}


CLAIM = {**BASE, "event_type": "CLAIM", "claim_id": "c", "statement": "s", "tier": "task"}


def _decode(raw: bytes, max_bytes: int = 10_000, max_items: int = 100) -> object:
    return decode(raw, max_bytes, max_items)


def test_valid_events_of_each_type() -> None:
    assert isinstance(_decode(orjson.dumps(BASE)), LlmResponse)
    tool = {**BASE, "event_type": "TOOL_INVOCATION", "tool": "find", "target": "x", "status": "ok"}
    assert isinstance(_decode(orjson.dumps(tool)), ToolInvocation)
    claim = {**BASE, "event_type": "CLAIM", "claim_id": "c", "statement": "s", "tier": "task"}
    assert isinstance(_decode(orjson.dumps(claim)), ClaimEvent)


def test_non_finite_literals_accepted_only_inside_token_logprobs() -> None:
    raw = orjson.dumps(BASE)[:-1] + b',"token_logprobs":[NaN,-Infinity,Infinity,null,-0.5]}'
    event = _decode(raw)
    assert isinstance(event, LlmResponse)
    assert event.token_logprobs is not None and len(event.token_logprobs) == 5
    bad = orjson.dumps(BASE)[:-1] + b',"retrieval":[{"similarity":NaN}]}'
    letter = _decode(bad)
    assert isinstance(letter, DeadLetter) and letter.reason == "non_finite_number"


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        (b'"temperature":NaN', "temperature"),
        (b'"retrieval":[{"similarity":0.9,"rank":Infinity}]', "retrieval.0.rank"),
        (b'"meta":{"scores":[0.5,-Infinity]}', "meta.scores.1"),
    ],
)
def test_a_non_finite_literal_in_an_unknown_field_is_bad_input(extra: bytes, where: str) -> None:
    """DESIGN 4b: NaN / Infinity only as token_logprobs entries. In a field the models drop unread,
    pydantic's parser accepted them and the event was scored."""
    letter = _decode(orjson.dumps(BASE)[:-1] + b"," + extra + b"}")
    assert isinstance(letter, DeadLetter) and letter.reason == "non_finite_number", letter
    assert letter.message.startswith(f"{where}: ")


def test_the_words_nan_and_infinity_in_text_are_no_literals() -> None:
    text = {**BASE, "response": 'NaN and Infinity, "quoted": NaN', "NaN": "Infinity"}
    raw = orjson.dumps(text)[:-1] + b',"token_logprobs":[NaN,-Infinity]}'
    assert isinstance(_decode(raw), LlmResponse)


def test_a_claim_named_self_is_refused() -> None:
    """`cause: "self"` marks a claim's own CLAIM_SCORED: a claim named "self" made the re-scores it
    caused read as their claims' own inputs (review). Other fields may say "self"."""
    claim = {**BASE, "event_type": "CLAIM", "claim_id": "self", "statement": "s", "tier": "task"}
    letter = _decode(orjson.dumps(claim))
    assert isinstance(letter, DeadLetter) and letter.reason == "invalid_value", letter
    assert letter.message == "CLAIM.claim_id: claim_id 'self' is reserved for `cause`"
    assert isinstance(
        _decode(orjson.dumps({**claim, "claim_id": "Self", "derived_from": ["self"]})), ClaimEvent
    )


def test_unknown_extra_fields_are_dropped() -> None:
    event = _decode(orjson.dumps({**BASE, "secret_extra": "x"}))
    assert isinstance(event, LlmResponse)
    assert "secret_extra" not in event.model_dump()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "invalid_json"),
        (b"[1, 2]", "not_an_object"),
        (orjson.dumps({**BASE, "event_type": "NOPE"}), "unknown_event_type"),
        (orjson.dumps({k: v for k, v in BASE.items() if k != "event_type"}), "missing_field"),
        (orjson.dumps({k: v for k, v in BASE.items() if k != "tenant_id"}), "missing_field"),
        (orjson.dumps({**BASE, "schema_version": 2}), "unsupported_schema_version"),
        (orjson.dumps({**BASE, "schema_version": True}), "unsupported_schema_version"),
        (orjson.dumps({**BASE, "schema_version": "1"}), "unsupported_schema_version"),
        (
            orjson.dumps(
                {
                    **BASE,
                    "event_type": "TOOL_INVOCATION",
                    "tool": "find",
                    "target": "x",
                    "status": "ok",
                    "result_count": "3",
                }
            ),
            "wrong_type",
        ),
        (orjson.dumps({**BASE, "code_validation": {"code_exists": "yes"}}), "wrong_type"),
        (orjson.dumps({**BASE, "response": 5}), "wrong_type"),
        (orjson.dumps({**BASE, "timestamp": "2026-11-22T10:00:00"}), "invalid_value"),
        (orjson.dumps({**BASE, "retrieval": [{"similarity": 1.2}]}), "out_of_range"),
        (orjson.dumps({**BASE, "retrieval": [{"source": "no similarity"}]}), "missing_field"),
        (
            orjson.dumps(
                {**BASE, "event_type": "CLAIM", "claim_id": "c", "statement": "s", "tier": "forever"}
            ),
            "invalid_value",
        ),
        (orjson.dumps({**BASE, "token_logprobs": [-0.1] * 101}), "oversized_array"),
        (orjson.dumps({**BASE, "trace_id": "t" * (ID_MAX_CHARS + 1)}), "oversized_field"),
        (orjson.dumps({**BASE, "sub_call_id": "s" * (ID_MAX_CHARS + 1)}), "oversized_field"),
        (orjson.dumps({**CLAIM, "source_id": "s" * (ID_MAX_CHARS + 1)}), "oversized_field"),
        (
            orjson.dumps(
                {**CLAIM, "provenance": [{"source_type": "doc", "confidence": 0.5, "source_id": "s" * 1025}]}
            ),
            "oversized_field",
        ),
        (orjson.dumps({**BASE, "timestamp": "9999-12-31T23:00:00Z"}), "out_of_range"),
        (orjson.dumps({**BASE, "timestamp": "0001-01-01T00:00:00Z"}), "out_of_range"),
        (orjson.dumps({**BASE, "response": "x" * 20_000}), "oversized_event"),
    ],
)
def test_bad_input_reasons(raw: bytes, reason: str) -> None:
    letter = _decode(raw)
    assert isinstance(letter, DeadLetter)
    assert letter.reason == reason
    assert letter.message


def test_error_message_never_contains_input_values() -> None:
    raw = orjson.dumps({**BASE, "token_logprobs": "-0.0123456789 as a string"})
    letter = _decode(raw)
    assert isinstance(letter, DeadLetter)
    assert "0123456789" not in letter.message


@pytest.mark.parametrize(
    "raw",
    [
        orjson.dumps(
            {**BASE, "token_logprobs": [-0.0123456789], "nested": {"token_logprobs": [-0.0123456789]}}
        ),
        b'{"token_logprobs": [-0.0123456789, NaN], "x": 1}',
        b'{"event_type": "LLM_RESPONSE", "token_logprobs": [-0.0123456789, -0.2',
        b'{"token_logprobs": [-0.0123456789]',
        # Every letter of the key escaped, and -Infinity (orjson refuses it): the textual path (review).
        b'{"event_type":"LLM_RESPONSE","'
        + "".join(f"\\u{ord(c):04x}" for c in "token_logprobs").encode()
        + b'":[-0.0123456789,-Infinity]}',
        # Logprobs under other names a producer adds (found by review): top_logprobs, OpenAI's shape.
        orjson.dumps({**BASE, "top_logprobs": [{"t": "a", "logprob": -0.0123456789}]}),
        orjson.dumps({**BASE, "logprobs": {"content": [{"token": "a", "LogProb": -0.0123456789}]}}),
        b'{"event_type":"LLM_RESPONSE","top_logprobs":[{"logprob":-0.0123456789},NaN],"x":1}',
        b'{"event_type":"LLM_RESPONSE","top_logprobs":[{"logprob":-0.0123456789',
        b'{"event_type":"LLM_RESPONSE","x":"the logprobs: -0.0123456789',  # a mention cuts the rest
    ],
)
def test_strip_logprobs_removes_every_value(raw: bytes) -> None:
    stored = strip_logprobs(raw, 10_000)
    assert b"0123456789" not in stored


def test_strip_keeps_other_fields_and_caps_size() -> None:
    stored = orjson.loads(strip_logprobs(orjson.dumps({**BASE, "token_logprobs": [-0.5]}), 10_000))
    assert stored["token_logprobs"] == "<removed>"
    assert stored["request_id"] == "r"
    # The text path keeps a removed key's name and the rest of the record.
    text = strip_logprobs(b'{"top_logprobs" : [-0.5, NaN], "request_id": "r"', 10_000)
    assert text == b'{"top_logprobs" : "<removed>", "request_id": "r"'

    assert len(strip_logprobs(b"x" * 500, 100)) == 100


@pytest.mark.parametrize("max_bytes", range(40, 60))
def test_a_cut_record_is_still_utf8(max_bytes: int) -> None:
    """Capping the stored record in bytes could split a character: the DLQ value was not UTF-8."""
    raw = orjson.dumps({"content": "é€😀" * 20, **BASE})  # 2-, 3- and 4-byte characters from byte 12
    stored = strip_logprobs(raw, max_bytes)
    assert max_bytes - 3 <= len(stored) <= max_bytes
    assert raw.startswith(stored)
    stored.decode("utf-8")  # raises on a split character


def test_connect_headers() -> None:
    letter = DeadLetter(b"raw", "invalid_json", "ValidationError", "bad")
    headers = dict(connect_headers(letter, "agent-events", 3, 42))
    assert headers == {
        "__connect.errors.topic": b"agent-events",
        "__connect.errors.partition": b"3",
        "__connect.errors.offset": b"42",
        "__connect.errors.exception.class.name": b"ValidationError",
        "__connect.errors.exception.message": b"bad",
        "__connect.errors.reason": b"invalid_json",
    }


# --- From a mutation review of the twenty-eighth round: decode and DLQ -------------------------------


def test_a_non_finite_literal_in_top_logprobs_is_bad_input() -> None:
    """Only token_logprobs' entries may be NaN / Infinity (DESIGN 4b), not another logprobs field's."""
    letter = _decode(orjson.dumps(BASE)[:-1] + b',"top_logprobs":[-0.5,NaN]}')
    assert isinstance(letter, DeadLetter) and letter.reason == "non_finite_number", letter
    assert letter.message.startswith("top_logprobs.1: ")


def test_the_path_of_a_non_finite_literal_is_capped() -> None:
    key = "k" * 300
    letter = _decode(orjson.dumps(BASE)[:-1] + b',"' + key.encode() + b'":NaN}')
    assert isinstance(letter, DeadLetter) and letter.reason == "non_finite_number", letter
    assert letter.message.split(": ", 1)[0] == key[:120]


@pytest.mark.parametrize(
    "raw",
    [
        # Key names in any case: on the JSON path ...
        orjson.dumps({**BASE, "TopLogProbs": [-0.0123456789]}),
        # ... and on the textual path (NaN: orjson refuses it), plain and with every letter escaped.
        b'{"event_type":"LLM_RESPONSE","TopLogProbs":[-0.0123456789,NaN],"x":1}',
        b'{"event_type":"LLM_RESPONSE","'
        + "".join(f"\\u{ord(c):04x}" for c in "top_logprobs").encode()
        + b'":[-0.0123456789,NaN],"x":1}',
    ],
)
def test_strip_logprobs_removes_every_value_under_any_logprobs_name(raw: bytes) -> None:
    stored = strip_logprobs(raw, 10_000)
    assert b"0123456789" not in stored
    assert b"<removed>" in stored
