"""Through the broker: a failed send or table write never loses input; topics and health at start-up.

Failures are injected with FAULT_INJECTION (streams/faults.py): the named batch of the named agent
raises at its send or its table write. The worker must not acknowledge that batch and must stop with
exit status 70; its successor must then score every input (exactly once in the distinct-event-id
sense: one output event id per input, however many copies).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import pytest

from streams import harness
from streams.batch_runner import EXIT_BATCH_FAILED
from streams.config import load_settings
from streams.demo_runner import worker_env
from streams.harness import RunningBroker
from streams.kafka_io import Consumed, WorkerProcess
from tests.integration.fixtures import (
    Deployment,
    EventFactory,
    create_plain_topics,
    deploy,
    free_port,
    health,
    poll,
)
from tests.integration.workload import scrape


def _traffic(tenant: str, n: int = 60) -> list[dict[str, Any]]:
    """Responses, tool calls and claims over a few traces: outputs from all three stages."""
    f = EventFactory(tenant=tenant)
    events: list[dict[str, Any]] = []
    for i in range(n):
        trace = f"{tenant}-tr-{i % 6}"
        kind = i % 3
        if kind == 0:
            events.append(f.response(trace, minutes=i, agent=f"agent-{i % 4}", token_logprobs=[-0.1, -0.2]))
        elif kind == 1:
            events.append(f.tool(trace, "find", f"Sym{i}", minutes=i, result_count=1))
        else:
            events.append(
                f.claim(
                    f"{tenant}-claims",
                    f"c{i % 7}",
                    minutes=i,
                    relationships=[{"type": "contradicts", "target": f"c{(i + 3) % 7}", "strength": 0.5}],
                )
            )
    return events


def _own_outputs(d: Deployment, records: list[Consumed]) -> dict[str, set[str]]:
    """Input event id -> the distinct output event ids it caused as its own (claims: cause self)."""
    own: dict[str, set[str]] = {}
    for o in d.outputs(records):
        if o["event_type"] == "CLAIM_SCORED" and o["cause"] != "self":
            continue
        own.setdefault(o["source_event_id"], set()).add(o["event_id"])
    return own


def _collect_all(d: Deployment, ids: set[str], timeout: float = 120) -> list[Consumed]:
    """Outputs until every input in `ids` has its own output, or all that arrived by `timeout`."""
    seen: list[Consumed] = []

    def done(records: list[Consumed]) -> bool:
        seen[:] = records
        return ids <= set(_own_outputs(d, records))

    try:
        return d.collect(done, timeout=timeout)
    except TimeoutError:
        return seen  # the caller's assertion names what is missing


def _scored_by_a_successor(d: Deployment, events: list[dict[str, Any]], why: str) -> dict[str, set[str]]:
    """Start a worker without the fault (it re-reads from the committed offsets); every input must get
    its own output. Returns the output ids per input."""
    d.env.pop("FAULT_INJECTION")
    d.start_worker()
    own = _own_outputs(d, _collect_all(d, {e["event_id"] for e in events}))
    missing = [(e["event_id"], e["event_type"], e["trace_id"]) for e in events if e["event_id"] not in own]
    assert missing == [], f"{why}: inputs never scored ({len(missing)}): {missing[:8]}; logs in {d.workdir}"
    return own


def _inputs_processed(port: int) -> float:
    """`confidence_events_processed_total` over every event type: inputs stage 1 has processed."""
    samples = scrape(port, timeout=5).samples
    return sum(v for (name, _), v in samples.items() if name == "confidence_events_processed_total")


def _wait_exit(worker: WorkerProcess, timeout: float = 90) -> int:
    assert worker.process is not None
    return worker.process.wait(timeout=timeout)


@pytest.mark.parametrize(
    ("fault", "why"),
    [
        ("send:score-events:2", "stage 1's send refused"),
        ("table:score-events:2", "stage 1's table write failed"),
        ("send:score-responses:1", "stage 2's send refused"),
        ("table:score-claims:1", "stage 3's table write failed"),
    ],
)
def test_failed_batch_is_not_acknowledged_and_is_scored_after_restart(
    kafka: RunningBroker, fault: str, why: str
) -> None:
    d = deploy(kafka, partitions=2, BATCH_SIZE="10", FAULT_INJECTION=fault)
    events = _traffic(f"fault-{fault.split(':')[0]}-{fault.split(':')[1]}")
    ids = {e["event_id"] for e in events}
    failing = d.start_worker()
    try:
        d.produce(events)
        status = _wait_exit(failing)
        assert status == EXIT_BATCH_FAILED, f"{why}: worker exited {status}"
        log = d.log_text()
        assert "stopping the worker" in log and "injected" in log, why
        own = _scored_by_a_successor(d, events, why)
    finally:
        d.stop()
    # Exactly once by event id: each input caused one distinct output id (copies share it).
    several = {k: v for k, v in own.items() if k in ids and len(v) != 1}
    assert several == {}, f"{why}: inputs with several distinct output ids: {several}"


@pytest.mark.parametrize("send_timeout", [60.0, 3.0], ids=["within-the-send-timeout", "past-it"])
def test_a_broker_that_stops_answering_for_a_while_loses_nothing(send_timeout: float) -> None:
    """The broker stops answering (its process paused: a network partition, a long GC pause, a stuck
    disk) for twice the worker's session timeout while the worker has inputs in flight, then answers
    again. Within SEND_TIMEOUT_SECONDS the worker waits, /healthz and /readyz stay 200 (they describe
    the worker, not the broker) and it goes on; past it the worker stops as for a failed batch (exit
    70), which also shows the pause met sends in flight, and a successor takes over. Either way every
    input is scored, each once by output id. Its own broker: pausing the suite's would stall the rest."""
    with harness._tansu() as private:
        assert private.process is not None
        d = deploy(private, partitions=2, SEND_TIMEOUT_SECONDS=str(send_timeout))
        before, during = _traffic("pause-before", 30), _traffic("pause-during", 6_000)
        after = _traffic("pause-after", 30)
        worker = d.start_worker()
        try:
            d.produce(before)
            _collect_all(d, {e["event_id"] for e in before})
            d.produce(during)
            # Paused while the worker is part-way through them (a condition, not a time): it has
            # batches to finish, so sends are in flight or about to be when the broker goes silent.
            port, total = d.web_ports[0], len(before) + len(during)
            processed = poll(lambda: _inputs_processed(port), lambda n: n > len(before), 60, 0.02)
            private.process.send_signal(signal.SIGSTOP)
            # At least two batches left: stage 1 has sends to make while the broker is silent.
            left = total - processed
            assert processed > len(before) and left >= 2 * d.settings.batch_size, f"{processed} of {total}"
            health_seen: set[tuple[str, int]] = set()
            try:
                paused_until = time.monotonic() + 2 * d.settings.broker_session_timeout_seconds
                while time.monotonic() < paused_until and worker.alive():
                    for path in ("/healthz", "/readyz"):
                        with contextlib.suppress(OSError):  # the stopping worker's server goes away
                            health_seen.add((path, health(d.web_ports[0], path)[0]))
                    time.sleep(0.5)
            finally:
                private.process.send_signal(signal.SIGCONT)
            if send_timeout < 2 * d.settings.broker_session_timeout_seconds:
                assert _wait_exit(worker) == EXIT_BATCH_FAILED, d.log_tails()
                d.start_worker()
            else:
                assert worker.alive(), d.log_tails()
                assert health_seen == {("/healthz", 200), ("/readyz", 200)}, health_seen
            d.produce(after)
            ids = {e["event_id"] for e in before + during + after}
            records = _collect_all(d, ids, timeout=180)
            assert d.workers[-1].alive(), d.log_tails()
        finally:
            d.stop()
    own = _own_outputs(d, records)
    assert ids <= set(own), f"{len(ids - set(own))} inputs without output"
    several = {k: v for k, v in own.items() if k in ids and len(v) != 1}
    assert several == {}, f"inputs with several distinct output ids: {several}"


def test_a_failed_expiry_sweep_stops_the_worker_and_loses_nothing(kafka: RunningBroker) -> None:
    """The sweep runs on a Faust timer, whose exception crashed the app through Faust's graceful
    shutdown (not exit 70, /healthz "ok" while it ran). It stops the worker as a failed batch does."""
    d = deploy(
        kafka,
        partitions=1,
        BATCH_SIZE="5",
        SWEEP_INTERVAL_SECONDS="0.5",
        FAULT_INJECTION="sweep:expiry:2",
        FATAL_EXIT_DELAY_SECONDS="10",
    )
    events = _traffic("sweep-fault", n=60)
    try:
        d.produce(events)  # read while the sweeps run: the failure lands between batches
        failing = d.start_worker()
        port = d.web_ports[0]
        reason = None
        deadline = time.monotonic() + 90
        while reason is None and time.monotonic() < deadline and failing.alive():
            try:
                status, body = health(port, "/healthz")
            except OSError:
                status, body = 0, {}
            if status == 503:
                reason = body["reason"]
            time.sleep(0.05)
        assert reason is not None and reason.startswith("stopping: the expiry sweep failed: InjectedFault"), (
            reason,
            d.log_text()[-2000:],
        )
        assert _wait_exit(failing) == EXIT_BATCH_FAILED
        _scored_by_a_successor(d, events, "a failed sweep")
    finally:
        d.stop()


def test_health_and_readiness_tell_the_truth(kafka: RunningBroker) -> None:
    # The 503 window is FATAL_EXIT_DELAY_SECONDS: 10 s rather than the default 3, so that a busy machine
    # (two test processes on two cores) still sees both endpoints answer before the exit.
    d = deploy(
        kafka,
        partitions=1,
        BATCH_SIZE="5",
        FAULT_INJECTION="send:score-events:3",
        FATAL_EXIT_DELAY_SECONDS="10",
    )
    worker = d.start_worker()
    port = d.web_ports[0]
    seen: list[tuple[str, int, str]] = []
    try:
        # Ready only once assigned and recovered; alive meanwhile.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                status, body = health(port, "/readyz")
            except OSError:
                time.sleep(0.05)
                continue
            seen.append(("readyz", status, body["reason"]))
            if status == 200:
                break
            time.sleep(0.05)
        assert seen and seen[-1][1] == 200 and seen[-1][2] == "ready"
        assert health(port, "/healthz")[0] == 200
        # Now feed it until the third batch fails: both endpoints answer 503 with the reason.
        d.produce(_traffic("health", n=40))
        failing: dict[str, tuple[int, dict[str, Any]]] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(failing) < 2 and worker.alive():
            for path in ("/healthz", "/readyz"):
                try:
                    status, body = health(port, path)
                except OSError:
                    continue
                if status == 503:
                    failing[path] = (status, body)
            time.sleep(0.02)
        assert set(failing) == {"/healthz", "/readyz"}, f"saw {failing} before the worker exited"
        for _status, body in failing.values():
            assert body["reason"].startswith("stopping: score-events failed a batch of 5")
        assert _wait_exit(worker) == EXIT_BATCH_FAILED
    finally:
        d.stop()


def _platform_env(kafka: RunningBroker, **extra: str) -> dict[str, str]:
    suffix = f"-p{os.urandom(4).hex()}"
    workdir = tempfile.mkdtemp(prefix=f"confidence-platform{suffix}-")  # under pytest's base temp dir
    return worker_env(kafka, suffix, workdir, free_port(), **extra)


def _public_topics_only(kafka: RunningBroker, **extra: str) -> Deployment:
    """What a platform team might set up: the four public topics (1 partition), no internal ones."""
    env = _platform_env(kafka, TOPIC_PARTITIONS="1", **extra)
    settings = load_settings(**{k.lower(): v for k, v in env.items()})
    public = [
        settings.input_topic_names[0],
        settings.scored_topic,
        settings.flagged_topic,
        settings.dlq_topic,
    ]
    asyncio.run(create_plain_topics(kafka.bootstrap_servers, public, 1))
    return Deployment(kafka, "", settings, env, env["DATA_DIR"])


def test_faust_environment_variables_of_its_own_do_not_reach_the_worker(kafka: RunningBroker) -> None:
    """A deployment's environment can hold a variable Faust reads (here left by another Faust app).
    Before the thirtieth round it overrode the worker's own setting past streams/config.py:
    `APP_WEB_ENABLED=false` left the worker without /healthz, /readyz, /metrics and views. (`latest` is
    harmless to the input: recovery seeks partitions without a committed offset to their beginning.)"""
    d = deploy(kafka, partitions=1)
    events = [EventFactory(tenant="faust-env").response(f"fe-{i}", minutes=i) for i in range(5)]
    ids = {e["event_id"] for e in events}
    d.produce(events)  # before the worker's group exists
    d.start_worker(CONSUMER_AUTO_OFFSET_RESET="latest", APP_WEB_ENABLED="false")
    try:
        records = _collect_all(d, ids)
        status, body = health(d.web_ports[0], "/readyz")
    finally:
        d.stop()
    assert ids <= set(_own_outputs(d, records))
    assert (status, body["status"]) == (200, "ready")


def test_worker_creates_missing_internal_topics(kafka: RunningBroker) -> None:
    """A platform team created only the four public topics (1 partition) and no internal ones."""
    d = _public_topics_only(kafka)
    events = [EventFactory(tenant="platform").response(f"pl-{i}", minutes=i) for i in range(20)]
    ids = {e["event_id"] for e in events}
    d.start_worker()
    try:
        d.produce(events)
        records = _collect_all(d, ids)
        log = d.log_text()
    finally:
        d.stop()
    assert ids <= set(_own_outputs(d, records))
    assert "created missing topics" in log and "agent-history-changelog" in log
    assert "Traceback" not in log


def test_partition_mismatch_stops_start_up_with_one_clear_line(kafka: RunningBroker) -> None:
    env = _platform_env(kafka, TOPIC_PARTITIONS="4")
    settings = load_settings(**{k.lower(): v for k, v in env.items()})
    asyncio.run(create_plain_topics(kafka.bootstrap_servers, [settings.input_topic_names[0]], 2))
    done = subprocess.run(
        [sys.executable, "-m", "streams.cli", "worker"],
        env={**os.environ, **env},
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = [line for line in done.stderr.decode().splitlines() if "partitions" in line]
    assert lines == [
        f"confidence-streams worker: topic {settings.input_topic_names[0]} has 2 partitions but "
        "TOPIC_PARTITIONS=4: make them equal (recreate the topic or set TOPIC_PARTITIONS)"
    ]


def test_no_output_lost_when_topics_were_created_by_someone_else_and_worker_restarts(
    kafka: RunningBroker,
) -> None:
    """The issue's reproduction: public topics only, a worker, then a second worker after the first."""
    d = _public_topics_only(kafka, BATCH_SIZE="5")
    f = EventFactory(tenant="restart")
    first_half = [f.response(f"rs-{i}", minutes=i, agent=f"a{i % 3}") for i in range(10)]
    second_half = [f.response(f"rs-{i}", minutes=i, agent=f"a{i % 3}") for i in range(10, 20)]
    ids = {e["event_id"] for e in first_half + second_half}
    first = d.start_worker()
    try:
        d.produce(first_half)
        d.collect(lambda rs: len(_own_outputs(d, rs)) >= 3, timeout=90)
        assert first.stop() == 0
        d.produce(second_half)
        d.start_worker()
        records = _collect_all(d, ids)
    finally:
        d.stop()
    outputs = [o for o in d.outputs(records) if o["source_event_id"] in ids]
    assert {o["source_event_id"] for o in outputs} == ids
