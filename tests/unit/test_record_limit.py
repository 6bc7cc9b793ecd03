"""With the default settings, nothing the worker sends is larger than Apache Kafka accepts by default.

A broker refuses a record batch over `message.max.bytes` (1,048,588 bytes by default, the batch
header of 61 bytes included); the worker would stop on that batch after every restart. The embedded
test broker takes far larger records, so this is checked on the records themselves: the largest
inputs the broker accepts, valid and not, are pushed through all four stages and every record the
stages return (outputs, internal messages, dead letters) and every table value they write (a
changelog record each) is measured.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from streams import metrics
from streams.config import load_settings, scoring_configs
from streams.decode import decode
from streams.dlq import DeadLetter
from streams.events import ID_MAX_CHARS
from streams.stages import AgentStage, CalibrationStage, ClaimStage, InputRecord, Record, TraceStage
from streams.stages.common import Outputs, _cached_key_partition, bundle, key_partition, unbundle
from streams.state import HistoryHour, TraceState, table_key
from tests.unit import stage_records
from tests.unit.stage_records import keyed

KAFKA_DEFAULT_LIMIT = 1_048_588 - 61 - 64  # the batch header, and a record's own framing (generous)
SETTINGS = load_settings()
EXAMPLE = orjson.loads((Path(__file__).parents[2] / "schemas/examples/LLM_RESPONSE.json").read_bytes())
BASE = {
    "timestamp": "2026-11-22T10:00:00Z",
    "tenant_id": "t",
    "trace_id": "big",
    "agent_name": "a",
    "agent_type": "planner",
    "schema_version": 1,
}


# The longest ids accepted, in characters of 4 UTF-8 bytes: keys, labels and outputs repeat them.
LONGEST_IDS = {
    name: letter * ID_MAX_CHARS
    for name, letter in (("tenant_id", "𝔱"), ("trace_id", "𝔯"), ("agent_name", "𝔞"), ("agent_type", "𝔭"))
}


def _padded(event: dict[str, Any], field: str, size: int) -> bytes:
    """`event` with `field` grown (from its own text) so that the encoded event is exactly `size` bytes."""
    text = str(event.get(field) or "x") + " "
    event = {**event, field: ""}
    room = size - len(orjson.dumps(event))
    event[field] = (text * (room // len(text) + 1))[:room]
    raw = orjson.dumps(event)
    assert len(raw) == size
    return raw


def _claim(claim_id: str, base: dict[str, Any]) -> dict[str, Any]:
    provenance = [{"source_type": "agent", "confidence": 0.8}]
    return {
        **base,
        "event_id": claim_id,
        "event_type": "CLAIM",
        "claim_id": claim_id,
        "statement": "s",
        "tier": "task",
        "provenance": provenance,
    }


def _inputs(base: dict[str, Any]) -> list[bytes]:
    largest = SETTINGS.max_event_bytes
    # A trace keeps its first SYNTHESIS_MAX_CLAIMS claims; a later one, however large, reaches stage 3
    # without growing the trace state, so the claim graph stores it.
    other_claims = [
        orjson.dumps({**_claim(f"c{i}", base), "trace_id": "many"})
        for i in range(SETTINGS.synthesis_max_claims)
    ]
    late_claim = _padded({**_claim("late", base), "trace_id": "many"}, "statement", largest)
    response = {**base, "event_type": "LLM_RESPONSE", "request_id": "r", "model": "m", "endpoint": "/v1"}
    # A well supported answer (allowed, not blocked): its RESPONSE_SCORED carries the whole text.
    supported = {**EXAMPLE, **base, "event_id": "plain", "token_logprobs": None}
    # Judging the response, the trace and the claim: their scores and outcomes go through calibration.
    verdict = {"event_type": "OUTCOME", "correct": True, "source": "human"}
    outcomes = [
        {**verdict, "event_id": "o-response", "subject_event_id": "plain"},
        {**verdict, "event_id": "o-trace"},
        {**verdict, "event_id": "o-claim", "claim_id": "claim"},
    ]
    return [
        _padded(supported, "response", largest),
        _padded({**response, "event_id": "sub", "role": "sub_call", "sub_call_id": "s"}, "response", largest),
        _padded(
            {**base, "event_id": "tool", "event_type": "TOOL_INVOCATION", "tool": "read"}, "target", largest
        ),
        _padded(_claim("claim", base), "statement", largest),
        *other_claims,
        late_claim,
        b"{" + b"x" * (largest - 1),  # not JSON, at the limit: dead-lettered whole
        _padded({**response, "event_id": "over"}, "response", KAFKA_DEFAULT_LIMIT),  # over the limit
        *(orjson.dumps({**base, **outcome}) for outcome in outcomes),
    ]


def _encoded(write: Any) -> bytes:
    """A stage's table write as its changelog record's value (b"" for a delete)."""
    value = getattr(write, "node", None) or getattr(write, "value", write)
    return b"" if value is None else value.model_dump_json().encode()


def _all_records(inputs: list[bytes]) -> list[Record]:
    """Every record the four stages send for `inputs`, internal hops followed to the end, and every
    table value they write (as a record of the table's changelog)."""
    configs, registry = scoring_configs(SETTINGS), metrics.create(CollectorRegistry())
    stages: dict[str, Callable[[list[InputRecord]], tuple[list[Record], Any]]] = {
        SETTINGS.responses_topic: lambda r: AgentStage(SETTINGS, configs, registry).process(
            r, lambda _: None, lambda _: None
        ),
        SETTINGS.claims_topic: lambda r: ClaimStage(SETTINGS, configs, registry).process(r, lambda _: None),
        SETTINGS.calibration_topic: lambda r: CalibrationStage(SETTINGS, configs, registry).process(
            r, lambda _table, _key: None
        ),
    }
    batch = [keyed(InputRecord("agent-events", 0, i, 1.0, value)) for i, value in enumerate(inputs)]
    sent, traces = TraceStage(SETTINGS, configs, registry).process(batch, lambda _: None)
    everything = [*sent, *(Record("traces-changelog", k, _encoded(v)) for k, v in traces.items())]
    while sent:
        waiting: dict[str, list[InputRecord]] = defaultdict(list)
        for record in sent:
            if record.topic in stages:
                waiting[record.topic].append(InputRecord(record.topic, 0, 0, 1.0, record.value))
        sent = []
        for topic, records in waiting.items():
            unbundled = [one for record in records for one in unbundle(record)]
            out, writes = stages[topic](unbundled)
            sent += out
            everything += [Record(f"{topic}-changelog", k, _encoded(v)) for k, v in writes.items()]
        everything += sent
    return everything


def _size(record: Record) -> int:
    headers = sum(len(name) + len(value or b"") for name, value in record.headers or [])
    return len(record.key or b"") + len(record.value) + headers


@pytest.mark.parametrize("base", [BASE, {**BASE, **LONGEST_IDS}], ids=["short ids", "longest ids"])
def test_the_largest_inputs_make_no_record_over_kafkas_default_limit(base: dict[str, Any]) -> None:
    records = _all_records(_inputs(base))
    scored = [orjson.loads(r.value) for r in records if r.topic == SETTINGS.scored_topic]
    plain = next(o for o in scored if o["source_event_id"] == "plain")
    assert len(plain["response"]) > 0.95 * SETTINGS.max_event_bytes  # the text did travel to the output
    assert any(o["event_type"] == "CLAIM_SCORED" and o["claim_id"] == "late" for o in scored)
    largest = max(records, key=_size)
    assert _size(largest) <= KAFKA_DEFAULT_LIMIT, f"{_size(largest)} bytes to {largest.topic}"
    assert _size(largest) > 0.9 * SETTINGS.max_event_bytes  # the inputs did make large records


@pytest.mark.parametrize(
    ("responses", "id_length"),
    [(7_200, 36), (1_000, ID_MAX_CHARS)],  # 2 a second with UUIDs; fewer with the longest ids accepted
)
def test_a_busy_agents_hour_of_history_is_stored_in_chunks_under_kafkas_default_limit(
    responses: int, id_length: int
) -> None:
    """One agent name in one tenant answering many times within one hour of event time: whole, the
    hour's entries would pass Kafka's default limit; they are stored as chunks of at most
    HISTORY_CHUNK_BYTES, each entry once."""
    start = datetime(2026, 11, 22, 10, tzinfo=UTC)
    inputs = [
        orjson.dumps(
            {
                **EXAMPLE,
                **BASE,
                "event_id": str(uuid.UUID(int=i)) if id_length == 36 else f"{i:0{id_length}d}",
                "trace_id": f"trace-{i}",
                "timestamp": (start + timedelta(seconds=3_599 * i / responses)).isoformat(),
                "token_logprobs": None,
            }
        )
        for i in range(responses)
    ]
    records = _all_records(inputs)
    assert sum(r.topic == SETTINGS.scored_topic for r in records) == responses
    history = [r for r in records if r.topic == f"{SETTINGS.responses_topic}-changelog"]
    summary_key = table_key(BASE["tenant_id"], BASE["agent_name"])
    chunks = [r.value for r in history if r.key != summary_key]
    assert len(chunks) == len(history) - 1 > 1
    assert sorted(e.event_id for c in chunks for e in HistoryHour.model_validate_json(c).entries) == sorted(
        orjson.loads(i)["event_id"] for i in inputs
    )
    assert sum(map(len, chunks)) > KAFKA_DEFAULT_LIMIT  # whole, the hour would not fit in one record
    assert max(map(len, chunks)) <= SETTINGS.history_chunk_bytes
    largest = max(history, key=_size)
    assert _size(largest) <= KAFKA_DEFAULT_LIMIT, f"{_size(largest)} bytes to {largest.topic}"


def test_a_batch_of_many_scores_with_long_ids_sends_calibration_in_records_under_the_limit() -> None:
    """One tenant's scores of a batch travel to calibration as one message: 500 tool calls whose
    trace id and agent type are 1,024 control characters (6 bytes each, escaped) made one record of
    6 MB. Split in order instead; stage 4 reads the same items."""
    long_ids = {"trace_id": "\x01" * ID_MAX_CHARS, "agent_type": "\x02" * ID_MAX_CHARS}
    inputs = [
        orjson.dumps(
            {**BASE, **long_ids, "event_id": f"tool-{i}", "event_type": "TOOL_INVOCATION", "tool": "read"}
            | {"target": f"f{i}.py", "status": "ok", "result_count": 1}
        )
        for i in range(500)
    ]
    records = _all_records(inputs)
    calibration = [r for r in records if r.topic == SETTINGS.calibration_topic]
    assert len(calibration) > 1
    assert max(_size(r) for r in calibration) <= SETTINGS.producer_max_batch_bytes + 1_000
    items = [i for r in calibration for part in r.value.split(b"\n") for i in orjson.loads(part)["items"]]
    assert len(items) == 500  # a TRACE_SCORED subject per tool call, none lost in the split


def _reasons(records: list[Record]) -> dict[str, bytes]:
    """Input event id -> reason, of the dead letters of inputs (of stage 1)."""
    return {
        orjson.loads(r.value)["event_id"]: dict(r.headers or [])["__connect.errors.reason"]
        for r in records
        if r.topic == SETTINGS.dlq_topic
    }


def _traces_remembering(records: list[Record]) -> set[str]:
    """The input event ids the trace states written remember as applied."""
    return {
        event_id
        for r in records
        if r.topic == "traces-changelog"
        for event_id in TraceState.model_validate_json(r.value).remembered
    }


LIST_EXPANDING = {
    # 16 bytes each in the input, 36 in the internal message (defaults written): 1.9 MB in all.
    "retrieval hits": {
        **BASE,
        "event_id": "hits",
        "event_type": "LLM_RESPONSE",
        "request_id": "r",
        "model": "m",
        "endpoint": "/v1",
        "response": "an answer",
        "retrieval": [{"similarity": 0}] * 58_000,
    },
    # 38 bytes each in the input, 57 in the internal message (its `source_id`): 1.5 MB in all.
    "provenance entries": {
        **_claim("hits", BASE),
        "provenance": [{"source_type": "a", "confidence": 0}] * 28_000,
    },
}


@pytest.mark.parametrize("name", LIST_EXPANDING)
def test_an_input_whose_message_to_a_later_stage_would_pass_the_limit_is_dead_lettered(name: str) -> None:
    """MAX_EVENT_BYTES bounds the input, not what it becomes: a list's entries gain their defaults in the
    internal message. Such an input is dead-lettered (`oversized_output`) and changes nothing; the
    trace's next input is scored."""
    event = LIST_EXPANDING[name]
    raw = orjson.dumps(event)
    assert len(raw) <= SETTINGS.max_event_bytes and len(
        event.get("retrieval") or event.get("provenance")
    ) <= (SETTINGS.max_array_items)  # a valid input
    after = {**BASE, "event_id": "after", "event_type": "TOOL_INVOCATION", "tool": "read", "target": "f"}
    after |= {"status": "ok", "result_count": 1}
    records = _all_records([raw, orjson.dumps(after)])
    largest = max(records, key=_size)
    assert _size(largest) <= KAFKA_DEFAULT_LIMIT, f"{_size(largest)} bytes to {largest.topic}"
    assert _reasons(records) == {"hits": b"oversized_output"}
    assert _traces_remembering(records) == {"after"}
    assert [o["source_event_id"] for o in stage_records.scored(records)] == ["after"]


def test_a_synthesis_whose_output_would_pass_the_limit_is_dead_lettered() -> None:
    """50 claims with the longest ids, contradicting each other in pairs, and 13 sub-calls: the
    SYNTHESIS_SCORED lists every conflict, 1.3 MB. As the trace's 64th input its remembered output is
    compressed into a block, so the trace-state bound does not see it; the record size does."""
    claims = [
        {
            **_claim("c" * (ID_MAX_CHARS - 4) + f"{i:04d}", BASE),
            "event_id": f"claim-{i}",
            "statement": "service returns nil" if i % 2 else "service never returns nil",
        }
        for i in range(50)
    ]
    response = {**BASE, "event_type": "LLM_RESPONSE", "request_id": "r", "model": "m", "endpoint": "/v1"}
    subs = [
        {
            **response,
            "event_id": f"sub-{i}",
            "role": "sub_call",
            "sub_call_id": f"s{i}",
            "response": "a result",
        }
        for i in range(13)
    ]
    synthesis = {**response, "event_id": "synthesis", "role": "synthesis", "response": "the synthesis"}
    records = _all_records([orjson.dumps(e) for e in [*claims, *subs, synthesis]])
    largest = max(records, key=_size)
    assert _size(largest) <= KAFKA_DEFAULT_LIMIT, f"{_size(largest)} bytes to {largest.topic}"
    assert _reasons(records) == {"synthesis": b"oversized_output"}
    assert "synthesis" not in _traces_remembering(records)
    assert {o["event_type"] for o in stage_records.scored(records)} == {"CLAIM_SCORED", "RESPONSE_SCORED"}


@pytest.mark.parametrize("key_bytes", [36, 4 * ID_MAX_CHARS, 48_400, 1_000_000])
def test_a_dead_letter_fits_whatever_the_inputs_key(key_bytes: int) -> None:
    """A record the broker took, a 48 KB key and an invalid value at MAX_EVENT_BYTES, made a dead letter
    300 bytes over its limit (the key kept, the value capped, the headers added): the worker stopped on
    it after every restart (found by review). A valid key is kept; a longer one becomes its SHA-256."""
    key = b"k" * key_bytes
    value = b"{" + b"x" * (SETTINGS.max_event_bytes - 1)  # not JSON
    dead = decode(value, SETTINGS.max_event_bytes, SETTINGS.max_array_items)
    assert isinstance(dead, DeadLetter)
    out = Outputs(SETTINGS, metrics.create(CollectorRegistry()))
    out.dead_letter(dead, InputRecord("agent-events", 3, 123_456_789, 0.0, value, key))
    (letter,) = out.records
    assert _size(letter) <= SETTINGS.max_record_bytes
    if key_bytes <= 4 * ID_MAX_CHARS:
        assert letter.key == key and letter.value == value[: len(letter.value)]
    else:
        assert letter.key == hashlib.sha256(key).hexdigest().encode()
    assert len(letter.value) > 0.99 * SETTINGS.max_event_bytes  # cut only as much as the key needs


def test_long_keys_are_partitioned_without_being_cached() -> None:
    """Every distinct key stayed in the partitioner's cache of 65,536: with dead letters' keys of up to
    1 MB, memory without bound."""
    before = _cached_key_partition.cache_info().currsize
    assert key_partition(b"x" * 100_000, 12) == key_partition(b"x" * 100_000, 12)
    assert _cached_key_partition.cache_info().currsize == before


def test_a_calibration_item_over_a_low_max_record_bytes_refuses_its_input() -> None:
    """Review (thirtieth round): calibration messages are cut at PRODUCER_MAX_BATCH_BYTES but never
    below one item, and an OUTCOME's ids of escaped characters make an item of about 31 KB: under a
    16 KB MAX_RECORD_BYTES stage 1 sent it as a record over the limit. The input is refused now."""
    settings = load_settings(max_record_bytes=16_384, producer_max_batch_bytes=16_384)
    stage = TraceStage(settings, scoring_configs(settings), metrics.create(CollectorRegistry()))
    escaped = "\x01" * ID_MAX_CHARS
    outcome = {
        "event_type": "OUTCOME",
        "schema_version": 1,
        "timestamp": "2026-11-22T10:00:00Z",
        "event_id": escaped,
        "tenant_id": escaped,
        "trace_id": escaped,
        "subject_event_id": escaped,
        "source": "human",
        "correct": True,
    }
    short = {**outcome, "event_id": "o2", "tenant_id": "t", "trace_id": "tr", "subject_event_id": "r"}
    records = [
        keyed(InputRecord("agent-events", 0, n, 1.0, orjson.dumps(e))) for n, e in enumerate([outcome, short])
    ]
    produced, _ = stage.process(records, {}.get)
    sent = bundle(produced, settings.internal_topics, settings.producer_max_batch_bytes)  # as the runner does
    assert stage_records.dead(sent) == [(0, b"oversized_output")]
    assert all(len(r.key or b"") + len(r.value) <= settings.max_record_bytes for r in sent)
    assert [
        len(unbundle(InputRecord(r.topic, 0, 0, 0.0, r.value)))
        for r in sent
        if r.topic == settings.calibration_topic
    ] == [1]
