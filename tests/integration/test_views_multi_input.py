"""A worker reading several input topics still serves the trace view (DESIGN section 1 allows several)."""

from __future__ import annotations

import asyncio

import pytest

from streams.config import load_settings
from streams.demo import encode
from streams.harness import RunningBroker
from streams.kafka_io import produce
from streams.topics import create_topics
from tests.integration.fixtures import EventFactory, count_of, deploy, get_json, settled


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
