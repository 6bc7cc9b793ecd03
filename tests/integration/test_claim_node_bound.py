"""Through a real broker: a claim that others keep pointing at reaches CLAIM_NODE_MAX_BYTES, and the
claims that would grow it further are dead-lettered (`claim_node_full`), never written, across a worker
restart; the claims changelog never holds a record over the bound."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import orjson

from streams.harness import RunningBroker
from streams.kafka_io import Consumed, collect
from tests.integration.fixtures import EventFactory, deploy, settled_as_offline
from tests.unit import stage_records
from tests.unit.test_claim_node_bound import _Worker

NODE_LIMIT = 16_384
CLAIMS = 600


def test_a_claim_at_its_node_bound_dead_letters_its_new_supporters_across_a_restart(
    kafka: RunningBroker,
) -> None:
    d = deploy(kafka, partitions=2, CLAIM_NODE_MAX_BYTES=str(NODE_LIMIT))
    f = EventFactory()
    # One trace, so the claims reach their tenant's claim stage in the order they were produced.
    events = [f.claim("claims-trace", "hub", 0)]
    for i in range(1, CLAIMS):  # every 10th claim stands alone; the others support the hub
        fields = (
            {} if i % 10 == 0 else {"relationships": [{"type": "supports", "target": "hub", "strength": 0.5}]}
        )
        events.append(f.claim("claims-trace", f"supporter-{i:04d}", i * 0.01, **fields))

    offline = _Worker(NODE_LIMIT)
    records = offline.run(events, [1] * len(events))
    refused = {events[offset]["event_id"] for offset, _ in stage_records.dead(records)}
    accepted = {o["source_event_id"] for o in stage_records.scored(records)}
    assert refused and accepted and not refused & accepted
    assert all("relationships" in e for e in events if e["event_id"] in refused)

    def settled(ids: set[str]) -> Callable[[list[Consumed]], bool]:
        return settled_as_offline(d, ids, accepted, refused, lambda dead: dead["arrived"]["source_event_id"])

    half = CLAIMS // 2
    try:
        first = d.start_worker()
        d.produce(events[:half])
        got = d.collect(settled({e["event_id"] for e in events[:half]}))
        d.replace_worker(first)  # SIGTERM; the successor restores the hub's node from the changelog
        d.produce(events[half:])
        got += d.collect(settled({e["event_id"] for e in events}))
    finally:
        d.stop()

    scored = {o["source_event_id"] for o in d.outputs(got) if o["event_type"] == "CLAIM_SCORED"}
    assert scored == accepted
    letters = [r for r in got if r.topic == d.settings.dlq_topic]
    assert {orjson.loads(r.value)["arrived"]["source_event_id"] for r in letters} == refused
    assert {dict(r.headers)["__connect.errors.reason"] for r in letters} == {b"claim_node_full"}

    # What reached the claims changelog: the hub's last node, and no record over the bound.
    changelog = f"{d.settings.app_id}-claims-changelog"
    last_supporter = max(
        e["claim_id"] for e in events if e["event_id"] in accepted and "relationships" in e
    ).encode()

    def last_hub_written(records: list[Consumed]) -> bool:
        return any(r.value and b'"hub"' in (r.key or b"") and last_supporter in r.value for r in records)

    written = asyncio.run(collect(kafka.bootstrap_servers, [changelog], last_hub_written, 60))
    sizes = [len(r.key or b"") + len(r.value) for r in written if r.value]
    assert max(sizes) <= NODE_LIMIT
    assert max(sizes) > NODE_LIMIT * 0.9, "the hub got close to the bound"
