"""Soak traffic, and observing a running worker from outside: /metrics, resident memory, group lag.

Used by the soak and load tests (tests/integration/test_soak.py, test_load.py).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.fixtures import T0, http_get

Labels = tuple[tuple[str, str], ...]


def full_run(config: pytest.Config) -> bool:
    """True when the run selected the `soak` marker (`pytest -m soak`): use the full sizes."""
    expression = str(config.getoption("markexpr") or "")
    return "soak" in expression and "not soak" not in expression


def sized(config: pytest.Config, env_name: str, full: float, short: float) -> float:
    """`env_name` if set, else the full size under `-m soak`, else the shortened size."""
    value = os.environ.get(env_name)
    if value:
        return float(value)
    return full if full_run(config) else short


@dataclass(frozen=True)
class Scrape:
    """One /metrics scrape: every sample by (name, sorted labels)."""

    samples: dict[tuple[str, Labels], float]

    def total(self, name: str, **match: str) -> float:
        """Sum of the samples of `name` whose labels include `match`."""
        return sum(
            value
            for (sample, labels), value in self.samples.items()
            if sample == name and all((k, v) in labels for k, v in match.items())
        )

    def series(self, name: str) -> dict[Labels, float]:
        """The samples of `name` by label set."""
        return {labels: value for (sample, labels), value in self.samples.items() if sample == name}

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, tuple(sorted(labels.items()))))


def scrape(port: int, timeout: float = 20.0) -> Scrape:
    status, body = http_get(port, "/metrics", timeout)
    assert status == 200, body
    text = body.decode()
    samples: dict[tuple[str, Labels], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return Scrape(samples)


def wait_for_metrics(port: int, timeout: float = 60.0) -> Scrape:
    """Scrape until the worker's web server answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return scrape(port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def rss_mb(pid: int) -> float:
    """Resident memory of `pid` in MB, from /proc/<pid>/status (VmRSS is in kB)."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class CpuMeter:
    """CPU use of one process and of the whole machine between two reads, in percent of one core."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._tick = os.sysconf("SC_CLK_TCK")
        self._last = self._read()

    def _read(self) -> tuple[float, float, float]:
        with open(f"/proc/{self.pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        process = (int(fields[11]) + int(fields[12])) / self._tick  # utime + stime
        with open("/proc/stat") as handle:
            cpu = [int(v) for v in handle.readline().split()[1:]]
        idle = (cpu[3] + cpu[4]) / self._tick  # idle + iowait, summed over cores
        return time.monotonic(), process, sum(cpu) / self._tick - idle

    def read(self) -> tuple[float, float]:
        """(process %, machine busy %) since the previous read; 100 % = one core."""
        now, process, busy = self._read()
        then, process_before, busy_before = self._last
        self._last = (now, process, busy)
        wall = max(now - then, 1e-6)
        return 100 * (process - process_before) / wall, 100 * (busy - busy_before) / wall


def event_time(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


async def committed_offsets(
    admin: AIOKafkaAdminClient, group_id: str, topic: str, partitions: int
) -> dict[int, int]:
    """The group's committed offsets (the next offset to read) for `topic`; -1 where none is committed."""
    offsets = await admin.list_consumer_group_offsets(
        group_id, partitions=[TopicPartition(topic, p) for p in range(partitions)]
    )
    return {tp.partition: meta.offset for tp, meta in offsets.items()}


def lag(committed: dict[int, int], ends: dict[int, int]) -> int:
    """Records produced but not yet committed by the group, over all partitions."""
    return sum(max(0, end - max(0, committed.get(p, -1))) for p, end in ends.items())


TENANTS = 5
AGENTS_PER_TENANT = 4
BLOCK = 20  # traces interleaved at a time: a trace lives for BLOCK * EVENTS_PER_TRACE events
# One trace's events, in order: 4 tool invocations, 3 sub-call responses and a synthesis, 2 claims (the
# second supports the first, so it re-scores it).
PATTERN = ("tool", "sub_call", "claim", "tool", "sub_call", "claim", "tool", "sub_call", "tool", "synthesis")
EVENTS_PER_TRACE = len(PATTERN)
# Outputs each step causes: one score per input, plus SYNTHESIS_SCORED for the synthesis response and the
# re-score of the supported claim for the second claim.
OUTPUTS_BY_STEP = tuple(
    2 if kind == "synthesis" or (kind == "claim" and step == 5) else 1 for step, kind in enumerate(PATTERN)
)
OUTPUTS_PER_TRACE = sum(OUTPUTS_BY_STEP)  # 4 TRACE_, 4 RESPONSE_, 1 SYNTHESIS_, 2 + 1 CLAIM_SCORED
TOOLS = ("find", "grep", "read", "cmake")
SECONDS_PER_EVENT = 1.0  # event time advances one second per event


def soak_event(run: str, trace: int, step: int, index: int) -> dict[str, Any]:
    kind = PATTERN[step]
    tenant = f"tenant-{trace % TENANTS}"
    agent = trace // TENANTS % AGENTS_PER_TENANT
    event: dict[str, Any] = {
        "event_id": f"{run}-{trace}-{step}",
        "timestamp": event_time(index * SECONDS_PER_EVENT),
        "tenant_id": tenant,
        "trace_id": f"trace-{trace}",
        "agent_name": f"agent-{agent}",
        "agent_type": "planner",
        "schema_version": 1,
    }
    if kind == "tool":
        event.update(
            event_type="TOOL_INVOCATION",
            tool=TOOLS[step % len(TOOLS)],
            target=f"src/module_{trace}.py",
            status="ok",
            result_count=3,
        )
    elif kind == "claim":
        event.update(
            event_type="CLAIM",
            claim_id=f"c-{trace}-{step}",
            statement=f"module {trace} step {step} is correct",
            source_id=f"sub-{step}",
            tier="task",
            provenance=[
                {"source_type": "agent", "confidence": 0.8},
                {"source_type": "tool", "confidence": 0.7},
            ],
        )
        if step == 5:
            event["relationships"] = [{"type": "supports", "target": f"c-{trace}-2", "strength": 0.6}]
    else:
        event.update(
            event_type="LLM_RESPONSE",
            request_id=f"req-{trace}-{step}",
            model=f"model-{trace % 3}",
            endpoint="/v1/chat",
            role=kind,
            response=f"The module {trace} works; tests pass for step {step}.",
            token_logprobs=[-0.05, -0.2, -0.01 * (trace % 7), -0.4, -0.1],
        )
        if kind == "sub_call":
            event["sub_call_id"] = f"sub-{step}"
    return event


def outputs_of(event: dict[str, Any]) -> Counter[str]:
    """The outputs one soak event causes, by event type (OUTPUTS_BY_STEP, spelled out)."""
    kind = event["event_type"]
    if kind == "TOOL_INVOCATION":
        return Counter(TRACE_SCORED=1)
    if kind == "CLAIM":
        return Counter(CLAIM_SCORED=1 + len(event.get("relationships", ())))
    return Counter(RESPONSE_SCORED=1, SYNTHESIS_SCORED=int(event["role"] == "synthesis"))


def soak_events(run: str, traces: int, first_trace: int = 0) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    """(outputs expected, key, event): BLOCK traces at a time, their events interleaved; event time
    advances one SECONDS_PER_EVENT with every event, continuing from `first_trace`'s place."""
    index = first_trace * EVENTS_PER_TRACE
    end = first_trace + traces
    for first in range(first_trace, end, BLOCK):
        block = range(first, min(first + BLOCK, end))
        for step in range(EVENTS_PER_TRACE):
            for trace in block:
                event = soak_event(run, trace, step, index)
                index += 1
                yield OUTPUTS_BY_STEP[step], event["trace_id"].encode(), event


def keyed(traffic: Iterable[tuple[int, bytes, dict[str, Any]]]) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """The (key, event) pairs of `soak_events`."""
    for _, key, event in traffic:
        yield key, event


async def scan_outputs(bootstrap: str, topic: str, expected: int, timeout: float) -> Counter[str]:
    """Read `topic` from the start until `expected` records arrived (or `timeout`); count them by kind.

    Counts by event type, and SYNTHESIS_SCORED also by its number of sources ("SYNTHESIS_SCORED/3"),
    without keeping the records: a soak's outputs are too many to hold.
    """
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None, fetch_max_wait_ms=100
    )
    await consumer.start()
    counts: Counter[str] = Counter()
    seen = 0
    deadline = time.monotonic() + timeout
    try:
        while seen < expected and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=500, max_records=5_000)).values():
                for record in batch:
                    seen += 1
                    output = orjson.loads(record.value or b"{}")
                    kind = output.get("event_type", "?")
                    counts[kind] += 1
                    if kind == "SYNTHESIS_SCORED":
                        counts[f"{kind}/{len(output['sources'])}"] += 1
    finally:
        await consumer.stop()
    return counts
