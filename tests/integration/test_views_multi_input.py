"""A worker reading several input topics still serves the trace view (DESIGN section 1 allows several)."""

from __future__ import annotations

import asyncio
import json
import urllib.request

from streams.demo import encode
from streams.harness import RunningBroker
from streams.kafka_io import produce
from tests.integration.fixtures import EventFactory, count_of, deploy


def test_trace_view_with_two_input_topics(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=2)
    second = f"{d.settings.input_topic_names[0]}-b"
    d.env["INPUT_TOPICS"] = f"{d.settings.input_topic_names[0]},{second}"
    f = EventFactory(tenant="multi")
    d.start_worker()
    try:
        d.produce([f.tool("multi-1", "find", "Widget", result_count=2)])
        event = f.tool("multi-1", "read", "src/Widget.h", minutes=1)
        asyncio.run(produce(kafka.bootstrap_servers, second, [(b"multi-1", encode(event))]))
        d.collect(count_of("TRACE_SCORED", 2, d.settings.scored_topic))
        url = f"http://127.0.0.1:{d.web_ports[0]}/traces/multi/multi-1"
        with urllib.request.urlopen(url, timeout=10) as response:
            view = json.loads(response.read())
    finally:
        d.stop()
    assert view["trace_id"] == "multi-1"
    assert view["evidence"]["categories"] == {"search": 0.65, "read": 0.80}  # one file read: 0.80 (DESIGN 4)
