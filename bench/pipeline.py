"""The whole pipeline on the harness broker, against Faust passthrough agents measured in the same run.

`python -m bench.pipeline` (also part of `make bench`). One broker for everything; every run gets fresh
topics, a fresh consumer group and fresh worker processes. Sections:

1. Throughput on a preloaded realistic mix (bench/mix.py), timed from the first output's record
   timestamp to the last, for the naive passthrough (`async for` + `await topic.send` per event, on
   Faust's own consumer: the baseline), the same passthrough on the worker's consumer
   (streams/transport.py, which hands records to the streams more cheaply), the batched passthrough
   (`noack_take`, the app's producer, futures awaited, then ack; the shape of the service's agents,
   on Faust's consumer) and the confidence-streams worker, which is done when every input has its own
   output (RESPONSE_SCORED, TRACE_SCORED, CLAIM_SCORED with cause self, or a dead letter). Worker CPU
   (utime + stime) over the same window per input event, and resident memory (VmRSS).
2. Latency: a paced producer at half the worker's measured throughput; each output's record timestamp
   (set by the worker's producer) minus its input's producer timestamp, both from this machine's clock.
3. Memory: RSS, events processed and table sizes sampled while a larger preloaded run streams through;
   the ratio reads the end and the half-way point off a line fitted to the second half's samples.
4. Scale-out: 1 vs 2 workers on 4 partitions (started, ready, then the mix produced at once), pairs run
   alternately (3, or 1 with BENCH_QUICK); the median ratio and its spread.

Environment: `BENCH_QUICK=1` (one run, smaller sizes), `BENCH_PARTITIONS` (sections 1-2, default 1),
`BENCH_MEMORY_EVENTS` (default 100000, over a tenth as many traces), `BENCH_MEMORY_SECONDS` (time cap of
section 3, default 150), `BENCH_PROFILE=1` (one extra, untimed worker run under py-spy: top self time),
`BENCH_ONLY` (comma-separated sections: throughput, latency, memory, scale; latency implies throughput),
`BENCH_DIAG=1` (each scale-out worker's `confidence_batch_seconds` after its run),
`CONSUMER_FETCH_MAX_WAIT_MS` (given to the worker and to the passthroughs alike). The last column of
the table, "others", is the CPU (in cores) that processes outside this benchmark used meanwhile: on a
shared 2-core machine that is the first thing to check before trusting a figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import ConsumerRecord
from rich.console import Console
from rich.table import Table

from bench import summary
from bench.mix import Mix, build_mix
from bench.passthrough import FAUST_FETCH_MAX_WAIT_MS
from streams.config import Settings, load_settings
from streams.demo_runner import worker_env
from streams.harness import RunningBroker, broker, free_port
from streams.kafka_io import dies_with_parent
from streams.topics import create_topics
from streams.transport import SKIPPED_OFFSETS

__all__ = ["main"]

QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
RUNS = 1 if QUICK else 3
MIX_EVENTS = 1_500 if QUICK else 6_000
MIX_TRACES = MIX_EVENTS // 7  # seven events per trace: 2 responses, 3 tools, 2 claims
PARTITIONS = int(os.environ.get("BENCH_PARTITIONS", "1"))
LATENCY_SECONDS = 4.0 if QUICK else 10.0
LATENCY_LOAD = 0.5  # share of the worker's measured throughput
WARMUP_EVENTS = 200
MEMORY_EVENTS = int(os.environ.get("BENCH_MEMORY_EVENTS", "10000" if QUICK else "100000"))
MEMORY_SECONDS = float(os.environ.get("BENCH_MEMORY_SECONDS", "60" if QUICK else "150"))
MEMORY_SPAN_DAYS = 120.0  # event time covered by the memory run: past every TTL (traces 24 h, claims 30 d)
MEMORY_SWEEP_SECONDS = 5.0  # the expiry sweep, compressed like the event time
# The expiry watermarks' idle span and start-up grace (300 s by default), compressed too: the run is
# shorter than the default, which would keep claims and calibration state unswept throughout it.
MEMORY_SOURCE_IDLE_SECONDS = 5.0
SCALE_PARTITIONS = 4
SCALE_EVENTS = 3_000 if QUICK else 12_000
PROFILE = os.environ.get("BENCH_PROFILE", "") not in ("", "0")
RUN_TIMEOUT = 300.0
CLOCK_TICK = os.sysconf("SC_CLK_TCK")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bench/ is not an installed package

console = Console()
if not console.is_terminal:
    console = Console(width=200)  # a log or a pipe: keep the table's rows on one line each


# --- processes and /proc ---------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` in seconds (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICK


def rss_mb(pid: int) -> float:
    """VmRSS of `pid` in MB."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def broker_pids() -> list[int]:
    """The embedded broker's processes (children of this one named tansu); none for another broker."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{entry}/stat") as handle:
                name, _, rest = handle.read().partition(" (")[2].rpartition(")")
                parent = int(rest.split()[1])
            if parent == os.getpid() and name.startswith("tansu"):
                found.append(int(entry))
    return found


class Proc:
    """A worker subprocess (the service's or a passthrough), its output in a log file."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], log_path: str, web_port: int) -> None:
        self.argv = list(argv)
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.web_port = web_port
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=dies_with_parent()
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)

    def log_tail(self, lines: int = 25) -> str:
        with contextlib.suppress(OSError), open(self.log_path, errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
        return ""


class Sampler:
    """CPU seconds and RSS of some processes, sampled on the event loop every `interval` seconds."""

    def __init__(self, pids: Sequence[int], interval: float = 0.02) -> None:
        self.pids = list(pids)
        self.interval = interval
        self.samples: list[tuple[float, float, float]] = []  # (wall time, CPU s summed, RSS MB summed)
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        try:
            cpu = sum(cpu_seconds(p) for p in self.pids)
            rss = sum(rss_mb(p) for p in self.pids)
        except (OSError, IndexError, ValueError):
            return  # a process ended
        self.samples.append((time.time(), cpu, rss))

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval)

    def start(self) -> Sampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.sample()

    def cpu_at(self, when: float) -> float:
        """CPU seconds at wall time `when`, interpolated between the samples around it."""
        samples = self.samples
        if not samples:
            return 0.0
        if when <= samples[0][0]:
            return samples[0][1]
        for (t0, c0, _), (t1, c1, _) in itertools.pairwise(samples):
            if t0 <= when <= t1:
                return c0 + (c1 - c0) * (when - t0) / max(t1 - t0, 1e-9)
        return samples[-1][1]

    def rss_max(self, start: float, end: float) -> float:
        inside = [rss for t, _, rss in self.samples if start - 0.1 <= t <= end + 0.1]
        return max(inside or [s[2] for s in self.samples[-1:]] or [0.0])


# --- Kafka -----------------------------------------------------------------------------------------


@dataclass
class Produced:
    """What was produced: each input's event id, producer timestamp and place in the topic."""

    timestamp_ms: dict[str, int] = field(default_factory=dict)
    place: dict[tuple[int, int], str] = field(default_factory=dict)  # (partition, offset) -> event id


async def produce(
    bootstrap: str, topic: str, mix: Mix, produced: Produced, rate: float | None = None
) -> None:
    """Send every record of `mix` (Kafka's default partitioner on the key); paced at `rate` per second
    if given, else as fast as the producer goes."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        linger_ms=0 if rate else 5,
        max_batch_size=262_144,
    )
    await producer.start()
    try:
        futures = []
        started = time.monotonic()
        for index, ((key, value), event_id) in enumerate(zip(mix.records, mix.event_ids, strict=True)):
            if rate:
                due = started + index / rate
                delay = due - time.monotonic()
                if delay > 0.001:
                    await asyncio.sleep(delay)
            stamp = int(time.time() * 1000)
            produced.timestamp_ms[event_id] = stamp
            futures.append((event_id, await producer.send(topic, value, key=key, timestamp_ms=stamp)))
        await producer.flush()
        for event_id, future in futures:
            metadata = await future
            produced.place[(metadata.partition, metadata.offset)] = event_id
    finally:
        await producer.stop()


class Tracker:
    """Follows output records until every expected input has its own output (or a dead letter)."""

    def __init__(
        self, expected: Iterable[str], produced: Produced, input_topic: str, dlq_topic: str | None
    ) -> None:
        self.pending = set(expected)
        self.expected = len(self.pending)
        self.produced = produced
        self.input_topic = input_topic
        self.dlq_topic = dlq_topic
        self.completed_ms: dict[str, int] = {}  # input event id -> timestamp of its own output
        # Output kind -> milliseconds from the input's producer timestamp to the output's arrival here
        # (what a consumer of the scored topic sees), and to the output's creation (its record timestamp,
        # set when the worker appended it to a batch: before its send, the broker and this reader).
        self.latency_ms: dict[str, list[int]] = {}
        self.created_ms: dict[str, list[int]] = {}
        self.kinds: Counter[str] = Counter()
        self.dead = 0
        self.dead_reasons: Counter[str] = Counter()
        self.records = 0

    @property
    def done(self) -> bool:
        return not self.pending

    def missing(self) -> list[tuple[int, int, str]]:
        """(input partition, offset, event id) of each input still without its output, in input order."""
        return sorted(
            (*place, event_id) for place, event_id in self.produced.place.items() if event_id in self.pending
        )

    def add(self, record: ConsumerRecord[bytes, bytes], arrived_ms: int) -> None:
        self.records += 1
        if record.topic == self.dlq_topic:
            headers = dict(record.headers or ())
            self.dead += 1
            self.dead_reasons[headers.get("__connect.errors.reason", b"?").decode()] += 1
            if headers.get("__connect.errors.topic", b"").decode() != self.input_topic:
                return  # a later stage refused an internal record: its place is not an input's
            place = (
                int(headers.get("__connect.errors.partition", b"-1")),
                int(headers.get("__connect.errors.offset", b"-1")),
            )
            self._complete(self.produced.place.get(place), "DLQ", record.timestamp, arrived_ms)
            return
        try:
            output = orjson.loads(record.value or b"{}")
        except orjson.JSONDecodeError:  # never expected: every output (and every mix input) is JSON
            self.kinds["<not JSON>"] += 1
            return
        kind = output.get("event_type", "?")
        self.kinds[kind] += 1
        if "source_event_id" not in output:  # a passthrough forwards the input itself
            self._complete(output.get("event_id"), kind, record.timestamp, arrived_ms)
        elif kind in ("RESPONSE_SCORED", "TRACE_SCORED") or (
            kind == "CLAIM_SCORED" and output.get("cause") == "self"
        ):
            self._complete(output["source_event_id"], kind, record.timestamp, arrived_ms)
        elif kind == "SYNTHESIS_SCORED":
            self._latency(output["source_event_id"], kind, record.timestamp, arrived_ms)

    def check_clean(self) -> None:
        """Raise if anything was dead-lettered: the mixes hold no bad events, so a dead letter is a
        valid input the worker refused, and a run that counted it as done would look faster."""
        if self.dead:
            raise RuntimeError(
                f"{self.dead} dead letters on a mix without bad events: {dict(self.dead_reasons)}"
            )

    def _complete(self, event_id: str | None, kind: str, created_ms: int, arrived_ms: int) -> None:
        if event_id is None or event_id not in self.pending:
            return
        self.pending.discard(event_id)
        self.completed_ms[event_id] = created_ms
        self._latency(event_id, kind, created_ms, arrived_ms)

    def _latency(self, event_id: str, kind: str, created_ms: int, arrived_ms: int) -> None:
        sent = self.produced.timestamp_ms.get(event_id)
        if sent is not None:
            self.latency_ms.setdefault(kind, []).append(arrived_ms - sent)
            self.created_ms.setdefault(kind, []).append(created_ms - sent)


async def follow(
    bootstrap: str,
    topics: Sequence[str],
    tracker: Tracker,
    timeout: float,
    deployment: Deployment | None = None,
    fetch_wait: int = 50,
) -> None:
    """Read `topics` from the beginning into `tracker` until it is done; TimeoutError after `timeout`.
    A worker of `deployment` that exits fails the run at once, with its log, rather than at the timeout."""
    consumer = AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
        fetch_max_wait_ms=fetch_wait,
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    await consumer.start()
    deadline = time.monotonic() + timeout
    try:
        while not tracker.done:
            if deployment is not None:
                deployment.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(tracker.pending)} of {tracker.expected} inputs without their output "
                    f"after {timeout:.0f}s ({tracker.records} output records read); first missing "
                    f"(input partition, offset, event id): {tracker.missing()[:5]}"
                    + (deployment.skipped_offsets() if deployment is not None else "")
                )
            batches = await consumer.getmany(timeout_ms=200, max_records=20_000)
            arrived_ms = int(time.time() * 1000)
            for batch in batches.values():
                for record in batch:
                    tracker.add(record, arrived_ms)
    finally:
        await consumer.stop()


async def produce_and_follow(
    kafka: RunningBroker, deployment: Deployment, mix: Mix, fetch_wait: int, rate: float | None = None
) -> Tracker:
    """Produce `mix` to the deployment's input while following its outputs until every input has its
    own; fails if a worker exits or anything is dead-lettered (the mixes hold no bad events)."""
    tracker = Tracker(mix.event_ids, Produced(), deployment.input_topic, deployment.dlq_topic)
    await asyncio.gather(
        produce(kafka.bootstrap_servers, deployment.input_topic, mix, tracker.produced, rate=rate),
        follow(
            kafka.bootstrap_servers, deployment.follow_topics, tracker, RUN_TIMEOUT, deployment, fetch_wait
        ),
    )
    tracker.check_clean()
    return tracker


# --- deployments -------------------------------------------------------------------------------------


def fetch_wait_setting() -> tuple[int, bool]:
    """The fetch wait both sides get, and whether the worker has the setting (else it uses Faust's 1500)."""
    has_setting = "consumer_fetch_max_wait_ms" in Settings.model_fields
    configured = os.environ.get("CONSUMER_FETCH_MAX_WAIT_MS", "").strip()
    if configured:
        return int(configured), has_setting
    if has_setting:
        return int(getattr(load_settings(), "consumer_fetch_max_wait_ms")), True  # noqa: B009
    return FAUST_FETCH_MAX_WAIT_MS, False


@dataclass
class Deployment:
    """Private topics and the worker processes of one contestant."""

    kind: str  # "naive", "naive-ours", "batched" or "pipeline"
    bootstrap: str
    workdir: str
    partitions: int
    input_topic: str
    follow_topics: list[str]
    dlq_topic: str | None
    env: dict[str, str]
    procs: list[Proc] = field(default_factory=list)

    def start_worker(self) -> Proc:
        port = free_port()
        number = len(self.procs)
        env = {**self.env, "WEB_PORT": str(port), "DATA_DIR": os.path.join(self.workdir, f"data-{number}")}
        if self.kind == "pipeline":
            argv = [sys.executable, "-m", "streams.cli", "worker"]
        else:
            argv = [sys.executable, "-m", "bench.passthrough", "worker"]
            env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
        proc = Proc(argv, env, os.path.join(self.workdir, f"worker-{number}.log"), port).start()
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()

    def skipped_offsets(self) -> str:
        """The workers' log lines saying the broker skipped offsets of an internal topic (Tansu does
        under concurrent appends, README "Brokers"): the likely cause of inputs without output."""
        lines = []
        for proc in self.procs:
            with open(proc.log_path, errors="replace") as log:
                lines += [line.strip() for line in log if SKIPPED_OFFSETS in line]
        return "; the broker skipped offsets (README 'Brokers'): " + " | ".join(lines) if lines else ""

    def check_alive(self) -> None:
        for proc in self.procs:
            if not proc.alive():
                raise RuntimeError(f"worker {proc.pid} exited; log {proc.log_path}:\n{proc.log_tail()}")


async def deploy(
    kind: str, kafka: RunningBroker, partitions: int, fetch_wait: int, **extra: str
) -> Deployment:
    """Fresh topics and environment for `kind`; no worker started yet."""
    suffix = f"-b{uuid.uuid4().hex[:8]}"
    workdir = tempfile.mkdtemp(prefix=f"bench-{kind}-", dir=WORKDIR)
    env = worker_env(
        kafka,
        suffix,
        workdir,
        0,
        TOPIC_PARTITIONS=str(partitions),
        CONSUMER_FETCH_MAX_WAIT_MS=str(fetch_wait),
        **extra,
    )
    settings = load_settings(**{k.lower(): v for k, v in env.items()})
    if kind == "pipeline":
        await create_topics(settings)
        return Deployment(
            kind,
            kafka.bootstrap_servers,
            workdir,
            partitions,
            settings.input_topic_names[0],
            [settings.scored_topic, settings.dlq_topic],
            settings.dlq_topic,
            env,
        )
    # The passthrough gets the worker's settings (group timeouts, producer batching, batch size).
    topic_in, topic_out = f"bench-in-{kind}{suffix}", f"bench-out-{kind}{suffix}"
    env.update(
        PASSTHROUGH_MODE=kind.removesuffix("-ours"),
        PASSTHROUGH_CONSUMER="streams" if kind.endswith("-ours") else "faust",
        PASSTHROUGH_APP_ID=f"bench-passthrough-{kind}{suffix}",
        PASSTHROUGH_INPUT=topic_in,
        PASSTHROUGH_OUTPUT=topic_out,
        BATCH_SIZE=str(settings.batch_size),
        BATCH_WITHIN_SECONDS=str(settings.batch_within_seconds),
        PRODUCER_MAX_BATCH_BYTES=str(settings.producer_max_batch_bytes),
        PRODUCER_LINGER_MS=str(settings.producer_linger_ms),
        CONSUMER_FETCH_MAX_BYTES=str(settings.consumer_fetch_max_bytes),
        GC_GEN0_THRESHOLD=str(settings.gc_gen0_threshold),
    )
    await create_plain_topics(kafka.bootstrap_servers, (topic_in, topic_out), partitions)
    return Deployment(kind, kafka.bootstrap_servers, workdir, partitions, topic_in, [topic_out], None, env)


async def create_plain_topics(bootstrap: str, names: Sequence[str], partitions: int) -> None:
    """Topics with `partitions` partitions, replication 1, for the passthroughs and the round-trip probe."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1) for name in names])
    finally:
        await admin.close()


async def wait_ready(deployment: Deployment, timeout: float = 90.0, stable: float = 2.0) -> None:
    """Until every worker answers (the service: /readyz 200) and keeps answering for `stable` seconds."""
    path = "/readyz" if deployment.kind == "pipeline" else "/"
    deadline = time.monotonic() + timeout
    since: float | None = None
    while time.monotonic() < deadline:
        deployment.check_alive()
        answers = [
            await asyncio.to_thread(_http_ok, f"http://127.0.0.1:{p.web_port}{path}")
            for p in deployment.procs
        ]
        ready = all(answers)
        now = time.monotonic()
        if not ready:
            since = None
        elif since is None:
            since = now
        elif now - since >= stable:
            return
        await asyncio.sleep(0.25)
    raise TimeoutError(f"workers not ready after {timeout:.0f}s")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def scrape(port: int) -> dict[str, float]:
    """The worker's /metrics: totals by sample name and, for table sizes, by table."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    values: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "confidence_table_keys":
                values[f"table:{sample.labels.get('table')}"] += sample.value
            else:
                values[sample.name] += sample.value
    return dict(values)


def batch_steps(port: int) -> str:
    """Mean time per batch of each agent's steps (`confidence_batch_seconds`), since the worker started."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    sums: Counter[tuple[str, str]] = Counter()
    counts: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.labels.get("agent", ""), sample.labels.get("phase", ""))
            if sample.name == "confidence_batch_seconds_sum":
                sums[key] += sample.value
            elif sample.name == "confidence_batch_seconds_count":
                counts[key] += sample.value
    agents = sorted({agent for agent, _ in counts})
    return "; ".join(
        f"{agent} ({counts[(agent, 'process')]:.0f} batches) "
        + " ".join(
            f"{phase} {1000 * sums[(agent, phase)] / max(1, counts[(agent, phase)]):.1f}"
            for phase in ("process", "outputs", "state")
        )
        for agent in agents
    )


# --- 1. throughput -----------------------------------------------------------------------------------


@dataclass
class RunResult:
    events: int
    seconds: float
    cpu_us: float  # worker CPU per input event over the timed window
    rss_mb: float
    dead: int
    kinds: Counter[str]
    latency_ms: dict[str, list[int]] = field(default_factory=dict)  # to arrival at the reader
    created_ms: dict[str, list[int]] = field(default_factory=dict)  # to the output's record timestamp
    cpu_share: float = 0.0  # worker CPU over the window, in cores
    broker_cpu_us: float = 0.0  # the embedded broker's CPU per input event over the window (0: not ours)
    produced_rate: float = 0.0  # inputs per second the producer achieved (latency runs: the offered load)

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def _window(tracker: Tracker, sampler: Sampler, events: int, broker: Sampler | None = None) -> RunResult:
    stamps = sorted(tracker.completed_ms.values())
    start, end = stamps[0] / 1000, stamps[-1] / 1000
    seconds = max(end - start, 1e-3)
    cpu = sampler.cpu_at(end) - sampler.cpu_at(start)
    broker_cpu = broker.cpu_at(end) - broker.cpu_at(start) if broker is not None else 0.0
    return RunResult(
        broker_cpu_us=1e6 * broker_cpu / events,
        events=events,
        seconds=seconds,
        cpu_us=1e6 * cpu / events,
        rss_mb=sampler.rss_max(start, end),
        dead=tracker.dead,
        kinds=tracker.kinds,
        latency_ms=tracker.latency_ms,
        created_ms=tracker.created_ms,
        cpu_share=cpu / seconds,
    )


async def throughput_run(kind: str, kafka: RunningBroker, mix: Mix, fetch_wait: int) -> RunResult:
    """Preload `mix`, start one worker, time first output to last."""
    deployment = await deploy(kind, kafka, PARTITIONS, fetch_wait)
    produced = Produced()
    await produce(kafka.bootstrap_servers, deployment.input_topic, mix, produced)
    tracker = Tracker(mix.event_ids, produced, deployment.input_topic, deployment.dlq_topic)
    proc = deployment.start_worker()
    sampler = Sampler([proc.pid]).start()
    # The worker's outputs, changelogs and internal topics are the broker's work too (a passthrough
    # makes it store one record per input).
    broker = Sampler(broker_pids()).start()
    try:
        await follow(
            kafka.bootstrap_servers, deployment.follow_topics, tracker, RUN_TIMEOUT, deployment, fetch_wait
        )
        tracker.check_clean()
        if kind == "pipeline":
            console.print(f"  batch steps (mean ms per batch): {batch_steps(proc.web_port)}")
    except TimeoutError as exc:
        raise RuntimeError(f"{kind}: {exc}; log {proc.log_path}:\n{proc.log_tail()}") from exc
    finally:
        await sampler.stop()
        await broker.stop()
        await asyncio.to_thread(deployment.stop)
    # (N - 1) intervals between the first and the last completion: the rate those N outputs came at.
    return _window(tracker, sampler, len(mix.records) - 1, broker)


# --- 2. latency ----------------------------------------------------------------------------------


async def latency_run(
    kind: str, kafka: RunningBroker, rate: float, seconds: float, fetch_wait: int
) -> RunResult:
    """Start a worker, warm it up, then produce at `rate` events/s for `seconds`; latency per output."""
    deployment = await deploy(kind, kafka, PARTITIONS, fetch_wait)
    proc = deployment.start_worker()
    try:
        warm = build_mix(WARMUP_EVENTS, WARMUP_EVENTS // 7, seed=5, run="warm")
        await produce_and_follow(kafka, deployment, warm, fetch_wait)
        paced = build_mix(
            max(50, int(rate * seconds)), max(8, int(rate * seconds) // 7), seed=11, run="paced"
        )
        sampler = Sampler([proc.pid], interval=0.1).start()
        tracker = await produce_and_follow(kafka, deployment, paced, fetch_wait, rate=rate)
        await sampler.stop()
        if kind == "pipeline":
            console.print(f"  batch steps at {rate:.0f}/s (mean ms per batch): {batch_steps(proc.web_port)}")
    except TimeoutError as exc:
        raise RuntimeError(f"{kind} latency: {exc}; log {proc.log_path}:\n{proc.log_tail()}") from exc
    finally:
        await asyncio.to_thread(deployment.stop)
    result = _window(tracker, sampler, len(paced.records) - 1)
    stamps = sorted(tracker.produced.timestamp_ms.values())
    result.produced_rate = (len(stamps) - 1) / max((stamps[-1] - stamps[0]) / 1000, 1e-3)
    return result


async def produce_round_trips(bootstrap: str, sends: int = 300) -> list[float]:
    """Milliseconds per `send_and_wait` of one 500-byte record (acks=all), one at a time, on a fresh
    topic of an otherwise idle broker: what one broker round trip of a stage's send costs by itself."""
    topic = f"bench-round-trip-{uuid.uuid4().hex[:8]}"
    await create_plain_topics(bootstrap, (topic,), 1)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    await producer.start()
    try:
        for _ in range(20):  # metadata and connection warm-up
            await producer.send_and_wait(topic, b"x" * 500)
        times: list[float] = []
        for _ in range(sends):
            started = time.perf_counter()
            await producer.send_and_wait(topic, b"x" * 500)
            times.append((time.perf_counter() - started) * 1000)
        return times
    finally:
        await producer.stop()


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile: the smallest value with at least `share` of the values at or below it."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


# --- 3. memory -------------------------------------------------------------------------------------


@dataclass
class MemoryPoint:
    seconds: float
    processed: int
    rss_mb: float
    tables: dict[str, int]


@dataclass
class MemoryResult:
    events: int
    traces: int
    processed: int
    points: list[MemoryPoint]
    capped: bool


async def memory_run(kafka: RunningBroker, fetch_wait: int) -> MemoryResult:
    """Preload MEMORY_EVENTS over a tenth as many traces; sample RSS, progress and table sizes."""
    traces = max(1, MEMORY_EVENTS // 10)
    mix = build_mix(
        MEMORY_EVENTS,
        traces,
        seed=99,
        run="mem",
        seconds_per_event=MEMORY_SPAN_DAYS * 86_400 / MEMORY_EVENTS,
    )
    deployment = await deploy(
        "pipeline",
        kafka,
        PARTITIONS,
        fetch_wait,
        SWEEP_INTERVAL_SECONDS=str(MEMORY_SWEEP_SECONDS),
        EXPIRY_SOURCE_IDLE_SECONDS=str(MEMORY_SOURCE_IDLE_SECONDS),
    )
    await produce(kafka.bootstrap_servers, deployment.input_topic, mix, Produced())
    proc = deployment.start_worker()
    points: list[MemoryPoint] = []
    started = time.monotonic()
    processed = 0
    capped = False
    try:
        while True:
            await asyncio.sleep(2.0)
            deployment.check_alive()
            try:
                metrics = await asyncio.to_thread(scrape, proc.web_port)
            except urllib.error.HTTPError:
                raise  # the worker answered with an error: not a figure to print
            except (urllib.error.URLError, OSError):
                continue  # web server not up yet
            processed = int(metrics.get("confidence_events_processed_total", 0))
            tables = {k[6:]: int(v) for k, v in metrics.items() if k.startswith("table:")}
            points.append(MemoryPoint(time.monotonic() - started, processed, rss_mb(proc.pid), tables))
            if processed >= MEMORY_EVENTS:
                # One more sweep, so the table sizes are those after the last expiry.
                await asyncio.sleep(MEMORY_SWEEP_SECONDS + 1)
                metrics = await asyncio.to_thread(scrape, proc.web_port)
                tables = {k[6:]: int(v) for k, v in metrics.items() if k.startswith("table:")}
                points.append(MemoryPoint(time.monotonic() - started, processed, rss_mb(proc.pid), tables))
                break
            if time.monotonic() - started > MEMORY_SECONDS:
                capped = True
                break
    finally:
        await asyncio.to_thread(deployment.stop)
    return MemoryResult(MEMORY_EVENTS, mix.traces, processed, points, capped)


# --- 4. scale-out ---------------------------------------------------------------------------------


async def scale_run(workers: int, kafka: RunningBroker, mix: Mix, fetch_wait: int) -> RunResult:
    """`workers` workers on SCALE_PARTITIONS partitions, all ready, then `mix` produced at once."""
    deployment = await deploy("pipeline", kafka, SCALE_PARTITIONS, fetch_wait)
    for _ in range(workers):
        deployment.start_worker()
    try:
        await wait_ready(deployment)
        before = await asyncio.to_thread(_assignments, deployment)
        if not all(before):
            raise RuntimeError(f"a worker has no partitions (partitions per worker: {before})")
        sampler = Sampler([p.pid for p in deployment.procs]).start()
        tracker = await produce_and_follow(kafka, deployment, mix, fetch_wait)
        await sampler.stop()
        deployment.check_alive()
        after = await asyncio.to_thread(_assignments, deployment)
        if after != before:  # a worker left or rejoined: the run did not measure `workers` workers
            raise RuntimeError(f"partitions per worker moved during the run: {before} -> {after}")
        if os.environ.get("BENCH_DIAG"):
            for proc in deployment.procs:
                console.print(f"  scale {workers} worker {proc.pid}: {batch_steps(proc.web_port)}")
    finally:
        await asyncio.to_thread(deployment.stop)
    return _window(tracker, sampler, len(mix.records) - 1)


def _assignments(deployment: Deployment) -> list[int]:
    """Partitions each worker consumes (its /readyz; 0 when not ready)."""
    counts = []
    for proc in deployment.procs:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{proc.web_port}/readyz", timeout=5) as answer:
                counts.append(int(orjson.loads(answer.read()).get("assigned_partitions") or 0))
        except (urllib.error.URLError, OSError):  # 503 (not ready) included
            counts.append(0)
    return counts


# --- profile ---------------------------------------------------------------------------------------


async def profile_run(
    kafka: RunningBroker, mix: Mix, fetch_wait: int
) -> list[tuple[str, float, float]] | None:
    """One untimed worker run under `py-spy record`; the top self-time functions (share of samples)."""
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        console.print("[yellow]profile skipped[/]: py-spy not installed (pip install py-spy)")
        return None
    deployment = await deploy("pipeline", kafka, PARTITIONS, fetch_wait)
    proc = deployment.start_worker()
    raw = os.path.join(deployment.workdir, "profile.txt")
    try:
        await wait_ready(deployment)
        recorder = subprocess.Popen(
            [spy, "record", "--pid", str(proc.pid), "--rate", "200", "--format", "raw", "-o", raw],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        await asyncio.sleep(1.0)
        await produce_and_follow(kafka, deployment, mix, fetch_wait)
        recorder.send_signal(signal.SIGINT)
        await asyncio.to_thread(recorder.wait, 30)
    finally:
        await asyncio.to_thread(deployment.stop)
    return _self_time(raw)


def _self_time(raw: str) -> list[tuple[str, float, float]]:
    """Top self-time functions of a py-spy raw (collapsed) profile, and the packages they live in.

    Rows: (name, share of active samples, seconds at 200 Hz). The event loop's `select` is waiting,
    not work: it is reported as its own first row and left out of the shares of the others.
    """
    functions: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    with open(raw) as handle:
        for line in handle:
            stack, _, count = line.rstrip().rpartition(" ")
            if not stack:
                continue
            name, _, where = stack.split(";")[-1].partition(" (")
            path = where.split(":")[0]
            functions[f"{name} ({_short(path)})"] += int(count)
            packages[_package(path)] += int(count)
    total = sum(functions.values()) or 1
    waiting = sum(v for k, v in functions.items() if k.startswith("EpollSelector.select"))
    work = max(1, total - waiting)
    rows = [
        (
            f"(waiting) EpollSelector.select: share of all {total} active samples",
            waiting / total,
            waiting / 200,
        )
    ]
    rows += [
        (name, count / work, count / 200)
        for name, count in functions.most_common(11)
        if not name.startswith("EpollSelector.select")
    ][:10]
    rows += [
        (f"package: {name}", count / work, count / 200)
        for name, count in packages.most_common(9)
        if name != "selectors"
    ][:8]
    return rows


def _short(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3.", "/work/main/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            return path.split("/", 1)[1] if marker == "/lib/python3." else path
    return path


def _package(path: str) -> str:
    short = _short(path)
    if short.startswith("streams/"):
        return short.removesuffix(".py")
    head = short.split("/", 1)[0]
    return head.removesuffix(".py") if "/" in short or short.endswith(".py") else short


# --- report ----------------------------------------------------------------------------------------


def spread(values: Sequence[float], fmt: str) -> str:
    median = statistics.median(values)
    if len(values) == 1:
        return format(median, fmt)
    return f"{format(median, fmt)} [{format(min(values), fmt)}-{format(max(values), fmt)}]"


def _loadavg() -> str:
    with contextlib.suppress(OSError), open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])
    return "?"


def _revision() -> str:
    """The commit measured, with `+changes` when the working tree differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown revision"
    return f"{head}{' +changes' if dirty else ''}"


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "n/a"


WORKDIR: str | None = None  # set by main(); None (the system temp dir) when functions are used directly


class Machine:
    """CPU the machine spent outside this benchmark's process tree: other people's work distorts figures.

    The embedded broker is a child of this process and counts as ours; a Docker or external broker on
    the same machine would count as "others".
    """

    def __init__(self) -> None:
        self.mark = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float]:
        """(monotonic time, machine busy CPU s, CPU s of this process, its children and reaped ones)."""
        with open("/proc/stat") as handle:
            cpu = [int(v) for v in handle.readline().split()[1:]]
        busy = (sum(cpu) - cpu[3] - cpu[4]) / CLOCK_TICK  # minus idle and iowait
        parents: dict[int, int] = {}
        times: dict[int, float] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
                parents[int(entry)] = int(fields[1])
                times[int(entry)] = (int(fields[11]) + int(fields[12])) / CLOCK_TICK
        own_pid = os.getpid()
        own = 0.0
        for pid, cpu_s in times.items():
            walk, hops = pid, 0
            while walk not in (0, 1, own_pid) and hops < 64:
                walk, hops = parents.get(walk, 0), hops + 1
            if walk == own_pid and pid != own_pid:
                own += cpu_s
        with open(f"/proc/{own_pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        own += sum(int(v) for v in fields[11:15]) / CLOCK_TICK  # utime, stime, cutime, cstime
        return time.monotonic(), busy, own

    def others(self) -> float:
        """Cores used by other processes since the previous call (averaged over the wall time)."""
        now = self._read()
        then, self.mark = self.mark, now
        return max(0.0, (now[1] - then[1]) - (now[2] - then[2])) / max(now[0] - then[0], 1e-3)


@dataclass
class Context:
    kafka: RunningBroker
    fetch_wait: int
    mix: Mix
    machine: Machine
    rows: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    failures: int = 0
    pipeline_rate: float = 0.0

    def row(self, measurement: str, ratio: str, baseline: str, figures: str, others: float) -> None:
        self.rows.append((measurement, ratio, baseline, figures, f"{others:.2f}"))

    def failed(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        console.print(f"[red]{what} failed[/]: {exc}")


async def _throughput(ctx: Context) -> None:
    """Section 1: the four contestants interleaved, so drift spreads over all of them."""
    ctx.machine.others()
    results: dict[str, list[RunResult]] = {"naive": [], "naive-ours": [], "batched": [], "pipeline": []}
    for run in range(RUNS):
        kinds = list(results)
        # Each run starts with another contestant: a drift over the section (the broker's store grows
        # with every run) does not land on the same one each time.
        for kind in kinds[run % len(kinds) :] + kinds[: run % len(kinds)]:
            try:
                result = await throughput_run(kind, ctx.kafka, ctx.mix, ctx.fetch_wait)
            except Exception as exc:
                ctx.failed(f"throughput {kind} run {run + 1}", exc)
                continue
            results[kind].append(result)
            console.print(
                f"throughput {kind:10} run {run + 1}: {result.rate:8,.0f} events/s, "
                f"{result.cpu_us:6.0f} us CPU/event, RSS {result.rss_mb:5.0f} MB, "
                f"{result.seconds:.2f} s, {result.cpu_share:.2f} cores, broker {result.broker_cpu_us:.0f} us "
                f"CPU/event"
            )
    others = ctx.machine.others()
    labels = {
        "naive": "naive Faust passthrough (async for + topic.send)",
        "naive-ours": "naive passthrough on the worker's consumer (streams/transport.py)",
        "batched": "batched Faust passthrough (noack_take + producer.send)",
        "pipeline": "confidence-streams worker (every input scored)",
    }
    base = results["naive"]
    base_rate = statistics.median(r.rate for r in base) if base else 0.0
    base_cpu = statistics.median(r.cpu_us for r in base) if base else 0.0
    base_rss = statistics.median(r.rss_mb for r in base) if base else 0.0
    base_broker = statistics.median(r.broker_cpu_us for r in base) if base else 0.0
    for kind, runs in results.items():
        if not runs:
            ctx.row(f"throughput: {labels[kind]}", "FAILED", "", "", others)
            continue
        rate = statistics.median(r.rate for r in runs)
        cpu = statistics.median(r.cpu_us for r in runs)
        rss = statistics.median(r.rss_mb for r in runs)
        figures = (
            f"{spread([r.rate for r in runs], ',.0f')} events/s (n={len(runs)}); "
            f"CPU {spread([r.cpu_us for r in runs], '.0f')} us/event ({_ratio(cpu, base_cpu)}); "
            f"RSS {spread([r.rss_mb for r in runs], '.0f')} MB ({_ratio(rss, base_rss)})"
        )
        if base_broker:
            broker_cpu = statistics.median(r.broker_cpu_us for r in runs)
            figures += f"; broker CPU {broker_cpu:.0f} us/event ({_ratio(broker_cpu, base_broker)})"
        if kind == "pipeline" and base_rate:
            figures += f"; targets: >= 1.0x throughput (1.5x = {1.5 * base_rate:,.0f}/s), CPU <= 2.0x"
            if results["naive-ours"]:
                ours = statistics.median(r.rate for r in results["naive-ours"])
                figures += f"; {_ratio(rate, ours)} the naive passthrough on the worker's consumer"
        baseline = "naive passthrough" if kind != "naive" else "(baseline)"
        ctx.row(f"throughput: {labels[kind]}", _ratio(rate, base_rate), baseline, figures, others)
    if results["pipeline"]:
        ctx.pipeline_rate = statistics.median(r.rate for r in results["pipeline"])


async def _latency(ctx: Context) -> None:
    """Section 2: at half the worker's measured throughput; the passthroughs at the same load."""
    if not ctx.pipeline_rate:
        ctx.row("latency", "SKIPPED", "", "no worker throughput to derive the load from", 0.0)
        return
    ctx.machine.others()
    rate = LATENCY_LOAD * ctx.pipeline_rate
    latency: dict[str, RunResult] = {}
    for kind in ("naive", "batched", "pipeline"):
        try:
            latency[kind] = await latency_run(kind, ctx.kafka, rate, LATENCY_SECONDS, ctx.fetch_wait)
        except Exception as exc:
            ctx.failed(f"latency {kind}", exc)
            continue
        console.print(
            f"latency {kind:8} at {rate:,.0f}/s: "
            + ", ".join(
                f"{k} p50 {percentile(v, 0.5):.0f} p99 {percentile(v, 0.99):.0f} ms (n={len(v)})"
                for k, v in sorted(latency[kind].latency_ms.items())
            )
            + f"; worker {latency[kind].cpu_share:.2f} cores"
        )
    others = ctx.machine.others()

    def pooled(kind: str, created: bool = False) -> list[int]:
        """Every latency of `kind`'s run over all its output kinds (a passthrough has one)."""
        if kind not in latency:
            return []
        by_kind = latency[kind].created_ms if created else latency[kind].latency_ms
        return [v for values in by_kind.values() for v in values]

    naive = pooled("naive")
    base_p50, base_p99 = percentile(naive, 0.5), percentile(naive, 0.99)
    produced_at = {kind: f"{result.produced_rate:,.0f}" for kind, result in latency.items()}
    load = (
        f"{rate:,.0f} events/s offered for {LATENCY_SECONDS:.0f} s (produced at "
        + ", ".join(f"{kind} {value}/s" for kind, value in produced_at.items())
        + ")"
    )
    rows: list[tuple[str, list[int], list[int]]] = []
    if "batched" in latency:
        rows.append(("batched passthrough", pooled("batched"), pooled("batched", created=True)))
    if "pipeline" in latency:
        for kind in ("RESPONSE_SCORED", "TRACE_SCORED", "CLAIM_SCORED", "SYNTHESIS_SCORED"):
            if latency["pipeline"].latency_ms.get(kind):
                rows.append(
                    (kind, latency["pipeline"].latency_ms[kind], latency["pipeline"].created_ms[kind])
                )
    naive_created = pooled("naive", created=True)
    for name, values, created in rows:
        p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
        target = "; target p50 < 20, p99 < 50 ms" if name == "RESPONSE_SCORED" else ""
        ctx.row(
            f"latency: {name}, producer timestamp to arrival at a reader (p50 / p99)",
            f"{_ratio(p50, base_p50)} / {_ratio(p99, base_p99)}",
            "naive passthrough, same load",
            f"{p50:.0f} / {p99:.0f} ms vs {base_p50:.0f} / {base_p99:.0f} ms (to the output's creation: "
            f"{percentile(created, 0.5):.0f} / {percentile(created, 0.99):.0f} vs "
            f"{percentile(naive_created, 0.5):.0f} / {percentile(naive_created, 0.99):.0f} ms) at {load} "
            f"(n={len(values)}){target}",
            others,
        )
    try:
        round_trips = await produce_round_trips(ctx.kafka.bootstrap_servers)
        p50, p99 = percentile(round_trips, 0.5), percentile(round_trips, 0.99)
        ctx.row(
            "latency: one produce round trip, idle broker (p50 / p99)",
            f"{_ratio(p50, base_p50)} / {_ratio(p99, base_p99)}",
            "naive passthrough, same load",
            f"{p50:.2f} / {p99:.2f} ms (send_and_wait of one 500-byte record, acks=all, "
            f"n={len(round_trips)}): a send's cost at the broker; the rest of a batch's 'outputs' "
            f"step is waiting inside the worker (its busy event loop, the batch before)",
            ctx.machine.others(),
        )
    except Exception as exc:
        ctx.failed("latency round trip", exc)


async def _memory(ctx: Context) -> None:
    """Section 3: the memory curve of a larger run."""
    ctx.machine.others()
    try:
        memory = await memory_run(ctx.kafka, ctx.fetch_wait)
    except Exception as exc:
        ctx.failed("memory run", exc)
        ctx.row("memory", "FAILED", "", str(exc)[:80], ctx.machine.others())
        return
    others = ctx.machine.others()
    console.print(
        f"memory curve: {memory.events:,} events over {memory.traces:,} traces, event time spanning "
        f"{MEMORY_SPAN_DAYS:.0f} days, SWEEP_INTERVAL_SECONDS={MEMORY_SWEEP_SECONDS:.0f}, "
        f"EXPIRY_SOURCE_IDLE_SECONDS={MEMORY_SOURCE_IDLE_SECONDS:.0f}"
        + (f", [yellow]stopped at the {MEMORY_SECONDS:.0f} s cap[/]" if memory.capped else "")
    )
    previous: MemoryPoint | None = None
    step = max(1, len(memory.points) // 30)  # about 30 lines, the last point always
    for index, point in enumerate(memory.points):
        if index % step and index != len(memory.points) - 1:
            continue
        tables = ", ".join(f"{k} {v:,}" for k, v in sorted(point.tables.items()))
        rate = (
            (point.processed - previous.processed) / max(point.seconds - previous.seconds, 1e-3)
            if previous is not None
            else 0.0
        )
        previous = point
        console.print(
            f"  {point.seconds:6.1f} s  {point.processed:8,} events ({rate:6,.0f}/s)  "
            f"RSS {point.rss_mb:6.1f} MB  tables: {tables or 'not swept yet'}"
        )
    if len({p.processed for p in memory.points}) < 4:
        ctx.failed("memory run", RuntimeError(f"only {len(memory.points)} samples of the worker's metrics"))
        ctx.row("memory", "FAILED", "", "too few samples", others)
        return
    last = memory.points[-1]
    half = min(memory.points, key=lambda p: abs(p.processed - last.processed / 2))
    end_fit, half_fit = _second_half_line(memory.points, half, last)
    first_slope, second_slope = _half_slopes(memory.points, half)
    ctx.row(
        "memory: worker RSS, end vs half-way (a line fitted to the second half's samples)",
        _ratio(end_fit, half_fit),
        f"RSS at {half.processed:,} events",
        f"fitted {end_fit:.0f} vs {half_fit:.0f} MB (sampled {last.rss_mb:.0f} MB at {last.processed:,} "
        f"events vs {half.rss_mb:.0f} MB); growth {second_slope:+.1f} MB per 100k events in the second "
        f"half against {first_slope:+.1f} in the first ({_ratio(second_slope, first_slope)}: 1.0x is "
        f"growth that never levels off, 0x flat); {memory.traces:,} "
        f"traces over {MEMORY_SPAN_DAYS:.0f} days of event time; table keys at end: "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(last.tables.items()))
        + " (half-way: "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(half.tables.items()))
        + ")"
        + (" (time cap reached)" if memory.capped else ""),
        others,
    )


def _second_half_line(points: list[MemoryPoint], half: MemoryPoint, last: MemoryPoint) -> tuple[float, float]:
    """RSS at `last` and at `half` on a least-squares line through the samples from `half` on.

    Two single samples made the ratio move 1.01-1.24x between identical runs (a sample can land on a
    fetch buffer's peak or a sweep's trough); the line reads the trend of all of them.
    """
    tail = [p for p in points if p.processed >= half.processed]
    if len({p.processed for p in tail}) < 2:
        return last.rss_mb, half.rss_mb
    slope, intercept = statistics.linear_regression(
        [float(p.processed) for p in tail], [p.rss_mb for p in tail]
    )
    return intercept + slope * last.processed, intercept + slope * half.processed


def _half_slopes(points: list[MemoryPoint], half: MemoryPoint) -> tuple[float, float]:
    """RSS growth in MB per 100k events of least-squares lines through the samples before and after
    `half`. The end-vs-half ratio alone hides a steady leak behind a large base (160 bytes an event
    over 100k events on 300 MB reads 1.03x); a leak grows as fast in both halves, a curve that levels
    off much slower in the second."""

    def slope(part: list[MemoryPoint]) -> float:
        if len({p.processed for p in part}) < 2:
            return 0.0
        fitted = statistics.linear_regression([float(p.processed) for p in part], [p.rss_mb for p in part])
        return fitted.slope * 100_000

    first = [p for p in points if p.processed <= half.processed]
    second = [p for p in points if p.processed >= half.processed]
    return slope(first), slope(second)


async def _scale(ctx: Context) -> None:
    """Section 4: 1 vs 2 workers on SCALE_PARTITIONS partitions, alternating, RUNS pairs."""
    ctx.machine.others()
    mix = build_mix(SCALE_EVENTS, SCALE_EVENTS // 7, seed=3, run="scale")
    # One pair ranged 1.05-1.35x between identical runs on this 2-core machine (broker, producer and
    # two workers share it): pairs, alternating, and the median ratio with its spread.
    pairs: list[tuple[RunResult, RunResult]] = []
    for run in range(RUNS):
        pair: dict[int, RunResult] = {}
        for workers in (1, 2) if run % 2 == 0 else (2, 1):  # alternating which goes first
            try:
                pair[workers] = await scale_run(workers, ctx.kafka, mix, ctx.fetch_wait)
            except Exception as exc:
                ctx.failed(f"scale-out with {workers} worker(s)", exc)
                continue
            r = pair[workers]
            console.print(
                f"scale-out {workers} worker(s): {r.rate:,.0f} events/s, {r.cpu_us:.0f} us CPU/event, "
                f"{r.cpu_share:.2f} cores, RSS {r.rss_mb:.0f} MB (sum)"
            )
        if len(pair) == 2:
            pairs.append((pair[1], pair[2]))
    others = ctx.machine.others()
    if pairs:
        pairs.sort(key=lambda pair: pair[1].rate / pair[0].rate)
        ratios = [two.rate / one.rate for one, two in pairs]
        one, two = pairs[len(pairs) // 2]
        ctx.row(
            f"scale-out: 2 workers vs 1, {SCALE_PARTITIONS} partitions, {len(pairs)} pair(s)",
            f"{statistics.median(ratios):.2f}x",
            "1 worker",
            f"ratios {spread(ratios, '.2f')}; median pair {two.rate:,.0f} vs {one.rate:,.0f} events/s, "
            f"{two.cpu_us:.0f} vs {one.cpu_us:.0f} us CPU/event ({len(mix.records):,} events, produced "
            f"once all were ready); the machine has {os.cpu_count()} cores, shared with the broker and "
            "the producer",
            others,
        )


async def _profile(ctx: Context) -> None:
    """One untimed worker run under py-spy: where the worker's CPU goes."""
    ctx.machine.others()
    try:
        mix = build_mix(2 * MIX_EVENTS, 2 * MIX_TRACES, seed=77, run="profile")
        top = await profile_run(ctx.kafka, mix, ctx.fetch_wait)
    except Exception as exc:
        ctx.failed("profile", exc)
        return
    if not top:
        return
    profile = Table(
        title=f"worker self time under py-spy, a run of {2 * MIX_EVENTS:,} mix events: top 10 functions "
        f"and top packages, share of the samples not waiting in select (others: "
        f"{ctx.machine.others():.2f} cores)"
    )
    for column in ("function (file)", "share", "seconds"):
        profile.add_column(column, justify="left" if column.startswith("function") else "right")
    for name, share, seconds in top:
        profile.add_row(name, f"{100 * share:.1f}%", f"{seconds:.2f}")
    console.print(profile)


SECTIONS = {"throughput": _throughput, "latency": _latency, "memory": _memory, "scale": _scale}


async def _run_all(kafka: RunningBroker, machine: Machine) -> int:
    fetch_wait, worker_has_setting = fetch_wait_setting()
    wanted = {s.strip() for s in os.environ.get("BENCH_ONLY", ",".join(SECTIONS)).split(",") if s.strip()}
    if "latency" in wanted:
        wanted.add("throughput")  # the load is half the worker's measured throughput
    unknown = wanted - set(SECTIONS)
    if unknown:
        console.print(
            f"[red]BENCH_ONLY names unknown sections {sorted(unknown)}; known: {sorted(SECTIONS)}[/]"
        )
        return 1
    mix = build_mix(MIX_EVENTS, MIX_TRACES)
    ctx = Context(kafka, fetch_wait, mix, machine)
    console.print(f"mix: {mix.describe()}; load average before: {_loadavg()}")
    console.print(
        f"fetch wait {fetch_wait} ms (worker setting {'present' if worker_has_setting else 'absent'}), "
        f"{PARTITIONS} partition(s), {RUNS} run(s) each, sections {', '.join(s for s in SECTIONS if s in wanted)}, "
        f"work dir {WORKDIR}"
    )
    for name, section in SECTIONS.items():
        if name in wanted:
            await section(ctx)
    if PROFILE:
        await _profile(ctx)

    table = Table(
        title=(
            f"make bench ({_revision()}): {kafka.kind} broker, {os.cpu_count()} cores, "
            f"fetch wait {fetch_wait} ms, {PARTITIONS} partition(s), {RUNS} run(s) each "
            f"(median \\[min-max]); mix {mix.describe()}"
        )
    )
    for column in ("measurement", "ratio", "baseline (same run)", "absolute figures", "others"):
        table.add_column(column, justify="right" if column in ("ratio", "others") else "left")
    for measurement, ratio, baseline, figures in summary.ROWS:  # the micro-benchmarks run before this
        table.add_row(measurement, ratio, baseline, figures, "")
    for row in ctx.rows:
        table.add_row(*row)
    if not worker_has_setting and fetch_wait != FAUST_FETCH_MAX_WAIT_MS:
        console.print(
            f"[red]the worker has no CONSUMER_FETCH_MAX_WAIT_MS setting: it uses Faust's "
            f"{FAUST_FETCH_MAX_WAIT_MS} ms while the passthroughs use {fetch_wait} ms[/]"
        )
    console.print(
        "others: cores used by processes outside this benchmark during the section (the machine has "
        f"{os.cpu_count()}); load average after: {_loadavg()}"
    )
    console.print(table)
    return ctx.failures


def main() -> int:
    global WORKDIR
    WORKDIR = tempfile.mkdtemp(prefix="confidence-bench-")
    started = time.monotonic()
    machine = Machine()
    with broker() as running:
        try:
            failures = asyncio.run(_run_all(running, machine))
        except Exception:
            traceback.print_exc()
            failures = 1
    console.print(f"pipeline benchmark took {time.monotonic() - started:.0f} s; logs in {WORKDIR}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
