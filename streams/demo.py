"""Realistic demo traffic: several tenants, agents and traces, low-confidence responses and bad records."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

__all__ = ["DemoTraffic", "demo_traffic", "encode"]

BASE_TIME = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)


def encode(event: dict[str, Any]) -> bytes:
    """JSON with the non-finite literals (NaN, Infinity) that producers may put in token_logprobs."""
    logprobs = event.get("token_logprobs")
    if not logprobs or all(v is None or math.isfinite(v) for v in logprobs):
        return orjson.dumps(event)
    # orjson refuses non-finite floats: write the array by hand, the rest with orjson.
    body = orjson.dumps({k: v for k, v in event.items() if k != "token_logprobs"})
    items = ",".join("null" if v is None else _literal(v) for v in logprobs)
    return body[:-1] + b',"token_logprobs":[' + items.encode() + b"]}"


def _literal(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


@dataclass
class DemoTraffic:
    """The records to produce, in order, and what the worker must answer."""

    records: list[tuple[bytes, bytes]] = field(default_factory=list)
    responses: int = 0
    tools: int = 0
    claims: int = 0
    claim_rescores: int = 0  # CLAIM_SCORED outputs caused by another claim's arrival (at least)
    syntheses: int = 0
    bad: int = 0
    # OUTCOME events per tenant that judge a response (the calibration view waits for them).
    response_outcomes: dict[str, int] = field(default_factory=dict)


class _Builder:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.traffic = DemoTraffic()
        self.counter = 0

    def common(
        self, kind: str, tenant: str, trace: str, agent: str, agent_type: str, minutes: float
    ) -> dict[str, Any]:
        self.counter += 1
        return {
            "event_id": f"demo-{self.counter:05d}",
            "event_type": kind,
            "timestamp": (BASE_TIME + timedelta(minutes=minutes)).isoformat(),
            "tenant_id": tenant,
            "trace_id": trace,
            "agent_name": agent,
            "agent_type": agent_type,
            "schema_version": 1,
        }

    def add(self, event: dict[str, Any]) -> None:
        self.traffic.records.append((str(event["trace_id"]).encode(), encode(event)))

    def logprobs(self, mean: float, n: int = 40) -> list[float | None]:
        values: list[float | None] = [min(0.0, self.rng.gauss(mean, 0.05)) for _ in range(n)]
        values[3] = None  # providers sometimes drop a token's logprob
        return values


def _outcomes(b: _Builder, minute: float) -> None:
    """Feedback on what was scored: the calibration join (README "Calibration").

    Each response is judged: confident ones (logprob mean -0.05, confidence about 0.95) turn out right
    80 % of the time and hesitant ones 30 %, so the groups are over-confident by about 0.15. One verdict
    judges the investigation trace's evidence and one a claim.
    """
    responses = [orjson.loads(raw) for _, raw in b.traffic.records if b'"event_type":"LLM_RESPONSE"' in raw]
    for response in responses:
        minute += 0.1
        event = b.common("OUTCOME", response["tenant_id"], response["trace_id"], "", "", minute)
        del event["agent_name"], event["agent_type"]  # a verdict names no agent
        logprobs = [v for v in response["token_logprobs"] if v is not None]
        confident = sum(logprobs) / len(logprobs) > -0.5
        event.update(
            subject_event_id=response["event_id"],
            correct=b.rng.random() < (0.8 if confident else 0.3),
            source="judge",
        )
        b.add(event)
        tenant = response["tenant_id"]
        b.traffic.response_outcomes[tenant] = b.traffic.response_outcomes.get(tenant, 0) + 1
    for extra in ({"correct": True}, {"claim_id": "c-nil-2", "correct": False}):
        minute += 0.1
        trace = "trace-investigation" if "claim_id" not in extra else "trace-synth"
        event = b.common("OUTCOME", "acme", trace, "", "", minute)
        del event["agent_name"], event["agent_type"]
        event.update(source="human", **extra)
        b.add(event)


def demo_traffic(seed: int = 7) -> DemoTraffic:
    """Build the demo scenario (deterministic for a seed)."""
    b = _Builder(seed)
    t = b.traffic
    agents = [
        ("acme", "planner-1", "planner"),
        ("acme", "patcher-1", "patcher"),
        ("globex", "validator-1", "validator"),
        ("globex", "clerk-1", "clerk"),
    ]
    texts = [
        "The bug is in `parse_config`: it **definitely** drops the last line. Verified, tested and confirmed.\n"
        "- fix the loop bound\n- add a regression test\n```python\nfor i in range(n):\n```",
        "I think the cache might be stale, maybe. Not sure.",
        "Verified and tested: the build is confirmed green and the change is documented in CHANGELOG.",
        "Possibly the timeout, perhaps the retry policy; it is unclear which.",
    ]
    minute = 0.0
    for round_ in range(3):
        for i, (tenant, agent, agent_type) in enumerate(agents):
            minute += 1
            trace = f"trace-{tenant}-{round_}-{i}"
            low = (round_ + i) % 3 == 0
            event = b.common("LLM_RESPONSE", tenant, trace, agent, agent_type, minute)
            event.update(
                request_id=f"req-{round_}-{i}",
                model=["gpt-4o", "claude-sonnet"][i % 2],
                endpoint="/v1/chat",
                response=texts[(round_ + i) % len(texts)],
                token_logprobs=b.logprobs(-1.6 if low else -0.05),
                retrieval=[{"similarity": 0.82, "source": "docs"}, {"similarity": 0.74, "source": "code"}]
                if i % 2 == 0
                else None,
                code_validation={"code_exists": True, "syntax_valid": True, "tests_exist": True}
                if agent_type == "patcher"
                else None,
            )
            b.add(event)
            t.responses += 1
    # An investigation trace (seed 001): find + grep + two reads on one symbol, then a build.
    for tool, target, extra in [
        ("find", "MemoryManager", {"result_count": 3}),
        ("grep", "MemoryManager", {"result_count": 12}),
        ("read", "src/MemoryManager.h", {}),
        ("read", "src/MemoryManager.cpp", {}),
        ("cmake", "all", {"build_passed": True}),
    ]:
        minute += 0.5
        event = b.common("TOOL_INVOCATION", "acme", "trace-investigation", "planner-1", "planner", minute)
        event.update(tool=tool, target=target, status="ok", **extra)
        b.add(event)
        t.tools += 1
    # A weak trace: only an empty grep and a failed discovery, then a recovery find.
    for tool, target, status, extra in [
        ("grep", "FooBar", "empty", {}),
        ("discovery", "project", "ok", {"factors_found": 1}),
        ("find", "FooBar", "error", {"phase": "recovery"}),
    ]:
        minute += 0.5
        event = b.common("TOOL_INVOCATION", "globex", "trace-weak", "validator-1", "validator", minute)
        event.update(tool=tool, target=target, status=status, **extra)
        b.add(event)
        t.tools += 1
    # Claims in two traces, one contradicting the other, plus sub calls and a synthesis.
    claim_specs = [
        ("trace-synth", "c-nil-1", "The function returns nil on error", "sub-a", [], ["extraction", "agent"]),
        (
            "trace-synth",
            "c-nil-2",
            "The function never returns nil",
            "sub-b",
            [{"type": "contradicts", "target": "c-nil-1", "strength": 0.8}],
            ["agent"],
        ),
        (
            "trace-other",
            "c-retry",
            "Retries use exponential backoff",
            "sub-c",
            [{"type": "supports", "target": "c-nil-1", "strength": 0.5}],
            ["user", "extraction", "agent"],
        ),
    ]
    for trace, claim_id, statement, source, relationships, kinds in claim_specs:
        minute += 0.5
        event = b.common("CLAIM", "acme", trace, "planner-1", "planner", minute)
        event.update(
            claim_id=claim_id,
            statement=statement,
            source_id=source,
            provenance=[{"source_type": k, "confidence": 0.7, "source_id": source} for k in kinds],
            tier="task",
            relationships=relationships,
        )
        b.add(event)
        t.claims += 1
    # c-nil-2 contradicts c-nil-1: its input re-scores c-nil-1 too. c-retry supports c-nil-1 from another
    # trace, so on several partitions it may reach the claim stage before c-nil-1 (then c-nil-1's own
    # score already has the support) or after it (then c-retry's input re-scores c-nil-1): 1 or 2.
    t.claim_rescores = 1
    for sub_id, text, mean in [
        ("sub-a", "## Findings\n- `load()` returns nil on error\n- callers check it", -0.05),
        ("sub-b", "I think it never returns nil, maybe.", -0.4),
        ("sub-c", "Unclear. Not sure. Maybe. Perhaps. Possibly. Might be.", -2.5),
    ]:
        minute += 0.5
        event = b.common("LLM_RESPONSE", "acme", "trace-synth", "planner-1", "planner", minute)
        event.update(
            request_id=f"req-{sub_id}",
            model="gpt-4o",
            endpoint="/v1/chat",
            role="sub_call",
            sub_call_id=sub_id,
            response=text,
            token_logprobs=b.logprobs(mean, 20),
        )
        b.add(event)
        t.responses += 1
    minute += 0.5
    event = b.common("LLM_RESPONSE", "acme", "trace-synth", "planner-1", "planner", minute)
    event.update(
        request_id="req-synth",
        model="gpt-4o",
        endpoint="/v1/chat",
        role="synthesis",
        response="Combined answer: load() returns nil on error.",
        token_logprobs=b.logprobs(-0.1, 20),
    )
    b.add(event)
    t.responses += 1
    t.syntheses += 1
    _outcomes(b, minute)
    # Bad records: each must land in the DLQ without stopping anything.
    bad_event = b.common("LLM_RESPONSE", "acme", "trace-bad", "planner-1", "planner", minute)
    bad_records = [
        b'{"event_type": "LLM_RESPONSE", "token_logprobs": [-0.1, -0.2',  # truncated JSON
        orjson.dumps({**bad_event, "event_type": "SOMETHING_ELSE"}),
        orjson.dumps({k: v for k, v in bad_event.items() if k != "tenant_id"}),
        orjson.dumps(
            {
                **bad_event,
                "schema_version": 2,
                "request_id": "r",
                "model": "m",
                "endpoint": "e",
                "response": "x",
                "token_logprobs": [-0.5],
            }
        ),
    ]
    for raw in bad_records:
        t.records.append((b"trace-bad", raw))
        t.bad += 1
    return t
