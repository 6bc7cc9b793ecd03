"""Through a real broker: a corpus of malformed records, interleaved with valid events, on one worker.

Every bad record reaches the DLQ once, with Kafka Connect's error headers, its reason code and an offset
that points back at it, its logprobs removed; no header quotes an input value; every valid event is
scored exactly as it is when sent alone (a second deployment receives only the valid events); and the
one worker process survives the whole corpus.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from streams.demo import encode
from streams.dlq import strip_logprobs
from streams.events import ID_MAX_CHARS
from streams.harness import RunningBroker
from streams.kafka_io import Consumed, collect, produce
from streams.stages.common import is_flagged
from tests.integration.fixtures import STRONG_COMPOSITE as STRONG
from tests.integration.fixtures import Deployment, EventFactory, assigned_partitions, deploy, poll

MAX_EVENT_BYTES = 4096
MAX_ARRAY_ITEMS = 16
LIMITS = {"MAX_EVENT_BYTES": str(MAX_EVENT_BYTES), "MAX_ARRAY_ITEMS": str(MAX_ARRAY_ITEMS)}

# Every logprob in a bad record reads -0.NN8642097531: these digits must never reach the DLQ.
MARKER = b"8642097531"
# Planted in bad non-logprob fields (they stay in the stored record): no header may quote them.
SECRET = "zq-s3cr3t-value"
OTHER_MARKER = "1357924689"

CONNECT_HEADERS = (
    "__connect.errors.topic",
    "__connect.errors.partition",
    "__connect.errors.offset",
    "__connect.errors.exception.class.name",
    "__connect.errors.exception.message",
    "__connect.errors.reason",
)


DROP = object()  # Corpus.event(field=DROP) leaves the field out


@dataclass(frozen=True)
class Bad:
    name: str
    raw: bytes | None
    reason: str


class Corpus:
    """Builds the bad records: each one distinct, each JSON one with its own marked logprobs."""

    def __init__(self, f: EventFactory) -> None:
        self.f = f
        self.n = 0
        self.cases: list[Bad] = []

    def logprobs(self, k: int = 2) -> list[float]:
        values = []
        for _ in range(k):
            self.n += 1
            values.append(float(f"-0.{self.n:02d}{MARKER.decode()}"))
        return values

    def event(self, kind: str = "response", **changes: Any) -> dict[str, Any]:
        """A valid event of `kind` (own trace) carrying marked logprobs, with `changes` applied."""
        trace = f"tr-bad-{len(self.cases)}"
        if kind == "response":
            base = self.f.response(trace)
        elif kind == "tool":
            base = self.f.tool(trace, "find", "Sym")
        else:
            base = self.f.claim(trace, f"c-bad-{len(self.cases)}")
        base["token_logprobs"] = self.logprobs()
        for key, value in changes.items():
            if value is DROP:
                base.pop(key)
            else:
                base[key] = value
        return base

    def add(self, name: str, reason: str, raw: bytes | dict[str, Any] | None) -> None:
        value = orjson.dumps(raw) if isinstance(raw, dict) else raw
        assert all(value != c.raw for c in self.cases if value is not None), name
        self.cases.append(Bad(name, value, reason))


def json_with_nan(event: dict[str, Any], **literals: str) -> bytes:
    """`event` as JSON with some fields written as raw literals (NaN, Infinity, nested arrays...)."""
    body = orjson.dumps({k: v for k, v in event.items() if k not in literals})
    extra = ",".join(f'"{k}":{v}' for k, v in literals.items())
    return body[:-1] + b"," + extra.encode() + b"}"


def build_corpus(f: EventFactory) -> list[Bad]:
    c = Corpus(f)
    lp = c.logprobs  # fresh marked values for records written by hand

    def lit(values: list[float]) -> str:
        return "[" + ",".join(repr(v) for v in values) + "]"

    # Not a record at all, or not JSON.
    c.add("tombstone (no value)", "invalid_json", None)
    c.add("empty value", "invalid_json", b"")
    c.add(
        "invalid UTF-8",
        "invalid_json",
        b'{"event_type":"LLM_RESPONSE","response":"\xff\xfe","token_logprobs":' + lit(lp()).encode() + b"}",
    )
    c.add(
        "truncated inside token_logprobs",
        "invalid_json",
        b'{"event_type": "LLM_RESPONSE", "token_logprobs": [' + ", ".join(map(repr, lp(3))).encode(),
    )
    c.add("trailing garbage", "invalid_json", orjson.dumps(c.event()) + b" trailing")
    c.add("UTF-8 BOM", "invalid_json", b"\xef\xbb\xbf" + orjson.dumps(c.event()))
    c.add("plain text", "invalid_json", b"LLM_RESPONSE token_logprobs=" + lit(lp()).encode())
    c.add(
        "lone surrogate escape",
        "invalid_json",
        orjson.dumps(c.event()).replace(b'"response":"Done."', b'"response":"\\ud800"'),
    )
    # JSON, but not an object.
    c.add("array", "not_an_object", b"[" + orjson.dumps(c.event()) + b"]")
    c.add("string", "not_an_object", b'"LLM_RESPONSE"')
    c.add("number", "not_an_object", b"42")
    c.add("null", "not_an_object", b"null")
    c.add("boolean", "not_an_object", b"true")
    # Each required field missing: the common ones, then each type's own.
    common = ("event_id", "event_type", "timestamp", "tenant_id", "trace_id", "agent_name", "agent_type")
    kinds = ("response", "tool", "claim")
    for i, field in enumerate((*common, "schema_version")):
        c.add(f"missing {field}", "missing_field", c.event(kinds[i % 3], **{field: DROP}))
    for field in ("request_id", "model", "endpoint", "response"):
        c.add(f"LLM_RESPONSE without {field}", "missing_field", c.event("response", **{field: DROP}))
    for field in ("tool", "target", "status"):
        c.add(f"TOOL_INVOCATION without {field}", "missing_field", c.event("tool", **{field: DROP}))
    for field in ("claim_id", "statement", "tier"):
        c.add(f"CLAIM without {field}", "missing_field", c.event("claim", **{field: DROP}))
    c.add("retrieval hit without similarity", "missing_field", c.event(retrieval=[{"source": "kb"}]))
    c.add(
        "provenance without confidence", "missing_field", c.event("claim", provenance=[{"source_type": "a"}])
    )
    c.add(
        "relationship without target",
        "missing_field",
        c.event("claim", relationships=[{"type": "supports", "strength": 0.5}]),
    )
    # Logprobs in fields a producer adds (top_logprobs, OpenAI's logprobs.content): they reached the DLQ.
    c.add(
        "top_logprobs and OpenAI logprobs, response missing",
        "missing_field",
        c.event(
            response=DROP,
            top_logprobs=[[{"token": "a", "logprob": v} for v in lp()]],
            logprobs={"content": [{"token": "a", "logprob": v, "top_logprobs": []} for v in lp()]},
        ),
    )
    c.add(
        "truncated inside top_logprobs",
        "invalid_json",
        b'{"event_type": "LLM_RESPONSE", "top_logprobs": [{"logprob": ' + repr(lp(1)[0]).encode() + b", NaN",
    )
    # "self" is the cause of a claim's own score: a claim of that name would blur it.
    c.add("claim named self", "invalid_value", c.event("claim", claim_id="self"))
    # Wrong JSON types (strict: no coercion).
    c.add("response is a number", "wrong_type", c.event(response=42))
    c.add("event_id is a number", "wrong_type", c.event("tool", event_id=7))
    c.add("token_logprobs is a string", "wrong_type", c.event(token_logprobs=repr(lp(1)[0])))
    c.add("token_logprobs of strings", "wrong_type", c.event(token_logprobs=[repr(v) for v in lp()]))
    c.add("result_count is a string", "wrong_type", c.event("tool", result_count="3"))
    c.add("build_passed is a number", "wrong_type", c.event("tool", tool="cmake", build_passed=1))
    c.add("provenance is an object", "wrong_type", c.event("claim", provenance={"source_type": "a"}))
    c.add("code_validation is an array", "not_an_object", c.event(code_validation=[True]))
    c.add("timestamp is a number", "wrong_type", c.event(timestamp=1_700_000_000))
    # pydantic alone would read these two as Unix times (1970-01-01T00:00:00Z - 0.1 s, 2023-11-14...).
    c.add("timestamp is a numeric string", "wrong_type", c.event(timestamp=f"-0.1{OTHER_MARKER}"))
    c.add("timestamp is epoch seconds", "wrong_type", c.event("claim", timestamp="1700000000"))
    c.add("timestamp is a date", "wrong_type", c.event("tool", timestamp="2026-11-22"))
    # Valid events, but keyed "bad", not by their trace_id: before the thirty-second round they were
    # scored on whichever partition the key chose, against a trace state without the trace's others.
    c.add("valid response keyed by another trace", "wrong_key", c.event())
    c.add("valid claim keyed by another trace", "wrong_key", c.event("claim"))
    # Read as +06:00 before the thirty-second round: an hour off what was written; the schema refuses it.
    c.add("offset minute 60", "wrong_type", c.event("tool", timestamp="2026-11-22T12:00:00+05:60"))
    c.add(
        "token_logprobs is NaN",
        "wrong_type",
        json_with_nan(c.event(), token_logprobs="NaN"),
    )
    c.add(
        "nested token_logprobs and a NaN",
        "wrong_type",
        json_with_nan(c.event(), token_logprobs=f"[{lit(lp())},NaN,{lit(lp())}]"),
    )
    # Unknown event types (the tag is never quoted back).
    c.add("unknown event_type", "unknown_event_type", c.event(event_type="MYSTERY"))
    c.add("lower-case event_type", "unknown_event_type", c.event(event_type="llm_response"))
    c.add("secret event_type", "unknown_event_type", c.event(event_type=SECRET))
    c.add("numeric event_type", "unknown_event_type", c.event(event_type=float(f"-0.2{OTHER_MARKER}")))
    c.add(
        "duplicate event_type, last unknown",
        "unknown_event_type",
        orjson.dumps(c.event())[:-1] + b',"event_type":"MYSTERY"}',
    )
    # Non-finite numbers outside token_logprobs.
    c.add("similarity NaN", "non_finite_number", json_with_nan(c.event(), retrieval='[{"similarity":NaN}]'))
    c.add(
        "provenance confidence Infinity",
        "non_finite_number",
        json_with_nan(c.event("claim"), provenance='[{"source_type":"a","confidence":Infinity}]'),
    )
    c.add(
        "relationship strength -Infinity",
        "non_finite_number",
        json_with_nan(
            c.event("claim"), relationships='[{"type":"supports","target":"c-1","strength":-Infinity}]'
        ),
    )
    c.add("assessed_upper NaN", "non_finite_number", json_with_nan(c.event("claim"), assessed_upper="NaN"))
    # In fields the models drop unread: pydantic's parser let these through and the events were scored.
    c.add("unknown field NaN", "non_finite_number", json_with_nan(c.event(), temperature="NaN"))
    c.add(
        "unknown field in a hit Infinity",
        "non_finite_number",
        json_with_nan(c.event(), retrieval='[{"similarity":0.9,"rank":Infinity}]'),
    )
    # Outside [0, 1], or negative counts.
    c.add("similarity 1.5", "out_of_range", c.event(retrieval=[{"similarity": 1.5}]))
    c.add("instance_trust -0.1", "out_of_range", c.event("claim", instance_trust=-0.1))
    c.add(
        "relationship strength 2",
        "out_of_range",
        c.event("claim", relationships=[{"type": "contradicts", "target": "c-1", "strength": 2.0}]),
    )
    c.add("negative result_count", "out_of_range", c.event("tool", result_count=-1))
    c.add("negative factors_found", "out_of_range", c.event("tool", tool="discovery", factors_found=-2))
    c.add("factors_found 5", "out_of_range", c.event("tool", tool="discovery", factors_found=5))
    # Right type, unacceptable value.
    c.add("timestamp without zone", "invalid_value", c.event(timestamp="2026-11-22T12:00:00"))
    c.add("staleness_at without zone", "invalid_value", c.event("claim", staleness_at="2026-11-23T12:00:00"))
    c.add("unknown tier", "invalid_value", c.event("claim", tier=SECRET))
    c.add("unknown role", "invalid_value", c.event(role="boss"))
    c.add("unknown status", "invalid_value", c.event("tool", status="maybe"))
    c.add("empty tenant_id", "invalid_value", c.event(tenant_id=""))
    # schema_version other than the integer 1.
    for version in (2, "1", True, 1.5, 2.0, None):
        c.add(f"schema_version {version!r}", "unsupported_schema_version", c.event(schema_version=version))
    # Limits (MAX_EVENT_BYTES, MAX_ARRAY_ITEMS) and shapes.
    c.add("huge string", "oversized_event", c.event(query="q" * MAX_EVENT_BYTES))
    c.add("oversized with logprobs", "oversized_event", c.event(token_logprobs=lp(MAX_EVENT_BYTES // 15)))
    c.add("logprob array too long", "oversized_array", c.event(token_logprobs=lp(MAX_ARRAY_ITEMS + 1)))
    c.add(
        "retrieval too long",
        "oversized_array",
        c.event(retrieval=[{"similarity": 0.5}] * (MAX_ARRAY_ITEMS + 1)),
    )
    c.add(
        "derived_from too long",
        "oversized_array",
        c.event("claim", derived_from=["c"] * (MAX_ARRAY_ITEMS + 1)),
    )
    # An id as a Kafka key and again in an output's value could pass the broker's record limit.
    c.add("trace_id too long", "oversized_field", c.event(trace_id="t" * (ID_MAX_CHARS + 1)))
    c.add("claim source_id too long", "oversized_field", c.event("claim", source_id="s" * (ID_MAX_CHARS + 1)))
    c.add(
        "provenance source_id too long",
        "oversized_field",
        c.event(
            "claim",
            provenance=[{"source_type": "doc", "confidence": 0.5, "source_id": "s" * (ID_MAX_CHARS + 1)}],
        ),
    )
    c.add(
        "derived_from id too long",
        "oversized_field",
        c.event("claim", derived_from=["c" * (ID_MAX_CHARS + 1)]),
    )
    # Deeper than the decoder parses: 300 levels is also deeper than orjson writes, 1500 than it reads.
    c.add("nested 300 deep", "invalid_json", json_with_nan(c.event(), deep="[" * 300 + "]" * 300))
    c.add("nested 1500 deep", "invalid_json", b"[" * 1500 + orjson.dumps(c.event()) + b"]" * 1500)
    c.add(
        "objects nested 250 deep",
        "invalid_json",
        json_with_nan(c.event(), deep='{"a":' * 250 + "1" + "}" * 250),
    )
    return c.cases


def build_valid(f: EventFactory) -> list[bytes | dict[str, Any]]:
    """Valid events, several of them on the edge of a rule: each must be scored as if alone."""
    at_limit = f.response("tr-v-limit", minutes=9, token_logprobs=[-0.01] * MAX_ARRAY_ITEMS, **STRONG)
    padded = f.response("tr-v-size", minutes=10, token_logprobs=[-0.2, None], query="")
    padded["query"] = "p" * (MAX_EVENT_BYTES - len(orjson.dumps(padded)))
    assert len(orjson.dumps(padded)) == MAX_EVENT_BYTES
    escaped = f.response("tr-v-esc", minutes=11, token_logprobs=[-0.3], unknown_extra={"x": [1, 2]})
    escaped["timestamp"] = "2026-11-22T14:11:00+02:00"
    leap = f.tool("tr-v-leap", "find", "Leap", minutes=13, result_count=1)
    leap["timestamp"] = "2026-11-22T12:13:60Z"  # RFC 3339's leap second: read as 12:13:59.999999
    return [
        f.response("tr-v-1", minutes=1, token_logprobs=[-0.1, -0.2, -0.3], **STRONG),
        f.tool("tr-v-2", "find", "Widget", minutes=2, result_count=3),
        f.response("tr-v-3", minutes=3, token_logprobs=[-1.5, None, float("nan"), float("-inf")]),
        f.tool("tr-v-2", "read", "src/Widget.cpp", minutes=4),
        f.claim("tr-v-4", "c-1", minutes=5),
        f.claim(
            "tr-v-4",
            "c-2",
            minutes=6,
            relationships=[{"type": "supports", "target": "c-1", "strength": 0.7}],
        ),
        # A claim contradicting itself: self-relationships are ignored (DESIGN 4b), so it is valid.
        f.claim(
            "tr-v-5",
            "c-self",
            minutes=7,
            relationships=[{"type": "contradicts", "target": "c-self", "strength": 0.9}],
        ),
        f.response("tr-v-6", minutes=8, role="sub_call", sub_call_id="sub-a", token_logprobs=[-0.05]),
        f.response("tr-v-6", minutes=8, role="sub_call", sub_call_id="sub-b", token_logprobs=[-0.9]),
        f.tool("tr-v-7", "discovery", "Widget", minutes=8, factors_found=4, result_count=0),
        at_limit,
        padded,
        orjson.dumps(escaped).replace(b'"event_type"', b'"event\\u005ftype"'),
        f.response("tr-v-6", minutes=12, role="synthesis", **STRONG),
        leap,
        # JSON Schema's integers include 3.0 and 1.0 (Python's json writes floats so): the integers 3 and 1.
        f.tool("tr-v-8", "find", "Widget", minutes=14, result_count=3.0, schema_version=1.0),
        # Ids may hold U+001F, which output ids join their parts with: these two CLAIM_SCOREDs shared
        # one event id before the thirty-second round (counted once below).
        f.claim("tr-v-9", "c-sep", minutes=15, event_id=f"{f.run}-x", tenant_id="t\x1fu"),
        f.claim("tr-v-9", "c-sep", minutes=15, event_id=f"{f.run}-x\x1ft", tenant_id="u"),
    ]


# Outputs the valid events above must produce (each RESPONSE_SCORED once, c-2 re-scores c-1, ...).
EXPECTED = {"RESPONSE_SCORED": 8, "TRACE_SCORED": 5, "CLAIM_SCORED": 6, "SYNTHESIS_SCORED": 1}


def _encode(event: bytes | dict[str, Any]) -> tuple[bytes, bytes]:
    if isinstance(event, bytes):
        return b"tr-v-esc", event
    return str(event["trace_id"]).encode(), encode(event)


def _event_id(event: bytes | dict[str, Any]) -> str:
    return str((orjson.loads(event) if isinstance(event, bytes) else event)["event_id"])


def _send(d: Deployment, records: list[tuple[bytes, bytes | None]]) -> None:
    # A None value is a tombstone; aiokafka sends it as such.
    asyncio.run(produce(d.kafka.bootstrap_servers, d.settings.input_topic_names[0], records))  # type: ignore[arg-type]


def _until(condition: Callable[[list[Consumed]], bool], seconds: float) -> Callable[[list[Consumed]], bool]:
    """Stop collecting when `condition` holds or after `seconds`, so the assertions can say what is missing."""
    deadline = time.monotonic() + seconds

    def done(records: list[Consumed]) -> bool:
        return condition(records) or time.monotonic() > deadline

    return done


def _scored(d: Deployment, records: list[Consumed]) -> dict[str, dict[str, Any]]:
    """Scored outputs by their deterministic event id, without the processing time."""
    outputs = {}
    for out in d.outputs(records):
        out.pop("scored_at")
        assert outputs.setdefault(out["event_id"], out) == out
    return outputs


def _flagged(d: Deployment, records: list[Consumed]) -> set[str]:
    return {o["event_id"] for o in d.outputs(records, d.settings.flagged_topic)}


def _complete(d: Deployment, valid_ids: set[str], dead: int) -> Callable[[list[Consumed]], bool]:
    def condition(records: list[Consumed]) -> bool:
        kinds: dict[str, set[str]] = {}
        dlq = 0
        for r in records:
            if r.topic == d.settings.dlq_topic:
                dlq += 1
            elif r.topic == d.settings.scored_topic:
                out = orjson.loads(r.value)
                if out["source_event_id"] in valid_ids:
                    kinds.setdefault(out["event_type"], set()).add(out["event_id"])
        return dlq >= dead and all(len(kinds.get(k, ())) >= n for k, n in EXPECTED.items())

    return condition


def test_bad_input_corpus(kafka: RunningBroker) -> None:
    mixed = deploy(kafka, partitions=1, **LIMITS)
    alone = deploy(kafka, partitions=1, **LIMITS)
    worker = mixed.start_worker()
    alone.start_worker()
    try:
        assert worker.process is not None
        pid = worker.process.pid
        f = EventFactory()
        corpus = build_corpus(f)
        valid = build_valid(f)
        assert len(corpus) >= 40 and len({c.name for c in corpus}) == len(corpus)

        # Interleaved: a few bad records, a valid event, ... (one partition: offsets follow this order).
        sequence: list[Bad | bytes | dict[str, Any]] = []
        step = -(-len(corpus) // len(valid))
        for i, event in enumerate(valid):
            sequence += [*corpus[i * step : (i + 1) * step], event]
        assert sum(isinstance(item, Bad) for item in sequence) == len(corpus)
        sent: list[tuple[bytes, bytes | None]] = [
            (b"bad", item.raw) if isinstance(item, Bad) else _encode(item) for item in sequence
        ]
        # The collect budgets below are for processing: start them once both workers are ready (two
        # worker starts on a loaded host are not part of them; the suite allows 90 s for those).
        ready = poll(lambda: [assigned_partitions(d.web_ports[0]) for d in (mixed, alone)], all, 90, 0.2)
        assert all(ready), f"the workers never became ready: {ready}"
        _send(mixed, sent)
        _send(alone, [_encode(v) for v in valid])

        valid_ids = {_event_id(v) for v in valid}
        records = mixed.collect(_until(_complete(mixed, valid_ids, len(corpus)), 50), timeout=60)
        reference = alone.collect(_until(_complete(alone, valid_ids, 0), 20), timeout=30)
        inputs = asyncio.run(
            collect(
                kafka.bootstrap_servers,
                mixed.settings.input_topic_names,
                lambda rs: len(rs) >= len(sent),
                timeout=30,
            )
        )

        # The worker that took the whole corpus is the one that started, still running.
        assert worker.alive() and worker.process.pid == pid and len(mixed.workers) == 1
    finally:
        mixed.stop()
        alone.stop()

    s = mixed.settings
    # The input topic holds what we sent, in order, so an offset names one record of the sequence.
    assert [(r.partition, r.offset) for r in inputs] == [(0, i) for i in range(len(sent))]
    assert [r.value for r in inputs] == [value or b"" for _, value in sent]
    bad_at = {i: item for i, item in enumerate(sequence) if isinstance(item, Bad)}

    dead = [r for r in records if r.topic == s.dlq_topic]
    got: dict[int, Consumed] = {}
    for r in dead:
        headers = dict(r.headers)
        assert set(CONNECT_HEADERS) <= set(headers), r.headers
        assert headers["__connect.errors.topic"].decode() == s.input_topic_names[0]
        assert headers["__connect.errors.partition"] == b"0"
        offset = int(headers["__connect.errors.offset"])
        assert offset not in got, f"dead-lettered twice: {bad_at.get(offset)}"
        got[offset] = r
    missing = sorted(bad_at[i].name for i in set(bad_at) - set(got))
    assert not missing, f"not dead-lettered: {missing}"
    assert set(got) == set(bad_at), "a valid event was dead-lettered"

    wrong = {}
    for offset, r in got.items():
        case, headers = bad_at[offset], dict(r.headers)
        if headers["__connect.errors.reason"].decode() != case.reason:
            wrong[case.name] = (headers["__connect.errors.reason"].decode(), case.reason)
        assert headers["__connect.errors.exception.class.name"], case.name
        assert headers["__connect.errors.exception.message"], case.name
        # The stored value is the record as sent, its logprobs removed and capped at MAX_EVENT_BYTES.
        assert r.value == strip_logprobs(case.raw or b"", MAX_EVENT_BYTES), case.name
        assert r.key == b"bad"  # the bad record's own key, as Kafka Connect's DLQ keeps it
    assert not wrong, f"wrong reasons (got, expected): {wrong}"

    # No logprob from a bad record in any DLQ value or header (or anywhere else); no header quotes input.
    for r in records:
        for part in (r.value, *(v for _, v in r.headers)):
            assert MARKER not in part, (r.topic, part[:200])
        for _, v in r.headers:
            assert SECRET.encode() not in v and OTHER_MARKER.encode() not in v, v
    assert MARKER not in mixed.log_text().encode()

    # Every valid event is scored exactly as when it is sent alone, and nothing else is scored.
    ours, theirs = _scored(mixed, records), _scored(alone, reference)
    assert {o["source_event_id"] for o in ours.values()} == valid_ids
    assert ours.keys() == theirs.keys()
    for event_id, out in ours.items():
        assert out == theirs[event_id], out["event_type"]
    counts = {k: sum(o["event_type"] == k for o in ours.values()) for k in EXPECTED}
    assert counts == EXPECTED
    # Flagged copies travel on their own topic: wait (bounded) until each side has a copy of every
    # scored output DESIGN section 3 flags (the mix has some: the comparison is never of two empty sets).
    wanted = {event_id for event_id, out in ours.items() if is_flagged(out)}
    assert wanted, "the valid events should include flagged outputs"
    flagged = _flagged(mixed, mixed.collect(_until(lambda rs: _flagged(mixed, rs) >= wanted, 15), 20))
    flagged_alone = _flagged(alone, alone.collect(_until(lambda rs: _flagged(alone, rs) >= wanted, 15), 20))
    assert flagged == flagged_alone == wanted

    # result_count 3.0 counts three results, as tr-v-2's result_count 3 does.
    trace_of = {o["trace_id"]: o for o in ours.values() if o["event_type"] == "TRACE_SCORED"}
    assert trace_of["tr-v-8"]["categories"] == {"search": 0.65}
    # The self-contradiction is ignored: no penalty on c-self.
    self_claim = next(o for o in ours.values() if o.get("claim_id") == "c-self")
    assert self_claim["interval"]["factors"]["contradiction_penalty"] == 1.0
