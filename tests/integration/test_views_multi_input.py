"""A worker reading several input topics still serves the trace view (DESIGN section 1 allows several)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from streams.config import load_settings
from streams.demo import encode
from streams.harness import RunningBroker
from streams.kafka_io import produce
from streams.topics import create_topics
from tests.integration.fixtures import EventFactory, count_of, deploy, get_json, poll, settled
from tests.integration.test_expiry import _sweeps


def test_trace_view_with_two_input_topics(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=2)
    second = f"{d.settings.input_topic_names[0]}-b"
    d.env["INPUT_TOPICS"] = f"{d.settings.input_topic_names[0]},{second}"
    # Create the second input with the deployment's partition count before anything is produced to it:
    # otherwise the producer may auto-create it with the broker's default count first, and the worker
    # refuses inputs that are not co-partitioned.
    asyncio.run(create_topics(load_settings(**{k.lower(): v for k, v in d.env.items()})))
    f = EventFactory(tenant="multi")
    d.start_worker()
    # Both events applied, whichever topic they came from. By hand (DESIGN 4): find with results -> search
    # 0.65; one file read with search results -> read 0.80; base (0.80 x 3.0 + 0.65 x 2.5) / 5.5
    # = 4.025 / 5.5 = 0.731818...; read and search converge on src/widget.h -> bonus 0.10 + 0.05;
    # final 0.731818 + 0.15 x 0.268182 = 0.772045... (strong).
    expected_view = {
        "tenant_id": "multi",
        "trace_id": "multi-1",
        "last_event_time": "2026-11-22T12:01:00+00:00",  # the read, one minute after the find
        "evidence": {
            "score": pytest.approx(0.772045454545, abs=1e-12),
            "base": pytest.approx(0.731818181818, abs=1e-12),
            "band": "strong",
            "categories": {"search": 0.65, "read": 0.80},
            "weights": {
                "read": pytest.approx(3.0 / 5.5, abs=1e-12),
                "search": pytest.approx(2.5 / 5.5, abs=1e-12),
            },
            "convergence": {
                "categories": ["read", "search"],
                "count": 2,
                "bonus": pytest.approx(0.15, abs=1e-12),
                "target": "src/widget.h",
            },
            "recovery_recommended": False,
            "should_stop": False,
            "recovery_attempts": 0,
        },
        "sub_calls": [],
        "claims": [],
    }
    try:
        d.produce([f.tool("multi-1", "find", "Widget", result_count=2)])
        event = f.tool("multi-1", "read", "src/Widget.h", minutes=1)
        asyncio.run(produce(kafka.bootstrap_servers, second, [(b"multi-1", encode(event))]))
        d.collect(count_of("TRACE_SCORED", 2, d.settings.scored_topic))
        status, view = settled(
            lambda: get_json(d.web_ports[0], "/traces/multi/multi-1"), (200, expected_view)
        )
        assert status == 200, view
    finally:
        d.stop()
    assert view == expected_view


def test_a_topic_read_ahead_does_not_expire_traces_whose_events_wait_in_the_other(
    kafka: RunningBroker,
) -> None:
    """Thirty-first round: the input topics sharing a partition number shared one expiry clock, so a
    topic read 24.5 h ahead let the sweep delete trace T while T's next event waited in the other topic
    (scored 0.55, a lone read, instead of 0.772 with its find). Each topic is a source of the clock now.
    The second topic is kept heard throughout (a topic quiet past EXPIRY_SOURCE_IDLE_SECONDS leaves the
    watermark): a thread sends it an event every second until T's read is produced."""
    idle = 15.0
    d = deploy(kafka, partitions=1, SWEEP_INTERVAL_SECONDS="0.5", EXPIRY_SOURCE_IDLE_SECONDS=str(idle))
    first = d.settings.input_topic_names[0]
    second = f"{first}-b"
    d.env["INPUT_TOPICS"] = f"{first},{second}"
    asyncio.run(create_topics(load_settings(**{k.lower(): v for k, v in d.env.items()})))
    f = EventFactory(tenant="ahead")
    scored = d.settings.scored_topic

    def to_second(*events: dict[str, Any]) -> None:
        records = [(e["trace_id"].encode(), encode(e)) for e in events]
        asyncio.run(produce(kafka.bootstrap_servers, second, records))

    stop = threading.Event()

    def keep_second_heard() -> None:
        own = EventFactory(tenant="ahead")  # its own event ids: the factory is not shared across threads
        n = 0
        while not stop.is_set():
            n += 1
            to_second(own.tool(f"ahead-b{n}", "find", "Other", 30))
            stop.wait(1.0)

    find = f.tool("ahead-T", "find", "Widget", 0, result_count=2)
    heard = threading.Thread(target=keep_second_heard, name="second-topic")
    d.start_worker()
    try:
        d.produce([find])
        d.collect(count_of("TRACE_SCORED", 1, scored, {find["event_id"]}), timeout=60)
        heard.start()
        # Past the clock's start-up grace (wall clock, idle + 3 s after both topics were first heard),
        # the first topic heard too: each of its events waits for its output before the next.
        started, n = time.monotonic(), 0
        while time.monotonic() - started < idle + 3:
            n += 1
            event = f.tool(f"ahead-a{n}", "find", "Other", 30)
            d.produce([event])
            d.collect(count_of("TRACE_SCORED", 1, scored, {event["event_id"]}), timeout=30)
        # The first topic reads 24.5 h on; two sweeps run while the second is still heard.
        far = f.tool("ahead-far", "find", "Other", 24.5 * 60)
        d.produce([far])
        d.collect(count_of("TRACE_SCORED", 1, scored, {far["event_id"]}), timeout=30)
        sweeps_from = _sweeps(d.web_ports[0])
        swept = poll(lambda: _sweeps(d.web_ports[0]), lambda s: s >= sweeps_from + 2, 10, 0.1)
        assert swept >= sweeps_from + 2, "no sweep ran"
        read = f.tool("ahead-T", "read", "src/Widget.h", 60)
        to_second(read)
        stop.set()
        records = d.collect(count_of("TRACE_SCORED", 1, scored, {read["event_id"]}), timeout=30)
    finally:
        stop.set()
        if heard.is_alive():
            heard.join(timeout=10)
        d.stop()
    (output,) = [o for o in d.outputs(records) if o["source_event_id"] == read["event_id"]]
    assert round(output["score"], 3) == 0.772, output  # the find and the read converge: T was kept
