"""Tests that kill mutants of the pure scoring modules which the other unit tests let survive.

Every expected value is worked out by hand from the formula it names (DESIGN.md, the seeds, or the
module's documented choice where DESIGN leaves it to the project).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from streams.scoring import calibration
from streams.scoring.calibration import BinStats
from streams.scoring.claim_graph import (
    ClaimArrived,
    ClaimDefinition,
    ClaimNode,
    ClaimUpdate,
    NeighbourFacts,
    Relationship,
    apply_claim,
    neighbour_facts,
    without_expired,
)
from streams.scoring.claims import ClaimsConfig, Provenance, aggregate, derived_interval
from streams.scoring.composite import CompositeConfig, response_certainty_score, score_composite
from streams.scoring.heuristic import Component, score_heuristic
from streams.scoring.synthesis import SubResult, SynthesisConfig, TraceClaim, source_confidence, synthesize

# --- heuristic (seed 000; certainty is the project's documented choice) ---------------------------


def _component(text: str, factor: str) -> float:
    return next(c.score for c in score_heuristic(text).components if c.factor == factor)


def test_certainty_penalty_is_capped_at_half() -> None:
    # heuristic.py: certainty = 1 - min(0.1 x count, 0.5); 6 x "definitely" -> 1 - 0.5.
    assert _component("definitely " * 6, "certainty") == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("text", "factor"),
    [("unclear", "hedging"), ("undoubtedly", "certainty")],  # the last entry of each seed word list
)
def test_every_seed_marker_counts(text: str, factor: str) -> None:
    # One marker: 1 - 0.1.
    assert _component(text, factor) == pytest.approx(0.9)


# --- composite (seed 004) -------------------------------------------------------------------------


def test_uncertainty_adjustment_is_capped_at_half() -> None:
    # Seed 004: 0.5 + min(1 x 0.1, 0.5) - min(4 x 0.15, 0.5) = 0.5 + 0.1 - 0.5 = 0.1 ("maybe" x 4).
    assert response_certainty_score("definitely maybe maybe maybe maybe") == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("text", "level"),
    [
        # 5 certainty markers -> certainty 1.0; history 0.5; weights 0.2 / 0.2 renormalised to 0.5 / 0.5
        # (no retrieval, no code_validation: DESIGN 4) -> 0.75, the MODERATE edge (>= 0.75).
        ("definitely certainly absolutely confirmed verified", "MODERATE"),
        # No markers -> certainty 0.5; history 0.5 -> 0.50, the LOW edge (>= 0.50).
        ("the answer", "LOW"),
    ],
)
def test_composite_level_edges_are_inclusive(text: str, level: str) -> None:
    result = score_composite("planner", None, None, text, 0.5, CompositeConfig())
    assert result.level == level


# --- claims (seed 002) ----------------------------------------------------------------------------


def test_diversity_is_capped_at_full_credit() -> None:
    # 0.5 + 0.5 x min(4 / 3, 1.0) = 1.0, so lower = max(c) x 1.0; upper = 1 - 0.5^4.
    provenance = [Provenance(source_type=t, confidence=0.5) for t in ("a", "b", "c", "d")]
    lower, upper, diversity = aggregate(provenance, ClaimsConfig())
    assert diversity == pytest.approx(1.0)
    assert lower == pytest.approx(0.5)
    assert upper == pytest.approx(1 - 0.5**4)


def test_derived_lower_bound_never_goes_below_zero() -> None:
    # DESIGN 4: lower = min(0.2) = 0.2, upper = min(assessed 0.1, max(0.8)) = 0.1; widening to the widest
    # constituent's width 0.6 would give 0.1 - 0.6 < 0, and an interval bound stays in [0, 1].
    interval = derived_interval([(0.2, 0.8)], 0.1, (0.0, 0.0, 0.5))
    assert interval.upper == pytest.approx(0.1)
    assert interval.lower == 0.0


# --- synthesis (seed 000) -------------------------------------------------------------------------


def test_logprob_confidence_of_zero_is_a_component() -> None:
    # DESIGN 4: when the logprob confidence exists (0.0 does) it is a component of weight 0.3:
    # (0.8 x 1.0 + 0.0 x 0.3) / 1.3.
    sub = SubResult(
        sub_call_id="a",
        content="x",
        heuristic_components=(Component(factor="h", score=0.8, weight=1.0),),
        logprob_confidence=0.0,
    )
    assert source_confidence(sub, SynthesisConfig()) == pytest.approx(0.8 / 1.3)


def test_conflict_at_exactly_the_threshold_is_reported() -> None:
    # ConflictThreshold 0.5 is the minimum severity to report (seed 000), so strength 0.5 is kept.
    claims = [
        TraceClaim(claim_id="a", statement="alpha", contradicts=(("b", 0.5),)),
        TraceClaim(claim_id="b", statement="beta"),
    ]
    result = synthesize([], claims, SynthesisConfig())
    assert [(c.claim_a, c.claim_b, c.severity, c.detected_by) for c in result.conflicts] == [
        ("a", "b", 0.5, "explicit")
    ]


def test_heuristic_negation_conflict_has_documented_severity() -> None:
    # DESIGN 4's example pair; synthesis.py documents the heuristic severity as 0.6.
    claims = [
        TraceClaim(claim_id="a", statement="returns nil on error"),
        TraceClaim(claim_id="b", statement="never returns nil"),
    ]
    (conflict,) = synthesize([], claims, SynthesisConfig()).conflicts
    assert (conflict.claim_a, conflict.claim_b, conflict.detected_by) == ("a", "b", "heuristic")
    assert conflict.severity == pytest.approx(0.6)


# --- calibration (the module's documented contract; DESIGN and the seeds do not define it) ----------


def test_subtract_drops_emptied_bins() -> None:
    # "emptied entries are dropped": removing the only sample of bin 50 leaves no bin 50.
    one = BinStats(1, 0.5, 1.0, 0.25)
    assert calibration.subtract({50: one, 60: one}, {50: one}) == {60: one}


def test_merge_sums_a_bin_present_in_several_histograms() -> None:
    # The sum of two hourly buckets: bin 50 holds both samples.
    a, b = BinStats(1, 0.5, 1.0, 0.25), BinStats(1, 0.55, 0.0, 0.3025)
    merged = calibration.merge([{50: a}, {50: b}])
    assert merged[50].n == 2
    assert merged[50].sum_predicted == pytest.approx(1.05)
    assert merged[50].sum_observed == pytest.approx(1.0)
    assert merged[50].sum_squared_error == pytest.approx(0.5525)


def test_subtract_removes_each_sum_of_the_leaving_hour() -> None:
    # Bin 50 held (0.5, 1.0) and (0.55, 0.0); the hour with (0.5, 1.0) leaves: (0.55, 0.0) is left.
    both = BinStats(2, 1.05, 1.0, 0.5525)
    left = calibration.subtract({50: both}, {50: BinStats(1, 0.5, 1.0, 0.25)})[50]
    assert left.n == 1
    assert left.sum_predicted == pytest.approx(0.55)
    assert left.sum_observed == pytest.approx(0.0)
    assert left.sum_squared_error == pytest.approx(0.3025)


def test_observed_accuracy_of_a_single_outcome() -> None:
    assert calibration.ActionStats(1, 1.0).observed_accuracy == 1.0
    assert calibration.ActionStats(0, 0.0).observed_accuracy is None


def test_subtract_ignores_a_bin_the_totals_lack() -> None:
    # "An entry `totals` lacks ... is left out rather than raising."
    one = BinStats(1, 0.5, 1.0, 0.25)
    assert calibration.subtract({60: one}, {50: one}) == {60: one}


# --- claim graph (seed 002 with DESIGN 4 / 4b) ------------------------------------------------------

CFG = ClaimsConfig()
T0 = datetime(2026, 11, 22, tzinfo=UTC)
# One provenance entry of confidence c, one source type: diversity 0.5 + 0.5 x 1/3 = 2/3, so the
# aggregate interval is [c x 2/3, c].


def claim(
    claim_id: str,
    *rels: tuple[str, str, float],
    conf: float = 0.5,
    tier: str = "task",
    staleness_at: datetime | None = None,
    derived_from: tuple[str, ...] = (),
) -> ClaimDefinition:
    return ClaimDefinition.model_validate(
        {
            "claim_id": claim_id,
            "trace_id": f"trace-{claim_id}",
            "statement": claim_id,
            "tier": tier,
            "staleness_at": staleness_at,
            "derived_from": derived_from,
            "provenance": [Provenance(source_type="agent", confidence=conf)],
            "relationships": [Relationship(type=k, target=t, strength=st) for k, t, st in rels],
        }
    )


def arrive(
    nodes: dict[str, ClaimNode],
    definition: ClaimDefinition,
    event_id: str,
    when: datetime,
    *,
    cfg: ClaimsConfig = CFG,
    with_facts: bool = False,
    redelivered: bool = False,
) -> ClaimUpdate:
    """Apply one CLAIM input over `nodes` (the tenant's table) and store what it wrote."""

    def facts(claim_id: str) -> NeighbourFacts | None:
        return neighbour_facts(nodes.get(claim_id), cfg)

    update = apply_claim(
        nodes.get,
        ClaimArrived(definition=definition, source_event_id=event_id, event_time=when),
        cfg,
        facts=facts if with_facts else None,
        redelivered=redelivered,
    )
    nodes.update(update.nodes)
    return update


def test_neighbour_contributes_its_stale_upper() -> None:
    # z: upper 0.8, ephemeral, one half-life (4 h) past staleness_at at T0 -> stale upper 0.4.
    # t: upper 0.5 x (1 + 0.4 x 1.0 x BOOST 0.1) = 0.52; lower 1/3 (support never raises it).
    nodes: dict[str, ClaimNode] = {}
    stale = claim(
        "z", ("supports", "t", 1.0), conf=0.8, tier="ephemeral", staleness_at=T0 - timedelta(hours=4)
    )
    arrive(nodes, stale, "e-z", T0 - timedelta(hours=5))
    (own,) = arrive(nodes, claim("t"), "e-t", T0).scores
    assert own.interval.upper == pytest.approx(0.52)
    assert own.interval.lower == pytest.approx(1 / 3)
    assert own.contradicted is False


def test_contradiction_uses_the_stronger_of_two_declared_strengths() -> None:
    # One penalty per pair at the stronger strength 0.9: 1 - 0.5 x 0.9 x PENALTY 0.2 = 0.91 for both claims.
    nodes: dict[str, ClaimNode] = {}
    arrive(nodes, claim("t"), "e-t", T0)
    scores = arrive(nodes, claim("z", ("contradicts", "t", 0.9), ("contradicts", "t", 0.3)), "e-z", T0).scores
    assert [s.claim_id for s in scores] == ["z", "t"]
    for score in scores:
        assert score.contradicted is True
        assert score.interval.factors.contradiction_penalty == pytest.approx(0.91)
        assert score.interval.upper == pytest.approx(0.455)
        assert score.interval.lower == pytest.approx(0.91 / 3)


def test_redelivery_of_the_latest_input_is_remembered_when_the_memory_is_full() -> None:
    # DESIGN 4b: a re-delivered CLAIM re-emits its own CLAIM_SCORED; the memory keeps the newest inputs.
    cfg = ClaimsConfig(max_remembered_events=1)
    nodes: dict[str, ClaimNode] = {}
    arrive(nodes, claim("a"), "e1", T0, cfg=cfg)
    (latest,) = arrive(nodes, claim("a", conf=0.6), "e2", T0 + timedelta(minutes=1), cfg=cfg).scores
    again = arrive(nodes, claim("a", conf=0.6), "e2", T0 + timedelta(minutes=1), cfg=cfg, redelivered=True)
    assert again.scores == (latest,)
    assert again.nodes == {}


def test_an_older_event_never_moves_a_node_back_in_time() -> None:
    # Claims are kept for 30 days after their last update: x's last update (T0 + 1 h) must survive a
    # supporter whose event time is older.
    nodes: dict[str, ClaimNode] = {}
    arrive(nodes, claim("x"), "e-x", T0 + timedelta(hours=1))
    update = arrive(nodes, claim("y", ("supports", "x", 1.0)), "e-y", T0)
    assert update.nodes["x"].last_event_time == T0 + timedelta(hours=1)


def test_resending_the_same_edges_at_the_same_time_leaves_the_target_alone() -> None:
    # claim_graph._reindex: "a node already touched at `when` or later is left alone".
    nodes: dict[str, ClaimNode] = {}
    arrive(nodes, claim("t"), "e-t", T0)
    arrive(nodes, claim("y", ("supports", "t", 1.0)), "e-y1", T0)
    update = arrive(nodes, claim("y", ("supports", "t", 1.0)), "e-y2", T0)
    assert "t" not in update.nodes


def test_neighbour_replaced_by_this_input_counts_with_its_new_version() -> None:
    # x v2 (confidence 0.9) supports t; the facts loader still holds x v1 (0.5), as the table does before
    # this input is written. t: 0.5 x (1 + 0.9 x 1.0 x 0.1) = 0.545.
    nodes: dict[str, ClaimNode] = {}
    arrive(nodes, claim("t"), "e-t", T0, with_facts=True)
    arrive(nodes, claim("x", ("supports", "t", 1.0)), "e-x1", T0, with_facts=True)
    scores = arrive(nodes, claim("x", ("supports", "t", 1.0), conf=0.9), "e-x2", T0, with_facts=True).scores
    assert [s.claim_id for s in scores] == ["x", "t"]
    assert scores[1].interval.upper == pytest.approx(0.545)


def test_expired_claims_are_not_rewritten_by_without_expired() -> None:
    # Both a and the claim it supports expire together: nothing is left to rewrite.
    nodes: dict[str, ClaimNode] = {}
    arrive(nodes, claim("a", ("supports", "b", 1.0)), "e-a", T0)
    arrive(nodes, claim("b"), "e-b", T0)
    assert without_expired(nodes.get, {"a": nodes["a"], "b": nodes["b"]}) == {}


def test_shared_constituents_are_scored_once_per_input() -> None:
    # A ladder c2..c24, each derived from the two before it: with every claim scored once per input this
    # is ~25 interval steps; scoring shared constituents again would take Fibonacci(24) (~46,000) steps,
    # past MAX_INTERVAL_STEPS (5,000), and refuse a valid acyclic graph.
    nodes: dict[str, ClaimNode] = {}
    arrive(nodes, claim("c0"), "e-c0", T0)
    arrive(nodes, claim("c1", conf=0.9), "e-c1", T0)
    for i in range(2, 25):
        arrive(nodes, claim(f"c{i}", derived_from=(f"c{i - 1}", f"c{i - 2}")), f"e-c{i}", T0)
    (top,) = arrive(nodes, claim("c24", derived_from=("c23", "c22")), "e-c24-again", T0).scores
    # c0 = [1/3, 0.5], c1 = [0.6, 0.9]; c2 = [min lowers 1/3, max uppers 0.9] widened to the widest
    # constituent width 0.3: lower stays 1/3. Every later rung repeats [1/3, 0.9].
    assert top.interval.lower == pytest.approx(1 / 3)
    assert top.interval.upper == pytest.approx(0.9)
