"""Through a real broker: every metric the Grafana dashboard queries is exported by a running worker (the
calibration ones after OUTCOME events were joined with their scores), the per-action counter counts what was
emitted, and the consumer-lag gauge reads records past the group's committed offset."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from streams.harness import RunningBroker
from streams.scoring import calibration
from tests.deploy_files import dashboard_metric_names, load_dashboard
from tests.integration.fixtures import STRONG_COMPOSITE, Deployment, EventFactory, count_of, deploy, poll
from tests.integration.test_metrics_values import STRONG_TEXT, _outputs_seen
from tests.integration.workload import Scrape, committed_offsets, scrape

T = TypeVar("T")


def _wait_until(probe: Callable[[], T | None], timeout: float, what: Callable[[], str]) -> T:
    """Poll `probe` until it returns a value; fail with `what()` (the state seen last) after `timeout`."""

    def attempt() -> T | None:
        try:
            return probe()
        except OSError:  # the web server is not up yet
            return None

    result = poll(attempt, lambda seen: seen is not None, timeout, 0.25)
    if result is None:
        raise AssertionError(f"timed out after {timeout:.0f}s: {what()}")
    return result


def _exported(s: Scrape) -> set[str]:
    return {name for name, _ in s.samples}


def _lag(s: Scrape, topic: str) -> dict[str, float]:
    return {
        dict(labels)["partition"]: v
        for labels, v in s.series("confidence_consumer_lag").items()
        if dict(labels)["topic"] == topic
    }


def test_every_dashboard_metric_is_exported_by_a_running_worker(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=1, CONFIDENCE_ON_LOW="reject")
    f = EventFactory(tenant="dash")
    allowed = f.response("d-r", token_logprobs=[-0.05], **STRONG_COMPOSITE)  # exp(-0.05) = 0.951: allow
    rejected = f.response("d-r", minutes=1, token_logprobs=[-3.0], **STRONG_COMPOSITE)  # 0.05 < 0.40: reject
    # No logprobs (missing, allowed); the clerk's composite (0.2 + 0.5) / 2 = 0.35 blocks it.
    clerk = f.response("d-c", agent="clerk-1", agent_type="clerk", response="Maybe it works, I think.")
    traffic = [
        f.tool("d-ev-1", "find", "Widget", result_count=2),  # adequate
        f.tool("d-ev-2", "ctest", "suite", tests_passed=False),  # weak: recovery recommended
        allowed,
        rejected,
        clerk,
        f.claim("d-s", "k1", statement="The function returns nil on error"),
        f.claim("d-s", "k2", statement="The function never returns nil"),
        f.response("d-s", role="sub_call", sub_call_id="sub-a", response=STRONG_TEXT, token_logprobs=[-0.05]),
        f.response("d-s", role="synthesis", response="Combined."),  # no logprobs: allow
    ]
    # Verdicts on three responses and on d-ev-2's evidence (no subject id: the trace's score); the first
    # is re-delivered. The calibration gauges and the outcome counter appear with the first matched outcome.
    right = f.outcome("d-r", minutes=2, subject_event_id=allowed["event_id"], correct=True)
    outcomes = [
        right,
        f.outcome("d-r", minutes=2, subject_event_id=rejected["event_id"], correct=False),
        f.outcome("d-c", minutes=2, subject_event_id=clerk["event_id"], correct=False),
        f.outcome("d-ev-2", minutes=2, correct=False),
        right,
    ]
    referenced = dashboard_metric_names(load_dashboard())
    d.start_worker()
    try:
        d.produce([*traffic, *outcomes])
        d.produce([b"{not json"], key=b"bad")
        records = d.collect(
            _outputs_seen(d, {"TRACE_SCORED": 2, "RESPONSE_SCORED": 5, "SYNTHESIS_SCORED": 1}, 1)
        )
        port = d.web_ports[0]
        last: list[Scrape] = []

        def complete() -> Scrape | None:
            last[:] = [scrape(port)]
            s = last[0]
            joined = s.value("confidence_outcomes_total", status="matched") == 4.0
            joined = (
                joined and s.value("confidence_outcomes_total", status="duplicate") == 1.0
            )  # re-delivered
            return s if referenced <= _exported(s) and joined else None

        # The lag gauge appears at the monitor's first sample (every 5 s); outcomes that came before their
        # score wait for it (`waiting`, then `matched`).
        s = _wait_until(
            complete,
            60,
            lambda: (
                f"not exported: {sorted(referenced - _exported(last[0]))}, "
                f"outcomes: {last[0].series('confidence_outcomes_total')}"
            ),
        )
        assert referenced - _exported(s) == set()
        assert s.series("confidence_response_actions_total") == {
            (("action", "allow"),): 4.0,
            (("action", "reject"),): 1.0,
        }
        assert s.total("llm_confidence_rejected_total", tenant="dash") == 1.0
        # Calibration: one series per (dimension, group, kind) the judged scores belong to.
        assert s.value("confidence_outcomes_total", status="duplicate") == 1.0
        assert s.value("confidence_outcomes_unmatched_total") == 0.0
        groups = {
            (labels["dimension"], labels["group"], labels["kind"])
            for labels in map(dict, s.series("confidence_calibration_ece"))
            if labels["tenant"] == "dash"
        }
        assert groups == {
            ("model", "gpt-4o", "response"),
            ("model", "gpt-4o", "composite"),
            ("agent_type", "planner", "response"),
            ("agent_type", "planner", "composite"),
            ("agent_type", "planner", "evidence"),
            ("agent_type", "clerk", "composite"),
        }
        assert set(s.series("confidence_calibration_brier")) == set(s.series("confidence_calibration_ece"))
        scored = {o["source_event_id"]: o for o in d.outputs(records)}
        histogram: calibration.Histogram = {}
        for response, observed in ((allowed, 1.0), (rejected, 0.0)):
            histogram = calibration.add(histogram, scored[response["event_id"]]["confidence"], observed)
        response_group = {"tenant": "dash", "dimension": "model", "group": "gpt-4o", "kind": "response"}
        assert s.value("confidence_calibration_ece", **response_group) == pytest.approx(
            calibration.ece(histogram), abs=1e-12
        )
        assert s.value("confidence_calibration_brier", **response_group) == pytest.approx(
            calibration.brier(histogram), abs=1e-12
        )
        # Lag series: this worker's partitions of the input and the internal repartition topics, nothing else.
        settings = d.settings
        topics = {dict(labels)["topic"] for labels in s.series("confidence_consumer_lag")}
        assert topics == {settings.input_topic_names[0], *settings.internal_topics}
        assert set(_lag(s, settings.input_topic_names[0])) == {"0"}
    finally:
        d.stop()


async def _committed(d: Deployment) -> dict[int, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=d.kafka.bootstrap_servers)
    await admin.start()
    try:
        return await committed_offsets(admin, d.settings.app_id, d.settings.input_topic_names[0], 1)
    finally:
        await admin.close()


def test_consumer_lag_counts_records_past_the_committed_offset(kafka: RunningBroker) -> None:
    # The second input batch fails on purpose: the worker keeps serving /metrics (FATAL_EXIT_DELAY_SECONDS)
    # but acknowledges nothing more, so its committed offset stays behind the records it was sent.
    d = deploy(kafka, partitions=1, FAULT_INJECTION="send:score-events:2", FATAL_EXIT_DELAY_SECONDS="40")
    f = EventFactory(tenant="lag")
    topic = d.settings.input_topic_names[0]
    worker = d.start_worker()
    try:
        d.produce([f.tool("lag-0", "find", "x")])
        d.collect(count_of("TRACE_SCORED", 1, d.settings.scored_topic))
        _wait_until(
            lambda: True if asyncio.run(_committed(d)).get(0) == 1 else None,
            30,
            lambda: f"group committed {asyncio.run(_committed(d))}, expected offset 1",
        )
        port = d.web_ports[0]
        _wait_until(
            lambda: True if _lag(scrape(port), topic) == {"0": 0.0} else None, 30, lambda: "lag never 0"
        )
        # One request per record: Tansu reports an exact end offset only after single-record batches (DESIGN 7).
        for i in range(3):
            d.produce([f.tool(f"lag-{i + 1}", "find", "x")])
        # End offset 4, committed offset 1.
        _wait_until(
            lambda: True if _lag(scrape(port), topic) == {"0": 3.0} else None,
            30,
            lambda: f"input lag {_lag(scrape(port), topic)}, expected 3 (worker alive: {worker.alive()})",
        )
        # The lag reads 3 once the records exist, whether or not batch 2 has failed yet.
        _wait_until(
            lambda: True if "injected send failure in score-events batch 2" in d.log_text() else None,
            30,
            lambda: "batch 2 never failed",
        )
        # Seen: no need to sit out FATAL_EXIT_DELAY_SECONDS before the worker exits by itself.
        assert worker.process is not None
        worker.process.kill()
        worker.process.wait(timeout=10)
    finally:
        d.stop()
