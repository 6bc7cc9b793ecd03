"""Pins found by hand-mutation review of stages 3 and 4 (claims, calibration) and synthesis scoring.

Each test names the behaviour it pins; every one failed with a mutation that the rest of the unit suite
let through.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from streams.scoring import calibration
from streams.scoring.claim_graph import (
    MAX_INTERVAL_STEPS,
    ClaimArrived,
    ClaimDefinition,
    ClaimNode,
    ClaimUpdate,
    GraphTooComplex,
    Relationship,
    apply_claim,
    interval_of,
    sweepable,
    without_expired,
)
from streams.scoring.claims import ClaimsConfig, Provenance, aggregate, derived_interval
from streams.scoring.heuristic import Component
from streams.scoring.synthesis import SubResult, SynthesisConfig, TraceClaim, synthesize
from streams.stages.calibration import _messages, hour_key, subject_key
from streams.stages.common import ExpiryClock
from streams.state import CalibrationItem, CalibrationMessage, CalibrationSubject, SubjectEntry
from tests.unit import stage_records
from tests.unit.test_calibration_stage import (
    START,
    TENANT,
    _outcome,
    _score,
    _swept,
    _Worker,
    model_updates_of_25_half_scores,
)
from tests.unit.test_claim_node_bound import _claim as _claim_event
from tests.unit.test_claim_node_bound import _Worker as _ClaimWorker

SYN = SynthesisConfig()
CLAIMS = ClaimsConfig()
T0 = datetime(2026, 11, 22, tzinfo=UTC)


def _sub(sub_id: str, score: float) -> SubResult:
    return SubResult(
        sub_call_id=sub_id,
        content="x" * 10,
        heuristic_components=(Component(factor="h", score=score, weight=1.0),),
        logprob_confidence=None,
    )


# --- synthesis -------------------------------------------------------------------------------------


def test_an_explicit_conflict_at_exactly_the_threshold_is_kept() -> None:
    """Seed 000 keeps `Severity >= threshold`: strength 0.5 against ConflictThreshold 0.5 is a conflict."""
    claims = [
        TraceClaim(claim_id="a", statement="alpha", contradicts=(("b", 0.5),)),
        TraceClaim(claim_id="b", statement="beta"),
    ]
    result = synthesize([_sub("s", 0.9)], claims, SYN)
    assert [(c.claim_a, c.claim_b, c.severity) for c in result.conflicts] == [("a", "b", 0.5)]


def test_a_heuristic_conflict_has_the_configured_severity_0_6() -> None:
    """The module's documented choice: a heuristic hit has severity `heuristic_conflict_severity`, 0.6."""
    claims = [
        TraceClaim(claim_id="1", statement="The function returns nil on error"),
        TraceClaim(claim_id="2", statement="The function never returns nil"),
    ]
    result = synthesize([_sub("s", 0.9)], claims, SYN)
    assert [(c.severity, c.detected_by) for c in result.conflicts] == [(0.6, "heuristic")]


def test_two_trace_claims_of_one_id_never_conflict_with_each_other() -> None:
    """A claim is not in conflict with itself, even when the trace lists its id twice (one negated)."""
    claims = [
        TraceClaim(claim_id="1", statement="The function returns nil on error"),
        TraceClaim(claim_id="1", statement="The function never returns nil"),
    ]
    assert synthesize([_sub("s", 0.9)], claims, SYN).conflicts == ()


# --- calibration math ------------------------------------------------------------------------------


def test_subtract_drops_an_emptied_bin_instead_of_keeping_a_zero_count() -> None:
    """`subtract` drops entries whose count reaches 0, so their float residue cannot outlive the data."""
    one = calibration.add({}, 0.42, 0.7)
    assert calibration.subtract(one, one) == {}
    actions = {"allow": calibration.ActionStats(1, 0.3)}
    assert calibration.subtract(actions, actions) == {}


def test_an_action_mean_drifted_past_1_is_kept_within_0_and_1() -> None:
    """Window totals drift by ulps; `observed_accuracy` is clamped to [0, 1] like every other mean."""
    assert calibration.ActionStats(1, 1.0000000000000004).observed_accuracy == 1.0
    assert calibration.ActionStats(2, -4.4e-16).observed_accuracy == 0.0


# --- calibration stage -----------------------------------------------------------------------------


def test_an_outcome_redelivered_while_it_waits_counts_once() -> None:
    """The duplicate check also covers waiting outcomes: a re-delivered early outcome joins its score once."""
    worker = _Worker()
    worker.feed(_outcome("o1", "r1", 1))
    worker.feed(_outcome("o1", "r1", 1))
    worker.feed(_score("r1", 0))
    assert worker.outcomes("matched") == 1
    assert worker.outcomes("duplicate") == 1
    assert calibration.total(worker.group().bins) == 1


def test_only_the_response_kind_counts_actions() -> None:
    """The action (allow / flag / reject) belongs to the response score: other kinds' groups get none."""
    worker = _Worker()
    subject = CalibrationSubject(
        subject_type="response",
        subject_id="r1",
        event_time=START,
        scores={"response": 0.8, "composite": 0.7},
        action="allow",
        model="m",
    )
    worker.feed(CalibrationItem(subject=subject, received_at=1.0))
    worker.feed(_outcome("o1", "r1", 1))
    assert worker.group(kind="response").actions == {"allow": calibration.ActionStats(1, 1.0)}
    composite = worker.group(kind="composite")
    assert calibration.total(composite.bins) == 1 and composite.actions == {}


def test_a_late_outcome_does_not_move_its_groups_newest_back() -> None:
    """A group's `newest` (its expiry) is the newest outcome time it counted, not the last one's."""
    worker = _Worker()
    worker.feed(_score("r1", 0), _score("r2", 0))
    worker.feed(_outcome("o1", "r1", 600))
    worker.feed(_outcome("o2", "r2", 1))
    group = worker.group()
    assert calibration.total(group.bins) == 2
    assert group.newest == START + timedelta(minutes=600)


def test_an_hour_leaving_the_window_takes_its_actions_and_its_bucket_with_it() -> None:
    """One-hour window: the outcome at +30 leaves once one at +125 arrives. Its action count leaves the
    group's totals with its bins, and its hour bucket is deleted from the table."""
    worker = _Worker(calibration_window_hours=1)
    worker.feed(_score("r0", 29), _outcome("o0", "r0", 30, correct=False))
    worker.feed(_score("r1", 124), _outcome("o1", "r1", 125))
    group = worker.group()
    assert calibration.total(group.bins) == 1
    assert group.actions == {"allow": calibration.ActionStats(1, 1.0)}
    first_hour = int((START + timedelta(minutes=30)).timestamp() // 3600)
    assert hour_key(group, first_hour) not in worker.tables
    assert group.hours == (int((START + timedelta(minutes=125)).timestamp() // 3600),)


DAY = 24 * 60


def test_counted_ids_stay_while_their_score_lives_even_after_their_wait_ended() -> None:
    """The sweep keeps a subject's counted outcome ids while its score lives: the score can still join a
    re-delivered outcome, which must then count as a duplicate, not a second time."""
    worker = _Worker()
    worker.feed(_score("r1", -3 * DAY), _outcome("o1", "r1", -3 * DAY + 10))  # o1's hour ends at +70
    _swept(worker, -3 * DAY + 120)  # past o1's wait, well within the score's 7-day join window
    kept = worker.tables[subject_key(TENANT, "response", "r1")]
    assert isinstance(kept, SubjectEntry) and kept.subject is not None and kept.applied == ("o1",)
    worker.feed(_outcome("o1", "r1", -3 * DAY + 10))  # re-delivered
    assert worker.outcomes("duplicate") == 1
    assert calibration.total(worker.group().bins) == 1


def test_counted_ids_are_kept_until_the_latest_wait_of_them_ends() -> None:
    """`applied_until` is the end of the latest counted outcome's wait, not the earliest's."""
    worker = _Worker(calibration_join_window_hours=1)
    worker.feed(_score("r1", -3 * DAY))
    worker.feed(_outcome("o1", "r1", -3 * DAY + 10))  # its hour of waiting ends at +70
    worker.feed(_outcome("o2", "r1", -3 * DAY + 40))  # at +100
    key = subject_key(TENANT, "response", "r1")
    _swept(worker, -3 * DAY + 75)  # the score's join window ended at +60
    kept = worker.tables[key]
    assert isinstance(kept, SubjectEntry) and kept.subject is None and kept.applied == ("o1", "o2")
    assert kept.applied_until == START + timedelta(minutes=-3 * DAY + 100)


def test_outcomes_alone_move_the_expiry_clock() -> None:
    """Outcomes are event time too: a tenant that only sends outcomes still ends their waits."""
    worker = _Worker()
    worker.stage.clock = ExpiryClock(timedelta(hours=1), None)  # one source: no idle wait
    worker.feed(_outcome("o1", "r1", 0))  # waits an hour for its score
    worker.feed(_outcome("o2", "r2", 120))
    key = subject_key(TENANT, "response", "r1")
    entry = worker.tables[key]
    assert isinstance(entry, SubjectEntry)
    assert worker.stage.sweep_subject(key, entry) == (None, 1)


def test_one_calibration_item_larger_than_the_batch_limit_is_still_one_message() -> None:
    """Messages split in halves past PRODUCER_MAX_BATCH_BYTES, down to one item each, and no further."""
    item = _score("r" * 500, 0)
    assert len(_messages(TENANT, 0, [item], 100)) == 1
    assert len(_messages(TENANT, 0, [item, item, item], 100)) == 3


def test_a_calibration_update_names_the_ece_last_emitted_for_its_group() -> None:
    """CALIBRATION_UPDATED carries `previous_ece`: None the first time, then the ECE emitted before."""
    worker = _Worker()  # minimum 20 samples, change 0.02, at most every 10 minutes
    emitted = [(u["ece"], u["previous_ece"]) for _, u in model_updates_of_25_half_scores(worker)]
    assert len(emitted) == 2
    assert emitted[0][1] is None
    assert emitted[1][1] == emitted[0][0] == pytest.approx(0.2)


# --- claims ----------------------------------------------------------------------------------------


def test_diversity_is_capped_at_1_past_the_full_diversity_types() -> None:
    """Seed 002: diversity = 0.5 + 0.5 * min(types / 3, 1): four source types are full diversity, not 1.17."""
    provenance = [Provenance(source_type=t, confidence=0.6) for t in ("a", "b", "c", "d")]
    lower, upper, diversity = aggregate(provenance, CLAIMS)
    assert diversity == 1.0
    assert lower == pytest.approx(0.6)
    assert upper == pytest.approx(1 - 0.4**4)


def test_a_derived_lower_bound_never_drops_below_0() -> None:
    """An assessed upper far below a wide constituent: the width rule lowers the lower bound to 0, not
    below (0.3 - 0.8 would be -0.5)."""
    interval = derived_interval([(0.1, 0.9)], 0.3, (0.4, 0.6, 2 / 3))
    assert (interval.lower, interval.upper) == (0.0, 0.3)


def test_a_derived_interval_reports_neutral_step_2_to_4_factors() -> None:
    """The derived rule replaces steps 1-4: its factors say so (staleness, boost, penalty, trust all 1)."""
    factors = derived_interval([(0.2, 0.5), (0.4, 0.6)], None, (0.4, 0.6, 2 / 3)).factors
    assert factors.derived
    assert (
        factors.staleness,
        factors.support_boost,
        factors.contradiction_penalty,
        factors.instance_trust,
    ) == (
        1.0,
        1.0,
        1.0,
        1.0,
    )
    assert (factors.aggregate_lower, factors.aggregate_upper) == (0.4, 0.6)


def _claim(
    claim_id: str, derived_from: tuple[str, ...] = (), agent_type: str | None = None
) -> ClaimDefinition:
    return ClaimDefinition(
        claim_id=claim_id,
        trace_id=f"trace-{claim_id}",
        statement=claim_id,
        tier="task",
        provenance=(Provenance(source_type="agent", confidence=0.8),),
        derived_from=derived_from,
        agent_type=agent_type,
    )


def test_the_step_budget_allows_exactly_max_interval_steps() -> None:
    """A claim derived from MAX_INTERVAL_STEPS - 1 plain claims takes exactly MAX_INTERVAL_STEPS steps
    (itself and each constituent once): allowed. One constituent more is refused."""
    parts = [f"c{i}" for i in range(MAX_INTERVAL_STEPS)]
    nodes = {c: ClaimNode(definition=_claim(c)) for c in parts}
    nodes["d"] = ClaimNode(definition=_claim("d", tuple(parts[:-1])))
    nodes["too-wide"] = ClaimNode(definition=_claim("too-wide", tuple(parts)))
    assert interval_of(nodes.get, "d", T0, CLAIMS).factors.derived
    with pytest.raises(GraphTooComplex, match="steps"):
        interval_of(nodes.get, "too-wide", T0, CLAIMS)


def _arrive(
    nodes: dict[str, ClaimNode],
    definition: ClaimDefinition,
    event_id: str,
    cfg: ClaimsConfig = CLAIMS,
    **kw: Any,
) -> ClaimUpdate:
    update = apply_claim(
        nodes.get, ClaimArrived(definition=definition, source_event_id=event_id, event_time=T0), cfg, **kw
    )
    nodes.update(update.nodes)
    return update


def test_a_claim_remembers_its_newest_scores_not_its_oldest() -> None:
    """With room for two remembered scores, the third input pushes out the first: the third, re-delivered,
    re-emits its score and changes nothing; the first, marked re-delivered, is forgotten."""
    cfg = ClaimsConfig(max_remembered_events=2)
    nodes: dict[str, ClaimNode] = {}
    for event_id in ("e1", "e2", "e3"):
        third = _arrive(nodes, _claim("a"), event_id, cfg)
    assert list(nodes["a"].applied) == ["e2", "e3"]
    again = _arrive(nodes, _claim("a"), "e3", cfg)
    assert (again.nodes, again.scores) == ({}, third.scores[:1])
    assert _arrive(nodes, _claim("a"), "e1", cfg, redelivered=True) == ClaimUpdate()


def test_a_claim_score_carries_the_claims_agent_type() -> None:
    """The agent type rides on CLAIM_SCORED's calibration subject: own and re-scored claims carry theirs."""
    nodes: dict[str, ClaimNode] = {}
    _arrive(nodes, _claim("c", agent_type="Planner"), "e1")
    scores = _arrive(nodes, _claim("d", ("c",), agent_type="coder"), "e2").scores
    assert [(s.claim_id, s.agent_type) for s in scores] == [("d", "coder")]
    scores = _arrive(nodes, _claim("c", agent_type="Planner"), "e3").scores
    assert [(s.claim_id, s.agent_type) for s in scores] == [("c", "Planner"), ("d", "coder")]


def test_the_nodes_an_input_changes_count_their_expiry_from_touched_at() -> None:
    """`touched_at` (the stage passes the clock's bound) is what the written nodes' expiry counts from."""
    nodes: dict[str, ClaimNode] = {}
    earlier = T0 - timedelta(days=1)
    definition = _claim("a").model_copy(update={"derived_from": ("b",)})
    _arrive(nodes, definition, "e1", touched_at=earlier)
    assert nodes["a"].last_event_time == earlier
    assert nodes["b"].last_event_time == earlier  # the stub `a` points at


def test_a_supporter_contributes_its_stale_upper_bound() -> None:
    """DESIGN 4: neighbours contribute their stale (steps 1-2) upper. A supporter whose staleness_at lies
    one ephemeral half-life (4 h) back contributes 0.8 * 0.5: boost 1 + 0.4 * 0.5 * 0.1 = 1.02."""
    nodes: dict[str, ClaimNode] = {}
    _arrive(nodes, _claim("t"), "e1")
    supporter = _claim("s").model_copy(
        update={
            "tier": "ephemeral",
            "staleness_at": T0 - timedelta(hours=4),
            "relationships": (Relationship(type="supports", target="t", strength=0.5),),
        }
    )
    scores = {s.claim_id: s.interval for s in _arrive(nodes, supporter, "e2").scores}
    assert scores["t"].factors.support_boost == pytest.approx(1.02)
    assert scores["t"].upper == pytest.approx(0.8 * 1.02)


def test_the_target_of_several_contradictions_by_one_peer_takes_the_strongest_whatever_the_order() -> None:
    """One penalty per pair at the stronger strength: b declares 0.9 then 0.1 against a, and a (which
    reads the edges from its incoming index) is penalised 1 - 0.8 * 0.9 * 0.2 = 0.856, as b is."""
    nodes: dict[str, ClaimNode] = {}
    _arrive(nodes, _claim("a"), "e1")
    b = _claim("b").model_copy(
        update={
            "relationships": (
                Relationship(type="contradicts", target="a", strength=0.9),
                Relationship(type="contradicts", target="a", strength=0.1),
            )
        }
    )
    scores = {s.claim_id: s.interval.factors.contradiction_penalty for s in _arrive(nodes, b, "e2").scores}
    assert scores == {"a": pytest.approx(0.856), "b": pytest.approx(0.856)}


def test_only_a_penalised_claim_score_is_marked_contradicted() -> None:
    """`ClaimScore.contradicted` is set by a penalty below 1 only: a lone or supported claim is not."""
    nodes: dict[str, ClaimNode] = {}
    [alone] = _arrive(nodes, _claim("a"), "e1").scores
    assert not alone.contradicted
    b = _claim("b").model_copy(
        update={"relationships": (Relationship(type="contradicts", target="a", strength=0.5),)}
    )
    assert all(s.contradicted for s in _arrive(nodes, b, "e2").scores)


def test_emitted_intervals_use_the_event_time_not_touched_at() -> None:
    """DESIGN 4: emitted intervals use the triggering event's time; `touched_at` only dates expiry. A
    claim stale since one ephemeral half-life before the event scores staleness 0.5 even when its
    nodes are touched at the staleness time."""
    nodes: dict[str, ClaimNode] = {}
    stale = _claim("a").model_copy(update={"tier": "ephemeral", "staleness_at": T0 - timedelta(hours=4)})
    [score] = _arrive(nodes, stale, "e1", touched_at=T0 - timedelta(hours=4)).scores
    assert score.as_of == T0
    assert score.interval.factors.staleness == pytest.approx(0.5)


def _supporting(claim_id: str, target: str) -> ClaimDefinition:
    return _claim(claim_id).model_copy(
        update={"relationships": (Relationship(type="supports", target=target, strength=1.0),)}
    )


def test_a_re_sent_claim_touches_the_nodes_it_points_at_even_with_unchanged_edges() -> None:
    """`_reindex`: every version of X touches the nodes X points at, so they live as long as X."""
    nodes: dict[str, ClaimNode] = {}
    _arrive(nodes, _supporting("x", "t"), "e1")
    assert nodes["t"].last_event_time == T0
    later = T0 + timedelta(days=10)
    _arrive(nodes, _supporting("x", "t"), "e2", touched_at=later)
    assert nodes["t"].last_event_time == later and nodes["t"].incoming == {"x": (("supports", 1.0),)}


def test_an_older_input_never_moves_a_nodes_last_update_back() -> None:
    """A node's `last_event_time` (its expiry) only moves forward: an input touched earlier leaves it."""
    nodes: dict[str, ClaimNode] = {}
    later = T0 + timedelta(days=1)
    _arrive(nodes, _claim("t"), "e1", touched_at=later)
    _arrive(nodes, _supporting("s", "t"), "e2")  # touches t at T0
    assert nodes["t"].last_event_time == later
    assert nodes["s"].last_event_time == T0


def test_a_candidate_kept_alive_keeps_what_it_points_at_transitively() -> None:
    """`sweepable`: live L points at a, a at b, b at c (all past their TTL): none may go."""
    edge = (("supports", 1.0),)
    candidates = {
        "a": ClaimNode(incoming={"L": edge}),
        "b": ClaimNode(incoming={"a": edge}),
        "c": ClaimNode(derived_by=("b",)),
    }
    assert sweepable(candidates, lambda claim_id: claim_id == "L") == set()
    assert sweepable(candidates, lambda claim_id: False) == {"a", "b", "c"}


def test_nodes_deleted_with_an_expired_claim_are_not_rewritten() -> None:
    """`without_expired` rewrites only surviving nodes: one expiring too would be written back."""
    nodes: dict[str, ClaimNode] = {}
    _arrive(nodes, _supporting("a", "b"), "e1")
    _arrive(nodes, _supporting("a2", "c"), "e2")
    _arrive(nodes, _claim("b"), "e3")
    changed = without_expired(nodes.get, {"a": nodes["a"], "b": nodes["b"], "a2": nodes["a2"]})
    assert set(changed) == {"c"} and changed["c"].incoming == {}


def test_a_re_sent_derived_claim_touches_its_constituents_nodes() -> None:
    """`_reindex`: a derived claim re-sent with the same derived_from touches its constituents too."""
    nodes: dict[str, ClaimNode] = {}
    _arrive(nodes, _claim("d", ("part",)), "e1")
    later = T0 + timedelta(days=10)
    _arrive(nodes, _claim("d", ("part",)), "e2", touched_at=later)
    assert nodes["part"].last_event_time == later and nodes["part"].derived_by == ("d",)


# --- claim stage -----------------------------------------------------------------------------------


def test_each_claim_scored_by_one_input_has_its_own_event_id() -> None:
    """Every output has its own deterministic event id: one input re-scoring two claims emits two ids."""
    worker = _ClaimWorker()
    contradicting = _claim_event(1, "b", relationships=[_contradicts("a")])
    records = worker.run([_claim_event(0, "a"), contradicting], [1])
    scored = [(o["claim_id"], o["source_event_id"], o["event_id"]) for o in stage_records.scored(records)]
    assert [(c, s) for c, s, _ in scored] == [("a", "e0"), ("b", "e1"), ("a", "e1")]
    assert len({event_id for _, _, event_id in scored}) == 3


def test_a_claims_calibration_subject_is_its_midpoint_with_its_agent_type() -> None:
    """Stage 3 sends each CLAIM_SCORED's midpoint to calibration, under the claim's agent type."""
    worker = _ClaimWorker()
    records = worker.run([_claim_event(0, "a")], [])
    [scored] = stage_records.scored(records)
    messages = [
        CalibrationMessage.model_validate_json(r.value)
        for r in records
        if r.topic == worker.settings.calibration_topic
    ]
    subjects = [item.subject for message in messages for item in message.items]
    assert [(s.subject_id, s.scores, s.agent_type) for s in subjects if s is not None] == [
        ("a", {"claim": scored["interval"]["midpoint"]}, "planner")
    ]


def _contradicts(target: str, strength: float = 0.5) -> dict[str, Any]:
    return {"type": "contradicts", "target": target, "strength": strength}
