"""Publish one small agent trace to the confidence-streams input topic with the producer kit.

Uses the worker's own settings: KAFKA_BOOTSTRAP_SERVERS, and the first of INPUT_TOPICS (agent-events).

    python examples/produce_events.py
"""

from __future__ import annotations

import asyncio
import uuid

from streams.events import ClaimEvent, LlmResponse, ToolInvocation
from streams.producer import EventProducer, build


async def main() -> None:
    trace_id = f"trace-{uuid.uuid4().hex[:12]}"
    # The fields every event of this trace shares; build() adds event_id, timestamp and schema_version.
    common = {"tenant_id": "acme", "trace_id": trace_id, "agent_name": "planner-1", "agent_type": "planner"}
    events: list[ToolInvocation | LlmResponse | ClaimEvent] = [
        build(ToolInvocation, **common, tool="grep", target="load_retry_config", status="ok", result_count=3),
        build(ToolInvocation, **common, tool="read", target="src/config/load_retry_config.py", status="ok"),
        build(
            LlmResponse,
            **common,
            request_id="req-1",
            model="gpt-4o",
            endpoint="/v1/chat/completions",
            query="Where is the retry limit configured?",
            response="load_retry_config() reads the retry limit from config/retry.yaml.",
            # One natural-log probability per generated token, straight from the model API.
            token_logprobs=[-0.02, -0.31, -0.004, -0.12, None, -0.05],
        ),
        build(
            ClaimEvent,
            **common,
            claim_id=f"{trace_id}-retry-limit",
            statement="The retry limit is read from config/retry.yaml.",
            source_id="req-1",
            tier="project",
            provenance=[
                {"source_type": "code", "confidence": 0.9},
                {"source_type": "llm", "confidence": 0.7},
            ],
        ),
    ]
    async with EventProducer() as producer:
        acks = await producer.send_many(events)  # concurrent; returns once the broker acknowledged all
    for event, ack in zip(events, acks, strict=True):
        print(f"{event.event_type:<16} {event.event_id} -> {ack.topic}[{ack.partition}] offset {ack.offset}")
    print(f"trace_id={trace_id} (see its scores with `confidence-streams tail`)")


if __name__ == "__main__":
    asyncio.run(main())
