"""The per-claim actor: graph behaviour emerging from per-key processing and messages between keys."""

from __future__ import annotations

from collections import deque
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.scoring.claim_graph import (
    ClaimArrived,
    ClaimDefinition,
    ClaimScore,
    ClaimState,
    Relationship,
    handle,
    interval_at,
)
from streams.scoring.claims import ClaimsConfig, Provenance, aggregate, effective_interval

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
    """Per-key states and per-key FIFO queues: a stand-in for the claims topic and its consumers."""

    def __init__(self) -> None:
        self.states: dict[str, ClaimState] = {}
        self.queues: dict[str, deque[Any]] = {}
        self.emitted: list[ClaimScore] = []
        self.n = 0

    def arrive(self, definition: ClaimDefinition, minutes: float = 0, event_id: str | None = None) -> str:
        self.n += 1
        event_id = event_id or f"ev-{self.n}"
        self.send(
            definition.claim_id,
            ClaimArrived(
                definition=definition, source_event_id=event_id, event_time=T0 + timedelta(minutes=minutes)
            ),
        )
        return event_id

    def send(self, key: str, message: Any) -> None:
        self.queues.setdefault(key, deque()).append(message)

    def step(self, key: str) -> None:
        message = self.queues[key].popleft()
        state, out = handle(self.states.get(key), key, message, CFG)
        self.states[key] = state
        self.emitted.extend(out.scores)
        for recipient, update in out.messages:
            self.send(recipient, update)

    def run(self, choose: Any = None, limit: int = 10_000) -> None:
        for _ in range(limit):
            ready = sorted(k for k, q in self.queues.items() if q)
            if not ready:
                return
            self.step(choose(ready) if choose else ready[0])
        raise AssertionError("messages never settled")

    def interval(self, claim_id: str) -> tuple[float, float]:
        last = self.states[claim_id].last_interval
        assert last is not None
        return round(last.lower, 6), round(last.upper, 6)

    def scores_of(self, claim_id: str) -> list[ClaimScore]:
        return [s for s in self.emitted if s.claim_id == claim_id]


def test_one_source_and_three_types() -> None:
    g = Graph()
    g.arrive(define("a"))
    g.arrive(define("b", conf=0.7, types=("extraction", "agent", "user")))
    g.run()
    assert g.interval("a") == (round(0.8 * 2 / 3, 6), 0.8)
    assert g.interval("b") == (0.7, 0.973)
    assert [s.cause for s in g.emitted] == ["self", "self"]


def test_later_contradiction_re_emits_the_first_claim_lower() -> None:
    g = Graph()
    g.arrive(define("a"))
    g.run()
    event = g.arrive(define("x", ("contradicts", "a", 1.0)), minutes=5)
    g.run()
    rescored = [s for s in g.scores_of("a") if s.source_event_id == event]
    assert len(rescored) == 1 and rescored[0].cause == "x" and rescored[0].contradicted
    assert rescored[0].as_of == T0 + timedelta(minutes=5) and rescored[0].trace_id == "trace-a"
    assert g.interval("a") == (round(0.8 * 2 / 3 * 0.84, 6), round(0.8 * 0.84, 6))
    assert g.interval("x") == g.interval("a")  # the penalty is symmetric
    assert [s.cause for s in g.scores_of("x")] == ["self", "a"]


def test_support_boosts_only_the_target() -> None:
    g = Graph()
    g.arrive(define("t"))
    g.arrive(define("s", ("supports", "t", 0.5)))
    g.run()
    assert g.interval("t") == (round(0.8 * 2 / 3, 6), round(0.8 * 1.04, 6))
    assert g.interval("s") == (round(0.8 * 2 / 3, 6), 0.8)


def test_unknown_target_is_ignored_until_it_arrives() -> None:
    g = Graph()
    g.arrive(define("x", ("contradicts", "later", 0.5)))
    g.run()
    assert g.interval("x") == (round(0.8 * 2 / 3, 6), 0.8)
    event = g.arrive(define("later"), minutes=1)
    g.run()
    assert g.interval("later") == g.interval("x") == (round(0.8 * 2 / 3 * 0.92, 6), round(0.8 * 0.92, 6))
    assert [s.cause for s in g.scores_of("x") if s.source_event_id == event] == ["later"]


def test_replacement_dropping_a_contradiction_restores_the_target() -> None:
    g = Graph()
    g.arrive(define("a"))
    g.arrive(define("x", ("contradicts", "a", 1.0)))
    g.run()
    g.arrive(define("x"), minutes=2)  # same claim id, no relationship any more
    g.run()
    assert g.interval("a") == (round(0.8 * 2 / 3, 6), 0.8)
    assert g.interval("x") == (round(0.8 * 2 / 3, 6), 0.8)


def test_derived_claim_follows_its_constituent_transitively() -> None:
    g = Graph()
    g.arrive(define("c1", conf=0.7, types=("a", "b", "c")))
    g.arrive(define("c2"))
    g.run()
    g.arrive(define("d", derived_from=("c1", "c2"), assessed_upper=0.9))
    g.run()
    assert g.interval("d") == (round(0.8 * 2 / 3, 6), 0.9)
    event = g.arrive(define("x", ("contradicts", "c2", 1.0)), minutes=3)
    g.run()
    assert any(s.cause == "c2" and s.source_event_id == event for s in g.scores_of("d"))
    lower_c2 = round(0.8 * 2 / 3 * 0.84, 6)
    assert g.interval("d") == (lower_c2, 0.9)  # min lower follows c2's penalised interval
    assert g.states["d"].last_interval.factors.derived  # type: ignore[union-attr]


def test_redelivery_re_emits_the_remembered_score_and_changes_nothing() -> None:
    g = Graph()
    event = g.arrive(define("a"))
    g.arrive(define("x", ("contradicts", "a", 1.0)))
    g.run()
    before = dict(g.states)
    emitted = len(g.emitted)
    g.arrive(define("a"), event_id=event)
    g.run()
    assert g.states == before
    assert g.emitted[emitted:] == [next(s for s in g.emitted if s.source_event_id == event)]


def test_state_round_trips_and_view_uses_given_time() -> None:
    g = Graph()
    g.arrive(define("a", staleness_at=T0, tier="ephemeral"))
    g.run()
    state = g.states["a"]
    assert ClaimState.model_validate_json(state.model_dump_json()) == state
    assert interval_at(state, T0 + timedelta(hours=4), CFG).upper == pytest.approx(0.4)


def _direct(definitions: list[ClaimDefinition]) -> dict[str, tuple[float, float]]:
    """Whole-graph computation: every relationship between known claims, no messages."""
    known = {d.claim_id: d for d in definitions}
    result = {}
    for d in definitions:
        lo, up, div = aggregate(d.provenance, CFG)
        supports = [
            (aggregate(o.provenance, CFG)[1], r.strength)
            for o in definitions
            for r in o.relationships
            if r.type == "supports" and r.target == d.claim_id and o.claim_id != d.claim_id
        ]
        contradictions = []
        for other in known:
            if other == d.claim_id:
                continue
            strengths = [
                r.strength
                for r in known[other].relationships
                if r.type == "contradicts" and r.target == d.claim_id
            ]
            strengths += [
                r.strength for r in d.relationships if r.type == "contradicts" and r.target == other
            ]
            if strengths:
                contradictions.append((aggregate(known[other].provenance, CFG)[1], max(strengths)))
        i = effective_interval(lo, up, div, 1.0, supports, contradictions, 1.0, CFG)
        result[d.claim_id] = (round(i.lower, 6), round(i.upper, 6))
    return result


ids = ["a", "b", "c", "d", "e"]
relationship = st.tuples(
    st.sampled_from(["supports", "contradicts"]),
    st.sampled_from([*ids, "ghost"]),
    st.sampled_from([0.2, 0.5, 1.0]),
)
claim = st.builds(
    lambda cid, rels, conf: define(cid, *rels, conf=conf),
    st.sampled_from(ids),
    st.lists(relationship, max_size=3),
    st.sampled_from([0.4, 0.7, 0.9]),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(claim, min_size=1, max_size=6, unique_by=lambda d: d.claim_id), st.randoms())
def test_any_delivery_order_converges_to_the_whole_graph_result(
    defs: list[ClaimDefinition], rnd: Any
) -> None:
    g = Graph()
    for d in defs:
        g.arrive(d)
    g.run(choose=rnd.choice)
    direct = _direct(defs)
    assert {d.claim_id: g.interval(d.claim_id) for d in defs} == direct


def test_stub_for_a_target_that_never_arrives_ages_and_expires() -> None:
    from prometheus_client import CollectorRegistry

    from streams import metrics
    from streams.config import load_settings, scoring_configs
    from streams.stages import ClaimStage

    g = Graph()
    g.arrive(define("x", ("contradicts", "never", 0.5)), minutes=5)
    g.run()
    stub = g.states["never"]
    assert stub.definition is None and stub.last_event_time == T0 + timedelta(minutes=5)

    settings = load_settings()
    stage = ClaimStage(settings, scoring_configs(settings), metrics.create(CollectorRegistry(), 10))
    stage.newest_event_time = T0 + timedelta(days=settings.claim_ttl_days - 1)
    assert not stage.expired(stub)
    stage.newest_event_time = T0 + timedelta(days=settings.claim_ttl_days + 1)
    assert stage.expired(stub)
