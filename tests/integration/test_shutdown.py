"""SIGTERM mid-stream: the worker exits cleanly and a successor loses no output."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import orjson

from streams.harness import RunningBroker
from streams.kafka_io import Consumed
from tests.integration.fixtures import EventFactory, deploy


def test_sigterm_then_restart_loses_no_output(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=2, BATCH_SIZE="20")
    first = d.start_worker()
    f = EventFactory(tenant="shutdown")
    events = [f.tool(f"sd-{i % 20}", "find", f"sym{i}", minutes=i, result_count=1) for i in range(400)]
    ids = {e["event_id"] for e in events}

    def sources(records: list[Consumed]) -> set[str]:
        return {
            orjson.loads(r.value)["source_event_id"] for r in records if r.topic == d.settings.scored_topic
        }

    # Events keep arriving while SIGTERM lands (small requests from another thread), and the last ten
    # only after the first worker has exited, so the successor always has work of its own.
    during, after = events[200:390], events[390:]

    def feed() -> None:
        for start in range(0, len(during), 10):
            d.produce(during[start : start + 10])

    feeder = threading.Thread(target=feed, daemon=True)
    try:
        d.produce(events[:200])
        d.collect(lambda rs: len(sources(rs)) >= 50)
        feeder.start()
        assert first.stop() == 0  # SIGTERM: Faust finishes the batch, commits, flushes, exits 0
        restarted_at = datetime.now(UTC)
        feeder.join(timeout=60)
        d.produce(after)
        d.start_worker()
        records = d.collect(lambda rs: ids <= sources(rs), timeout=120)
    finally:
        d.stop()
    assert sources(records) >= ids
    # The successor did part of the work (at least the last ten, and any re-delivered uncommitted batch).
    later = [o for o in d.outputs(records) if datetime.fromisoformat(o["scored_at"]) > restarted_at]
    assert later
