"""The whole pipeline on the harness broker, against Faust passthrough agents measured in the same run.

`python -m bench.pipeline` (also part of `make bench`). One broker for everything; every run gets fresh
topics, a fresh consumer group and fresh worker processes. Sections:

1. Throughput on a preloaded realistic mix (bench/mix.py), timed from the first output's record
   timestamp to the last, for the naive passthrough (`async for` + `await topic.send` per event), the
   batched passthrough (`noack_take`, the app's producer, futures awaited, then ack; the shape of the
   service's agents) and the confidence-streams worker, which is done when every input has its own
   output (RESPONSE_SCORED, TRACE_SCORED, CLAIM_SCORED with cause self, or a dead letter). Worker CPU
   (utime + stime) over the same window per input event, and resident memory (VmRSS).
2. Latency: a paced producer at half the worker's measured throughput; each output's record timestamp
   (set by the worker's producer) minus its input's producer timestamp, both from this machine's clock.
3. Memory: RSS, events processed and table sizes sampled while a larger preloaded run streams through.
4. Scale-out: 1 vs 2 workers on 4 partitions (started, ready, then the mix produced at once).

Environment: `BENCH_QUICK=1` (one run, smaller sizes), `BENCH_PARTITIONS` (sections 1-2, default 1),
`BENCH_MEMORY_EVENTS` (default 100000, over a tenth as many traces), `BENCH_MEMORY_SECONDS` (time cap of
section 3, default 150), `BENCH_PROFILE=1` (one extra, untimed worker run under py-spy: top self time),
`CONSUMER_FETCH_MAX_WAIT_MS` (given to the worker and to the passthroughs alike).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import socket
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

from bench.mix import Mix, build_mix
from bench.passthrough import FAUST_FETCH_MAX_WAIT_MS
from streams.config import Settings, load_settings
from streams.demo_runner import worker_env
from streams.harness import broker
from streams.topics import create_topics

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
SCALE_PARTITIONS = 4
SCALE_EVENTS = 3_000 if QUICK else 12_000
PROFILE = os.environ.get("BENCH_PROFILE", "") not in ("", "0")
RUN_TIMEOUT = 300.0
CLOCK_TICK = os.sysconf("SC_CLK_TCK")

console = Console()
if not console.is_terminal:
    console = Console(width=200)  # a log or a pipe: keep the table's rows on one line each


# --- processes and /proc ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
            self.popen = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
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

    def __init__(self, expected: Iterable[str], produced: Produced, dlq_topic: str | None) -> None:
        self.pending = set(expected)
        self.expected = len(self.pending)
        self.produced = produced
        self.dlq_topic = dlq_topic
        self.completed_ms: dict[str, int] = {}  # input event id -> timestamp of its own output
        self.latency_ms: dict[str, list[int]] = {}  # output kind -> latencies of own outputs
        self.kinds: Counter[str] = Counter()
        self.dead = 0
        self.records = 0

    @property
    def done(self) -> bool:
        return not self.pending

    def add(self, record: ConsumerRecord[bytes, bytes]) -> None:
        self.records += 1
        if record.topic == self.dlq_topic:
            headers = dict(record.headers or ())
            place = (
                int(headers.get("__connect.errors.partition", b"-1")),
                int(headers.get("__connect.errors.offset", b"-1")),
            )
            self.dead += 1
            self._complete(self.produced.place.get(place), "DLQ", record.timestamp)
            return
        output = orjson.loads(record.value or b"{}")
        kind = output.get("event_type", "?")
        self.kinds[kind] += 1
        if "source_event_id" not in output:  # a passthrough forwards the input itself
            self._complete(output.get("event_id"), kind, record.timestamp)
        elif kind in ("RESPONSE_SCORED", "TRACE_SCORED") or (
            kind == "CLAIM_SCORED" and output.get("cause") == "self"
        ):
            self._complete(output["source_event_id"], kind, record.timestamp)
        elif kind == "SYNTHESIS_SCORED":
            self._latency(output["source_event_id"], kind, record.timestamp)

    def _complete(self, event_id: str | None, kind: str, timestamp_ms: int) -> None:
        if event_id is None or event_id not in self.pending:
            return
        self.pending.discard(event_id)
        self.completed_ms[event_id] = timestamp_ms
        self._latency(event_id, kind, timestamp_ms)

    def _latency(self, event_id: str, kind: str, timestamp_ms: int) -> None:
        sent = self.produced.timestamp_ms.get(event_id)
        if sent is not None:
            self.latency_ms.setdefault(kind, []).append(timestamp_ms - sent)


async def follow(bootstrap: str, topics: Sequence[str], tracker: Tracker, timeout: float) -> None:
    """Read `topics` from the beginning into `tracker` until it is done; TimeoutError after `timeout`."""
    consumer = AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
        fetch_max_wait_ms=50,
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    await consumer.start()
    deadline = time.monotonic() + timeout
    try:
        while not tracker.done:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(tracker.pending)} of {tracker.expected} inputs without their output "
                    f"after {timeout:.0f}s ({tracker.records} output records read)"
                )
            batches = await consumer.getmany(timeout_ms=200, max_records=20_000)
            for batch in batches.values():
                for record in batch:
                    tracker.add(record)
    finally:
        await consumer.stop()


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

    kind: str  # "naive", "batched" or "pipeline"
    bootstrap: str
    workdir: str
    partitions: int
    input_topic: str
    follow_topics: list[str]
    dlq_topic: str | None
    env: dict[str, str]
    procs: list[Proc] = field(default_factory=list)

    def start_worker(self) -> Proc:
        port = _free_port()
        number = len(self.procs)
        env = {**self.env, "WEB_PORT": str(port), "DATA_DIR": os.path.join(self.workdir, f"data-{number}")}
        if self.kind == "pipeline":
            argv = [sys.executable, "-m", "streams.cli", "worker"]
        else:
            argv = [sys.executable, "-m", "bench.passthrough", "worker"]
        proc = Proc(argv, env, os.path.join(self.workdir, f"worker-{number}.log"), port).start()
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()

    def check_alive(self) -> None:
        for proc in self.procs:
            if not proc.alive():
                raise RuntimeError(f"worker {proc.pid} exited; log {proc.log_path}:\n{proc.log_tail()}")


async def deploy(kind: str, bootstrap: str, partitions: int, fetch_wait: int, **extra: str) -> Deployment:
    """Fresh topics and environment for `kind`; no worker started yet."""
    suffix = f"-b{uuid.uuid4().hex[:8]}"
    workdir = tempfile.mkdtemp(prefix=f"bench-{kind}-", dir=WORKDIR)
    env = worker_env(
        bootstrap,
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
            bootstrap,
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
        PASSTHROUGH_MODE=kind,
        PASSTHROUGH_APP_ID=f"bench-passthrough-{kind}{suffix}",
        PASSTHROUGH_INPUT=topic_in,
        PASSTHROUGH_OUTPUT=topic_out,
        BATCH_SIZE=str(settings.batch_size),
        BATCH_WITHIN_SECONDS=str(settings.batch_within_seconds),
        PRODUCER_MAX_BATCH_BYTES=str(settings.producer_max_batch_bytes),
        PRODUCER_LINGER_MS=str(settings.producer_linger_ms),
    )
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1) for name in (topic_in, topic_out)])
    finally:
        await admin.close()
    return Deployment(kind, bootstrap, workdir, partitions, topic_in, [topic_out], None, env)


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


# --- 1. throughput -----------------------------------------------------------------------------------


@dataclass
class RunResult:
    events: int
    seconds: float
    cpu_us: float  # worker CPU per input event over the timed window
    rss_mb: float
    dead: int
    kinds: Counter[str]
    latency_ms: dict[str, list[int]] = field(default_factory=dict)
    cpu_share: float = 0.0  # worker CPU over the window, in cores

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def _window(tracker: Tracker, sampler: Sampler, events: int) -> RunResult:
    stamps = sorted(tracker.completed_ms.values())
    start, end = stamps[0] / 1000, stamps[-1] / 1000
    seconds = max(end - start, 1e-3)
    cpu = sampler.cpu_at(end) - sampler.cpu_at(start)
    return RunResult(
        events=events,
        seconds=seconds,
        cpu_us=1e6 * cpu / events,
        rss_mb=sampler.rss_max(start, end),
        dead=tracker.dead,
        kinds=tracker.kinds,
        latency_ms=tracker.latency_ms,
        cpu_share=cpu / seconds,
    )


async def throughput_run(kind: str, bootstrap: str, mix: Mix, fetch_wait: int) -> RunResult:
    """Preload `mix`, start one worker, time first output to last."""
    deployment = await deploy(kind, bootstrap, PARTITIONS, fetch_wait)
    produced = Produced()
    await produce(bootstrap, deployment.input_topic, mix, produced)
    tracker = Tracker(mix.event_ids, produced, deployment.dlq_topic)
    proc = deployment.start_worker()
    sampler = Sampler([proc.pid]).start()
    try:
        await follow(bootstrap, deployment.follow_topics, tracker, RUN_TIMEOUT)
    except TimeoutError as exc:
        raise RuntimeError(f"{kind}: {exc}; log {proc.log_path}:\n{proc.log_tail()}") from exc
    finally:
        await sampler.stop()
        await asyncio.to_thread(deployment.stop)
    # (N - 1) intervals between the first and the last completion: the rate those N outputs came at.
    return _window(tracker, sampler, len(mix.records) - 1)


# --- 2. latency ----------------------------------------------------------------------------------


async def latency_run(kind: str, bootstrap: str, rate: float, seconds: float, fetch_wait: int) -> RunResult:
    """Start a worker, warm it up, then produce at `rate` events/s for `seconds`; latency per output."""
    deployment = await deploy(kind, bootstrap, PARTITIONS, fetch_wait)
    proc = deployment.start_worker()
    try:
        warm = build_mix(WARMUP_EVENTS, WARMUP_EVENTS // 7, seed=5, run="warm")
        warm_produced = Produced()
        await produce(bootstrap, deployment.input_topic, warm, warm_produced)
        await follow(
            bootstrap,
            deployment.follow_topics,
            Tracker(warm.event_ids, warm_produced, deployment.dlq_topic),
            RUN_TIMEOUT,
        )
        paced = build_mix(
            max(50, int(rate * seconds)), max(8, int(rate * seconds) // 7), seed=11, run="paced"
        )
        produced = Produced()
        tracker = Tracker(paced.event_ids, produced, deployment.dlq_topic)
        sampler = Sampler([proc.pid], interval=0.1).start()
        await asyncio.gather(
            produce(bootstrap, deployment.input_topic, paced, produced, rate=rate),
            follow(bootstrap, deployment.follow_topics, tracker, RUN_TIMEOUT),
        )
        await sampler.stop()
    except TimeoutError as exc:
        raise RuntimeError(f"{kind} latency: {exc}; log {proc.log_path}:\n{proc.log_tail()}") from exc
    finally:
        await asyncio.to_thread(deployment.stop)
    result = _window(tracker, sampler, len(paced.records) - 1)
    return result


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


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


async def memory_run(bootstrap: str, fetch_wait: int) -> MemoryResult:
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
        "pipeline", bootstrap, PARTITIONS, fetch_wait, SWEEP_INTERVAL_SECONDS=str(MEMORY_SWEEP_SECONDS)
    )
    await produce(bootstrap, deployment.input_topic, mix, Produced())
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


async def scale_run(workers: int, bootstrap: str, mix: Mix, fetch_wait: int) -> RunResult:
    """`workers` workers on SCALE_PARTITIONS partitions, all ready, then `mix` produced at once."""
    deployment = await deploy("pipeline", bootstrap, SCALE_PARTITIONS, fetch_wait)
    for _ in range(workers):
        deployment.start_worker()
    try:
        await wait_ready(deployment)
        produced = Produced()
        tracker = Tracker(mix.event_ids, produced, deployment.dlq_topic)
        sampler = Sampler([p.pid for p in deployment.procs]).start()
        await asyncio.gather(
            produce(bootstrap, deployment.input_topic, mix, produced),
            follow(bootstrap, deployment.follow_topics, tracker, RUN_TIMEOUT),
        )
        await sampler.stop()
    finally:
        await asyncio.to_thread(deployment.stop)
    return _window(tracker, sampler, len(mix.records) - 1)


# --- profile ---------------------------------------------------------------------------------------


async def profile_run(bootstrap: str, mix: Mix, fetch_wait: int) -> list[tuple[str, float, float]] | None:
    """One untimed worker run under `py-spy record`; the top self-time functions (share of samples)."""
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        console.print("[yellow]profile skipped[/]: py-spy not installed (pip install py-spy)")
        return None
    deployment = await deploy("pipeline", bootstrap, PARTITIONS, fetch_wait)
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
        produced = Produced()
        tracker = Tracker(mix.event_ids, produced, deployment.dlq_topic)
        await asyncio.gather(
            produce(bootstrap, deployment.input_topic, mix, produced),
            follow(bootstrap, deployment.follow_topics, tracker, RUN_TIMEOUT),
        )
        recorder.send_signal(signal.SIGINT)
        await asyncio.to_thread(recorder.wait, 30)
    finally:
        await asyncio.to_thread(deployment.stop)
    self_samples: Counter[str] = Counter()
    with open(raw) as handle:
        for line in handle:
            stack, _, count = line.rstrip().rpartition(" ")
            if not stack:
                continue
            leaf = stack.split(";")[-1]
            name, _, where = leaf.partition(" (")
            self_samples[f"{name} ({where.split(':')[0]})"] += int(count)
    total = sum(self_samples.values()) or 1
    console.print(f"profile: {total} active samples at 200 Hz, raw stacks in {raw}")
    return [(name, count / total, count / 200) for name, count in self_samples.most_common(10)]


# --- report ----------------------------------------------------------------------------------------


def _spread(values: Sequence[float], fmt: str) -> str:
    median = statistics.median(values)
    if len(values) == 1:
        return format(median, fmt)
    return f"{format(median, fmt)} [{format(min(values), fmt)}-{format(max(values), fmt)}]"


def _loadavg() -> str:
    with contextlib.suppress(OSError), open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])
    return "?"


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "n/a"


WORKDIR = ""


async def _run_all(bootstrap: str, broker_kind: str) -> int:
    fetch_wait, worker_has_setting = fetch_wait_setting()
    failures = 0
    rows: list[tuple[str, str, str, str]] = []
    notes: list[str] = []
    if not worker_has_setting and fetch_wait != FAUST_FETCH_MAX_WAIT_MS:
        notes.append(
            f"[red]the worker has no CONSUMER_FETCH_MAX_WAIT_MS setting: it uses Faust's "
            f"{FAUST_FETCH_MAX_WAIT_MS} ms while the passthroughs use {fetch_wait} ms[/]"
        )
    mix = build_mix(MIX_EVENTS, MIX_TRACES)
    console.print(f"mix: {mix.describe()}; load average before: {_loadavg()}")
    console.print(
        f"fetch wait {fetch_wait} ms (worker setting {'present' if worker_has_setting else 'absent'}), "
        f"{PARTITIONS} partition(s), {RUNS} run(s) each, work dir {WORKDIR}"
    )

    # 1. throughput: contestants interleaved so drift spreads over all of them.
    results: dict[str, list[RunResult]] = {"naive": [], "batched": [], "pipeline": []}
    for run in range(RUNS):
        for kind in results:
            try:
                result = await throughput_run(kind, bootstrap, mix, fetch_wait)
            except Exception as exc:
                failures += 1
                console.print(f"[red]throughput {kind} run {run + 1} failed[/]: {exc}")
                continue
            results[kind].append(result)
            console.print(
                f"throughput {kind:8} run {run + 1}: {result.rate:8,.0f} events/s, "
                f"{result.cpu_us:6.0f} us CPU/event, RSS {result.rss_mb:5.0f} MB, "
                f"{result.seconds:.2f} s, {result.cpu_share:.2f} cores, dead letters {result.dead}"
            )
    labels = {
        "naive": "naive Faust passthrough (async for + topic.send)",
        "batched": "batched Faust passthrough (noack_take + producer.send)",
        "pipeline": "confidence-streams worker (every input scored)",
    }
    base = results["naive"]
    base_rate = statistics.median(r.rate for r in base) if base else 0.0
    base_cpu = statistics.median(r.cpu_us for r in base) if base else 0.0
    base_rss = statistics.median(r.rss_mb for r in base) if base else 0.0
    for kind, runs in results.items():
        if not runs:
            rows.append((f"throughput: {labels[kind]}", "FAILED", "", ""))
            continue
        rate = statistics.median(r.rate for r in runs)
        cpu = statistics.median(r.cpu_us for r in runs)
        rss = statistics.median(r.rss_mb for r in runs)
        figures = (
            f"{_spread([r.rate for r in runs], ',.0f')} events/s; "
            f"CPU {_spread([r.cpu_us for r in runs], '.0f')} us/event ({_ratio(cpu, base_cpu)}); "
            f"RSS {_spread([r.rss_mb for r in runs], '.0f')} MB ({_ratio(rss, base_rss)})"
        )
        if kind == "pipeline" and base_rate:
            figures += f"; targets: >= 1.0x throughput (1.5x = {1.5 * base_rate:,.0f}/s), CPU <= 2.0x"
        rows.append(
            (
                f"throughput: {labels[kind]}",
                _ratio(rate, base_rate),
                "naive passthrough" if kind != "naive" else "(baseline)",
                figures,
            )
        )
    pipeline_rate = statistics.median(r.rate for r in results["pipeline"]) if results["pipeline"] else 0.0

    # 2. latency at half the worker's measured throughput, the naive passthrough at the same load.
    if pipeline_rate:
        rate = LATENCY_LOAD * pipeline_rate
        latency: dict[str, RunResult] = {}
        for kind in ("naive", "batched", "pipeline"):
            try:
                latency[kind] = await latency_run(kind, bootstrap, rate, LATENCY_SECONDS, fetch_wait)
            except Exception as exc:
                failures += 1
                console.print(f"[red]latency {kind} failed[/]: {exc}")
                continue
            lat = latency[kind].latency_ms
            console.print(
                f"latency {kind:8} at {rate:,.0f}/s: "
                + ", ".join(
                    f"{k} p50 {percentile(v, 0.5):.0f} p99 {percentile(v, 0.99):.0f} ms (n={len(v)})"
                    for k, v in sorted(lat.items())
                )
                + f"; worker {latency[kind].cpu_share:.2f} cores"
            )
        naive_all = (
            [v for values in latency["naive"].latency_ms.values() for v in values]
            if "naive" in latency
            else []
        )
        base_p50, base_p99 = percentile(naive_all, 0.5), percentile(naive_all, 0.99)
        load = f"{rate:,.0f} events/s for {LATENCY_SECONDS:.0f} s"
        if "batched" in latency:
            batched_all = [v for values in latency["batched"].latency_ms.values() for v in values]
            p50, p99 = percentile(batched_all, 0.5), percentile(batched_all, 0.99)
            rows.append(
                (
                    "latency: batched passthrough (p50 / p99)",
                    f"{_ratio(p50, base_p50)} / {_ratio(p99, base_p99)}",
                    "naive passthrough, same load",
                    f"{p50:.0f} / {p99:.0f} ms vs {base_p50:.0f} / {base_p99:.0f} ms at {load}",
                )
            )
        if "pipeline" in latency:
            for kind in ("RESPONSE_SCORED", "TRACE_SCORED", "CLAIM_SCORED", "SYNTHESIS_SCORED"):
                values = latency["pipeline"].latency_ms.get(kind, [])
                if not values:
                    continue
                p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
                target = "; target p50 < 20, p99 < 50 ms" if kind == "RESPONSE_SCORED" else ""
                rows.append(
                    (
                        f"latency: {kind} (p50 / p99)",
                        f"{_ratio(p50, base_p50)} / {_ratio(p99, base_p99)}",
                        "naive passthrough, same load",
                        f"{p50:.0f} / {p99:.0f} ms vs {base_p50:.0f} / {base_p99:.0f} ms at {load} "
                        f"(n={len(values)}){target}",
                    )
                )
    else:
        rows.append(("latency", "SKIPPED", "", "no worker throughput to derive the load from"))

    # 3. memory curve.
    try:
        memory = await memory_run(bootstrap, fetch_wait)
        console.print(
            f"memory curve: {memory.events:,} events over {memory.traces:,} traces, event time spanning "
            f"{MEMORY_SPAN_DAYS:.0f} days, SWEEP_INTERVAL_SECONDS={MEMORY_SWEEP_SECONDS:.0f}"
            + (f", [yellow]stopped at the {MEMORY_SECONDS:.0f} s cap[/]" if memory.capped else "")
        )
        previous: MemoryPoint | None = None
        for point in memory.points:
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
        if memory.points:
            last = memory.points[-1]
            half = min(memory.points, key=lambda p: abs(p.processed - last.processed / 2))
            rows.append(
                (
                    "memory: worker RSS, end vs half-way",
                    _ratio(last.rss_mb, half.rss_mb),
                    f"RSS at {half.processed:,} events",
                    f"{last.rss_mb:.0f} MB at {last.processed:,} vs {half.rss_mb:.0f} MB; "
                    f"{memory.traces:,} traces; tables at end: "
                    + ", ".join(f"{k} {v:,}" for k, v in sorted(last.tables.items()))
                    + (" (time cap reached)" if memory.capped else ""),
                )
            )
    except Exception as exc:
        failures += 1
        console.print(f"[red]memory run failed[/]: {exc}")
        rows.append(("memory", "FAILED", "", str(exc)[:80]))

    # 4. scale-out.
    scale_mix = build_mix(SCALE_EVENTS, SCALE_EVENTS // 7, seed=3, run="scale")
    scale: dict[int, RunResult] = {}
    for workers in (1, 2):
        try:
            scale[workers] = await scale_run(workers, bootstrap, scale_mix, fetch_wait)
        except Exception as exc:
            failures += 1
            console.print(f"[red]scale-out with {workers} worker(s) failed[/]: {exc}")
            continue
        r = scale[workers]
        console.print(
            f"scale-out {workers} worker(s): {r.rate:,.0f} events/s, {r.cpu_us:.0f} us CPU/event, "
            f"{r.cpu_share:.2f} cores, RSS {r.rss_mb:.0f} MB (sum)"
        )
    if 1 in scale and 2 in scale:
        rows.append(
            (
                f"scale-out: 2 workers vs 1, {SCALE_PARTITIONS} partitions",
                _ratio(scale[2].rate, scale[1].rate),
                "1 worker",
                f"{scale[2].rate:,.0f} vs {scale[1].rate:,.0f} events/s ({len(scale_mix.records):,} events); "
                f"the machine has {os.cpu_count()} cores, shared with the broker and the producer",
            )
        )

    if PROFILE:
        try:
            profile_mix = build_mix(2 * MIX_EVENTS, 2 * MIX_TRACES, seed=77, run="profile")
            top = await profile_run(bootstrap, profile_mix, fetch_wait)
        except Exception as exc:
            failures += 1
            console.print(f"[red]profile failed[/]: {exc}")
            top = None
        if top:
            profile = Table(title="worker self time under py-spy (top 10, share of active samples)")
            for column in ("function (file)", "share", "seconds"):
                profile.add_column(column, justify="left" if column.startswith("function") else "right")
            for name, share, seconds in top:
                profile.add_row(name, f"{100 * share:.1f}%", f"{seconds:.2f}")
            console.print(profile)

    table = Table(
        title=(
            f"pipeline benchmark: {broker_kind} broker, {os.cpu_count()} cores, fetch wait {fetch_wait} ms, "
            f"{PARTITIONS} partition(s), {RUNS} run(s) each (median [min-max]); mix {mix.describe()}"
        )
    )
    for column in ("measurement", "ratio", "baseline (same run)", "absolute figures"):
        table.add_column(column, justify="right" if column == "ratio" else "left")
    for row in rows:
        table.add_row(*row)
    notes.append(f"load average after: {_loadavg()} (1, 5, 15 min; other processes distort every figure)")
    for note in notes:
        console.print(note)
    console.print(table)
    return failures


def main() -> int:
    global WORKDIR
    WORKDIR = tempfile.mkdtemp(prefix="confidence-bench-")
    started = time.monotonic()
    with broker() as running:
        try:
            failures = asyncio.run(_run_all(running.bootstrap_servers, running.kind))
        except Exception:
            traceback.print_exc()
            failures = 1
    console.print(f"pipeline benchmark took {time.monotonic() - started:.0f} s; logs in {WORKDIR}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
