"""Through a real broker: a synthesis over sub calls, with a filtered source and both kinds of conflict."""

from __future__ import annotations

import unicodedata
from typing import Any

import pytest

from streams.harness import RunningBroker
from tests.integration.fixtures import EventFactory, count_of, deploy, get_json, settled

STRONG_TEXT = "## Findings\n- `load()` returns nil on error\n- callers check it\n```go\nif err != nil {}\n```"
WEAK_TEXT = "Maybe. Not sure."

# Expected values worked out by hand from seed 000 (DESIGN 4 "Synthesis", streams/scoring/heuristic.py),
# never with the scoring code under test. A source's confidence is the weighted mean of the heuristic
# components (length 0.15, hedging 0.2, certainty 0.15, structure 0.15) plus `token_logprobs` (0.3),
# total weight 0.95.
#
# sub-a, STRONG_TEXT, 89 code points: "## Findings\n" 12 + "- `load()` returns nil on error\n" 32
#   + "- callers check it\n" 19 + "```go\n" 6 + "if err != nil {}\n" 17 + "```" 3 = 89.
#   length    = 0.3 + 0.7 * 89/200 = 0.6115
#   hedging   = 1.0 (no hedge word)                 certainty = 1.0 (no certainty word)
#   structure = 0.5 + 0.15 ("- ") + 0.15 ("##") + 0.2 ("```") = 1.0
#   logprobs  = exp(-0.05) = 0.95123 -> rounded to 3 decimals: 0.951
#   sum = 0.6115*0.15 + 1.0*0.2 + 1.0*0.15 + 1.0*0.15 + 0.951*0.3
#       = 0.091725 + 0.2 + 0.15 + 0.15 + 0.2853 = 0.877025
#   confidence = 0.877025 / 0.95 = 0.923184210526...   (>= 0.5: included)
# sub-b, WEAK_TEXT, 16 code points ("Maybe." 6 + " Not" 4 + " sure." 6):
#   length    = 0.3 + 0.7 * 16/200 = 0.356
#   hedging   = 1 - 0.1 * 2 ("maybe", "not sure") = 0.8     certainty = 1.0
#   structure = 0.5 (no list, header or code)
#   logprobs  = exp(-3.0) = 0.04979 -> 0.05
#   sum = 0.356*0.15 + 0.8*0.2 + 1.0*0.15 + 0.5*0.15 + 0.05*0.3
#       = 0.0534 + 0.16 + 0.15 + 0.075 + 0.015 = 0.4534
#   confidence = 0.4534 / 0.95 = 0.477263157894...   (< 0.5: excluded)
# overall = (0.923184210526 * 89) / 89 = 0.923184210526 (only sub-a is included) -> level high (>= 0.9)
SUB_A = 0.877025 / 0.95
SUB_B = 0.4534 / 0.95
# syn-2's one sub call answers "" (0 code points): length 0.3, hedging 1.0, certainty 1.0, structure 0.5,
# no logprobs: (0.3*0.15 + 0.2 + 0.15 + 0.5*0.15) / 0.65 = 0.47 / 0.65 = 0.723076923...; as the only
# included source, and weighing 0 by length, the overall is its plain mean: the same, level medium.
EMPTY = 0.47 / 0.65
# The negation detector's severity is the project's documented choice (streams/scoring/synthesis.py).
HEURISTIC_SEVERITY = 0.6


def test_synthesis_filters_and_reports_conflicts(kafka: RunningBroker) -> None:
    # MinConfidence 0.5: with the seed's heuristic floors no source can score below the default 0.3.
    d = deploy(kafka, SYNTHESIS_MIN_CONFIDENCE="0.5")
    d.start_worker()
    f = EventFactory(tenant="synth")
    trace = "syn-1"
    events = [
        f.claim(trace, "k1", statement="The function returns nil on error", source_id="sub-a"),
        f.claim(trace, "k2", statement="The function never returns nil", source_id="sub-b"),
        f.claim(
            trace,
            "k3",
            statement="The cache is warm at start",
            source_id="sub-a",
            relationships=[{"type": "contradicts", "target": "k4", "strength": 0.9}],
        ),
        f.claim(trace, "k4", statement="Startup begins cold", source_id="sub-b"),
        f.claim(trace, "k5", statement="The parser handles unicode input", source_id="sub-a"),
        # A typographic apostrophe (U+2019), as LLM text often has: still the negation "doesn't".
        f.claim(trace, "k6", statement="The parser doesn\u2019t handle unicode input", source_id="sub-b"),
        f.response(trace, role="sub_call", sub_call_id="sub-a", response=STRONG_TEXT, token_logprobs=[-0.05]),
        f.response(trace, role="sub_call", sub_call_id="sub-b", response=WEAK_TEXT, token_logprobs=[-3.0]),
        f.response(trace, role="synthesis", response="Combined."),
    ]
    # syn-2: wordings the negation heuristic misread (review): a quoted word, Python's None, "no-op"
    # (no conflict), NFC against NFD; and an empty answer, whose weight by length is 0.
    syn2 = [
        f.claim("syn-2", "q1", statement="\u2018fsync\u2019 is called"),
        f.claim("syn-2", "q2", statement="fsync is never called"),
        f.claim("syn-2", "n1", statement="The function returns None on error"),
        f.claim("syn-2", "n2", statement="The function never returns None"),
        f.claim("syn-2", "o1", statement="The flush call is a no-op when idle"),
        f.claim("syn-2", "o2", statement="The flush call returns at once when idle"),
        f.claim("syn-2", "z1", statement=unicodedata.normalize("NFC", "Zo\u00eb is the owner")),
        f.claim("syn-2", "z2", statement=unicodedata.normalize("NFD", "Zo\u00eb is not the owner")),
        f.claim("syn-2", "b1", statement="- None of the tests pass"),  # a bullet, then the negation
        f.claim("syn-2", "b2", statement="- All of the tests pass"),
        f.response("syn-2", role="sub_call", sub_call_id="sub-e", response=""),
        f.response("syn-2", role="synthesis", response="Combined."),
    ]
    # The trace view of the same trace: its sub calls and claims, and no tool evidence at all
    # (score 0.0: band failed, recovery and stop both recommended).
    expected_view = {
        "tenant_id": "synth",
        "trace_id": trace,
        "last_event_time": "2026-11-22T12:00:00+00:00",
        "evidence": {
            "score": 0.0,
            "base": 0.0,
            "band": "failed",
            "categories": {},
            "weights": {},
            "convergence": {"categories": [], "count": 0, "bonus": 0.0, "target": None},
            "recovery_recommended": True,
            "should_stop": True,
            "recovery_attempts": 0,
        },
        "sub_calls": ["sub-a", "sub-b"],
        "claims": ["k1", "k2", "k3", "k4", "k5", "k6"],
    }
    try:
        d.produce(events + syn2)
        synth_id = events[-1]["event_id"]
        scored = count_of("SYNTHESIS_SCORED", 2, d.settings.scored_topic, {synth_id, syn2[-1]["event_id"]})
        # Both have warnings: each is copied to flagged-events, its own topic.
        copied = count_of("SYNTHESIS_SCORED", 2, d.settings.flagged_topic, {synth_id, syn2[-1]["event_id"]})
        records = d.collect(lambda rs: scored(rs) and copied(rs))
        status, view = settled(
            lambda: get_json(d.web_ports[0], f"/traces/synth/{trace}"), (200, expected_view)
        )
        assert status == 200, view
    finally:
        d.stop()
    syntheses = {o["trace_id"]: o for o in d.outputs(records) if o["event_type"] == "SYNTHESIS_SCORED"}
    out = syntheses[trace]
    assert sorted(out["sources"], key=lambda s: s["sub_call_id"]) == [
        {"sub_call_id": "sub-a", "confidence": pytest.approx(SUB_A, abs=1e-12), "included": True,
         "content_length": 89},
        {"sub_call_id": "sub-b", "confidence": pytest.approx(SUB_B, abs=1e-12), "included": False,
         "content_length": 16},
    ]  # fmt: skip
    assert round(SUB_A, 9) == 0.923184211 and round(SUB_B, 9) == 0.477263158  # the literals above
    assert out["overall_confidence"] == pytest.approx(0.923184210526, abs=1e-12)
    assert out["level"] == "high"
    assert out["filtered_count"] == 1
    # k1/k2: "returns nil on error" vs "never returns nil" share function/returns/nil and only k2 is
    # negated -> heuristic; k3 -> k4 is an explicit `contradicts` of strength 0.9; k5/k6 share
    # parser/unicode/input and only k6 is negated ("doesn\u2019t") -> heuristic. All >= 0.5.
    assert sorted(out["conflicts"], key=lambda c: (c["claim_a"], c["claim_b"])) == [
        {"claim_a": "k1", "claim_b": "k2", "type": "contradiction", "severity": HEURISTIC_SEVERITY,
         "detected_by": "heuristic"},
        {"claim_a": "k3", "claim_b": "k4", "type": "contradiction", "severity": 0.9, "detected_by": "explicit"},
        {"claim_a": "k5", "claim_b": "k6", "type": "contradiction", "severity": HEURISTIC_SEVERITY,
         "detected_by": "heuristic"},
    ]  # fmt: skip
    assert out["warnings"] == [
        "3 conflicts detected between sources. Review carefully.",
        "1 low-confidence sources excluded from synthesis.",
    ]
    flagged = [
        o for o in d.outputs(records, d.settings.flagged_topic) if o["event_type"] == "SYNTHESIS_SCORED"
    ]
    assert sorted(o["event_id"] for o in flagged) == sorted([out["event_id"], syntheses["syn-2"]["event_id"]])
    assert view == expected_view

    out2 = syntheses["syn-2"]
    assert out2["sources"] == [
        {"sub_call_id": "sub-e", "confidence": pytest.approx(EMPTY, abs=1e-12), "included": True,
         "content_length": 0},
    ]  # fmt: skip
    assert out2["overall_confidence"] == pytest.approx(EMPTY, abs=1e-12)  # was 0.0
    assert out2["level"] == "medium"
    assert sorted((c["claim_a"], c["claim_b"], c["detected_by"]) for c in out2["conflicts"]) == [
        ("b1", "b2", "heuristic"),
        ("n1", "n2", "heuristic"),
        ("q1", "q2", "heuristic"),
        ("z1", "z2", "heuristic"),
    ]
    assert out2["warnings"] == ["4 conflicts detected between sources. Review carefully."]


def test_the_same_sub_calls_and_claims_in_another_order_give_the_same_synthesis(kafka: RunningBroker) -> None:
    """Review (thirtieth round): the overall score was summed in arrival order (last bits differed) and
    conflicts were listed in claim arrival order. Two traces with the same inputs, reversed."""
    d = deploy(kafka, partitions=1)
    f = EventFactory(tenant="synth-order")
    subs = [
        ("s0", "The retry limit is 3.", [-0.1]),
        ("s2", "## Result\n- limit: 3\n- verified", None),
        ("s4", "Perhaps it could be 4", [-2.0]),
    ]
    pairs = [("k1", "k2"), ("k3", "k4")]

    def trace(name: str, reverse: bool) -> list[dict[str, Any]]:
        inputs = (
            [
                f.response(name, role="sub_call", sub_call_id=sub, response=text, token_logprobs=logprobs)
                for sub, text, logprobs in subs
            ]
            + [
                f.claim(name, a, relationships=[{"type": "contradicts", "target": b, "strength": 0.9}])
                for a, b in pairs
            ]
            + [f.claim(name, b) for _, b in pairs]
        )
        ordered = inputs[::-1] if reverse else inputs
        return [*ordered, f.response(name, minutes=1, role="synthesis", response="Combined.")]

    forward, backward = trace("order-a", False), trace("order-b", True)
    ids = {forward[-1]["event_id"], backward[-1]["event_id"]}
    d.start_worker()
    try:
        d.produce(forward + backward)
        records = d.collect(count_of("SYNTHESIS_SCORED", 2, d.settings.scored_topic, ids))
    finally:
        d.stop()
    syntheses = [o for o in d.outputs(records) if o["event_type"] == "SYNTHESIS_SCORED"]
    (a,) = [o for o in syntheses if o["source_event_id"] == forward[-1]["event_id"]]
    (b,) = [o for o in syntheses if o["source_event_id"] == backward[-1]["event_id"]]
    assert a["overall_confidence"] == b["overall_confidence"]
    assert (
        a["conflicts"] == b["conflicts"] and [(c["claim_a"], c["claim_b"]) for c in a["conflicts"]] == pairs
    )
    assert sorted(s["sub_call_id"] for s in a["sources"]) == sorted(s["sub_call_id"] for s in b["sources"])
