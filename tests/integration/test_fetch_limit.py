"""Through a real broker: a worker whose fetches are far smaller than its records still reads everything.

`CONSUMER_FETCH_MAX_BYTES` bounds what one fetch returns (README "Configuration"), and so what a
lagging worker holds fetched but not yet processed. Kafka returns a record batch larger than the limit
on its own (KIP-74), so a small limit slows a partition down but never stalls it. Here every fetch is
limited to 4 KB while the input carries one 300 KB record and the internal topics carry bundles of a
whole batch's messages: every input must still produce all its outputs.
"""

from __future__ import annotations

import orjson

from streams.harness import RunningBroker
from streams.kafka_io import Consumed
from tests.integration.fixtures import EventFactory, deploy

TRACES = 60


def test_a_fetch_limit_below_the_record_sizes_still_reads_every_record(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=2, CONSUMER_FETCH_MAX_BYTES="4096")
    f = EventFactory(tenant="fetch-limit")
    events = []
    for i in range(TRACES):
        trace = f"fl-{i}"
        text = "x" * 300_000 if i == TRACES // 2 else "Done."
        events += [
            f.response(trace, i, token_logprobs=[-0.05, -0.2, -0.1], response=text),
            f.tool(trace, "grep", f"src/{i}.py", i + 0.1),
            f.claim(trace, f"c-{i}", i + 0.2),
        ]
    assert max(len(orjson.dumps(e)) for e in events) > 70 * 4096
    wanted = {"RESPONSE_SCORED": TRACES, "TRACE_SCORED": TRACES, "CLAIM_SCORED": TRACES}

    def kinds(records: list[Consumed]) -> dict[str, int]:
        seen: dict[str, int] = {}
        for record in records:
            if record.topic == d.settings.scored_topic:
                kind = orjson.loads(record.value)["event_type"]
                seen[kind] = seen.get(kind, 0) + 1
        return seen

    d.start_worker()
    try:
        d.produce(events)
        records = d.collect(
            lambda records: all(kinds(records).get(k, 0) >= n for k, n in wanted.items()), timeout=120
        )
    finally:
        d.stop()
    assert {k: kinds(records).get(k, 0) for k in wanted} == wanted
    assert not [r for r in records if r.topic == d.settings.dlq_topic]
