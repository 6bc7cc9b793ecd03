"""`confidence-streams tail`: pretty-prints scored (or flagged) events as they arrive."""

from __future__ import annotations

import orjson
from aiokafka import AIOKafkaConsumer
from rich.console import Console

from streams.config import load_settings

__all__ = ["tail"]


async def tail(flagged_only: bool = False, limit: int | None = None) -> int:
    """Follow the scored (or flagged) topic from its end; print one line per event."""
    settings = load_settings()
    topic = settings.flagged_topic if flagged_only else settings.scored_topic
    console = Console()
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=settings.kafka_bootstrap_servers, auto_offset_reset="latest", group_id=None
    )
    await consumer.start()
    for partition in consumer.assignment():
        await consumer.position(partition)  # resolve "latest" now: every event after the next line is shown
    Console(stderr=True).print(f"following {topic} from its end (Ctrl-C to stop)")
    seen = 0
    try:
        async for message in consumer:
            event = orjson.loads(message.value or b"{}")
            console.print(_line(event))
            seen += 1
            if limit is not None and seen >= limit:
                break
    finally:
        await consumer.stop()
    return 0


def _line(event: dict[str, object]) -> str:
    kind = str(event.get("event_type"))
    head = f"[bold]{kind}[/] trace={event.get('trace_id')} tenant={event.get('tenant_id')}"
    if kind == "RESPONSE_SCORED":
        comp = event.get("composite") or {}
        assert isinstance(comp, dict)
        return f"{head} confidence={event.get('confidence')} action={event.get('action')} composite={comp.get('score')}"
    if kind == "TRACE_SCORED":
        return f"{head} score={event.get('score')} band={event.get('band')}"
    if kind == "CLAIM_SCORED":
        iv = event.get("interval") or {}
        assert isinstance(iv, dict)
        return f"{head} claim={event.get('claim_id')} interval=[{iv.get('lower')}, {iv.get('upper')}]"
    return f"{head} overall={event.get('overall_confidence')} warnings={event.get('warnings')}"
