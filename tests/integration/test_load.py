"""Sustained load: the worker keeps up with 80 % of its measured maximum and drains its lag afterwards.

First the maximum: a preload of events is produced as fast as possible and timed until the worker has
emitted every output it causes (all three stages). Then a paced producer offers 80 % of that rate for
LOAD_SECONDS; afterwards the consumer group's committed offsets on the input topic (the app id is the
group id) must reach the end of every partition, every output must have been emitted once, and nothing
valid may have been dead-lettered. Prints the maximum, the offered rate and the lag samples. No timing
assertion (DESIGN section 10): the rates are measured, only the drain has a (generous) deadline.

Shortened in plain runs (6,000 preloaded events, 20 s of load); the full run (40,000 preloaded, 300 s):

    .venv/bin/pytest -m soak -s tests/integration/test_load.py

`LOAD_SECONDS` and `LOAD_PRELOAD_EVENTS` override either size.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streams.demo import encode
from streams.harness import RunningBroker
from tests.integration.fixtures import Deployment, EventFactory, deploy
from tests.integration.workload import (
    BLOCK,
    EVENTS_PER_TRACE,
    SECONDS_PER_EVENT,
    CpuMeter,
    committed_offsets,
    lag,
    outputs_of,
    scrape,
    sized,
    soak_events,
    wait_for_metrics,
)

# Rate- and timing-based: `make test` runs these alone, after the parallel run of the rest.
pytestmark = pytest.mark.serial

TICK_SECONDS = 0.05
SAMPLE_SECONDS = 2.0
QUIET_SECONDS = 10.0


@dataclass
class Sample:
    seconds: float
    offered: int
    input_lag: int  # records produced to the input topic and not yet committed by the group
    outputs_behind: int  # outputs the offered events cause that the worker has not emitted yet
    worker_cpu: float  # percent of one core since the previous sample
    machine_cpu: float  # all processes, percent of one core (2 cores = 200)


@dataclass
class Producer:
    """One producer for every phase; remembers each partition's end and the outputs owed.

    Partition ends come from the producer's acknowledgements, not ListOffsets: Tansu's high watermark
    lags the real end after multi-record batches (DESIGN section 7).
    """

    producer: AIOKafkaProducer
    topic: str
    traffic: Iterator[tuple[int, bytes, dict[str, Any]]]
    ends: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    pending: list[asyncio.Future[Any]] = field(default_factory=list)
    sent: int = 0
    outputs_owed: int = 0
    owed_by_type: Counter[str] = field(default_factory=Counter)

    async def send(self, count: int) -> None:
        for _ in range(count):
            outputs, key, event = next(self.traffic)
            self.pending.append(await self.producer.send(self.topic, encode(event), key=key))
            self.sent += 1
            self.outputs_owed += outputs
            self.owed_by_type.update(outputs_of(event))

    async def settle(self) -> None:
        await self.producer.flush()
        for future in self.pending:
            meta = await future
            self.ends[meta.partition] = max(self.ends[meta.partition], meta.offset + 1)
        self.pending.clear()


async def _outputs(port: int) -> float:
    return (await asyncio.to_thread(scrape, port)).total("confidence_outputs_emitted_total")


async def _wait_outputs(port: int, sent: int, owed: int, timeout: float) -> float:
    """Wait until the worker emitted the `owed` outputs of `sent` inputs; return the monotonic time of
    the last output. If the outputs stop short (every input processed, no new output for QUIET_SECONDS),
    return too: the test's final count assertion reports what is missing."""
    deadline = time.monotonic() + timeout
    last_emitted, last_change = -1.0, time.monotonic()
    while True:
        metrics = await asyncio.to_thread(scrape, port)
        emitted = metrics.total("confidence_outputs_emitted_total")
        now = time.monotonic()
        if emitted != last_emitted:
            last_emitted, last_change = emitted, now
        if emitted >= owed:
            return now
        if metrics.total("confidence_events_processed_total") >= sent and now - last_change >= QUIET_SECONDS:
            return last_change
        assert now < deadline, f"{emitted:.0f} of {owed} outputs after {timeout:.0f}s"
        await asyncio.sleep(0.1)


@dataclass
class Measured:
    max_rate: float
    offered_rate: float
    achieved_rate: float
    samples: list[Sample]
    drained_after: float
    sent: int
    outputs_owed: int
    owed_by_type: Counter[str]


@dataclass
class Observer:
    """Samples the group's lag on the input topic, the outputs still owed and CPU use."""

    d: Deployment
    port: int
    admin: AIOKafkaAdminClient
    cpu: CpuMeter
    started: float = 0.0

    async def sample(self, p: Producer) -> Sample:
        await p.settle()
        settings = self.d.settings
        committed = await committed_offsets(
            self.admin, settings.app_id, settings.input_topic_names[0], settings.topic_partitions
        )
        behind = p.outputs_owed - int(await _outputs(self.port))
        worker_cpu, machine_cpu = self.cpu.read()
        return Sample(
            time.monotonic() - self.started, p.sent, lag(committed, p.ends), behind, worker_cpu, machine_cpu
        )


async def _run(
    d: Deployment, pid: int, port: int, preload: int, load_seconds: float, drain_timeout: float
) -> Measured:
    bootstrap = d.kafka.bootstrap_servers
    kafka_producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=262_144)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await kafka_producer.start()
    await admin.start()
    p = Producer(kafka_producer, d.settings.input_topic_names[0], soak_events(EventFactory().run, 10**9))
    observer = Observer(d, port, admin, CpuMeter(pid))
    try:
        # Warm-up: one block of traces, so the worker has joined its group and every stage has run.
        await p.send(BLOCK * EVENTS_PER_TRACE)
        await p.settle()
        await _wait_outputs(port, p.sent, p.outputs_owed, 90)

        # The maximum: a preload produced at once, timed until every output it causes was emitted.
        started = time.monotonic()
        await p.send(preload)
        await p.settle()
        produced_in = time.monotonic() - started
        done = await _wait_outputs(port, p.sent, p.outputs_owed, max(90, preload / 50))
        max_rate = preload / (done - started)
        print(f"\nmaximum: {preload} events in {preload / max_rate:.1f}s = {max_rate:.0f} events/s")
        print(f"(producing them took {produced_in:.1f}s)")

        # 80 % of it, paced in ticks, for load_seconds.
        offered_rate = 0.8 * max_rate
        samples: list[Sample] = []
        first_sent = p.sent
        started = observer.started = time.monotonic()
        observer.cpu.read()
        next_sample = started
        while (elapsed := time.monotonic() - started) < load_seconds:
            await p.send(int(offered_rate * elapsed) - (p.sent - first_sent))
            if time.monotonic() >= next_sample:
                samples.append(await observer.sample(p))
                next_sample += SAMPLE_SECONDS
            await asyncio.sleep(TICK_SECONDS)
        await p.settle()
        load_elapsed = time.monotonic() - started
        achieved_rate = (p.sent - first_sent) / load_elapsed

        # Stop offering: the group's lag must return to zero and every output must be emitted.
        stopped = last_change = time.monotonic()
        while True:
            sample = await observer.sample(p)
            if sample.outputs_behind != samples[-1].outputs_behind:
                last_change = time.monotonic()
            samples.append(sample)
            quiet = time.monotonic() - last_change >= QUIET_SECONDS  # outputs stopped short: asserted below
            if sample.input_lag == 0 and (sample.outputs_behind <= 0 or quiet):
                break
            assert time.monotonic() - stopped < drain_timeout, (
                f"lag not drained {drain_timeout:.0f}s after the load stopped: {sample}"
            )
            await asyncio.sleep(0.5)
        drained_after = time.monotonic() - stopped
        return Measured(
            max_rate,
            offered_rate,
            achieved_rate,
            samples,
            drained_after,
            p.sent,
            p.outputs_owed,
            p.owed_by_type,
        )
    finally:
        await kafka_producer.stop()
        await admin.close()


async def _dlq_records(bootstrap: str, topic: str, partitions: int) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    finally:
        await consumer.stop()
    return sum(ends.values())


@pytest.mark.soak
@pytest.mark.timeout(7200)
def test_sustained_load_at_80_percent_of_max(kafka: RunningBroker, request: pytest.FixtureRequest) -> None:
    preload = int(sized(request.config, "LOAD_PRELOAD_EVENTS", 40_000, 6_000))
    load_seconds = sized(request.config, "LOAD_SECONDS", 300, 20)
    # State stays bounded over a long run: traces and claims expire after 20,000 events of event time
    # (far more than a batch spans, so expiry never meets a trace still in progress), agent history
    # after 4,000 (each agent's history is re-read and re-written with every response).
    hours = SECONDS_PER_EVENT / 3600
    d = deploy(
        kafka,
        TRACE_TTL_HOURS=f"{20_000 * hours:.6f}",
        CLAIM_TTL_DAYS=f"{20_000 * hours / 24:.8f}",
        HISTORY_WINDOW_HOURS=f"{2_000 * hours:.6f}",
        HISTORY_RETENTION_HOURS=f"{4_000 * hours:.6f}",
        SWEEP_INTERVAL_SECONDS="1",
        EXPIRY_SOURCE_IDLE_SECONDS="2",  # the default 300 s start-up grace would outlast a short run
        # Synthetic event times run days past the wall clock: let the expiry clock follow them.
        EVENT_TIME_MAX_AHEAD_HOURS="876600",
    )
    worker = d.start_worker()
    assert worker.process is not None
    port = d.web_ports[0]
    try:
        wait_for_metrics(port)
        measured = asyncio.run(
            _run(d, worker.process.pid, port, preload, load_seconds, drain_timeout=max(60.0, load_seconds))
        )
        metrics = scrape(port)
        dlq = asyncio.run(
            _dlq_records(kafka.bootstrap_servers, d.settings.dlq_topic, d.settings.topic_partitions)
        )
    finally:
        d.stop()

    print(
        f"offered {measured.offered_rate:.0f} events/s (80 % of {measured.max_rate:.0f}), "
        f"achieved {measured.achieved_rate:.0f} events/s for {load_seconds:.0f}s; "
        f"lag drained {measured.drained_after:.1f}s after the load stopped"
    )
    print(
        f"{'t s':>7} {'offered':>9} {'input lag':>10} {'outputs behind':>15} {'worker %':>9} {'machine %':>10}"
    )
    for s in measured.samples:
        print(
            f"{s.seconds:7.1f} {s.offered:9d} {s.input_lag:10d} {s.outputs_behind:15d} "
            f"{s.worker_cpu:9.0f} {s.machine_cpu:10.0f}"
        )

    assert metrics.total("confidence_events_dead_lettered_total") == 0
    assert dlq == 0
    assert metrics.total("confidence_events_processed_total") == measured.sent
    assert measured.samples[-1].input_lag == 0
    emitted = {
        dict(labels)["event_type"]: value
        for labels, value in metrics.series("confidence_outputs_emitted_total").items()
    }
    assert emitted == measured.owed_by_type, f"emitted {emitted}, owed {dict(measured.owed_by_type)}"
