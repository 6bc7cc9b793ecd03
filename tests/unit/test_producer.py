"""Producer kit without a broker: build, encode / key, round trip through the service's decoder, limits."""

from __future__ import annotations

import asyncio
import math
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from streams.config import load_settings
from streams.decode import decode
from streams.events import ClaimEvent, LlmResponse, OutcomeEvent, ResponseScored, RetrievalHit, ToolInvocation
from streams.producer import (
    INPUT_MODELS,
    EventProducer,
    RejectedEvent,
    SendError,
    build,
    encode,
    key_of,
)

COMMON: dict[str, Any] = {
    "tenant_id": "acme",
    "trace_id": "trace-1",
    "agent_name": "planner-1",
    "agent_type": "planner",
}
RESPONSE: dict[str, Any] = {
    **COMMON,
    "request_id": "req-1",
    "model": "gpt-4o",  # a field named like a parameter: build takes its class positional-only
    "endpoint": "/v1/chat",
    "response": "Done.",
}
LIMITS = (1_000_000, 100_000)


def _events() -> list[BaseModel]:
    at = datetime(2026, 11, 22, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    return [
        build(LlmResponse, **RESPONSE),
        build(
            LlmResponse,
            **RESPONSE,
            timestamp=at,
            role="sub_call",
            sub_call_id="sub-a",
            token_logprobs=[-0.1, None, float("nan"), float("-inf"), float("inf"), 0.0, 5e-7],
            retrieval=[{"similarity": 0.9, "source": "a"}, RetrievalHit(similarity=0.5)],
            code_validation={"code_exists": True},
        ),
        build(ToolInvocation, **COMMON, tool="find", target="parse_config", status="ok", result_count=3),
        build(ToolInvocation, **COMMON, tool="cmake", target="build", status="ok", build_passed=False),
        build(
            ClaimEvent,
            **COMMON,
            claim_id="c-1",
            statement="parse_config retries three times",
            tier="task",
            provenance=[{"source_type": "code", "confidence": 0.8}],
            relationships=[{"type": "contradicts", "target": "c-0", "strength": 0.5}],
            staleness_at="2026-12-01T00:00:00Z",
            assessed_upper=0.9,
        ),
    ]


def test_build_fills_version_type_id_and_timestamp() -> None:
    before = datetime.now(UTC)
    event = build(LlmResponse, **RESPONSE)
    assert event.schema_version == 1 and event.event_type == "LLM_RESPONSE"
    assert uuid.UUID(event.event_id).version == 4
    assert event.timestamp.utcoffset() == timedelta(0)
    assert before <= event.timestamp <= datetime.now(UTC)
    assert event.model == "gpt-4o"
    assert build(LlmResponse, **RESPONSE).event_id != event.event_id


def test_build_keeps_what_the_caller_gave() -> None:
    event = build(
        ToolInvocation,
        **COMMON,
        event_id="e-7",
        timestamp="2026-11-22T12:00:00+01:00",
        tool="read",
        target="a.py",
        status="empty",
    )
    assert event.event_id == "e-7"
    assert event.timestamp == datetime(2026, 11, 22, 11, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"schema_version": 2}, "schema_version"),
        ({"schema_version": True}, "schema_version"),
        ({"timestamp": datetime(2026, 11, 22, 12, 0)}, "timestamp"),  # naive: no zone
        ({"timestamp": 1_700_000_000}, "timestamp"),
        ({"trace_id": ""}, "trace_id"),
        ({"response": 42}, "response"),
        ({"retrieval": [{"similarity": 1.5}]}, "retrieval.0.similarity"),
        ({"event_type": "CLAIM"}, "event_type"),
        ({"timestamp": "9999-12-31T23:00:00Z"}, "timestamp"),  # the models' own error types too
        ({"trace_id": "t" * 1025}, "trace_id"),
        ({"response": "x\ud800"}, "response"),  # a lone surrogate: the worker's `invalid_json`
        ({"agent_name": "\udc00a"}, "agent_name"),
    ],
)
def test_build_refuses_what_the_service_would_dead_letter(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        build(LlmResponse, **{**RESPONSE, **fields})
    assert field in {".".join(str(p) for p in e["loc"]) for e in err.value.errors()}


def test_a_lone_surrogate_is_refused_by_build_as_by_the_worker() -> None:
    """JSON can spell `\\ud800`, and the schemas accept it, but it is no Unicode text: the worker
    dead-letters it as `invalid_json`, and `build` raises ValidationError for it, as its docstring says
    (it raised pydantic's serialisation error before)."""
    event = build(LlmResponse, **RESPONSE)
    escaped = encode(event).replace(b'"Done."', b'"Done.\\ud800"')
    assert b"\\ud800" in escaped
    refused = decode(escaped, *LIMITS)
    assert not isinstance(refused, BaseModel) and refused.reason == "invalid_json"
    with pytest.raises(ValidationError, match="lone surrogate") as err:
        build(LlmResponse, **{**RESPONSE, "response": "Done.\ud800"})
    assert [e["loc"] for e in err.value.errors()] == [("response",)]
    assert "\\ud800" not in str(err.value)


def test_build_refuses_an_outcome_with_two_verdicts_as_the_service_would() -> None:
    fields = {"tenant_id": "t", "trace_id": "tr", "subject_event_id": "e", "source": "human"}
    with pytest.raises(ValidationError, match="exactly one of correct and score"):
        build(OutcomeEvent, **fields, correct=True, score=0.5)


def test_build_error_message_never_quotes_input_values() -> None:
    with pytest.raises(ValidationError) as err:
        build(LlmResponse, **RESPONSE, token_logprobs="-0.0123456789")
    assert "token_logprobs" in str(err.value)
    assert "0123456789" not in str(err.value)


def test_build_refuses_unknown_fields_and_non_input_models() -> None:
    with pytest.raises(TypeError, match="no field"):
        build(LlmResponse, **RESPONSE, tokens_logprobs=[-0.1])  # a typo the model would drop silently
    with pytest.raises(TypeError, match="not an input event"):
        build(ResponseScored, **COMMON)


@pytest.mark.parametrize("event", _events(), ids=lambda e: type(e).__name__)
def test_round_trip_through_the_service_decoder(event: BaseModel) -> None:
    raw = encode(event)
    decoded = decode(raw, *LIMITS)
    assert type(decoded) is type(event)
    # Compared as bytes: NaN != NaN would fail a model comparison that is in fact exact.
    assert encode(decoded) == raw
    assert decoded.model_dump().keys() == event.model_dump().keys()


def test_non_finite_logprobs_are_sent_as_they_were_given() -> None:
    event = _events()[1]
    raw = encode(event)
    assert b'"token_logprobs":[-0.1,null,NaN,-Infinity,Infinity,0.0,5e-7]' in raw
    decoded = decode(raw, *LIMITS)
    assert isinstance(decoded, LlmResponse) and decoded.token_logprobs is not None
    nan, minus_inf, inf = decoded.token_logprobs[2:5]
    assert nan is not None and math.isnan(nan)
    assert minus_inf == -math.inf and inf == math.inf
    assert b'"timestamp":"2026-11-22T12:00:00+02:00"' in raw


def test_key_is_the_trace_id_in_utf8() -> None:
    event = build(
        ToolInvocation, **{**COMMON, "trace_id": "trace-ü-1"}, tool="git", target="log", status="ok"
    )
    assert key_of(event) == "trace-ü-1".encode()


def test_encode_refuses_output_events() -> None:
    with pytest.raises(TypeError, match="not an input event"):
        key_of(RetrievalHit(similarity=0.5))


def test_every_current_input_type_is_known() -> None:
    assert {LlmResponse, ToolInvocation, ClaimEvent} <= set(INPUT_MODELS)


def test_settings_and_overrides() -> None:
    settings = load_settings(kafka_bootstrap_servers="k1:9092", input_topics="in-a,in-b")
    defaults = EventProducer(settings)
    assert (defaults.bootstrap_servers, defaults.topic) == ("k1:9092", "in-a")
    chosen = EventProducer(settings, bootstrap_servers="k2:9092", topic="other")
    assert (chosen.bootstrap_servers, chosen.topic) == ("k2:9092", "other")


def test_given_broker_and_topic_the_kit_ignores_the_agents_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOG_LEVEL", "WARNING")  # the agent's own variable; the worker would refuse it
    monkeypatch.setenv("WEB_PORT", "not a port")
    producer = EventProducer(bootstrap_servers="k3:9092", topic="agent-events")
    assert (producer.bootstrap_servers, producer.topic) == ("k3:9092", "agent-events")
    with pytest.raises(ValidationError, match="log_level"):
        EventProducer(topic="agent-events")  # the broker from the environment: it is read, and refused


async def test_events_the_service_would_dead_letter_are_not_sent() -> None:
    producer = EventProducer(load_settings(max_event_bytes=2048, max_array_items=10))
    big = build(LlmResponse, **{**RESPONSE, "response": "x" * 4096})
    many = build(LlmResponse, **RESPONSE, token_logprobs=[-0.1] * 11)
    with pytest.raises(RejectedEvent, match="oversized_event") as err:
        producer.record(big)
    assert err.value.event_id == big.event_id
    with pytest.raises(RejectedEvent, match="oversized_array"):
        producer.record(many)

    sent: list[tuple[bytes, bytes]] = []

    async def enqueue(record: tuple[bytes, bytes]) -> asyncio.Future[Any]:
        sent.append(record)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    producer._enqueue = enqueue  # type: ignore[method-assign]
    with pytest.raises(RejectedEvent):
        await producer.send_many([build(LlmResponse, **RESPONSE), many])
    assert sent == []  # checked before anything is sent


def _producer_acked_by_hand() -> tuple[EventProducer, list[asyncio.Future[Any]]]:
    """A producer whose sends return futures the test resolves: (producer, one future per send)."""
    producer = EventProducer(load_settings())
    futures: list[asyncio.Future[Any]] = []

    async def enqueue(record: tuple[bytes, bytes]) -> asyncio.Future[Any]:
        futures.append(asyncio.get_running_loop().create_future())
        return futures[-1]

    producer._enqueue = enqueue  # type: ignore[method-assign]
    return producer, futures


async def test_batch_waits_for_every_ack_and_names_the_failures() -> None:
    producer, futures = _producer_acked_by_hand()
    events = [build(ToolInvocation, **COMMON, tool="find", target=str(i), status="ok") for i in range(3)]

    async def acks() -> None:
        # Acks arrive after the block has been left: the exit must wait for all of them.
        await asyncio.sleep(0)
        futures[0].set_result("m0")
        futures[1].set_exception(TimeoutError("no ack"))
        futures[2].set_result("m2")

    with pytest.raises(SendError) as err:
        async with producer.batch() as batch:
            for event in events:
                await batch.send(event)
            acker = asyncio.create_task(acks())
    await acker
    assert err.value.failures[0][0] == events[1].event_id
    assert err.value.acknowledged == 2 and batch.metadata == ["m0", "m2"]


async def test_a_batch_whose_block_raised_still_names_the_events_not_acknowledged() -> None:
    producer, futures = _producer_acked_by_hand()
    events = [build(ToolInvocation, **COMMON, tool="find", target=str(i), status="ok") for i in range(2)]

    async def acks() -> None:
        await asyncio.sleep(0)
        futures[0].set_exception(TimeoutError("no ack"))
        futures[1].set_result("m1")

    with pytest.raises(ValueError, match="the caller's own error") as err:
        async with producer.batch() as batch:
            for event in events:
                await batch.send(event)
            acker = asyncio.create_task(acks())
            raise ValueError("the caller's own error")
    await acker
    # The block's exception is the one raised; the lost event is named on it and on the batch.
    assert any(events[0].event_id in note and "not acknowledged" in note for note in err.value.__notes__)
    assert [event_id for event_id, _ in batch.failures] == [events[0].event_id]
    assert batch.metadata == ["m1"]
