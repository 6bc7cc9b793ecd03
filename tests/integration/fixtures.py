"""Factories for the real-broker tier: a worker on private topics, events, and output collection."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
import urllib.error
import urllib.request
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streams.config import Settings, load_settings
from streams.demo import encode
from streams.demo_runner import worker_env
from streams.harness import RunningBroker, free_port
from streams.kafka_io import Consumed, WorkerProcess, collect, produce
from streams.topics import create_topics
from streams.transport import SKIPPED_OFFSETS

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
GAP_REASON = "Tansu watermark gap, DESIGN section 7"
UNUSED_TABLE_KEY = b"no table uses this key"
Answer = TypeVar("Answer")

# LLM_RESPONSE fields giving the seed 004 composite its strongest inputs (KB 1.0, code 1.0, certainty
# 1.0): the composite never blocks these, so the seed 003 decision alone decides what is flagged.
STRONG_COMPOSITE: dict[str, Any] = {
    "response": "Definitely verified and tested: confirmed and documented.",
    "retrieval": [{"similarity": 0.95, "source": "a"}, {"similarity": 0.9}, {"similarity": 0.85}],
    "code_validation": {
        "code_exists": True,
        "syntax_valid": True,
        "type_valid": True,
        "tests_exist": True,
        "tests_pass": True,
    },
}


def http_get(port: int, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """Status and body of a GET on a worker's web port; error answers (404, 503) are answers too."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get_json(port: int, path: str, timeout: float = 10.0) -> tuple[int, Any]:
    """Status and JSON body of a GET on a worker's web port (views, health).

    A body that is not JSON raises ValueError (as `json.loads` does, so callers that tolerate such an
    answer while partitions move keep catching it), naming the status and the body.
    """
    status, body = http_get(port, path, timeout)
    try:
        return status, json.loads(body)
    except json.JSONDecodeError:
        raise ValueError(f"GET {path} answered {status} without JSON: {body[:200]!r}") from None


def poll(
    fetch: Callable[[], Answer], ready: Callable[[Answer], bool], timeout: float = 10.0, interval: float = 0.1
) -> Answer:
    """`fetch()` once `ready` holds for it, else its last answer after `timeout` (for the caller to assert).

    The one wait-on-a-condition loop of these tests (never sleep-and-hope). Also for a view read right
    after the output it should reflect: a worker that restarted or took a partition over is behind until
    it has restored and processed again, and a view asked of another worker is routed (README "HTTP").
    """
    deadline = time.monotonic() + timeout
    while True:
        answer = fetch()
        if ready(answer) or time.monotonic() > deadline:
            return answer
        time.sleep(interval)


def settled(fetch: Callable[[], Answer], expected: object, timeout: float = 10.0) -> Answer:
    """`poll` until `fetch()` equals `expected`."""
    return poll(fetch, lambda answer: answer == expected, timeout)


def health(port: int, path: str, timeout: float = 2.0) -> tuple[int, dict[str, Any]]:
    """Status and JSON body of a worker's `/healthz` or `/readyz` (503 answers included)."""
    return get_json(port, path, timeout)


def assigned_partitions(port: int) -> int | None:
    """The partitions a ready worker consumes; None while it is starting (refused) or rebalancing (503)."""
    try:
        status, body = health(port, "/readyz", timeout=5)
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return int(body["assigned_partitions"]) if status == 200 else None


@dataclass
class Deployment:
    """Private topics and one or more workers sharing a consumer group."""

    kafka: RunningBroker
    suffix: str
    settings: Settings
    env: dict[str, str]
    workdir: str
    workers: list[WorkerProcess] = field(default_factory=list)
    web_ports: list[int] = field(default_factory=list)

    def start_worker(self, **overrides: str) -> WorkerProcess:
        """A worker on a free web port (or `WEB_PORT` in `overrides`, which also override the rest)."""
        port = int(overrides.get("WEB_PORT", free_port()))
        data_dir = os.path.join(self.workdir, f"worker-{len(self.workers)}")
        env = {**self.env, "WEB_PORT": str(port), "DATA_DIR": data_dir, **overrides}
        worker = WorkerProcess(env, os.path.join(self.workdir, f"worker-{len(self.workers)}.log")).start()
        self.workers.append(worker)
        self.web_ports.append(port)
        return worker

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()

    def replace_worker(self, worker: WorkerProcess) -> WorkerProcess:
        """Stop `worker` with SIGTERM, which must exit 0 (its batch finishes, offsets and changelog are
        committed), close Tansu's changelog gaps (else the successor may restore older state), and start
        the successor, which restores the tables from the changelog."""
        assert worker.stop() == 0
        self.close_changelog_gaps()
        return self.start_worker()

    def produce(self, events: list[dict[str, Any]] | list[bytes], key: bytes | None = None) -> None:
        records = [
            (
                key if key is not None else (str(e["trace_id"]).encode() if isinstance(e, dict) else b"k"),
                encode(e) if isinstance(e, dict) else e,
            )
            for e in events
        ]
        asyncio.run(produce(self.kafka.bootstrap_servers, self.settings.input_topic_names[0], records))

    def collect(self, done: Callable[[list[Consumed]], bool], timeout: float = 90.0) -> list[Consumed]:
        topics = [self.settings.scored_topic, self.settings.flagged_topic, self.settings.dlq_topic]
        try:
            return asyncio.run(collect(self.kafka.bootstrap_servers, topics, done, timeout))
        except TimeoutError as timeout_error:
            # CI keeps only pytest's output: say what the workers were doing when the wait ran out, and
            # whether the broker skipped records of an internal topic (streams/transport.py `_warn_gap`).
            skipped = [line for line in self.log_text().splitlines() if SKIPPED_OFFSETS in line]
            broker_fault = (
                f"\nThe broker ({self.kafka.kind}) skipped offsets of an internal topic, acknowledged unread "
                f"(on Tansu: a known gap under concurrent appends, README 'Brokers'):\n" + "\n".join(skipped)
                if skipped
                else ""
            )
            raise TimeoutError(f"{timeout_error}{broker_fault}\n{self.log_tails()}") from None

    def log_tails(self, lines: int = 40) -> str:
        """Each worker's state and the last `lines` lines of its log."""
        text = []
        for n, worker in enumerate(self.workers):
            state = "running" if worker.alive() else f"exited {worker.process and worker.process.returncode}"
            with open(worker.log_path, errors="replace") as handle:
                tail = handle.readlines()[-lines:]
            text.append(f"--- worker {n} ({state}), last {len(tail)} log lines:\n{''.join(tail)}")
        return "\n".join(text)

    def outputs(self, records: list[Consumed], topic: str | None = None) -> list[dict[str, Any]]:
        wanted = topic or self.settings.scored_topic
        return [orjson.loads(r.value) for r in records if r.topic == wanted]

    def close_changelog_gaps(self) -> dict[TopicPartition, int]:
        """Before a restart whose test compares restored state: make every changelog's reported end real.

        Tansu 0.6.0 reports a partition's end as its last batch's base offset + 1 (DESIGN section 7), so
        after a multi-record batch a restarted worker restores only up to there and starts on older
        state (CI saw a claim node restored without many of its supporters). Where a partition lags, one
        tombstone for a key no table uses is appended: a single-record batch, so the reported end is the
        real end, and restoring it deletes nothing. Said as a warning; a lag on another broker fails.
        Returns the records each lagging partition had past its reported end.
        """
        gaps = asyncio.run(changelog_gaps(self.kafka.bootstrap_servers, self.settings.app_id))
        if not gaps:
            return gaps
        assert self.kafka.is_tansu, f"changelog end offsets lag on {self.kafka.kind}: {gaps}"
        warnings.warn(f"{GAP_REASON}: appended a tombstone to close {gaps}", stacklevel=2)
        asyncio.run(_append_tombstones(self.kafka.bootstrap_servers, list(gaps)))
        left = asyncio.run(changelog_gaps(self.kafka.bootstrap_servers, self.settings.app_id))
        assert not left, f"{GAP_REASON}: still lagging after the tombstones: {left}"
        return gaps

    def log_text(self) -> str:
        text = []
        for worker in self.workers:
            with open(worker.log_path, errors="replace") as handle:
                text.append(handle.read())
        return "\n".join(text)


def deploy(kafka: RunningBroker, partitions: int = 4, **extra: str) -> Deployment:
    suffix = f"-t{uuid.uuid4().hex[:8]}"
    workdir = tempfile.mkdtemp(prefix="confidence-test-")
    env = worker_env(kafka, suffix, workdir, 0, TOPIC_PARTITIONS=str(partitions), **extra)
    settings = load_settings(**{k.lower(): v for k, v in env.items()})
    asyncio.run(create_topics(settings))
    return Deployment(kafka, suffix, settings, env, workdir)


class EventFactory:
    """Builds valid input events; every call gets a fresh event id."""

    def __init__(self, tenant: str = "t1") -> None:
        self.tenant = tenant
        self.run = uuid.uuid4().hex[:6]
        self.n = 0

    def _common(self, kind: str, trace: str, minutes: float, agent: str, agent_type: str) -> dict[str, Any]:
        self.n += 1
        return {
            "event_id": f"{self.run}-{self.n}",
            "event_type": kind,
            "timestamp": (T0 + timedelta(minutes=minutes)).isoformat(),
            "tenant_id": self.tenant,
            "trace_id": trace,
            "agent_name": agent,
            "agent_type": agent_type,
            "schema_version": 1,
        }

    def response(
        self,
        trace: str,
        minutes: float = 0,
        agent: str = "planner-1",
        agent_type: str = "planner",
        **fields: Any,
    ) -> dict[str, Any]:
        event = self._common("LLM_RESPONSE", trace, minutes, agent, agent_type)
        event.update(request_id=f"req-{self.n}", model="gpt-4o", endpoint="/v1/chat", response="Done.")
        event.update(fields)
        return event

    def tool(self, trace: str, tool: str, target: str, minutes: float = 0, **fields: Any) -> dict[str, Any]:
        event = self._common("TOOL_INVOCATION", trace, minutes, "planner-1", "planner")
        event.update(tool=tool, target=target, status="ok")
        event.update(fields)
        return event

    def claim(self, trace: str, claim_id: str, minutes: float = 0, **fields: Any) -> dict[str, Any]:
        event = self._common("CLAIM", trace, minutes, "planner-1", "planner")
        event.update(
            claim_id=claim_id,
            statement=f"statement {claim_id}",
            tier="task",
            provenance=[{"source_type": "agent", "confidence": 0.8}],
        )
        event.update(fields)
        return event

    def outcome(self, trace: str, minutes: float = 0, **fields: Any) -> dict[str, Any]:
        """An OUTCOME (no agent fields: a verdict comes from a human, a test, CI or a judge)."""
        self.n += 1
        event = {
            "event_id": f"{self.run}-o{self.n}",
            "event_type": "OUTCOME",
            "timestamp": (T0 + timedelta(minutes=minutes)).isoformat(),
            "tenant_id": self.tenant,
            "trace_id": trace,
            "schema_version": 1,
            "source": "test",
        }
        event.update(fields)
        return event


def settled_as_offline(
    d: Deployment,
    ids: set[str],
    accepted: set[str],
    refused: set[str],
    dead_source: Callable[[dict[str, Any]], str],
) -> Callable[[list[Consumed]], bool]:
    """`collect`'s condition: each input id in `ids` has an output if `accepted` holds it, or a dead letter
    if `refused` does, as an offline run decided (`dead_source` reads the input id of a dead letter)."""

    def done(records: list[Consumed]) -> bool:
        seen = {
            orjson.loads(r.value).get("source_event_id")
            for r in records
            if r.topic == d.settings.scored_topic
        }
        dead = {dead_source(orjson.loads(r.value)) for r in records if r.topic == d.settings.dlq_topic}
        return ids <= (seen & accepted) | (dead & refused)

    return done


def count_of(
    kind: str, n: int, topic: str, source_ids: set[str] | None = None
) -> Callable[[list[Consumed]], bool]:
    def done(records: list[Consumed]) -> bool:
        seen = 0
        for r in records:
            if r.topic != topic:
                continue
            out = orjson.loads(r.value)
            if out.get("event_type") == kind and (
                source_ids is None or out.get("source_event_id") in source_ids
            ):
                seen += 1
        return seen >= n

    return done


async def create_plain_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    """Topics made the way someone else would make them: plain, replication 1, no configs."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1) for name in names])
    finally:
        await admin.close()


async def changelog_gaps(bootstrap: str, app_id: str) -> dict[TopicPartition, int]:
    """Per changelog partition: records past the end offset the broker reports (Tansu's lag), if any."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        topics = [t for t in await admin.list_topics() if t.startswith(app_id) and t.endswith("-changelog")]
    finally:
        await admin.close()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, fetch_max_wait_ms=100
    )
    await consumer.start()
    try:
        await consumer.topics()
        tps = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        reported = await consumer.end_offsets(tps)
        real = dict.fromkeys(tps, 0)
        empty = 0
        while empty < 4:
            batches = await consumer.getmany(timeout_ms=500)
            empty = 0 if batches else empty + 1
            for tp, batch in batches.items():
                real[tp] = max(real[tp], batch[-1].offset + 1)
    finally:
        await consumer.stop()
    return {tp: real[tp] - reported[tp] for tp in tps if real[tp] > reported[tp]}


async def _append_tombstones(bootstrap: str, partitions: list[TopicPartition]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for tp in partitions:  # one request each, so each is a batch of one record
            await producer.send_and_wait(tp.topic, key=UNUSED_TABLE_KEY, value=None, partition=tp.partition)
    finally:
        await producer.stop()
