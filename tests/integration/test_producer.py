"""Through a real broker: events published with the producer kit (streams/producer.py) are scored."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2
from pydantic import BaseModel

from streams.events import ClaimEvent, LlmResponse, ToolInvocation
from streams.harness import RunningBroker
from streams.kafka_io import Consumed, collect
from streams.producer import EventProducer, build
from tests.integration.fixtures import STRONG_COMPOSITE, Deployment, deploy

PARTITIONS = 4
EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "produce_events.py"


@pytest.fixture(scope="module")
def deployment(kafka: RunningBroker) -> Iterator[Deployment]:
    d = deploy(kafka, partitions=PARTITIONS)
    d.start_worker()
    yield d
    d.stop()


def _java_partition(trace_id: str) -> int:
    # Kafka's default (Java) partitioner: murmur2 of the key. Producers in other languages that use it
    # put a trace on the same partition as this kit does (README, "Producing events").
    return int(murmur2(trace_id.encode()) & 0x7FFFFFFF) % PARTITIONS


Event = ToolInvocation | LlmResponse | ClaimEvent


def _trace(
    trace_id: str, tenant: str = "t-kit"
) -> tuple[ToolInvocation, ToolInvocation, LlmResponse, ClaimEvent]:
    common: dict[str, Any] = {
        "tenant_id": tenant,
        "trace_id": trace_id,
        "agent_name": "planner-1",
        "agent_type": "planner",
    }
    return (
        build(ToolInvocation, **common, tool="find", target="parse_config", status="ok", result_count=2),
        build(ToolInvocation, **common, tool="read", target="src/config/parse_config.py", status="ok"),
        build(
            LlmResponse,
            **common,
            request_id=f"req-{trace_id}",
            model="gpt-4o",
            endpoint="/v1/chat",
            # NaN and null are invalid and ignored (seed 003): exp(mean(-0.1, -0.2, -0.3)) = 0.8187.
            token_logprobs=[-0.1, None, -0.2, float("nan"), -0.3],
            **STRONG_COMPOSITE,
        ),
        build(
            ClaimEvent,
            **common,
            claim_id=f"claim-{trace_id}",
            statement="parse_config reads config/app.yaml",
            tier="task",
            provenance=[{"source_type": "code", "confidence": 0.8}],
        ),
    )


def _ids(events: list[Event], kind: type[BaseModel]) -> set[str]:
    return {e.event_id for e in events if isinstance(e, kind)}


def _scored(deployment: Deployment, events: list[Event]) -> list[Consumed]:
    """Scored-events records caused by `events`, once every expected output has arrived."""
    expected = {
        "RESPONSE_SCORED": _ids(events, LlmResponse),
        "TRACE_SCORED": _ids(events, ToolInvocation),
        "CLAIM_SCORED": _ids(events, ClaimEvent),
    }
    scored_topic = deployment.settings.scored_topic

    def mine(records: list[Consumed]) -> list[Consumed]:
        return [
            r
            for r in records
            if r.topic == scored_topic
            and orjson.loads(r.value)["source_event_id"] in expected[orjson.loads(r.value)["event_type"]]
        ]

    def done(records: list[Consumed]) -> bool:
        seen: dict[str, set[str]] = {kind: set() for kind in expected}
        for r in mine(records):
            out = orjson.loads(r.value)
            seen[out["event_type"]].add(out["source_event_id"])
        return seen == expected

    records = deployment.collect(done)
    dead = [r for r in records if r.topic == deployment.settings.dlq_topic]
    assert not dead, f"valid events dead-lettered: {[dict(r.headers) for r in dead]}"
    return mine(records)


def test_a_trace_sent_with_the_kit_is_scored_with_its_keys(deployment: Deployment) -> None:
    trace = f"trace-kit-{uuid.uuid4().hex[:8]}"
    find, read, response, claim = _trace(trace)

    async def publish() -> list[int]:
        async with EventProducer(deployment.settings) as producer:
            async with producer.batch() as batch:
                await batch.send(find)
                await batch.send(read)
            acks = [*batch.metadata, await producer.send(response), await producer.send(claim)]
        return [ack.partition for ack in acks]

    partitions = asyncio.run(publish())
    assert partitions == [_java_partition(trace)] * 4

    inputs = asyncio.run(
        collect(
            deployment.kafka.bootstrap_servers,
            [deployment.settings.input_topic_names[0]],
            lambda rs: len([r for r in rs if r.key == trace.encode()]) >= 4,
            timeout=30,
        )
    )
    sent_in_order = [find.event_id, read.event_id, response.event_id, claim.event_id]
    # json, not orjson: the kit sends the NaN logprob as the literal NaN, which orjson does not read.
    assert [json.loads(r.value)["event_id"] for r in inputs if r.key == trace.encode()] == sent_in_order

    records = _scored(deployment, [find, read, response, claim])
    assert {r.key for r in records} == {trace.encode()}
    by_source = {orjson.loads(r.value)["source_event_id"]: orjson.loads(r.value) for r in records}

    first, second = by_source[find.event_id], by_source[read.event_id]
    assert first["event_type"] == "TRACE_SCORED" and round(first["score"], 3) == 0.650
    assert first["band"] == "adequate"
    # find and read converge on parse_config: DESIGN 4's "find+read same target" 0.772.
    assert round(second["score"], 3) == 0.772 and second["band"] == "strong"

    scored = by_source[response.event_id]
    assert scored["event_type"] == "RESPONSE_SCORED"
    assert scored["confidence"] == 0.819 and scored["action"] == "allow"
    assert scored["metadata"]["request_id"] == f"req-{trace}"
    assert b"token_logprobs" not in b"".join(r.value for r in records)

    interval = by_source[claim.event_id]
    assert interval["event_type"] == "CLAIM_SCORED" and interval["claim_id"] == f"claim-{trace}"
    assert interval["cause"] == "self" and interval["trace_id"] == trace


def test_two_hundred_events_sent_as_one_batch_are_acknowledged_and_scored(deployment: Deployment) -> None:
    run = uuid.uuid4().hex[:8]
    traces = [f"trace-batch-{run}-{i}" for i in range(50)]
    events: list[Event] = [event for trace in traces for event in _trace(trace, tenant="t-batch")]
    assert len(events) == 200

    async def publish() -> list[Any]:
        async with EventProducer(deployment.settings) as producer:
            return await producer.send_many(events)

    acks = asyncio.run(publish())
    assert len(acks) == 200 and all(ack.offset >= 0 for ack in acks)
    for event, ack in zip(events, acks, strict=True):
        assert ack.partition == _java_partition(event.trace_id)

    records = _scored(deployment, events)
    trace_of = {e.event_id: e.trace_id for e in events}
    for record in records:
        out = orjson.loads(record.value)
        assert record.key == trace_of[out["source_event_id"]].encode() == out["trace_id"].encode()
    kinds = [orjson.loads(r.value)["event_type"] for r in records]
    assert (kinds.count("TRACE_SCORED"), kinds.count("RESPONSE_SCORED"), kinds.count("CLAIM_SCORED")) == (
        100,
        50,
        50,
    )


def test_idempotent_producer_where_the_broker_supports_it(deployment: Deployment) -> None:
    """Why idempotence is off by default: Tansu 0.6.0 refuses InitProducerId (DESIGN section 7)."""
    event = _trace(f"trace-idem-{uuid.uuid4().hex[:8]}")[0]

    async def publish() -> Any:
        producer = EventProducer(deployment.settings, enable_idempotence=True, request_timeout_ms=5000)
        await producer.start()
        try:
            return await asyncio.wait_for(producer.send(event), timeout=60)
        finally:
            await producer.stop()

    if deployment.kafka.is_tansu:
        with pytest.raises(KafkaError):
            asyncio.run(publish())
    else:
        assert asyncio.run(publish()).offset >= 0


def test_the_example_script_publishes_a_trace_that_is_scored(deployment: Deployment) -> None:
    # The worker's environment is the example's: same bootstrap servers, same input topic.
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        env={**os.environ, **deployment.env},
        cwd=deployment.workdir,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = re.search(r"^trace_id=(\S+) ", done.stdout, re.MULTILINE)
    assert found, done.stdout
    trace = found.group(1)
    wanted = {"TRACE_SCORED": 2, "RESPONSE_SCORED": 1, "CLAIM_SCORED": 1}

    def kinds(records: list[Consumed]) -> dict[str, int]:
        counts = dict.fromkeys(wanted, 0)
        for r in records:
            if r.topic == deployment.settings.scored_topic and r.key == trace.encode():
                counts[orjson.loads(r.value)["event_type"]] += 1
        return counts

    records = deployment.collect(lambda records: kinds(records) == wanted)
    assert kinds(records) == wanted
    bands = [
        out["band"]
        for out in deployment.outputs(records)
        if out["trace_id"] == trace and out["event_type"] == "TRACE_SCORED"
    ]
    assert bands == ["adequate", "strong"]  # what examples/README.md says the tail shows
