"""Through a real broker: the sample values a worker exports on /metrics after known traffic.

Every expected value is worked out by hand from the contract (DESIGN 4, 5) and the traffic below, never
with the scoring code. Both workers use one partition, so events reach every stage in production order
and the expected values (gauges, the order in which label values meet the cap) are deterministic.
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson

from streams.harness import RunningBroker
from streams.kafka_io import Consumed
from tests.integration.fixtures import STRONG_COMPOSITE, Deployment, EventFactory, deploy, poll
from tests.integration.workload import Labels, scrape

# Composite factors (seed 004) of these texts: response certainty only, no KB or code factor.
WEAK = {"response": "Maybe it works, I think."}  # certainty 0.5 - 2 x 0.15 = 0.2
STRONG_TEXT = "## Findings\n- `load()` returns nil on error\n- callers check it\n```go\nif err != nil {}\n```"
WEAK_TEXT = "Maybe. Not sure."
# Seed 000 source confidence of sub-a (STRONG_TEXT, logprobs [-0.05]): 0.877025 / 0.95, worked out in
# tests/integration/test_synthesis.py; the WEAK_TEXT sources score 0.4534 / 0.95 = 0.477 (< 0.5).
SUB_A = 0.877025 / 0.95
UNIT_BUCKETS = ("0.0", "0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8", "0.9", "1.0", "+Inf")
COUNT_BUCKETS = ("0.0", "1.0", "2.0", "3.0", "4.0", "5.0", "6.0", "7.0", "8.0", "9.0", "+Inf")


def _scrape(port: int) -> dict[str, dict[Labels, float]]:
    """Sample name -> {sorted labels -> value} (workload.scrape, parsed by prometheus_client)."""
    samples: dict[str, dict[Labels, float]] = {}
    for (name, labels), value in scrape(port, timeout=10).samples.items():
        samples.setdefault(name, {})[labels] = value
    return samples


def _rounded(samples: dict[str, dict[Labels, float]]) -> dict[str, dict[Labels, float]]:
    return {name: {k: round(v, 9) for k, v in series.items()} for name, series in samples.items()}


def _wait_for_metrics(port: int, expected: dict[str, dict[Labels, float]], timeout: float = 60.0) -> None:
    """Poll /metrics until every listed sample name has exactly the expected series and values.

    Values are compared at 9 decimals (DESIGN 4b): sums and averages are float arithmetic.
    """
    want = _rounded(expected)

    def actual() -> dict[str, dict[Labels, float]]:
        scraped = _scrape(port)
        return _rounded({name: scraped.get(name, {}) for name in expected})

    assert poll(actual, lambda seen: seen == want, timeout, 0.2) == want


def _histogram(
    name: str, buckets: tuple[str, ...], le_counts: dict[str, int], total: float
) -> dict[str, Any]:
    """Bucket, count and sum samples of an unlabelled histogram; `le_counts` lists cumulative counts."""
    return {
        f"{name}_bucket": {(("le", le),): float(le_counts[le]) for le in buckets},
        f"{name}_count": {(): float(le_counts["+Inf"])},
        f"{name}_sum": {(): total},
    }


def _one(label: str, value: str) -> Labels:
    return ((label, value),)


def _response_labels(tenant: str, model: str) -> Labels:
    return (("endpoint", "/v1/chat"), ("model", model), ("tenant", tenant))


def _outputs_seen(d: Deployment, wanted: dict[str, int], dead: int) -> Any:
    """Done once the scored topic holds `wanted` outputs per type and the DLQ `dead` records."""

    def done(records: list[Consumed]) -> bool:
        kinds: dict[str, int] = {}
        dlq = 0
        for r in records:
            if r.topic == d.settings.dlq_topic:
                dlq += 1
            elif r.topic == d.settings.scored_topic:
                kind = orjson.loads(r.value)["event_type"]
                kinds[kind] = kinds.get(kind, 0) + 1
        return dlq >= dead and all(kinds.get(k, 0) >= n for k, n in wanted.items())

    return done


def test_metric_values_after_known_traffic(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=1, SYNTHESIS_MIN_CONFIDENCE="0.5")
    f = EventFactory(tenant="mv")
    # Evidence (DESIGN 4), one TRACE_SCORED each; band and whether recovery is recommended (< 0.50):
    tools = [
        f.tool("ev-1", "find", "Widget", result_count=2),  # search 0.65: adequate
        f.tool("ev-1", "read", "src/Widget.h", minutes=1),  # 0.7318 + 0.15 x 0.2682 = 0.772: strong
        f.tool("ev-2", "find", "Gadget"),  # ok without result_count = results: 0.65 adequate
        f.tool("ev-3", "read", "notes.txt"),  # read without search results 0.55: adequate
        f.tool("ev-4", "git", "main", result_count=3),  # git 0.75: strong
        f.tool("ev-5", "ctest", "suite", tests_passed=False),  # 0.30: weak, recovery
        f.tool("ev-6", "discovery", "x", factors_found=0),  # 0.20: failed, recovery
        f.tool("ev-7", "cmake", "build", build_passed=False),  # 0.15: failed, recovery
        f.tool("ev-8", "find", "y", status="error"),  # adds nothing, 0.0: failed, recovery
    ]
    # Composite (seed 004) per agent, in order; history = threshold met / earlier responses (0.5 if none):
    agents = [
        # patcher (0.80): KB 1, code 1, certainty 1, history 0.5 -> 0.9 met
        f.response("ag-1", agent="fixer-1", agent_type="patcher", **STRONG_COMPOSITE),
        # (0.2 + 1.0) / 2 = 0.6 blocked; then (0.2 + 1/2) / 2 = 0.35 blocked -> success rate 1/3
        f.response("ag-1", minutes=1, agent="fixer-1", agent_type="patcher", **WEAK),
        f.response("ag-1", minutes=2, agent="fixer-1", agent_type="patcher", **WEAK),
        # clerk (0.70), matched lower-cased: (0.2 + 0.5) / 2 = 0.35 blocked -> success rate 0
        f.response("ag-2", agent="clerk-1", agent_type="Clerk", **WEAK),
    ]
    # Synthesis (seed 000) for agent synth-1 (planner, 0.75). Composite: certainty 0.5 ("Combined." and
    # STRONG_TEXT have no marker), 0.35 for WEAK_TEXT ("maybe"); history 0.5 first, then 0.0: all five
    # responses are blocked (0.5, 0.175, 0.175, 0.25, 0.25) -> success rate 0.
    synth = {"agent": "synth-1", "agent_type": "planner"}
    syntheses = [
        # Negated k2 shares function/returns/nil with k1: one heuristic conflict (severity 0.6 >= 0.5).
        f.claim("syn-a", "k1", statement="The function returns nil on error"),
        f.claim("syn-a", "k2", statement="The function never returns nil"),
        f.response("syn-a", role="sub_call", sub_call_id="sub-a", response=STRONG_TEXT, token_logprobs=[-0.05], **synth),
        f.response("syn-a", role="sub_call", sub_call_id="sub-b", response=WEAK_TEXT, token_logprobs=[-3.0], **synth),
        f.response("syn-a", role="sub_call", sub_call_id="sub-c", response=WEAK_TEXT, token_logprobs=[-3.0], **synth),
        # sub-b and sub-c filtered (2); overall = sub-a's 0.923; 1 conflict
        f.response("syn-a", role="synthesis", response="Combined.", **synth),
        # no sub calls: overall 0.0, 0 conflicts, 0 filtered
        f.response("syn-b", role="synthesis", response="Combined.", **synth),
    ]  # fmt: skip
    bogus = f.tool("bad-1", "find", "x")
    bogus["event_type"] = "BOGUS"
    future = f.tool("bad-2", "find", "x")
    future["schema_version"] = 2
    partial = f.tool("bad-3", "find", "x")
    del partial["trace_id"]
    d.start_worker()
    try:
        d.produce(tools + agents + syntheses + [bogus, future])
        d.produce([partial], key=b"bad-3")  # no trace_id to key it by
        d.produce([b"{not json", b"[1,"], key=b"bad")
        d.collect(_outputs_seen(d, {"TRACE_SCORED": 9, "RESPONSE_SCORED": 9, "SYNTHESIS_SCORED": 2}, 5))
        _wait_for_metrics(
            d.web_ports[0],
            {
                **_histogram(
                    "rlm_synthesis_confidence",
                    UNIT_BUCKETS,
                    {le: 2 if le in ("1.0", "+Inf") else 1 for le in UNIT_BUCKETS},  # 0.0 and 0.923
                    SUB_A,
                ),
                **_histogram(
                    "rlm_synthesis_conflicts",
                    COUNT_BUCKETS,
                    {le: 1 if le == "0.0" else 2 for le in COUNT_BUCKETS},  # 0 and 1
                    1.0,
                ),
                **_histogram(
                    "rlm_synthesis_filtered_results",
                    COUNT_BUCKETS,
                    {le: 1 if le in ("0.0", "1.0") else 2 for le in COUNT_BUCKETS},  # 0 and 2
                    2.0,
                ),
                "confidence_evidence_band_total": {
                    _one("band", "strong"): 2,
                    _one("band", "adequate"): 3,
                    _one("band", "weak"): 1,
                    _one("band", "failed"): 3,
                },
                "confidence_recovery_recommended_total": {(): 4},
                "confidence_composite_blocked_total": {
                    _one("agent_type", "patcher"): 2,
                    _one("agent_type", "clerk"): 1,
                    _one("agent_type", "planner"): 5,
                },
                "confidence_agent_success_rate": {
                    (("agent", "fixer-1"), ("tenant", "mv")): 1 / 3,
                    (("agent", "clerk-1"), ("tenant", "mv")): 0.0,
                    (("agent", "synth-1"), ("tenant", "mv")): 0.0,
                },
                "confidence_events_dead_lettered_total": {
                    _one("reason", "invalid_json"): 2,
                    _one("reason", "unknown_event_type"): 1,
                    _one("reason", "unsupported_schema_version"): 1,
                    _one("reason", "missing_field"): 1,
                },
                "confidence_events_processed_total": {
                    _one("event_type", "TOOL_INVOCATION"): 9,
                    _one("event_type", "LLM_RESPONSE"): 9,
                    _one("event_type", "CLAIM"): 2,
                },
                # Seed 003: three responses carry logprobs, exp(-0.05) -> 0.951 and exp(-3) -> 0.05
                # twice (rounded to 3 decimals); the six others have none.
                "llm_confidence_histogram_count": {_response_labels("mv", "gpt-4o"): 3},
                "llm_confidence_histogram_sum": {_response_labels("mv", "gpt-4o"): 0.951 + 0.05 + 0.05},
                "llm_confidence_missing_total": {_response_labels("mv", "gpt-4o"): 6},
                # EWMA, alpha 0.05, seeded by the first value: 0.951, 0.951 - 0.05 x 0.901 = 0.90595,
                # 0.90595 - 0.05 x 0.85595 = 0.8631525
                "llm_confidence_average": {_response_labels("mv", "gpt-4o"): 0.8631525},
            },
        )
        outputs = _scrape(d.web_ports[0])["confidence_outputs_emitted_total"]
        # Claim outputs come from the claim stage; the other three types are this traffic's alone.
        assert {k: v for k, v in outputs.items() if k != _one("event_type", "CLAIM_SCORED")} == {
            _one("event_type", "TRACE_SCORED"): 9,
            _one("event_type", "RESPONSE_SCORED"): 9,
            _one("event_type", "SYNTHESIS_SCORED"): 2,
        }
    finally:
        d.stop()


def test_response_label_sets_beyond_ten_times_the_cap_share_the_all_other_series(
    kafka: RunningBroker,
) -> None:
    """Tenant, model and endpoint were capped one by one: their sets multiplied (101^3 series at the
    default cap). With a cap of 2, 27 sets are possible; 20 keep their own series (thirtieth round)."""
    d = deploy(kafka, partitions=1, METRICS_LABEL_CAP="2")
    f = EventFactory()
    combinations = list(itertools.product("abc", "abc", "abc"))
    events = [
        f.response(
            f"sets-{n}",
            minutes=n,
            tenant_id=f"t-{t}",
            model=f"m-{m}",
            endpoint=f"/e-{e}",
            token_logprobs=[-0.1],
        )
        for n, (t, m, e) in enumerate(combinations)
    ]
    d.start_worker()
    try:
        d.produce(events)
        d.collect(_outputs_seen(d, {"RESPONSE_SCORED": len(events)}, 0))

        def counted() -> dict[Labels, float]:
            return _scrape(d.web_ports[0]).get("llm_confidence_histogram_count", {})

        series = poll(counted, lambda got: sum(got.values()) == len(events), 60, 0.2)
    finally:
        d.stop()
    assert sum(series.values()) == len(events)
    assert len(series) == 2 * 10 + 1
    assert series[(("endpoint", "other"), ("model", "other"), ("tenant", "other"))] >= len(events) - 20


def test_label_values_beyond_the_cap_collapse_to_other(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=1, METRICS_LABEL_CAP="2")
    f = EventFactory()

    def response(n: int, tenant: str, logprobs: list[float] | None, **fields: Any) -> dict[str, Any]:
        event = f.response(
            f"cap-{tenant}",
            minutes=n,
            agent=f"agent-{tenant}",
            tenant_id=tenant,
            model=f"model-{tenant}",
            **fields,
        )
        if logprobs is not None:
            event["token_logprobs"] = logprobs
        return event

    # Four tenants, models and agents, in this order; the cap keeps the first two of each label.
    events = [
        response(0, "a", [0.0], **STRONG_COMPOSITE),  # confidence exp(0) = 1.0
        response(1, "b", [0.0], **STRONG_COMPOSITE),  # 1.0
        response(2, "b", [-0.2], **STRONG_COMPOSITE),  # exp(-0.2) = 0.8187 -> 0.819
        response(3, "c", [-0.1], **STRONG_COMPOSITE),  # exp(-0.1) = 0.9048 -> 0.905, three times
        response(4, "c", [-0.1], **STRONG_COMPOSITE),
        response(5, "c", [-0.1], **STRONG_COMPOSITE),
        response(6, "d", None, **WEAK),  # no logprobs; composite (0.2 + 0.5) / 2 = 0.35 blocked
    ]
    d.start_worker()
    try:
        d.produce(events)
        d.collect(_outputs_seen(d, {"RESPONSE_SCORED": 7}, 0))
        a, b, other = (
            _response_labels("a", "model-a"),
            _response_labels("b", "model-b"),
            _response_labels("other", "other"),
        )
        _wait_for_metrics(
            d.web_ports[0],
            {
                "llm_confidence_histogram_count": {a: 1, b: 2, other: 3},
                "llm_confidence_histogram_sum": {a: 1.0, b: 1.0 + 0.819, other: 3 * 0.905},
                "llm_confidence_missing_total": {other: 1},
                # EWMA: b = 1.0 + 0.05 x (0.819 - 1.0) = 0.99095; other = 0.905 throughout
                "llm_confidence_average": {a: 1.0, b: 0.99095, other: 0.905},
                # STRONG_COMPOSITE meets planner's 0.75 (0.9, then 1.0); d's weak answer does not, and it
                # is the last writer of the shared `other` series.
                "confidence_agent_success_rate": {
                    (("agent", "agent-a"), ("tenant", "a")): 1.0,
                    (("agent", "agent-b"), ("tenant", "b")): 1.0,
                    (("agent", "other"), ("tenant", "other")): 0.0,
                },
                "confidence_composite_blocked_total": {_one("agent_type", "planner"): 1},
                "confidence_events_processed_total": {_one("event_type", "LLM_RESPONSE"): 7},
            },
        )
    finally:
        d.stop()
