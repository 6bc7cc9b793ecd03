"""Through a real broker: evidence per trace, claims across traces and partitions, agent history, views."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from streams.harness import RunningBroker
from streams.kafka_io import Consumed
from streams.scoring.composite import I_DONT_KNOW_ANSWER
from tests.integration.fixtures import (
    STRONG_COMPOSITE,
    T0,
    Deployment,
    EventFactory,
    count_of,
    deploy,
    http_get,
    poll,
    settled,
)
from tests.integration.workload import Scrape, scrape, wait_for_metrics


@pytest.fixture(scope="module")
def deployment(kafka: RunningBroker) -> Iterator[Deployment]:
    d = deploy(kafka, partitions=4)
    d.start_worker()
    yield d
    d.stop()


def _latest(outputs: list[dict[str, Any]], kind: str, **match: Any) -> dict[str, Any]:
    found = [o for o in outputs if o["event_type"] == kind and all(o.get(k) == v for k, v in match.items())]
    assert found, (kind, match)
    return found[-1]


def _get(deployment: Deployment, path: str) -> tuple[int, Any]:
    status, body = http_get(deployment.web_ports[0], path)
    ctype_json = body[:1] in (b"{", b"[")
    return status, json.loads(body) if ctype_json else body.decode()


def test_evidence_reproduces_seed_001_cases(deployment: Deployment) -> None:
    f = EventFactory()
    cases = {
        "ev-different": [
            f.tool("ev-different", "find", "MemoryManager", result_count=2),
            f.tool("ev-different", "read", "src/Allocator.cpp"),
        ],
        "ev-same": [
            f.tool("ev-same", "find", "MemoryManager", result_count=2),
            f.tool("ev-same", "read", "src/MemoryManager.h"),
        ],
        "ev-strong": [
            f.tool("ev-strong", "find", "MemoryManager", result_count=2),
            f.tool("ev-strong", "grep", "MemoryManager", result_count=9),
            f.tool("ev-strong", "read", "src/MemoryManager.h"),
            f.tool("ev-strong", "read", "src/MemoryManager.cpp"),
        ],
        # DESIGN 4b: `ok` with `result_count: 0` is no results, so this read adds nothing.
        "ev-empty-read": [
            f.tool("ev-empty-read", "find", "MemoryManager", result_count=2),
            f.tool("ev-empty-read", "read", "src/MemoryManager.h", result_count=0),
        ],
        # Twenty-eighth round: the same for a test run without an outcome; a pass followed by a failure
        # converges no more after a later pass elsewhere; an empty target converges with nothing.
        "ev-empty-ctest": [
            f.tool("ev-empty-ctest", "find", "MemoryManager", result_count=2),
            f.tool("ev-empty-ctest", "ctest", "MemoryManager", result_count=0),
        ],
        "ev-pass-fail": [
            f.tool("ev-pass-fail", "find", "foo", result_count=2),
            f.tool("ev-pass-fail", "read", "src/foo.py"),
            f.tool("ev-pass-fail", "ctest", "foo", tests_passed=True),
            f.tool("ev-pass-fail", "ctest", "foo", tests_passed=False),
            f.tool("ev-pass-fail", "ctest", "bar", tests_passed=True),
        ],
        "ev-no-target": [
            f.tool("ev-no-target", "git", "", result_count=3),
            f.tool("ev-no-target", "discovery", "", factors_found=1),
            f.tool("ev-no-target", "gh", "", complete=True),
        ],
    }
    events = [e for trace in cases.values() for e in trace]
    deployment.produce(events)
    ids = {e["event_id"] for e in events}
    records = deployment.collect(count_of("TRACE_SCORED", len(ids), deployment.settings.scored_topic, ids))
    outputs = [o for o in deployment.outputs(records) if o.get("source_event_id") in ids]
    last = {
        trace: _latest(outputs, "TRACE_SCORED", source_event_id=evs[-1]["event_id"])
        for trace, evs in cases.items()
    }
    assert round(last["ev-different"]["score"], 3) == 0.732
    assert last["ev-different"]["band"] == "adequate"
    assert last["ev-different"]["convergence"]["bonus"] == 0.0
    assert round(last["ev-same"]["score"], 3) == 0.772
    assert round(last["ev-strong"]["score"], 3) == 0.830
    assert last["ev-strong"]["band"] == "strong"
    assert last["ev-strong"]["convergence"]["categories"] == ["read", "search"]
    assert last["ev-empty-read"]["categories"] == {"search": 0.65}
    assert round(last["ev-empty-read"]["score"], 3) == 0.650
    assert last["ev-empty-read"]["convergence"]["bonus"] == 0.0
    assert last["ev-empty-ctest"]["categories"] == {"search": 0.65}
    assert last["ev-pass-fail"]["convergence"]["categories"] == ["read", "search"]
    assert last["ev-pass-fail"]["convergence"]["bonus"] == pytest.approx(0.15, abs=1e-12)
    assert last["ev-no-target"]["convergence"] == {"categories": [], "count": 0, "bonus": 0.0, "target": None}
    first = _latest(outputs, "TRACE_SCORED", source_event_id=cases["ev-same"][0]["event_id"])
    assert round(first["score"], 3) == 0.650 and first["band"] == "adequate"

    # The view as stored after the trace's last event, every field. By hand (DESIGN 4): find and grep both
    # found "MemoryManager" -> search 0.80; two files read, both matching it (fewer than 3) -> read 0.80;
    # weights 3.0 and 2.5 over 5.5; base 0.80; read and search converge on the first read (anchor order
    # read, search, ...) -> bonus 0.10 + 0.05; final 0.80 + 0.15 x (1 - 0.80) = 0.83.
    expected = {
        "tenant_id": "t1",
        "trace_id": "ev-strong",
        "last_event_time": "2026-11-22T12:00:00+00:00",
        "evidence": {
            "score": pytest.approx(0.83, abs=1e-12),
            "base": pytest.approx(0.80, abs=1e-12),
            "band": "strong",
            "categories": {"read": 0.80, "search": 0.80},
            "weights": {
                "read": pytest.approx(3.0 / 5.5, abs=1e-12),
                "search": pytest.approx(2.5 / 5.5, abs=1e-12),
            },
            "convergence": {
                "categories": ["read", "search"],
                "count": 2,
                "bonus": pytest.approx(0.15, abs=1e-12),
                "target": "src/memorymanager.h",
            },
            "recovery_recommended": False,
            "should_stop": False,
            "recovery_attempts": 0,
        },
        "sub_calls": [],
        "claims": [],
    }
    status, view = settled(lambda: _get(deployment, "/traces/t1/ev-strong"), (200, expected))
    assert status == 200
    assert view == expected
    assert _get(deployment, "/traces/t1/no-such-trace") == (404, {"error": "unknown trace"})


def test_claims_across_traces_contradiction_staleness_and_derived(deployment: Deployment) -> None:
    f = EventFactory(tenant="claims-tenant")
    s = deployment.settings
    one = f.claim("cl-trace-a", "one-source")
    three = f.claim(
        "cl-trace-b",
        "three-types",
        provenance=[{"source_type": t, "confidence": 0.7} for t in ("extraction", "agent", "user")],
    )
    stale = f.claim("cl-trace-c", "stale", minutes=240, tier="ephemeral", staleness_at=T0.isoformat())
    deployment.produce([one, three, stale])
    first_ids = {one["event_id"], three["event_id"], stale["event_id"]}
    deployment.collect(count_of("CLAIM_SCORED", 3, s.scored_topic, first_ids))

    # A contradiction from another trace (and, with 4 partitions, most likely another partition).
    against = f.claim(
        "cl-trace-d",
        "against",
        minutes=1,
        relationships=[{"type": "contradicts", "target": "one-source", "strength": 1.0}],
    )
    deployment.produce([against])
    # Exactly two outputs for this input: against itself, and one-source penalised (DESIGN 4b).
    both = count_of("CLAIM_SCORED", 2, s.scored_topic, {against["event_id"]})

    def penalty_copied(records: list[Consumed]) -> bool:  # the flagged copy comes on its own topic
        return any(
            o.get("claim_id") == "one-source" and o["source_event_id"] == against["event_id"]
            for o in deployment.outputs(records, s.flagged_topic)
        )

    records = deployment.collect(lambda rs: both(rs) and penalty_copied(rs))
    # Then a claim derived from two others.
    derived = f.claim(
        "cl-trace-e", "derived", minutes=2, derived_from=["three-types", "one-source"], assessed_upper=0.9
    )
    deployment.produce([derived])
    # Exactly one output: derived itself (nothing depends on it yet). Read until every input's outputs
    # are in (six in all) and the flagged copy too: they are on several partitions and two topics.
    inputs = [one, three, stale, against, derived]
    six = count_of("CLAIM_SCORED", 6, s.scored_topic, {e["event_id"] for e in inputs})
    records = deployment.collect(lambda rs: six(rs) and penalty_copied(rs))
    outputs = [
        o
        for o in deployment.outputs(records)
        if o["event_type"] == "CLAIM_SCORED" and o["tenant_id"] == "claims-tenant"
    ]
    per_input = Counter(o["source_event_id"] for o in outputs)
    assert [per_input[e["event_id"]] for e in inputs] == [1, 1, 1, 2, 1]

    def interval(claim_id: str, source: str) -> dict[str, Any]:
        return _latest(outputs, "CLAIM_SCORED", claim_id=claim_id, source_event_id=source)["interval"]

    base = interval("one-source", one["event_id"])
    assert (round(base["lower"], 4), round(base["upper"], 4)) == (0.5333, 0.8)
    assert round(base["factors"]["diversity"], 4) == 0.6667
    full = interval("three-types", three["event_id"])
    assert (round(full["lower"], 4), round(full["upper"], 4)) == (0.7, 0.973)
    decayed = interval("stale", stale["event_id"])  # one half-life (4 h) past staleness_at
    assert round(decayed["factors"]["staleness"], 6) == 0.5
    assert (round(decayed["lower"], 4), round(decayed["upper"], 4)) == (0.2667, 0.4)

    # The earlier claim is re-emitted, lowered, because of the later one; it keeps its own trace.
    rescored = _latest(outputs, "CLAIM_SCORED", claim_id="one-source", source_event_id=against["event_id"])
    assert rescored["trace_id"] == "cl-trace-a" and rescored["cause"] == "against"
    assert (round(rescored["interval"]["lower"], 4), round(rescored["interval"]["upper"], 4)) == (
        0.448,
        0.672,
    )
    assert rescored["as_of"].startswith("2026-11-22T12:01")
    own = interval("against", against["event_id"])
    assert (round(own["lower"], 4), round(own["upper"], 4)) == (0.448, 0.672)
    flagged = [o for o in deployment.outputs(records, s.flagged_topic) if o.get("claim_id") == "one-source"]
    assert any(o["source_event_id"] == against["event_id"] for o in flagged)

    d = interval("derived", derived["event_id"])
    assert d["factors"]["derived"] is True
    assert (round(d["lower"], 4), round(d["upper"], 4)) == (0.448, 0.9)

    # A support for the derived claim: the derived rule reads no edges, so only the backer is emitted
    # (the derived claim came again, unchanged, before the twenty-eighth round). Then a later claim of
    # the tenant, processed after it by the same owner, marks the end of the backer's outputs.
    backer = f.claim(
        "cl-trace-f",
        "backer",
        minutes=3,
        relationships=[{"type": "supports", "target": "derived", "strength": 0.9}],
    )
    after = f.claim("cl-trace-g", "after", minutes=4)
    deployment.produce([backer, after])
    records = deployment.collect(count_of("CLAIM_SCORED", 1, s.scored_topic, {after["event_id"]}))
    from_backer = [o for o in deployment.outputs(records) if o.get("source_event_id") == backer["event_id"]]
    assert [o["claim_id"] for o in from_backer] == ["backer"]

    status, view = _get(deployment, "/claims/claims-tenant/three-types?min_lower=0.6")
    assert status == 200 and view["matches"] is True
    assert round(view["interval"]["lower"], 4) == 0.7
    status, view = _get(deployment, "/claims/claims-tenant/one-source?min_upper=0.6&max_lower=0.5")
    assert status == 200 and view["matches"] is True  # upper high but lower low: potentially important
    # The contradiction counts in the view too: `against` is read through the worker's facts cache.
    assert (round(view["interval"]["lower"], 4), round(view["interval"]["upper"], 4)) == (0.448, 0.672)
    status, view = _get(deployment, "/claims/claims-tenant/one-source?min_lower=0.7")
    assert view["matches"] is False
    for bad in ("nan", "inf", "-inf"):  # a filter that can never hold is a client error
        assert _get(deployment, f"/claims/claims-tenant/one-source?min_lower={bad}") == (
            400,
            {"error": "filters must be finite numbers"},
        ), bad
    assert _get(deployment, "/claims/claims-tenant/one-source?min_width=abc")[0] == 400


def test_a_block_reason_never_rounds_the_score_up_to_its_threshold(deployment: Deployment) -> None:
    """A patcher's first response (history 0.5) with KB 0.96657, code 0.70 and certainty 1.0 scores
    0.799971 and is blocked; its reason read "80.00% below patcher threshold 80.00%" before the
    score was cut instead of rounded."""
    f = EventFactory(tenant="block-reason-tenant")
    event = f.response(
        "block-reason",
        agent="patcher-near",
        agent_type="Patcher",
        response=STRONG_COMPOSITE["response"],
        retrieval=[{"similarity": 0.91657}],
        code_validation={"code_exists": True, "syntax_valid": True, "type_valid": True},
    )
    deployment.produce([event])
    records = deployment.collect(
        count_of("RESPONSE_SCORED", 1, deployment.settings.scored_topic, {event["event_id"]})
    )
    out = next(o for o in deployment.outputs(records) if o["source_event_id"] == event["event_id"])
    assert out["composite"]["score"] == pytest.approx(0.799971)
    assert out["composite"]["should_block"] is True
    assert out["composite"]["block_reason"] == "Composite confidence 79.99% below patcher threshold 80.00%"


def test_agent_history_moves_and_blocks_with_i_dont_know(deployment: Deployment) -> None:
    f = EventFactory(tenant="history-tenant")
    s = deployment.settings
    weak = {"response": "Maybe it works, I think."}  # certainty 0.5 - 2*0.15 = 0.2; no KB or code factor
    events = [
        f.response(
            f"hist-{i}",
            minutes=i,
            agent="patcher-x",
            agent_type="Patcher",
            **(STRONG_COMPOSITE if i < 2 else weak),
        )
        for i in range(4)
    ]
    for event in events:  # one at a time: history must see each previous response
        deployment.produce([event])
        deployment.collect(count_of("RESPONSE_SCORED", 1, s.scored_topic, {event["event_id"]}))
    all_scored = count_of("RESPONSE_SCORED", 4, s.scored_topic, {e["event_id"] for e in events})
    blocked_copied = count_of("RESPONSE_SCORED", 1, s.flagged_topic, {events[2]["event_id"]})
    records = deployment.collect(lambda rs: all_scored(rs) and blocked_copied(rs))
    by_id = {
        o["source_event_id"]: o for o in deployment.outputs(records) if o["event_type"] == "RESPONSE_SCORED"
    }
    out = [by_id[e["event_id"]] for e in events]
    history = [o["composite"]["factors"]["agent_history"] for o in out]
    assert history == [0.5, 1.0, 1.0, pytest.approx(2 / 3)]
    assert out[0]["composite"]["threshold"] == 0.8  # patcher, matched case-insensitively
    assert round(out[0]["composite"]["score"], 6) == 0.9 and not out[0]["composite"]["should_block"]
    assert round(out[1]["composite"]["score"], 6) == 1.0
    # Weak: only certainty and history apply -> renormalised (0.2*0.2 + 1.0*0.2) / 0.4 = 0.6
    assert out[2]["composite"]["missing_factors"] == ["knowledge_base", "code_validation"]
    assert round(out[2]["composite"]["score"], 6) == 0.6
    assert out[2]["composite"]["should_block"] is True
    assert out[2]["response"] == I_DONT_KNOW_ANSWER
    assert out[2]["composite"]["level"] == "LOW"
    flagged_ids = {o["source_event_id"] for o in deployment.outputs(records, s.flagged_topic)}
    assert events[2]["event_id"] in flagged_ids and events[0]["event_id"] not in flagged_ids

    # Every field of seed 004's statistics. Composite scores by hand: 0.9, 1.0, 0.6 (above) and the fourth,
    # with history 2/3: (0.2 x 0.2 + 2/3 x 0.2) / 0.4 = 13/30; threshold met by the first two only.
    whole = {
        "tenant_id": "history-tenant",
        "agent_name": "patcher-x",
        "agent_type": "Patcher",
        "lookback_hours": 168.0,
        "total_executions": 4,
        "success_rate": 0.5,
        "average_confidence": pytest.approx((0.9 + 1.0 + 0.6 + 13 / 30) / 4, abs=1e-12),  # 0.7333
        "blocked_count": 2,
        "threshold": 0.8,
    }
    week = settled(lambda: _get(deployment, "/agents/history-tenant/patcher-x?hours=168"), (200, whole))
    assert week == (200, whole)
    assert _get(deployment, "/agents/history-tenant/patcher-x") == (200, whole)  # default 168
    # Longer than the 168 h kept (HISTORY_RETENTION_HOURS): the hours counted are reported, and a window
    # past datetime's range is no error (it was a 400, and 1,000 h were reported as 1,000).
    for longer in ("1000", "1e300"):
        assert _get(deployment, f"/agents/history-tenant/patcher-x?hours={longer}") == (200, whole), longer
    # 0.05 h = 3 min back from the newest event (minute 3): minutes 1, 2 and 3 are in, minute 0 is out.
    assert _get(deployment, "/agents/history-tenant/patcher-x?hours=0.05") == (
        200,
        {
            **whole,
            "lookback_hours": 0.05,
            "total_executions": 3,
            "success_rate": pytest.approx(1 / 3, abs=1e-12),
            "average_confidence": pytest.approx((1.0 + 0.6 + 13 / 30) / 3, abs=1e-12),  # 0.6778
            "blocked_count": 2,
        },
    )
    # A window that is not a positive number is a client error, never a silent 168.
    for bad in ("0", "-1", "-0.5", "nan", "inf"):
        assert _get(deployment, f"/agents/history-tenant/patcher-x?hours={bad}") == (
            400,
            {"error": "hours must be a positive number"},
        ), bad
    for bad in ("abc", ""):
        assert _get(deployment, f"/agents/history-tenant/patcher-x?hours={bad}") == (
            400,
            {"error": "hours must be a number"},
        ), bad
    assert _get(deployment, "/agents/history-tenant/nobody") == (404, {"error": "unknown agent"})


def test_the_agent_view_counts_a_response_at_the_retention_horizon(deployment: Deployment) -> None:
    """Thirty-first round: the view's window began 1 us after the horizon (newest - 168 h), while the
    stage keeps and counts a response dated exactly there: the view said 1 execution of 2."""
    s = deployment.settings
    f = EventFactory(tenant="horizon-tenant")
    week = s.history_retention_hours * 60
    # Dated up to T0 (not a week after it): a response past the wall clock is not kept in the history,
    # and the module's other tests share these partitions' clocks.
    events = [f.response("horizon-1", minutes, agent="edge-x") for minutes in (-week, 0)]
    for event in events:  # in order: the second's history holds the first, exactly at its horizon
        deployment.produce([event])
        deployment.collect(count_of("RESPONSE_SCORED", 1, s.scored_topic, {event["event_id"]}))
    status, body = poll(
        lambda: _get(deployment, "/agents/horizon-tenant/edge-x"),
        lambda answer: answer[0] == 200 and answer[1]["total_executions"] == 2,
        timeout=30,
    )
    assert status == 200 and body["total_executions"] == 2, body


# The worker-wide series test_metrics_and_health counts by difference, and what its traffic adds to each.
_WATCHED: dict[str, tuple[str, dict[str, str], int]] = {
    "processed": ("confidence_events_processed_total", {"event_type": "LLM_RESPONSE"}, 3),
    "emitted": ("confidence_outputs_emitted_total", {"event_type": "RESPONSE_SCORED"}, 3),
    # observed when an output's send is acknowledged, which may follow a reader seeing it
    "latency": ("confidence_processing_latency_seconds_count", {"event_type": "RESPONSE_SCORED"}, 3),
    "synthesis latency": (
        "confidence_processing_latency_seconds_count",
        {"event_type": "SYNTHESIS_SCORED"},
        1,
    ),
    "synthesis": ("rlm_synthesis_confidence_count", {}, 1),
}


def _watched(s: Scrape) -> dict[str, float]:
    return {what: s.value(name, **labels) or 0.0 for what, (name, labels, _) in _WATCHED.items()}


def test_metrics_and_health(deployment: Deployment) -> None:
    """Each family counts this traffic exactly: a fresh tenant, and deltas for the worker-wide series."""
    port = deployment.web_ports[0]
    wait_for_metrics(port)  # the worker may still be starting when this test runs first

    # An earlier test's last latency observations follow its outputs' acks (streams/batch_runner.py),
    # while the other watched series count at processing time, before its outputs could be read. So
    # start once every output emitted so far has its latency observed: a condition, not a quiet gap.
    def all_acked(s: Scrape) -> bool:
        return all(
            s.value("confidence_processing_latency_seconds_count", event_type=kind)
            == s.value("confidence_outputs_emitted_total", event_type=kind)
            for kind in ("RESPONSE_SCORED", "SYNTHESIS_SCORED")
        )

    settled_scrape = poll(lambda: scrape(port), all_acked, timeout=30)
    assert all_acked(settled_scrape), "outputs emitted before this test were never acknowledged"
    before = _watched(settled_scrape)
    f = EventFactory(tenant="metrics-tenant")
    events = [
        f.response("m-1", token_logprobs=[-0.1]),  # exp(-0.1) -> 0.905: allow
        f.response("m-1", token_logprobs=[-3.0]),  # exp(-3) -> 0.05: flag (CONFIDENCE_ON_LOW's default)
        f.response("m-1", role="synthesis", response="x"),  # no logprobs: missing
    ]
    deployment.produce(events)
    ids = {e["event_id"] for e in events}
    deployment.collect(count_of("RESPONSE_SCORED", 3, deployment.settings.scored_topic, ids))
    deployment.collect(count_of("SYNTHESIS_SCORED", 1, deployment.settings.scored_topic, ids))
    status, body = _get(deployment, "/healthz")
    assert status == 200 and body["status"] == "ok"

    def counted(after: Scrape) -> dict[str, float]:
        return {what: value - before[what] for what, value in _watched(after).items()}

    expected = {what: float(added) for what, (_, _, added) in _WATCHED.items()}
    after = poll(lambda: scrape(port), lambda s: counted(s) == expected)
    assert counted(after) == expected
    labels = {"tenant": "metrics-tenant", "model": "gpt-4o", "endpoint": "/v1/chat"}
    assert after.value("llm_confidence_histogram_count", **labels) == 2
    assert after.value("llm_confidence_histogram_sum", **labels) == pytest.approx(0.905 + 0.05)
    assert after.value("llm_confidence_histogram_bucket", le="0.1", **labels) == 1
    assert after.value("llm_confidence_missing_total", **labels) == 1
    assert after.value("llm_confidence_rejected_total", **labels) is None  # flagged, not rejected
    # EWMA, alpha 0.05, seeded by the first value: 0.905 - 0.05 x 0.855
    assert after.value("llm_confidence_average", **labels) == pytest.approx(0.86225)
