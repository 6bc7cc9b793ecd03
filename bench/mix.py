"""A realistic, deterministic input mix for the pipeline benchmarks.

By count about 29 % LLM_RESPONSE (each with 50-200 token logprobs), 42 % TOOL_INVOCATION and 29 % CLAIM,
mean about 770 bytes per record. Many tenants, agents and traces, traces interleaved as they are on a
busy input topic; some traces fan out into sub calls and a synthesis, and some claims support or
contradict earlier claims of their tenant (so the claim graph re-scores). Event time advances a fixed
step per event, so a long run ages its state past the TTLs the way a real stream does, and ends at the
last midnight (UTC) before now: the worker's expiry clocks never run ahead of the wall clock, so event
times in the future would keep every state alive.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from streams.demo import encode

__all__ = ["Mix", "build_mix"]

TENANTS = 25
AGENT_TYPES = ("planner", "patcher", "validator", "clerk", "researcher", "planner")
MODELS = ("gpt-4o", "claude-sonnet", "llama-3-70b")
ACTIVE_TRACES = 40  # traces open at once on the topic, interleaved
TOOLS: tuple[tuple[str, str], ...] = (
    ("find", "MemoryManager"),
    ("grep", "parse_config"),
    ("references", "RetryPolicy.backoff"),
    ("read", "src/storage/segment_writer.cpp"),
    ("read", "include/net/connection_pool.h"),
    ("discovery", "project"),
    ("cmake", "all"),
    ("ctest", "unit"),
    ("git", "log --oneline -20"),
    ("gh", "pr checks 412"),
)
SENTENCES = (
    "The bug is in `parse_config`: it drops the last line when the file has no trailing newline.",
    "I think the cache might be stale, but I am not sure which layer holds it.",
    "Verified and tested: the build is green and the change is documented in CHANGELOG.md.",
    "Possibly the timeout, perhaps the retry policy; it is unclear which one triggers first.",
    "The segment writer flushes before the index is updated, so a crash can leave a dangling entry.",
    "- fix the loop bound\n- add a regression test\n- document the new flag",
    "```python\nfor i in range(n):\n    total += values[i]\n```",
    "## Findings\nThe connection pool never releases sockets on a TLS handshake error.",
    "According to the retrieved design doc, retries use exponential backoff capped at 30 seconds.",
    "This definitely resolves the race: the lock is now taken before the read.",
)
QUERIES = (
    "Why does the nightly build fail on the storage module, and which commit introduced the failure?",
    "Summarise the open issues about connection pool exhaustion and propose a fix with a test plan.",
    "Find where the retry policy is configured and explain how backoff is computed for idempotent calls.",
    "Review the patch to segment_writer.cpp for crash safety and list what still needs verification.",
)
STATEMENTS = (
    "The function returns nil on error",
    "Retries use exponential backoff",
    "The index is rebuilt on startup",
    "The cache is invalidated on every write",
    "Connections are pooled per host",
    "The parser accepts trailing commas",
)


@dataclass
class Mix:
    """Encoded records (key, value) in produce order, with what a benchmark needs to check completion."""

    records: list[tuple[bytes, bytes]] = field(default_factory=list)
    event_ids: list[str] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)
    traces: int = 0
    tenants: int = 0

    @property
    def mean_bytes(self) -> float:
        return sum(len(v) for _, v in self.records) / max(1, len(self.records))

    def describe(self) -> str:
        total = max(1, len(self.records))
        shares = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in sorted(self.kinds.items()))
        return (
            f"{len(self.records):,} events ({shares}), mean {self.mean_bytes:.0f} B, "
            f"{self.traces:,} traces, {self.tenants} tenants"
        )


class _Trace:
    def __init__(self, number: int, rng: random.Random, events: int) -> None:
        self.number = number
        self.tenant = f"tenant-{rng.randrange(TENANTS):02d}"
        agent = rng.randrange(len(AGENT_TYPES))
        self.agent_name = f"{AGENT_TYPES[agent]}-{agent}"
        self.agent_type = AGENT_TYPES[agent]
        responses = max(1, round(events * 0.29))
        claims = max(1, round(events * 0.29))
        tools = max(1, events - responses - claims)
        kinds = ["tool"] * tools + ["claim"] * claims
        rng.shuffle(kinds)
        # A third of the traces with several responses fan out: sub calls, then a synthesis last.
        self.fan_out = responses >= 2 and rng.random() < 0.33
        steps = ["response"] * (responses - 1 if self.fan_out else responses)
        for step in steps:
            kinds.insert(rng.randrange(len(kinds) + 1), step)
        if self.fan_out:
            kinds.append("synthesis")
        self.steps = kinds
        self.position = 0
        self.sub_calls = 0

    @property
    def trace_id(self) -> str:
        return f"trace-{self.number}"


def build_mix(
    events: int,
    traces: int,
    seed: int = 42,
    run: str = "mix",
    seconds_per_event: float = 5.0,
) -> Mix:
    """`events` input events over about `traces` traces (deterministic for the arguments and the day)."""
    rng = random.Random(seed)
    mix = Mix()
    end = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    start = end - timedelta(seconds=events * seconds_per_event)
    per_trace = max(3, round(events / max(1, traces)))
    next_trace = 0
    active: list[_Trace] = []
    tenant_claims: dict[str, list[str]] = {}
    tenants: set[str] = set()
    while len(mix.records) < events:
        while len(active) < ACTIVE_TRACES:
            active.append(_Trace(next_trace, rng, per_trace))
            next_trace += 1
        trace = active[rng.randrange(len(active))]
        step = trace.steps[trace.position]
        trace.position += 1
        if trace.position == len(trace.steps):
            active.remove(trace)
        index = len(mix.records)
        event: dict[str, Any] = {
            "event_id": f"{run}-{index:07d}",
            "timestamp": (start + timedelta(seconds=index * seconds_per_event)).isoformat(),
            "tenant_id": trace.tenant,
            "trace_id": trace.trace_id,
            "agent_name": trace.agent_name,
            "agent_type": trace.agent_type,
            "schema_version": 1,
        }
        tenants.add(trace.tenant)
        if step == "tool":
            _tool(event, rng)
        elif step == "claim":
            _claim(event, rng, trace, tenant_claims.setdefault(trace.tenant, []))
        else:
            _response(event, rng, trace, step)
        mix.records.append((trace.trace_id.encode(), encode(event)))
        mix.event_ids.append(event["event_id"])
        mix.kinds[event["event_type"]] += 1
    mix.traces = next_trace
    mix.tenants = len(tenants)
    return mix


def _tool(event: dict[str, Any], rng: random.Random) -> None:
    tool, target = TOOLS[rng.randrange(len(TOOLS))]
    roll = rng.random()
    status = "ok" if roll < 0.8 else ("empty" if roll < 0.93 else "error")
    event.update(event_type="TOOL_INVOCATION", tool=tool, target=target, status=status)
    if rng.random() < 0.1:
        event["phase"] = "recovery"
    if tool in ("find", "grep", "references") and status == "ok":
        event["result_count"] = rng.randrange(1, 40)
    elif tool == "discovery":
        event["factors_found"] = rng.randrange(0, 5)
    elif tool == "cmake":
        event["build_passed"] = status == "ok"
    elif tool == "ctest":
        event["tests_passed"] = status == "ok"
        event["complete"] = True


def _claim(event: dict[str, Any], rng: random.Random, trace: _Trace, known: list[str]) -> None:
    claim_id = f"c-{trace.number}-{trace.position}"
    kinds = rng.sample(["agent", "tool", "extraction", "user"], rng.randrange(1, 4))
    event.update(
        event_type="CLAIM",
        claim_id=claim_id,
        statement=f"{STATEMENTS[rng.randrange(len(STATEMENTS))]} (module {trace.number % 97})",
        source_id=f"sub-{trace.sub_calls}",
        tier=rng.choice(("ephemeral", "task", "task", "project", "persistent")),
        provenance=[
            {
                "source_type": k,
                "confidence": round(rng.uniform(0.4, 0.95), 3),
                "source_id": f"{k}-{trace.trace_id}",
            }
            for k in kinds
        ],
    )
    if known and rng.random() < 0.4:
        target = known[-1 - rng.randrange(min(len(known), 50))]
        event["relationships"] = [
            {
                "type": "supports" if rng.random() < 0.7 else "contradicts",
                "target": target,
                "strength": round(rng.uniform(0.3, 0.9), 2),
            }
        ]
    known.append(claim_id)
    if len(known) > 200:
        del known[:100]


def _response(event: dict[str, Any], rng: random.Random, trace: _Trace, step: str) -> None:
    mean = rng.choice((-0.05, -0.05, -0.15, -0.4, -1.2))
    count = rng.randrange(50, 201)
    logprobs: list[float | None] = [round(min(0.0, rng.gauss(mean, 0.25)), 5) for _ in range(count)]
    if rng.random() < 0.1:
        logprobs[rng.randrange(count)] = None  # providers sometimes drop a token's logprob
    text = " ".join(SENTENCES[rng.randrange(len(SENTENCES))] for _ in range(rng.randrange(2, 6)))
    role = "single"
    if trace.fan_out:
        role = "synthesis" if step == "synthesis" else "sub_call"
    event.update(
        event_type="LLM_RESPONSE",
        request_id=f"req-{event['event_id']}",
        model=MODELS[trace.number % len(MODELS)],
        endpoint="/v1/chat",
        role=role,
        query=QUERIES[trace.number % len(QUERIES)],
        response=text,
        token_logprobs=logprobs,
    )
    if role == "sub_call":
        trace.sub_calls += 1
        event["sub_call_id"] = f"sub-{trace.sub_calls}"
    if rng.random() < 0.3:
        event["retrieval"] = [
            {"similarity": round(rng.uniform(0.5, 0.98), 3), "source": "docs"} for _ in range(2)
        ]
    if trace.agent_type == "patcher":
        event["code_validation"] = {
            "code_exists": True,
            "syntax_valid": rng.random() < 0.9,
            "tests_exist": rng.random() < 0.7,
            "tests_pass": rng.random() < 0.6,
        }
