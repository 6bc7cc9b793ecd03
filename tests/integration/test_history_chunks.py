"""Through a real broker: a busy agent's hour of history is stored in bounded chunks, survives a restart,
and every chunk counts.

With HISTORY_CHUNK_BYTES at 2 KiB (about ten responses a chunk), 120 responses of one agent within one
hour go through a worker that is stopped (SIGTERM) half-way and replaced, so the second half is added
to chunks restored from the changelog. A last response in the same hour is scored over a window that
cuts that hour, so its history factor reads every chunk: it must be the share of the 120 that met their
threshold. The changelog holds every response once, in chunks none larger than the bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import orjson
import pytest

from streams.harness import RunningBroker
from streams.kafka_io import Consumed, collect
from tests.integration.fixtures import (
    STRONG_COMPOSITE,
    Deployment,
    EventFactory,
    count_of,
    deploy,
    http_get,
    settled,
)

CHUNK_BYTES = 2_048
RESPONSES = 120


@pytest.fixture
def deployment(kafka: RunningBroker) -> Iterator[Deployment]:
    d = deploy(kafka, partitions=2, HISTORY_CHUNK_BYTES=str(CHUNK_BYTES))
    yield d
    d.stop()


def _latest_chunks(records: list[Consumed]) -> dict[bytes, bytes]:
    """The agent-history-hours changelog as a compacted topic reads: the last value per key."""
    latest: dict[bytes, bytes] = {}
    for record in records:
        assert record.key is not None
        latest[record.key] = record.value
    return {key: value for key, value in latest.items() if value}


def test_a_busy_hour_is_chunked_restored_and_counted_whole(deployment: Deployment) -> None:
    d = deployment
    f = EventFactory(tenant="chunk-tenant")
    weak = {"response": "Maybe it works, I think."}
    events = [
        f.response(
            f"trace-{i % 10}", minutes=i * 0.4, agent="busy-1", **(STRONG_COMPOSITE if i % 3 else weak)
        )
        for i in range(RESPONSES)
    ]
    probe = f.response("trace-probe", minutes=59, agent="busy-1", **weak)
    scored = d.settings.scored_topic
    half = RESPONSES // 2

    first = d.start_worker()
    d.produce(events[:half])
    records = d.collect(count_of("RESPONSE_SCORED", half, scored, {e["event_id"] for e in events[:half]}))
    d.replace_worker(first)  # SIGTERM; the successor restores the chunks from the changelog
    d.produce(events[half:])
    later = {e["event_id"] for e in events[half:]}
    records += d.collect(count_of("RESPONSE_SCORED", RESPONSES - half, scored, later))
    d.produce([probe])
    records += d.collect(count_of("RESPONSE_SCORED", 1, scored, {probe["event_id"]}))

    outputs = {o["source_event_id"]: o for o in d.outputs(records) if o["event_type"] == "RESPONSE_SCORED"}
    met = [outputs[e["event_id"]]["composite"]["threshold_met"] for e in events]
    assert 0 < sum(met) < RESPONSES  # a factor strictly between 0 and 1: a missed chunk would show
    factor = outputs[probe["event_id"]]["composite"]["factors"]["agent_history"]
    assert factor == pytest.approx(sum(met) / RESPONSES, abs=1e-12)

    def executions() -> tuple[int, object]:
        status, body = http_get(d.web_ports[-1], "/agents/chunk-tenant/busy-1?hours=168")
        return status, orjson.loads(body).get("total_executions")

    assert settled(executions, (200, RESPONSES + 1)) == (200, RESPONSES + 1)

    # The changelog: every response once, in several chunks, none over the bound.
    changelog = f"{d.settings.app_id}-agent-history-hours-changelog"
    wanted = {e["event_id"] for e in [*events, probe]}

    def stored_ids(chunks: dict[bytes, bytes]) -> list[str]:
        return [e["event_id"] for value in chunks.values() for e in orjson.loads(value)["entries"]]

    def all_stored(records: list[Consumed]) -> bool:
        return set(stored_ids(_latest_chunks(records))) >= wanted

    chunks = _latest_chunks(asyncio.run(collect(d.kafka.bootstrap_servers, [changelog], all_stored, 60)))
    assert sorted(stored_ids(chunks)) == sorted(wanted)
    assert len(chunks) >= (RESPONSES + 1) * 190 // CHUNK_BYTES  # about ten responses a chunk
    assert max(len(value) for value in chunks.values()) <= CHUNK_BYTES
