"""Through a real broker: a worker whose later stages lag its stage 1 holds its input back, and loses nothing.

With a backlog of inputs waiting, stage 1 reads far faster than the later stages keep up (they do more
work per event), so it used to run thousands of internal records ahead of them (README "Performance").
`INTERNAL_BACKLOG_MAX_RECORDS` bounds that: past it stage 1 pauses every input partition until at most
half is left. Here the bound is 10 records: the worker must hold its input back, again and again as the
backlog drains, and still produce every output each input causes, exactly once (paused input records
already fetched are sought back and read again, streams/transport.py).

What the gate does to memory shows in the full soak, not in a run this short: stage 1 reads its
buffered input even while held, so over a few seconds the unread records sampled here are alike with
and without the gate (max 66-91 against 63-73); over the full soak's 200k events the later stages fell
at most 1,447-1,499 records behind instead of 4,312-5,111 (docs/DECISIONS.md, "Sixteenth round").
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from streams.demo import encode
from streams.harness import RunningBroker
from streams.kafka_io import produce
from tests.integration.fixtures import EventFactory, deploy
from tests.integration.workload import outputs_of, scan_outputs, scrape, soak_events, wait_for_metrics

# Rate- and timing-based: `make test` runs these alone, after the parallel run of the rest.
pytestmark = pytest.mark.serial

BOUND = 10
TRACES = 500  # 5,000 events


def test_input_is_held_back_while_the_later_stages_lag_and_nothing_is_lost(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=2, INTERNAL_BACKLOG_MAX_RECORDS=str(BOUND))
    run = EventFactory().run
    traffic = list(soak_events(run, TRACES))
    expected = sum(outputs for outputs, _, _ in traffic)
    records = [(key, encode(event)) for _, key, event in traffic]
    assert asyncio.run(produce(kafka.bootstrap_servers, d.settings.input_topic_names[0], records)) == len(
        records
    )
    try:
        d.start_worker()
        port = d.web_ports[0]
        wait_for_metrics(port)
        paused: list[float] = []
        deadline = time.monotonic() + 180
        while True:
            metrics = scrape(port)
            paused.append(metrics.total("confidence_input_partitions_paused"))
            if metrics.total("confidence_outputs_emitted_total") >= expected:
                break
            assert time.monotonic() < deadline, (
                f"not done in time: {metrics.total('confidence_outputs_emitted_total')}"
            )
            time.sleep(0.05)
        scored = asyncio.run(scan_outputs(kafka.bootstrap_servers, d.settings.scored_topic, expected + 1, 30))
        holds = scrape(port).total("confidence_input_holds_total")
    finally:
        d.stop()
    wanted: Counter[str] = Counter()
    for _, _, event in traffic:
        wanted.update(outputs_of(event))
    assert {kind: scored[kind] for kind in wanted} == dict(wanted)  # every output once, none lost
    assert sum(scored[kind] for kind in wanted) == expected
    assert holds >= 2, f"held {holds} times"  # the later stages did lag, and the gate held input back
    assert 2 in paused, "no scrape saw both input partitions paused"
