"""Through a real broker: outcomes joined with scores give the calibration the data says they should.

Two models of one tenant answer 500 responses each with confidences we choose (one token whose logprob is
ln(p)). The outcomes are drawn from a seeded generator: "calibrated" is right with probability p,
"overconfident" with probability p - 0.2. The view must equal, exactly, the ECE, Brier and threshold
advice computed here from the same (confidence, outcome) pairs, and be near the closed-form values.
"""

from __future__ import annotations

import asyncio
import math
import random
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from streams.harness import RunningBroker
from streams.kafka_io import Consumed, collect, produce
from streams.scoring import calibration
from streams.stages.calibration import group_key
from tests.integration.fixtures import STRONG_COMPOSITE, Deployment, EventFactory, deploy, get_json, poll
from tests.integration.test_metrics_values import _scrape

N = 500  # responses per model


def view(d: Deployment, path: str) -> tuple[int, dict[str, Any]]:
    try:
        return get_json(d.web_ports[-1], path)  # the latest worker started
    except urllib.error.URLError:  # the worker's web server is not up yet
        return 0, {}


def wait_for(check: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
    """Poll `check` until it returns something truthy (never sleep-and-hope)."""
    result = poll(check, bool, timeout, 0.3)
    assert result, f"timed out waiting for {what}"
    return result


def group_view(d: Deployment, query: str, samples: int, tenant: str = "cal") -> dict[str, Any] | None:
    status, body = view(d, f"/calibration/{tenant}?{query}")
    if status != 200 or len(body["groups"]) != 1 or body["groups"][0]["samples"] != samples:
        return None
    return dict(body["groups"][0])


def metric(d: Deployment, name: str, **labels: str) -> float:
    series = _scrape(d.web_ports[0]).get(name, {})
    return series.get(tuple(sorted(labels.items())), 0.0)


def expected_brier(shift: float, low: float, high: float) -> float:
    """E[(p - o)^2] for p uniform on [low, high], o ~ Bernoulli(p - shift): integrated numerically."""
    steps = 10_000
    total = 0.0
    for i in range(steps):
        p = low + (high - low) * (i + 0.5) / steps
        q = p - shift
        total += q * (1 - p) ** 2 + (1 - q) * p**2
    return total / steps


def test_calibration_view_alert_advice_and_expiry(kafka: RunningBroker) -> None:
    d = deploy(
        kafka,
        partitions=2,
        CALIBRATION_MIN_SAMPLES="200",
        CALIBRATION_ECE_CHANGE="0.01",
        CALIBRATION_UPDATE_MIN_INTERVAL_MINUTES="0",
        CALIBRATION_WINDOW_HOURS="2",
        CALIBRATION_JOIN_WINDOW_HOURS="2",
        SWEEP_INTERVAL_SECONDS="1",
        EXPIRY_SOURCE_IDLE_SECONDS="2",  # the default 300 s start-up grace would outlast the test
    )
    f = EventFactory(tenant="cal")
    rng = random.Random(20261123)
    events: list[dict[str, Any]] = []
    pairs: dict[str, list[tuple[float, float]]] = {"calibrated": [], "overconfident": []}
    responses_by_model: dict[str, list[str]] = {"calibrated": [], "overconfident": []}
    for model, shift, low, high in (("calibrated", 0.0, 0.05, 0.95), ("overconfident", 0.2, 0.5, 0.99)):
        for i in range(N):
            p = round(rng.uniform(low, high), 3)
            correct = rng.random() < p - shift
            trace = f"{model}-{i % 40}"
            minutes = i * 0.02
            # One agent type in two spellings: grouped as one, as its composite threshold matches it.
            agent_type = "planner" if model == "calibrated" else "Planner"
            response = f.response(
                trace,
                minutes,
                agent_type=agent_type,
                model=model,
                token_logprobs=[math.log(p)],
                **STRONG_COMPOSITE,
            )
            verdict = f.outcome(trace, minutes + 0.01, subject_event_id=response["event_id"], correct=correct)
            # Every tenth outcome is produced before its response: it must wait for the score.
            events.extend([verdict, response] if i % 10 == 0 else [response, verdict])
            pairs[model].append((p, 1.0 if correct else 0.0))
            responses_by_model[model].append(response["event_id"])
    # Re-delivered outcome (same event id): counted once.
    duplicate = next(e for e in events if e["event_type"] == "OUTCOME")
    # Outcomes for subjects nobody scored: wait, then count as unmatched once event time moves on.
    unknown = [f.outcome("calibrated-0", 5, subject_event_id=f"never-{i}", correct=True) for i in range(3)]
    d.start_worker()
    try:
        d.produce([*events, duplicate, *unknown])
        calibrated = wait_for(
            lambda: group_view(d, "model=calibrated&kind=response", N), "the calibrated group's view"
        )
        overconfident = wait_for(
            lambda: group_view(d, "model=overconfident&kind=response", N), "the overconfident group's view"
        )
        planner = wait_for(
            lambda: group_view(d, "agent_type=PLANNER&kind=response&target_precision=0.8", 2 * N),
            "the agent type group",
        )
        # The filters: model= and agent_type= together select the groups of either; kind= narrows.
        status, body = view(d, "/calibration/cal?model=calibrated&agent_type=planner&kind=response")
        assert status == 200
        assert [(g["dimension"], g["value"], g["kind"]) for g in body["groups"]] == [
            ("agent_type", "planner", "response"),
            ("model", "calibrated", "response"),
        ]
        status, body = view(d, "/calibration/cal?model=calibrated")
        assert status == 200 and {g["kind"] for g in body["groups"]} == {"response", "composite"}
        # Bad queries get a clear 400; a tenant or filter with no data a 404.
        assert view(d, "/calibration/cal?target_precision=high") == (
            400,
            {"error": "target_precision must be a number"},
        )
        for bad in ("0", "-0.5", "1.01", "nan"):
            assert view(d, f"/calibration/cal?target_precision={bad}") == (
                400,
                {"error": "target_precision must be in (0, 1]"},
            ), bad
        nothing = (404, {"error": "no calibration data for this tenant and filter"})
        assert view(d, "/calibration/cal?model=no-such-model") == nothing
        # A kind that does not exist is a typo, not a filter matching nothing.
        assert view(d, "/calibration/cal?model=calibrated&kind=no-such-kind") == (
            400,
            {"error": "kind must be one of response, composite, evidence, claim"},
        )
        assert view(d, "/calibration/no-such-tenant") == nothing

        # Exactly what the pairs give, and near the closed form (tolerances: about 4 standard errors).
        for body, model in ((calibrated, "calibrated"), (overconfident, "overconfident")):
            histogram: dict[int, calibration.BinStats] = {}
            for p, o in pairs[model]:
                histogram = calibration.add(histogram, p, o)
            assert body["ece"] == pytest.approx(calibration.ece(histogram), abs=1e-12)
            assert body["brier"] == pytest.approx(calibration.brier(histogram), abs=1e-12)
            assert [b["count"] for b in body["bins"]] == [b.count for b in calibration.reliability(histogram)]
            threshold, allowed = brute_force_advice(pairs[model], 0.9)
            assert body["advice"]["threshold"] == threshold
            assert body["advice"]["allowed"] == allowed
            assert body["advice"]["setting"]["name"] == "CONFIDENCE_MIN_ACCEPTANCE"
        assert calibrated["ece"] < 0.08  # sampling noise only
        assert overconfident["ece"] == pytest.approx(0.2, abs=0.06)
        assert calibrated["brier"] == pytest.approx(expected_brier(0.0, 0.05, 0.95), abs=0.04)
        assert overconfident["brier"] == pytest.approx(expected_brier(0.2, 0.5, 0.99), abs=0.04)
        both = pairs["calibrated"] + pairs["overconfident"]
        threshold, allowed = brute_force_advice(both, 0.8)
        assert (planner["advice"]["threshold"], planner["advice"]["allowed"]) == (threshold, allowed)
        # Accuracy per action: below 0.40 (CONFIDENCE_MIN_ACCEPTANCE) responses are flagged.
        flagged = [o for p, o in both if p < 0.4]
        assert planner["accuracy_by_action"]["flag"]["count"] == len(flagged)
        assert planner["accuracy_by_action"]["flag"]["observed_accuracy"] == pytest.approx(
            sum(flagged) / len(flagged), abs=1e-12
        )

        # The overconfident group raised an alert copy on flagged-events; gauges follow the view.
        # A copy is its own record on its own topic: wait until every alert read so far has its copy.
        def copies_caught_up(rs: list[Consumed]) -> bool:
            return all(
                {u["event_id"] for u in alerts(d, rs, model)}
                == {u["event_id"] for u in updates(d, rs, model) if u["alert"]}
                for model in ("calibrated", "overconfident")
            )

        records = d.collect(lambda rs: bool(alerts(d, rs, "overconfident")) and copies_caught_up(rs))
        for model in ("calibrated", "overconfident"):
            scored = updates(d, records, model)
            assert scored and all(u["samples"] >= 200 for u in scored)  # CALIBRATION_MIN_SAMPLES
            assert all(u["alert"] == (u["ece"] >= 0.1) for u in scored)
            copied = {u["event_id"] for u in updates(d, records, model, d.settings.flagged_topic)}
            assert copied == {u["event_id"] for u in scored if u["alert"]}
        assert metric(
            d,
            "confidence_calibration_ece",
            tenant="cal",
            dimension="model",
            group="overconfident",
            kind="response",
        ) == pytest.approx(overconfident["ece"], abs=1e-12)
        # The re-delivered outcome is the last of its partition: the views above may be ahead of it.
        wait_for(lambda: metric(d, "confidence_outcomes_total", status="duplicate") == 1, "one duplicate")

        # Event time moves 3 hours on: the unknown outcomes count as unmatched, old hours leave the window
        # and the first phase's scores leave the join window.
        late: list[dict[str, Any]] = []
        late_pairs: list[tuple[float, float]] = []
        for i in range(40):
            trace = f"calibrated-{i}"
            response = f.response(trace, 180 + i * 0.1, model="calibrated", token_logprobs=[math.log(0.7)])
            late.extend(
                [
                    response,
                    f.outcome(trace, 180 + i * 0.1, subject_event_id=response["event_id"], correct=True),
                ]
            )
            late_pairs.append((0.7, 1.0))
        d.produce(late)
        wait_for(
            lambda: metric(d, "confidence_outcomes_unmatched_total") == len(unknown), "unmatched outcomes"
        )
        windowed = wait_for(
            lambda: group_view(d, "model=calibrated&kind=response", len(late_pairs)), "the window to slide"
        )
        assert windowed["ece"] == pytest.approx(0.3, abs=1e-12)  # all said 0.7 and all were right

        # An outcome for a first-phase response arrives after its score expired: unmatched too, once
        # event time (of responses and outcomes of another model) passes its wait.
        first = responses_by_model["calibrated"][1]
        d.produce([f.outcome("calibrated-1", 181, subject_event_id=first, correct=True)])
        other: list[dict[str, Any]] = []
        for i in range(40):
            response = f.response(f"calibrated-{i}", 290, model="other", token_logprobs=[-0.1])
            other.extend(
                [
                    response,
                    f.outcome(f"calibrated-{i}", 290, subject_event_id=response["event_id"], correct=True),
                ]
            )
        d.produce(other)
        wait_for(
            lambda: metric(d, "confidence_outcomes_unmatched_total") == len(unknown) + 1,
            "the expired subject",
        )
        assert group_view(d, "model=calibrated&kind=response", len(late_pairs)) is not None  # not counted
    finally:
        d.stop()


def test_the_join_windows_hold_by_event_time_without_a_sweep(kafka: RunningBroker) -> None:
    """A score joins outcomes up to CALIBRATION_JOIN_WINDOW_HOURS after it, and an outcome waits
    CALIBRATION_OUTCOME_WAIT_HOURS for its score, in event time. Before the twenty-seventh round only
    the sweep applied both, so without one (an hour apart here) the late pairs were matched."""
    d = deploy(kafka, partitions=1, CALIBRATION_JOIN_WINDOW_HOURS="2", SWEEP_INTERVAL_SECONDS="3600")
    f = EventFactory(tenant="join")

    def outcomes() -> dict[str, float]:
        return {s: metric(d, "confidence_outcomes_total", status=s) for s in ("matched", "waiting")} | {
            "unmatched": metric(d, "confidence_outcomes_unmatched_total")
        }

    def settled(done: Callable[[dict[str, float]], bool], what: str) -> dict[str, float]:
        def check() -> dict[str, float] | None:
            try:
                counts = outcomes()
            except OSError:  # the worker's web server is not up yet (URLError is an OSError)
                return None
            return counts if done(counts) else None

        return dict(wait_for(check, what))

    d.start_worker()
    try:
        scored = f.response("join-1", 0, model="m1", token_logprobs=[-0.1])
        d.produce([scored, f.outcome("join-1", 1, subject_event_id=scored["event_id"], correct=True)])
        before = settled(lambda c: c["matched"] == 1, "the first outcome matched")["waiting"]
        # (1 waiting if that outcome arrived before its score)
        # 3 hours after the score: past its 2-hour join window, so it waits for a newer score.
        d.produce([f.outcome("join-1", 180, subject_event_id=scored["event_id"], correct=False)])
        counts = settled(lambda c: c["waiting"] > before or c["matched"] > 1, "the late outcome")
        assert counts == {"matched": 1, "waiting": before + 1, "unmatched": 0}
        # An outcome first, then its score 2 hours later: its hour of waiting had ended.
        late = f.response("join-2", 120, model="m1", token_logprobs=[-0.1])
        d.produce([f.outcome("join-2", 0, subject_event_id=late["event_id"], correct=True)])
        settled(lambda c: c["waiting"] == before + 2, "the early outcome waiting")
        d.produce([late])
        counts = settled(lambda c: c["unmatched"] > 0 or c["matched"] > 1, "the late score")
        assert counts == {"matched": 1, "waiting": before + 2, "unmatched": 1}
        samples = wait_for(lambda: group_view(d, "model=m1&kind=response", 1, tenant="join"), "the group")
        assert samples["samples"] == 1

        # The same two pairs in the other arrival order are not joined either (twenty-ninth round: the
        # score's join window was checked only when the outcome came second, the outcome's wait only
        # when the score did, so each of these was matched).
        early = f.response("join-3", 0, model="m1", token_logprobs=[-0.1])
        d.produce([f.outcome("join-3", 180, subject_event_id=early["event_id"], correct=False)])
        settled(lambda c: c["waiting"] == before + 3, "the outcome 3 hours after its score, waiting")
        later = f.response("join-4", 120, model="m1", token_logprobs=[-0.1])
        marker = f.response("join-5", 0, model="m1", token_logprobs=[-0.1])
        d.produce([early, later, marker])  # scores reach stage 4 in this order: one partition, one path
        d.produce([f.outcome("join-5", 1, subject_event_id=marker["event_id"], correct=True)])
        waiting = settled(lambda c: c["matched"] > 1, "the marker pair matched, so both scores arrived")[
            "waiting"
        ]
        d.produce([f.outcome("join-4", 0, subject_event_id=later["event_id"], correct=False)])
        counts = settled(lambda c: c["waiting"] > waiting or c["matched"] > 2, "the outcome 2 hours early")
        assert counts == {"matched": 2, "waiting": waiting + 1, "unmatched": 1}
        samples = wait_for(lambda: group_view(d, "model=m1&kind=response", 2, tenant="join"), "the group")
        assert samples["samples"] == 2
    finally:
        d.stop()


def test_a_redelivered_outcome_counts_once_after_its_score_was_swept(kafka: RunningBroker) -> None:
    """Twenty-ninth round: the sweep deleted a subject with its expired score, and with it the ids of
    the outcomes it had counted; a counted outcome re-delivered then joined the trace's next score."""
    d = deploy(
        kafka,
        partitions=1,
        CALIBRATION_JOIN_WINDOW_HOURS="1",
        SWEEP_INTERVAL_SECONDS="1",
        EXPIRY_SOURCE_IDLE_SECONDS="2",  # the default 300 s start-up grace would outlast the test
    )
    f = EventFactory(tenant="redo")

    def value(name: str, **labels: str) -> float | None:
        try:
            return metric(d, name, **labels)
        except OSError:  # the worker's web server is not up yet (URLError is an OSError)
            return None

    def count(status: str) -> float | None:
        return value("confidence_outcomes_total", status=status)

    d.start_worker()
    try:
        # Traces redo-x, redo-k1 and redo-k2 scored at 0; an outcome joins redo-x's score (and could
        # join a newer one until 110).
        d.produce([f.tool(t, "find", "Widget", 0, result_count=2) for t in ("redo-x", "redo-k1", "redo-k2")])
        counted = f.outcome("redo-x", 50, correct=True)
        d.produce([counted])
        wait_for(lambda: count("matched") == 1, "the outcome matched")
        subjects = "calibration-subjects"
        wait_for(
            lambda: value("confidence_table_keys", table=subjects) == 3, "a sweep counting three subjects"
        )
        # Event time moves past the scores' hour: the sweep deletes redo-k1 and redo-k2 (4 subjects -> 2),
        # and keeps redo-x for its counted outcome's id (the old code deleted it too: 1 left).
        d.produce([f.tool("redo-m", "find", "Widget", 70, result_count=2)])
        left = wait_for(
            lambda: (
                (keys := value("confidence_table_keys", table=subjects)) is not None and keys <= 2 and keys
            ),
            "the expiry sweep after redo-m",
        )
        assert left == 2, "redo-x's entry was deleted with its score"
        # The outcome re-delivered, then redo-x scored again within its hour, then a marker pair.
        d.produce([counted, f.tool("redo-x", "grep", "Widget", 75, result_count=3)])
        d.produce([f.tool("redo-n", "find", "Widget", 76, result_count=2)])
        d.produce([f.outcome("redo-n", 77, correct=True)])
        wait_for(lambda: (count("matched") or 0) >= 2, "the marker pair matched, after redo-x's new score")
        assert (count("matched"), count("duplicate")) == (2, 1)
    finally:
        d.stop()


def test_a_claim_outcome_is_counted_against_the_claims_score_made_last_before_it(
    kafka: RunningBroker,
) -> None:
    """Thirty-first round: claim scores reach the calibration stage from the claim stage, and outcomes
    went there straight from stage 1, so an outcome overtook the re-score of the claim it judged when
    both came in one batch (counted at A's first score, 0.75, not its last, 0.6285). Claim outcomes
    now go through the claim stage, behind the scores of the claims before them."""
    d = deploy(kafka, partitions=2, CALIBRATION_MIN_SAMPLES="1")
    f = EventFactory(tenant="claim-order")
    a = f.claim("order", "A", 1, provenance=[{"source_type": "agent", "confidence": 0.9}])
    b = f.claim(
        "order",
        "B",
        2,
        provenance=[{"source_type": "agent", "confidence": 0.9}],
        relationships=[{"type": "contradicts", "target": "A", "strength": 0.9}],
    )
    d.start_worker()
    try:
        d.produce([a, b, f.outcome("order", 3, claim_id="A", correct=True)])  # one batch of stage 1
        query = "agent_type=planner&kind=claim"
        group = wait_for(lambda: group_view(d, query, 1, tenant="claim-order"), "the claim group")
        records = d.collect(
            lambda rs: sum(1 for o in d.outputs(rs) if o.get("claim_id") == "A") >= 2, timeout=30
        )
    finally:
        d.stop()
    a_scores = [o["interval"]["midpoint"] for o in d.outputs(records) if o.get("claim_id") == "A"]
    assert len(a_scores) == 2 and a_scores[1] < a_scores[0]  # B's contradiction re-scored A
    counted_at = [b["mean_predicted"] for b in group["bins"] if b["mean_predicted"] is not None]
    assert counted_at == [pytest.approx(a_scores[1])], (counted_at, a_scores)


def test_an_outcome_travels_behind_the_score_it_judges_on_the_internal_topics(kafka: RunningBroker) -> None:
    """Thirty-first round: a response's OUTCOME goes to the calibration stage through the agent stage,
    in its response's partition of the responses topic after the response, and a claim's through the
    claim stage; a response the trace does not know still goes straight. Before, every OUTCOME went
    straight from stage 1 to the calibration topic, where it could wait for a score still on its way
    and be counted unmatched by the sweep (`tests/unit/test_outcome_order.py` shows the sweep)."""
    d = deploy(kafka, partitions=2)
    f = EventFactory(tenant="routes")
    response = f.response("routes-1", 0, token_logprobs=[-0.1])
    claim = f.claim("routes-1", "C", 1)
    outcomes = {
        "response": f.outcome("routes-1", 2, subject_event_id=response["event_id"], correct=True),
        "claim": f.outcome("routes-1", 3, claim_id="C", correct=True),
        "unknown": f.outcome("routes-2", 4, subject_event_id=response["event_id"], correct=False),
    }
    settings = d.settings
    internal = [settings.responses_topic, settings.claims_topic, settings.calibration_topic]

    def messages(records: list[Consumed]) -> list[tuple[str, int, int, dict[str, Any]]]:
        """(topic, partition, offset, message) of every message in the internal bundles, in order."""
        return [
            (r.topic, r.partition, r.offset, orjson.loads(line))
            for r in sorted(records, key=lambda r: (r.topic, r.partition, r.offset))
            for line in r.value.split(b"\n")
            if line
        ]

    def outcome_ids(found: list[tuple[str, int, int, dict[str, Any]]]) -> dict[str, str]:
        """Outcome event id -> the internal topic it crossed (calibration items found straight from stage 1)."""
        ids = {}
        for topic, _, _, message in found:
            if topic == settings.calibration_topic:
                for item in message["items"]:
                    if item.get("outcome") and message["source"] < 2_000_000:  # stage 1's own source
                        ids[item["outcome"]["event_id"]] = topic
            elif message.get("outcome"):
                ids[message["outcome"]["event_id"]] = topic
        return ids

    d.start_worker()
    try:
        d.produce([response, claim, *outcomes.values()])
        records = asyncio.run(
            collect(
                kafka.bootstrap_servers,
                internal,
                lambda rs: len(outcome_ids(messages(rs))) == 3,
                timeout=60,
            )
        )
    finally:
        d.stop()
    found = messages(records)
    assert outcome_ids(found) == {
        outcomes["response"]["event_id"]: settings.responses_topic,
        outcomes["claim"]["event_id"]: settings.claims_topic,
        outcomes["unknown"]["event_id"]: settings.calibration_topic,
    }
    on_responses = [(p, m) for t, p, _, m in found if t == settings.responses_topic]  # in partition order
    (response_at,) = [
        i
        for i, (_, m) in enumerate(on_responses)
        if m.get("event", {}).get("event_id") == response["event_id"]
    ]
    (outcome_at,) = [i for i, (_, m) in enumerate(on_responses) if m.get("outcome")]
    assert on_responses[outcome_at][0] == on_responses[response_at][0]  # the response's partition
    assert outcome_at > response_at  # behind it


def brute_force_advice(pairs: list[tuple[float, float]], target: float) -> tuple[float | None, int]:
    for i in range(calibration.FINE_BINS):
        threshold = i / calibration.FINE_BINS
        allowed = [o for p, o in pairs if round(p, 9) >= threshold]  # the service's comparison
        if allowed and round(sum(allowed) / len(allowed), 9) >= target:
            return threshold, len(allowed)
    return None, 0


def updates(
    d: Deployment, records: list[Consumed], model: str, topic: str | None = None
) -> list[dict[str, Any]]:
    return [
        out
        for out in d.outputs(records, topic)
        if out["event_type"] == "CALIBRATION_UPDATED"
        and out["group"] == {"dimension": "model", "value": model, "kind": "response"}
    ]


def alerts(d: Deployment, records: list[Consumed], model: str) -> list[dict[str, Any]]:
    return [u for u in updates(d, records, model, d.settings.flagged_topic) if u["alert"]]


def test_bad_outcomes_go_to_the_dead_letter_topic(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=1)
    f = EventFactory(tenant="cal-bad")
    bad = [
        f.outcome("t", 0, subject_event_id="e", correct=True, score=0.5),  # two verdicts
        f.outcome("t", 0, subject_event_id="e", claim_id="c", correct=True),  # two subjects
        f.outcome("t", 0, subject_event_id="e"),  # no verdict
        f.outcome("t", 0, subject_event_id="e", score=1.5),  # out of range
        {k: v for k, v in f.outcome("t", 0, correct=True).items() if k != "source"},  # missing source
    ]
    d.start_worker()
    try:
        d.produce(bad)
        records = d.collect(lambda rs: sum(r.topic == d.settings.dlq_topic for r in rs) >= len(bad))
    finally:
        d.stop()
    reasons = sorted(
        dict(r.headers)["__connect.errors.reason"].decode()
        for r in records
        if r.topic == d.settings.dlq_topic
    )
    assert reasons == ["invalid_value", "invalid_value", "invalid_value", "missing_field", "out_of_range"]
    assert all(
        orjson.loads(r.value)["event_type"] == "OUTCOME" for r in records if r.topic == d.settings.dlq_topic
    )


def test_one_calibration_item_that_fails_is_dead_lettered_alone(kafka: RunningBroker) -> None:
    """Stage 1 sends a tenant's scores and outcomes of a whole batch as one calibration message. One that
    fails (here: its group's stored value cannot be read) dead-lettered all of them; now it goes alone,
    as a one-item message, and the others count."""
    d = deploy(kafka, partitions=1, CALIBRATION_MIN_SAMPLES="1")
    f = EventFactory(tenant="cal-item")
    first = d.start_worker()
    responses = {
        model: f.response("t", 0, model=model, token_logprobs=[math.log(0.8)], **STRONG_COMPOSITE)
        for model in ("good", "bad")
    }
    verdicts = [f.outcome("t", 1, subject_event_id=r["event_id"], correct=True) for r in responses.values()]
    try:
        d.produce([*responses.values(), *verdicts])
        for model in ("good", "bad"):
            wait_for(
                lambda m=model: group_view(d, f"model={m}&kind=response", 1, "cal-item"), f"the {model} group"
            )
        assert first.stop() == 0
        changelog = f"{d.settings.app_id}-calibration-groups-changelog"
        corrupt = [(group_key("cal-item", "model", "bad", "response"), b'{"not": "a group"}')]
        asyncio.run(produce(kafka.bootstrap_servers, changelog, corrupt))
        d.close_changelog_gaps()
        second = d.start_worker()
        wait_for(lambda: group_view(d, "model=good&kind=response", 1, "cal-item"), "the restored good group")
        # The view lists what it can read and counts the group it cannot (before: a 500 for the tenant).
        status, body = view(d, "/calibration/cal-item?kind=response")
        assert status == 200 and body["unreadable_groups"] == 1
        assert {(g["dimension"], g["value"]) for g in body["groups"]} == {
            ("model", "good"),
            ("agent_type", "planner"),
        }
        # Only the unreadable group matches: a 500, not "no calibration data".
        status, body = view(d, "/calibration/cal-item?model=bad&kind=response")
        assert status == 500 and body["unreadable_groups"] == 1, body
        # One produce, one trace: one stage-1 batch, so both outcomes travel in one calibration message.
        again = {
            m: f.outcome("t", 2, subject_event_id=r["event_id"], correct=False) for m, r in responses.items()
        }
        d.produce(list(again.values()))
        records = d.collect(lambda rs: any(r.topic == d.settings.dlq_topic for r in rs))
        good = wait_for(
            lambda: group_view(d, "model=good&kind=response", 2, "cal-item"), "the good outcome counted"
        )
        assert good["samples"] == 2
        (letter,) = [r for r in records if r.topic == d.settings.dlq_topic]
        headers = dict(letter.headers)
        assert headers["__connect.errors.exception.class.name"] == b"UndecodableState"
        dead = orjson.loads(letter.value)
        assert [item["outcome"]["event_id"] for item in dead["items"]] == [again["bad"]["event_id"]]
        # The premise: both outcomes travelled in one message (one producer batch, one stage-1 batch).
        both = {again["good"]["event_id"], again["bad"]["event_id"]}

        def one_message_with_both(rs: list[Consumed]) -> bool:
            messages = [orjson.loads(part) for r in rs for part in r.value.split(b"\n")]
            return any(
                {i["outcome"]["event_id"] for i in m["items"] if i.get("outcome")} == both for m in messages
            )

        asyncio.run(
            collect(kafka.bootstrap_servers, [d.settings.calibration_topic], one_message_with_both, 30)
        )
        assert second.alive()
    finally:
        d.stop()


def test_an_outcome_that_would_make_its_subjects_entry_too_large_is_dead_lettered(
    kafka: RunningBroker,
) -> None:
    """A subject's entry (its score, its outcomes) is one changelog record. Only the count of outcomes
    bounded it: ids of escaped characters (6 bytes each in JSON) grew it past MAX_RECORD_BYTES, a record
    a broker enforcing that limit refuses at every restart (Tansu does not enforce it, so this test
    sees the dead letters, not the stop). Before the thirtieth round there were none."""
    d = deploy(kafka, partitions=1, MAX_RECORD_BYTES="200000", PRODUCER_MAX_BATCH_BYTES="200000")
    f = EventFactory(tenant="cal-big")
    escaped = "\x01" * 1000
    outcomes = [
        f.outcome(escaped, 1, event_id=f"{escaped}{i:04d}", subject_event_id=escaped, correct=True)
        for i in range(20)
    ]
    d.start_worker()
    try:
        d.produce(outcomes)

        def every_outcome_waits_or_is_dead(records: list[Consumed]) -> bool:
            letters = sum(r.topic == d.settings.dlq_topic for r in records)
            return letters > 0 and letters + metric(d, "confidence_outcomes_total", status="waiting") == 20

        records = d.collect(every_outcome_waits_or_is_dead)
    finally:
        d.stop()
    letters = [dict(r.headers) for r in records if r.topic == d.settings.dlq_topic]
    assert {h["__connect.errors.reason"] for h in letters} == {b"oversized_output"}
    assert 5 <= 20 - len(letters) < 20  # about 200,000 / 18,500 bytes of outcomes wait
