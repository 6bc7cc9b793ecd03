"""One tenant's claim graph, one input at a time: exactly the affected claims, each computed once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.scoring.claim_graph import (
    MAX_DERIVED_DEPTH,
    ClaimArrived,
    ClaimDefinition,
    ClaimNode,
    ClaimScore,
    ClaimUpdate,
    GraphTooComplex,
    Relationship,
    apply_claim,
    interval_of,
)
from streams.scoring.claims import ClaimsConfig, Provenance

CFG = ClaimsConfig()
T0 = datetime(2026, 11, 22, tzinfo=UTC)


def define(
    claim_id: str,
    *rels: tuple[str, str, float],
    conf: float = 0.8,
    types: tuple[str, ...] = ("agent",),
    derived_from: tuple[str, ...] = (),
    **kw: Any,
) -> ClaimDefinition:
    return ClaimDefinition(
        claim_id=claim_id,
        trace_id=f"trace-{claim_id}",
        statement=claim_id,
        tier=kw.pop("tier", "task"),
        provenance=tuple(Provenance(source_type=t, confidence=conf) for t in types),
        relationships=tuple(Relationship(type=k, target=t, strength=s) for k, t, s in rels),  # type: ignore[arg-type]
        derived_from=derived_from,
        **kw,
    )


class Graph:
    """The claims table of one tenant, as a dict: what the claim stage does per input."""

    def __init__(self) -> None:
        self.nodes: dict[str, ClaimNode] = {}
        self.n = 0

    def arrive(
        self, definition: ClaimDefinition, minutes: float = 0, event_id: str | None = None
    ) -> list[ClaimScore]:
        self.n += 1
        update = apply_claim(
            self.nodes.get,
            ClaimArrived(
                definition=definition,
                source_event_id=event_id or f"ev-{self.n}",
                event_time=T0 + timedelta(minutes=minutes),
            ),
            CFG,
        )
        self.nodes.update(update.nodes)
        return list(update.scores)


def bounds(score: ClaimScore) -> tuple[float, float]:
    return round(score.interval.lower, 9), round(score.interval.upper, 9)


# Hand-worked values (seed 002, DESIGN 4b). One "agent" source at 0.8: diversity 0.5 + 0.5/3 = 0.6667,
# lower 0.8 * 0.6667 = 0.533333333, upper 1 - 0.2 = 0.8.
ALONE = (0.533333333, 0.8)
# Contradicted by a 0.8-upper neighbour at strength 0.5: penalty 1 - 0.8*0.5*0.2 = 0.92.
CONTRADICTED = (round(0.8 * (2 / 3) * 0.92, 9), round(0.8 * 0.92, 9))
# Supported by a 0.8-upper neighbour at strength 0.5: boost 1 + 0.8*0.5*0.1 = 1.04.
SUPPORTED = (0.533333333, round(0.8 * 1.04, 9))


def test_a_claim_alone() -> None:
    [score] = Graph().arrive(define("a"))
    assert (score.claim_id, score.cause, bounds(score)) == ("a", "self", ALONE)


def test_contradiction_after_the_target_penalises_both_at_the_same_input() -> None:
    g = Graph()
    g.arrive(define("a"))
    scores = g.arrive(define("b", ("contradicts", "a", 0.5)), minutes=1)
    assert [(s.claim_id, s.cause, s.source_event_id, bounds(s)) for s in scores] == [
        ("b", "self", "ev-2", CONTRADICTED),
        ("a", "b", "ev-2", CONTRADICTED),
    ]
    assert all(s.as_of == T0 + timedelta(minutes=1) and s.contradicted for s in scores)


def test_forward_contradiction_is_applied_when_the_target_arrives() -> None:
    g = Graph()
    [b_alone] = g.arrive(define("b", ("contradicts", "a", 0.5)))  # a unknown: ignored until it arrives
    assert bounds(b_alone) == ALONE
    scores = g.arrive(define("a"), minutes=1)
    assert [(s.claim_id, s.cause, s.source_event_id, bounds(s)) for s in scores] == [
        ("a", "self", "ev-2", CONTRADICTED),
        ("b", "a", "ev-2", CONTRADICTED),
    ]


def test_support_boosts_only_the_target() -> None:
    g = Graph()
    g.arrive(define("t"))
    scores = g.arrive(define("s", ("supports", "t", 0.5)), minutes=1)
    assert [(s.claim_id, bounds(s)) for s in scores] == [("s", ALONE), ("t", SUPPORTED)]
    # And a claim that supports X is not re-scored when X changes.
    assert [s.claim_id for s in g.arrive(define("t", conf=0.9), minutes=2)] == ["t"]


def test_forward_support_is_in_the_targets_own_first_score() -> None:
    g = Graph()
    g.arrive(define("s", ("supports", "t", 0.5)))
    [t_score] = g.arrive(define("t"), minutes=1)  # the supporter's score does not depend on t
    assert (t_score.claim_id, bounds(t_score)) == ("t", SUPPORTED)


def test_pair_contradicting_each_other_counts_once_at_the_stronger_strength() -> None:
    g = Graph()
    g.arrive(define("a", ("contradicts", "b", 0.2)))
    scores = g.arrive(define("b", ("contradicts", "a", 0.5)), minutes=1)
    assert {s.claim_id: bounds(s) for s in scores} == {"a": CONTRADICTED, "b": CONTRADICTED}


def test_one_peer_declaring_several_contradictions_counts_once_at_the_strongest() -> None:
    g = Graph()
    g.arrive(define("a"))
    scores = g.arrive(define("b", ("contradicts", "a", 0.2), ("contradicts", "a", 0.5)), minutes=1)
    assert {s.claim_id: bounds(s) for s in scores} == {"a": CONTRADICTED, "b": CONTRADICTED}


def test_one_peer_declaring_several_supports_counts_each() -> None:
    g = Graph()
    g.arrive(define("t"))
    scores = g.arrive(define("s", ("supports", "t", 0.5), ("supports", "t", 0.5)), minutes=1)
    # Each edge adds 0.8 x 0.5 x 0.1 to the boost: 1.08 for two (one edge gives SUPPORTED's 1.04).
    assert {s.claim_id: bounds(s) for s in scores} == {"s": ALONE, "t": (0.533333333, round(0.8 * 1.08, 9))}


def test_replacement_dropping_a_contradiction_re_scores_and_restores_the_old_target() -> None:
    g = Graph()
    g.arrive(define("a"))
    g.arrive(define("b", ("contradicts", "a", 0.5)))
    scores = g.arrive(define("b"), minutes=1)
    assert [(s.claim_id, s.cause, bounds(s)) for s in scores] == [("b", "self", ALONE), ("a", "b", ALONE)]


def test_derived_claim_follows_its_constituent_transitively() -> None:
    g = Graph()
    g.arrive(define("c"))
    g.arrive(define("d", derived_from=("c",)))
    g.arrive(define("e", derived_from=("d",)))
    scores = g.arrive(define("x", ("contradicts", "c", 0.5)), minutes=1)
    # x's input re-scores c (contradicted), d (derived from c) and e (derived from d), all as of x.
    assert [(s.claim_id, s.cause) for s in scores] == [("x", "self"), ("c", "x"), ("d", "x"), ("e", "x")]
    by_id = {s.claim_id: s for s in scores}
    # Derived rule with one constituent: the constituent's interval (width kept).
    assert bounds(by_id["d"]) == bounds(by_id["c"]) == bounds(by_id["e"]) == CONTRADICTED


@pytest.mark.parametrize("kind", ["supports", "contradicts"])
def test_an_edge_to_a_derived_claim_re_scores_nothing_but_its_source(kind: str) -> None:
    """The derived rule replaces steps 1-4 (DESIGN 4b): it reads no edges, so x's edge to d changes
    neither d nor e derived from d. Both were emitted again, unchanged, with cause x (review)."""
    g = Graph()
    g.arrive(define("c"))
    g.arrive(define("d", derived_from=("c",)))
    g.arrive(define("e", derived_from=("d",)))
    assert [s.claim_id for s in g.arrive(define("x", (kind, "d", 0.9)), minutes=1)] == ["x"]
    # A claim d derives from is no derived claim: x's edge to c re-scores c, d and e.
    scores = g.arrive(define("y", (kind, "c", 0.9)), minutes=2)
    assert [s.claim_id for s in scores] == ["y", "c", "d", "e"]


def test_self_relationships_and_self_derivation_are_ignored() -> None:
    [score] = Graph().arrive(
        define("a", ("contradicts", "a", 0.9), ("supports", "a", 0.9), derived_from=("a",))
    )
    assert bounds(score) == ALONE


def test_derived_cycle_terminates_and_is_deterministic() -> None:
    g = Graph()
    g.arrive(define("p", derived_from=("q",)))
    first = g.arrive(define("q", derived_from=("p",), conf=0.6), minutes=1)
    assert [s.claim_id for s in first] == ["q", "p"]
    again = Graph()
    again.arrive(define("p", derived_from=("q",)))
    assert [bounds(s) for s in again.arrive(define("q", derived_from=("p",), conf=0.6), minutes=1)] == [
        bounds(s) for s in first
    ]


def test_densely_cyclic_derivations_are_refused_instead_of_stalling() -> None:
    """Nine claims each derived from all the others took 10 s for the last one (a cut cycle's result
    is not memoised, so every simple path was walked): refused within the step budget instead."""
    g = Graph()
    ids = [f"c{i}" for i in range(9)]
    # The step budget, not a clock, stops it ("steps" in the refusal); pytest's timeout catches a stall.
    with pytest.raises(GraphTooComplex, match="steps"):
        for i, claim_id in enumerate(ids):
            g.arrive(define(claim_id, derived_from=tuple(c for c in ids if c != claim_id)), minutes=i)
    assert len(g.nodes) >= 5  # the first ones were scored


def test_a_derived_chain_deeper_than_the_bound_is_refused_not_a_recursion_error() -> None:
    """A chain of ~1,000 derived claims passed Python's recursion limit (dead-lettered as a
    processing error); past MAX_DERIVED_DEPTH links the new claim is refused with a clear error."""
    g = Graph()
    g.arrive(define("d0"))
    for i in range(1, MAX_DERIVED_DEPTH + 1):  # each new link walks the chain below it
        g.arrive(define(f"d{i}", derived_from=(f"d{i - 1}",)), minutes=i)
    with pytest.raises(GraphTooComplex, match="deeper"):
        g.arrive(define("too-deep", derived_from=(f"d{MAX_DERIVED_DEPTH}",)), minutes=10_000)


def test_redelivery_re_emits_only_the_own_score_and_changes_nothing() -> None:
    g = Graph()
    g.arrive(define("a"))
    first = g.arrive(define("b", ("contradicts", "a", 0.5)), event_id="e-b")
    before = dict(g.nodes)
    g.arrive(define("c", ("supports", "b", 0.5)))  # the graph moves on meanwhile
    before_redelivery = dict(g.nodes)
    update = apply_claim(
        g.nodes.get,
        ClaimArrived(definition=define("b", ("contradicts", "a", 0.5)), source_event_id="e-b", event_time=T0),
        CFG,
    )
    assert update.nodes == {}
    assert update.scores == (first[0],)
    assert g.nodes == before_redelivery != before


def test_a_marked_redelivery_the_claim_remembers_re_emits_its_own_score() -> None:
    """Review (thirtieth round, mutations): stage 1 marks every re-delivered CLAIM (`redelivered`); one
    its claim still remembers re-emits the remembered score (DESIGN 4b), only a forgotten one emits
    nothing. No test passed the mark with a remembered input."""
    g = Graph()
    g.arrive(define("a"))
    first = g.arrive(define("b", ("contradicts", "a", 0.5)), event_id="e-b")
    before = dict(g.nodes)
    again = ClaimArrived(
        definition=define("b", ("contradicts", "a", 0.5)), source_event_id="e-b", event_time=T0
    )
    update = apply_claim(g.nodes.get, again, CFG, redelivered=True)
    assert (update.scores, update.nodes) == ((first[0],), {})
    forgotten = again.model_copy(update={"source_event_id": "e-forgotten"})
    assert apply_claim(g.nodes.get, forgotten, CFG, redelivered=True) == ClaimUpdate()
    assert g.nodes == before


def test_unknown_constituents_are_skipped_and_none_known_uses_the_normal_formula() -> None:
    g = Graph()
    [score] = g.arrive(define("d", derived_from=("missing",)))
    assert bounds(score) == ALONE and not score.interval.factors.derived


def test_stub_ages_with_the_event_time_it_hears() -> None:
    g = Graph()
    g.arrive(define("b", ("contradicts", "never", 0.5)), minutes=30)
    stub = g.nodes["never"]
    assert stub.definition is None and stub.incoming == {"b": (("contradicts", 0.5),)}
    assert stub.last_event_time == T0 + timedelta(minutes=30)


def test_view_interval_uses_the_given_time() -> None:
    g = Graph()
    g.arrive(define("a", staleness_at=T0))
    later = interval_of(g.nodes.get, "a", T0 + timedelta(days=3), CFG)  # one task half-life
    assert round(later.upper, 9) == 0.4 and round(later.factors.staleness, 9) == 0.5


# --- Property: streaming equals a from-scratch recomputation after every input -----------------------


def from_scratch(definitions: dict[str, ClaimDefinition]) -> dict[str, ClaimNode]:
    """The nodes built directly from the latest definitions (no incremental reverse-index upkeep)."""
    nodes: dict[str, dict[str, Any]] = {}

    def node(cid: str) -> dict[str, Any]:
        return nodes.setdefault(cid, {"definition": None, "incoming": {}, "derived_by": set()})

    for cid, d in definitions.items():
        node(cid)["definition"] = d
        for r in d.relationships:
            if r.target != cid:
                edges = node(r.target)["incoming"].setdefault(cid, [])
                edges.append((r.type, r.strength))
        for c in set(d.derived_from) - {cid}:
            node(c)["derived_by"].add(cid)
    return {
        cid: ClaimNode(
            definition=n["definition"],
            incoming={k: tuple(v) for k, v in n["incoming"].items()},
            derived_by=tuple(sorted(n["derived_by"])),
        )
        for cid, n in nodes.items()
    }


IDS = ["a", "b", "c", "d", "e"]
relationship = st.tuples(
    st.sampled_from(["supports", "contradicts"]), st.sampled_from(IDS), st.sampled_from([0.3, 0.5, 0.9])
)
definition = st.builds(
    lambda cid, rels, conf, derived, stale: define(
        cid,
        *rels,
        conf=conf,
        derived_from=tuple(derived),
        staleness_at=T0 if stale else None,
    ),
    st.sampled_from(IDS),
    st.lists(relationship, max_size=3),
    st.sampled_from([0.5, 0.7, 0.9]),
    st.lists(st.sampled_from(IDS), max_size=2),
    st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(definition, min_size=1, max_size=12))
def test_streaming_equals_from_scratch_after_every_input(stream: list[ClaimDefinition]) -> None:
    g = Graph()
    definitions: dict[str, ClaimDefinition] = {}
    for minutes, d in enumerate(stream):
        as_of = T0 + timedelta(days=minutes)  # days: staleness changes between inputs
        before = from_scratch(definitions)
        definitions[d.claim_id] = d
        after = from_scratch(definitions)
        scores = g.arrive(d, minutes=minutes * 24 * 60)
        emitted = {s.claim_id: bounds(s) for s in scores}
        assert len(emitted) == len(scores), "one CLAIM_SCORED per affected claim"
        assert scores[0].claim_id == d.claim_id and scores[0].cause == "self"
        for cid, node in after.items():
            if node.definition is None:
                assert cid not in emitted
                continue
            expected = interval_of(after.get, cid, as_of, CFG)
            if cid in emitted:
                assert emitted[cid] == (round(expected.lower, 9), round(expected.upper, 9))
            else:
                # Not emitted: then this input did not change it (same value over the old graph).
                old = interval_of(before.get, cid, as_of, CFG)
                assert (round(old.lower, 12), round(old.upper, 12)) == (
                    round(expected.lower, 12),
                    round(expected.upper, 12),
                ), f"{cid} changed by {d.claim_id} but was not re-scored"
        # The incremental reverse index equals the one built from scratch.
        for cid, node in after.items():
            mine = g.nodes.get(cid, ClaimNode())
            assert (mine.definition, mine.incoming, mine.derived_by) == (
                node.definition,
                node.incoming,
                node.derived_by,
            )
