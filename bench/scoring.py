"""Pure scoring cost per call (median / p99 microseconds) on a 500-token response, vs `json.loads`."""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from rich.console import Console
from rich.table import Table

from bench import summary
from streams.config import load_settings, scoring_configs
from streams.demo import encode
from streams.scoring import claims, composite, evidence, heuristic, response, synthesis

REPEAT = 2000


def _timed(fn: Callable[[], object], repeat: int = REPEAT) -> tuple[float, float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def main() -> None:
    rng = random.Random(1)
    cfg = scoring_configs(load_settings())
    logprobs: list[float | None] = [min(0.0, rng.gauss(-0.2, 0.3)) for _ in range(500)]
    text = " ".join(
        rng.choice(["the", "function", "maybe", "returns", "definitely", "nil", "- item", "## h"])
        for _ in range(400)
    )
    event = {
        "event_id": "e",
        "event_type": "LLM_RESPONSE",
        "timestamp": "2026-11-22T10:00:00Z",
        "tenant_id": "t",
        "trace_id": "tr",
        "agent_name": "a",
        "agent_type": "planner",
        "schema_version": 1,
        "request_id": "r",
        "model": "m",
        "endpoint": "/e",
        "response": text,
        "token_logprobs": logprobs,
    }
    raw = encode(event)
    now = datetime(2026, 11, 22, tzinfo=UTC)
    history = [(now - timedelta(minutes=i), i % 3 != 0) for i in range(200)]
    state = evidence.EvidenceState()
    for i, (tool, target) in enumerate(
        [("find", "Mem"), ("grep", "Mem"), ("read", "src/Mem.h"), ("cmake", "all")]
    ):
        state = evidence.update(
            state, evidence.Invocation(event_id=str(i), tool=tool, target=target, status="ok"), cfg.evidence
        )
    invocation = evidence.Invocation(event_id="x", tool="read", target="src/Mem.cpp", status="ok")
    prov = [claims.Provenance(source_type=t, confidence=0.7) for t in ("a", "b", "c")]
    h = heuristic.score_heuristic(text)
    subs = [
        synthesis.SubResult(
            sub_call_id=str(i), content=text, heuristic_components=h.components, logprob_confidence=0.8
        )
        for i in range(5)
    ]
    trace_claims = [
        synthesis.TraceClaim(claim_id=str(i), statement=f"The function returns nil {i}") for i in range(10)
    ]

    def claim_score() -> object:
        lower, upper, diversity = claims.aggregate(prov, cfg.claims)
        stale = claims.staleness_factor(now - timedelta(hours=1), now, "task", cfg.claims)
        return claims.effective_interval(
            lower, upper, diversity, stale, [(0.8, 0.5)], [(0.7, 0.9)], 1.0, cfg.claims
        )

    cases: list[tuple[str, Callable[[], object]]] = [
        ("baseline: json.loads of the event", lambda: json.loads(raw)),
        (
            "response: calculate + evaluate",
            lambda: response.evaluate_confidence(
                response.calculate_confidence(logprobs, "average", 3), cfg.response
            ),
        ),
        ("response: percentile_90", lambda: response.calculate_confidence(logprobs, "percentile_90", 3)),
        ("heuristic: score_heuristic", lambda: heuristic.score_heuristic(text)),
        (
            "composite: history (200) + score",
            lambda: composite.score_composite(
                "planner", [0.9, 0.8], None, text, composite.history_score(history, now), cfg.composite
            ),
        ),
        (
            "evidence: update + score",
            lambda: evidence.score(evidence.update(state, invocation, cfg.evidence), cfg.evidence),
        ),
        ("claims: aggregate + stale + effective", claim_score),
        ("synthesis: 5 sources, 10 claims", lambda: synthesis.synthesize(subs, trace_claims, cfg.synthesis)),
    ]
    results = [(name, *_timed(fn)) for name, fn in cases]
    base_median = results[0][1]
    table = Table(title=f"scoring cost per call ({REPEAT} calls each, 500-token response)")
    for column in ("scorer", "median us", "p99 us", "x json.loads"):
        table.add_column(column, justify="right" if column != "scorer" else "left")
    for name, median, p99 in results:
        table.add_row(name, f"{median:.1f}", f"{p99:.1f}", f"{median / base_median:.2f}")
    for name, median, p99 in results[1:]:
        summary.add(
            f"scorer: {name}",
            median / base_median,
            f"{results[0][0].removeprefix('baseline: ')} ({base_median:.1f} us)",
            f"{median:.1f} us median, {p99:.1f} p99 ({REPEAT} calls, 500-token response)",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
