"""The claim graph of one tenant: a CLAIM input becomes exactly one interval per affected claim.

The service processes a tenant's claims in sequence (DESIGN 4b "Streaming"), so this module is a pure
function from (the graph as it is, one arriving claim X) to the new per-claim nodes and the scores to
emit. Each claim's node holds its definition and the reverse index the graph needs: which claims
declare an edge towards it (`incoming`) and which claims are derived from it (`derived_by`). Edges
towards claims that have not arrived yet live in a node without a definition (a stub), so the
target's arrival finds them.

Cost follows the work: `apply_claim` loads X, the claims X's old and new versions point at, the
claims that point at X, the derived-claim closure and the neighbours of those claims it re-scores;
it never scans the tenant.

Who depends on whom (seed 002 with DESIGN 4b):
- "Z supports T": T's score uses Z's stale (steps 1-2) upper.
- "Z contradicts T": both scores use the other's stale upper (one penalty per pair, the stronger).
- "D derived from C": D's score uses C's effective interval, so D follows C transitively.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from streams.scoring.claims import (
    ClaimInterval,
    ClaimsConfig,
    Provenance,
    Tier,
    aggregate,
    derived_interval,
    effective_interval,
    staleness_factor,
)
from streams.scoring.times import StdDatetime

__all__ = [
    "SELF",
    "ClaimArrived",
    "ClaimDefinition",
    "ClaimNode",
    "ClaimScore",
    "ClaimUpdate",
    "Edge",
    "FactsLoader",
    "GraphTooComplex",
    "Loader",
    "NeighbourFacts",
    "Relationship",
    "apply_claim",
    "interval_of",
    "neighbour_facts",
    "sweepable",
    "without_expired",
]

SELF = "self"
EdgeKind = Literal["supports", "contradicts"]
Edge = tuple[EdgeKind, float]


class Relationship(BaseModel):
    """'This claim supports / contradicts `target`'."""

    model_config = ConfigDict(frozen=True)
    type: EdgeKind
    target: str
    strength: float


class ClaimDefinition(BaseModel):
    """A claim as its input defined it."""

    model_config = ConfigDict(frozen=True)
    claim_id: str
    trace_id: str
    statement: str
    source_id: str | None = None
    provenance: tuple[Provenance, ...] = ()
    tier: Tier
    staleness_at: StdDatetime | None = None
    relationships: tuple[Relationship, ...] = ()
    derived_from: tuple[str, ...] = ()
    assessed_upper: float | None = None
    instance_trust: float = 1.0
    agent_type: str | None = Field(None, description="Of the agent that made the claim (calibration groups).")


class ClaimScore(BaseModel):
    """One CLAIM_SCORED to emit."""

    model_config = ConfigDict(frozen=True)
    claim_id: str
    trace_id: str
    interval: ClaimInterval
    source_event_id: str
    as_of: StdDatetime
    cause: str
    contradicted: bool
    agent_type: str | None = None


class ClaimNode(BaseModel):
    """One (tenant, claim) key: the claim (None until it arrives) and the edges that point at it."""

    model_config = ConfigDict(frozen=True)
    definition: ClaimDefinition | None = None
    incoming: dict[str, tuple[Edge, ...]] = {}  # claim id -> its supports/contradicts edges towards me
    derived_by: tuple[str, ...] = ()  # sorted ids of the claims derived from me
    last_event_time: StdDatetime | None = None
    applied: dict[str, ClaimScore] = {}  # my own input event ids -> my CLAIM_SCORED, for re-delivery


class ClaimArrived(BaseModel):
    """A claim's own input."""

    model_config = ConfigDict(frozen=True)
    definition: ClaimDefinition
    source_event_id: str
    event_time: StdDatetime


class ClaimUpdate(BaseModel):
    """What one CLAIM input did: the nodes to write and the scores to emit (X's own first)."""

    model_config = ConfigDict(frozen=True)
    nodes: dict[str, ClaimNode] = {}
    scores: tuple[ClaimScore, ...] = ()


class NeighbourFacts(NamedTuple):
    """What a neighbour's score takes from a claim: the inputs of its steps 1-2 upper bound."""

    aggregate_upper: float
    staleness_at: datetime | None
    tier: Tier


def neighbour_facts(node: ClaimNode | None, cfg: ClaimsConfig) -> NeighbourFacts | None:
    """The claim's `NeighbourFacts`; None for a claim that has not arrived (it counts for no one)."""
    if node is None or node.definition is None:
        return None
    definition = node.definition
    return NeighbourFacts(aggregate(definition.provenance, cfg)[1], definition.staleness_at, definition.tier)


Loader = Callable[[str], ClaimNode | None]
# Must answer what `neighbour_facts(load(claim_id))` would: a caller may keep these for far more claims
# than whole nodes, because a claim's score reads every claim that supports or contradicts it.
FactsLoader = Callable[[str], NeighbourFacts | None]


class _Graph:
    """The nodes this input reads and writes: loaded once each, changed copies kept apart."""

    def __init__(self, load: Loader, cfg: ClaimsConfig, facts: FactsLoader | None = None) -> None:
        self._load = load
        self._cfg = cfg
        self._facts = facts
        self._seen: dict[str, ClaimNode | None] = {}
        self.changed: dict[str, ClaimNode] = {}

    def get(self, claim_id: str) -> ClaimNode | None:
        if claim_id in self.changed:
            return self.changed[claim_id]
        if claim_id not in self._seen:
            self._seen[claim_id] = self._load(claim_id)
        return self._seen[claim_id]

    def definition(self, claim_id: str) -> ClaimDefinition | None:
        node = self.get(claim_id)
        return None if node is None else node.definition

    def put(self, claim_id: str, node: ClaimNode) -> None:
        self.changed[claim_id] = node

    def facts(self, claim_id: str) -> NeighbourFacts | None:
        """A neighbour's facts, from its node when this input holds it, else from the facts loader."""
        if self._facts is None or claim_id in self.changed or claim_id in self._seen:
            return neighbour_facts(self.get(claim_id), self._cfg)
        return self._facts(claim_id)


def _edges_by_target(definition: ClaimDefinition | None) -> dict[str, tuple[Edge, ...]]:
    if definition is None:
        return {}
    edges: dict[str, list[Edge]] = {}
    for r in definition.relationships:
        if r.target != definition.claim_id:  # self-relationships are ignored (DESIGN 4b)
            edges.setdefault(r.target, []).append((r.type, r.strength))
    return {target: tuple(found) for target, found in edges.items()}


def _constituents(definition: ClaimDefinition | None) -> set[str]:
    if definition is None:
        return set()
    return set(definition.derived_from) - {definition.claim_id}


def _stale_upper(facts: NeighbourFacts, as_of: datetime, cfg: ClaimsConfig) -> float:
    """A neighbour's contribution: its steps 1-2 upper bound (also for a derived neighbour)."""
    return facts.aggregate_upper * staleness_factor(facts.staleness_at, as_of, facts.tier, cfg)


# Bounds on one input's walk through derived_from: a result that cut a cycle is not memoised, so
# densely cyclic claims cost exponential time (9 claims each derived from all others: 10 s), and a
# chain of ~1,000 derived claims passes Python's recursion limit. Past either bound the input is
# refused (`GraphTooComplex`) rather than stalling the worker.
MAX_DERIVED_DEPTH = 200
MAX_INTERVAL_STEPS = 5_000


class GraphTooComplex(ValueError):
    """Scoring a claim would walk derived_from deeper or longer than the bounds above."""


class _Budget:
    """The steps one input's interval computations may still take."""

    def __init__(self) -> None:
        self.left = MAX_INTERVAL_STEPS

    def take(self, depth: int) -> None:
        self.left -= 1
        if self.left < 0:
            raise GraphTooComplex(
                f"scoring took more than {MAX_INTERVAL_STEPS} steps through derived_from (cycles)"
            )
        if depth > MAX_DERIVED_DEPTH:
            raise GraphTooComplex(f"derived_from is nested deeper than {MAX_DERIVED_DEPTH} claims")


class _Cause(NamedTuple):
    """What one input changed: claim X, and the claims whose incoming edges X's old or new version holds."""

    claim_id: str
    edge_targets: frozenset[str]


def _interval(
    graph: _Graph,
    claim_id: str,
    as_of: datetime,
    cfg: ClaimsConfig,
    memo: dict[str, tuple[ClaimInterval, bool]],
    budget: _Budget,
    cause: _Cause | None = None,
    stack: tuple[str, ...] = (),
) -> tuple[ClaimInterval, bool, bool]:
    """The claim's interval, whether a derived_from cycle was cut on the way, and whether the
    computation read what `cause` changed (X's definition or facts, or an edge X holds).

    A constituent already being computed (a cycle) is skipped like an unknown one, so a result that
    cut a cycle depends on where the computation started and is not memoised; the rest is.
    """
    if claim_id in memo:
        interval, reads_cause = memo[claim_id]
        return interval, False, reads_cause
    budget.take(len(stack))
    node = graph.get(claim_id)
    assert node is not None and node.definition is not None
    definition = node.definition
    own = aggregate(definition.provenance, cfg)
    known = [c for c in sorted(_constituents(definition)) if graph.definition(c) is not None]
    cut = any(c in stack for c in known)
    reads_cause = cause is not None and claim_id == cause.claim_id
    constituents = []
    for c in known:
        if c not in stack:
            interval, cut_below, reads_below = _interval(
                graph, c, as_of, cfg, memo, budget, cause, (*stack, claim_id)
            )
            constituents.append(interval)
            cut = cut or cut_below
            reads_cause = reads_cause or reads_below
    if constituents:
        result = derived_interval([(i.lower, i.upper) for i in constituents], definition.assessed_upper, own)
    else:
        supports: list[tuple[str, float]] = []  # every support edge counts
        strongest: dict[str, float] = {}  # one contradiction per pair, the stronger declared strength
        for peer, edges in node.incoming.items():
            for kind, strength in edges:
                if kind == "supports":
                    supports.append((peer, strength))
                else:
                    strongest[peer] = max(strength, strongest.get(peer, 0.0))
        for target, edges in _edges_by_target(definition).items():
            for kind, strength in edges:
                if kind == "contradicts":
                    strongest[target] = max(strength, strongest.get(target, 0.0))

        def upper_of(peer: str) -> float | None:
            facts = graph.facts(peer)
            return None if facts is None else _stale_upper(facts, as_of, cfg)

        # Sorted by peer id, so the sums add up in the same order on every run.
        support_terms = [
            (upper, strength) for peer, strength in sorted(supports) if (upper := upper_of(peer)) is not None
        ]
        contradiction_terms = [
            (upper, strength)
            for peer, strength in sorted(strongest.items())
            if (upper := upper_of(peer)) is not None
        ]
        if cause is not None:  # the normal formula reads its edges and its peers' facts
            peers = {peer for peer, _ in supports} | strongest.keys()
            reads_cause = reads_cause or claim_id in cause.edge_targets or cause.claim_id in peers
        staleness = staleness_factor(definition.staleness_at, as_of, definition.tier, cfg)
        result = effective_interval(
            own[0],
            own[1],
            own[2],
            staleness,
            support_terms,
            contradiction_terms,
            definition.instance_trust,
            cfg,
        )
    if not cut:
        memo[claim_id] = (result, reads_cause)
    return result, cut, reads_cause


def interval_of(
    load: Loader, claim_id: str, as_of: datetime, cfg: ClaimsConfig, facts: FactsLoader | None = None
) -> ClaimInterval:
    """The claim's interval at `as_of` over the graph `load` reads (the HTTP view uses the wall clock)."""
    graph = _Graph(load, cfg, facts)
    if graph.definition(claim_id) is None:
        raise KeyError(claim_id)
    return _interval(graph, claim_id, as_of, cfg, {}, _Budget())[0]


def _touch(node: ClaimNode | None, when: datetime) -> ClaimNode:
    node = node if node is not None else ClaimNode()
    newest = when if node.last_event_time is None else max(node.last_event_time, when)
    return node.model_copy(update={"last_event_time": newest})


def _reindex(graph: _Graph, old: ClaimDefinition | None, new: ClaimDefinition, when: datetime) -> None:
    """Point the reverse index of every old and new neighbour at X's new version, and keep the nodes X
    points at alive as long as X (touched at `when`).

    A neighbour's node holds X's edge towards it (or X in its `derived_by`). Refreshed only when the
    edge changed, a neighbour (a stub, or a claim not re-sent) expired while X, re-sent with the same
    edges, lived on: the edge was lost with it, so a target that arrived later took no support from X
    and a contradiction became one-sided. Now X's every version touches the nodes it points at (a node
    already touched at `when` or later is left alone), and puts back an edge an expired node lost.
    """
    me = new.claim_id
    old_edges, new_edges = _edges_by_target(old), _edges_by_target(new)
    for target in sorted(old_edges.keys() | new_edges.keys()):
        stored = graph.get(target)
        if target in new_edges:
            if stored is not None and stored.incoming.get(me) == new_edges[target] and _fresh(stored, when):
                continue
        elif stored is None or me not in stored.incoming:
            continue
        node = _touch(stored, when)
        incoming = {k: v for k, v in node.incoming.items() if k != me}
        if target in new_edges:
            incoming[me] = new_edges[target]
        graph.put(target, node.model_copy(update={"incoming": incoming}))
    new_parts = _constituents(new)
    for part in sorted(_constituents(old) | new_parts):
        stored = graph.get(part)
        listed = stored is not None and me in stored.derived_by
        if (part in new_parts and listed and _fresh(stored, when)) or (part not in new_parts and not listed):
            continue
        node = _touch(stored, when)
        derived_by = set(node.derived_by) - {me}
        if part in new_parts:
            derived_by.add(me)
        graph.put(part, node.model_copy(update={"derived_by": tuple(sorted(derived_by))}))


def _fresh(node: ClaimNode | None, when: datetime) -> bool:
    """The node was touched at `when` or later: it lives at least as long as a node touched at `when`."""
    return node is not None and node.last_event_time is not None and node.last_event_time >= when


def _affected(graph: _Graph, old: ClaimDefinition | None, new: ClaimDefinition) -> list[str]:
    """X, every claim whose score may use X (old or new version), and the derived closure of them all:
    the candidates, of which only those whose computation reads X are emitted (`apply_claim`)."""
    me = new.claim_id
    node = graph.get(me)
    assert node is not None
    direct = {me} | _edges_by_target(old).keys() | _edges_by_target(new).keys()
    direct |= {peer for peer, edges in node.incoming.items() if any(k == "contradicts" for k, _ in edges)}
    seen: set[str] = set()
    frontier = sorted(direct)
    while frontier:
        claim_id = frontier.pop()
        if claim_id in seen:
            continue
        seen.add(claim_id)
        current = graph.get(claim_id)
        if current is not None:
            frontier.extend(d for d in current.derived_by if d not in seen)
    # X first, then the others in id order; claims that have not arrived are not scored.
    others = sorted(c for c in seen - {me} if graph.definition(c) is not None)
    return [me, *others]


def sweepable(candidates: Mapping[str, ClaimNode], exists: Callable[[str], bool]) -> set[str]:
    """The `candidates` (a tenant's claims past their TTL) that may be deleted: those no live claim
    points at, directly or through other candidates.

    A claim's edges live in its targets' nodes, and a version touches only the claims it names, so a
    claim kept alive by being pointed at (touched by its supporter's versions, never re-sent itself)
    does not touch its own targets: deleting those lost its edge, and a contradiction became one-sided
    (found by review). A candidate pointed at by a claim that `exists` and is not a candidate is kept,
    and so is every candidate a kept one points at; a cycle of candidates nobody live points at goes.
    """
    kept_by: dict[str, list[str]] = {}  # candidate -> the candidates it points at
    keep: list[str] = []
    for me in sorted(candidates):
        node = candidates[me]
        for peer in sorted(node.incoming.keys() | set(node.derived_by)):
            if peer == me:
                continue
            if peer in candidates:
                kept_by.setdefault(peer, []).append(me)
            elif exists(peer):
                keep.append(me)
    kept: set[str] = set()
    while keep:
        me = keep.pop()
        if me not in kept:
            kept.add(me)
            keep.extend(kept_by.get(me, ()))
    return set(candidates) - kept


def without_expired(load: Loader, expired: Mapping[str, ClaimNode]) -> dict[str, ClaimNode]:
    """The nodes that still hold an edge or a `derived_by` entry of an `expired` claim, without it.

    The reverse index is kept only while its claim lives: left behind, an expired claim's entries counted
    against its targets' CLAIM_NODE_MAX_BYTES for ever, and a new claim of the same id that declared no
    such edge still boosted or penalised them (`_reindex` sees no old version to take the edge back from).
    A deleted claim counts for no one (`neighbour_facts` of a missing node is None), so taking its
    entries out changes no later score by itself: it keeps the index true for a claim of the same id.
    """
    changed: dict[str, ClaimNode] = {}
    for me in sorted(expired):
        definition = expired[me].definition
        for target in sorted(_edges_by_target(definition).keys() | _constituents(definition)):
            if target in expired:
                continue  # deleted with it
            node = changed[target] if target in changed else load(target)
            if node is None:
                continue
            incoming = {peer: edges for peer, edges in node.incoming.items() if peer != me}
            derived_by = tuple(d for d in node.derived_by if d != me)
            if len(incoming) != len(node.incoming) or derived_by != node.derived_by:
                changed[target] = node.model_copy(update={"incoming": incoming, "derived_by": derived_by})
    return changed


def _bounded(items: dict[str, ClaimScore], limit: int) -> dict[str, ClaimScore]:
    return items if len(items) <= limit else dict(list(items.items())[-limit:])


def apply_claim(
    load: Loader,
    arrived: ClaimArrived,
    cfg: ClaimsConfig,
    facts: FactsLoader | None = None,
    touched_at: datetime | None = None,
    redelivered: bool = False,
) -> ClaimUpdate:
    """Apply claim X to the graph: X's interval and every dependent's, all as of X's event time.

    A re-delivered input (its event id already applied to X) returns X's remembered score and no
    node changes (DESIGN 4b: a re-delivered CLAIM re-emits its own CLAIM_SCORED only). `facts`, if
    given, answers for neighbours this input does not otherwise load. `touched_at` (default: the
    event time) is what the nodes it changes count their expiry from. `redelivered`: the caller knows
    the input was applied before (stage 1 remembers every input of a live trace); if X no longer
    remembers its score (more than `max_remembered_events` later inputs, or X expired), nothing is
    emitted or changed: applying it again would put an old version of X back over newer ones.
    """
    graph = _Graph(load, cfg, facts)
    new = arrived.definition
    me, when = new.claim_id, arrived.event_time
    touched = when if touched_at is None else touched_at
    current = graph.get(me)
    if current is not None and arrived.source_event_id in current.applied:
        return ClaimUpdate(scores=(current.applied[arrived.source_event_id],))
    if redelivered:
        return ClaimUpdate()
    old = None if current is None else current.definition
    graph.put(me, _touch(current, touched).model_copy(update={"definition": new}))
    _reindex(graph, old, new, touched)

    memo: dict[str, tuple[ClaimInterval, bool]] = {}
    budget = _Budget()
    cause = _Cause(me, frozenset(_edges_by_target(old).keys() | _edges_by_target(new).keys()))
    scores = []
    for claim_id in _affected(graph, old, new):
        definition = graph.definition(claim_id)
        assert definition is not None
        interval, _, reads_cause = _interval(graph, claim_id, when, cfg, memo, budget, cause)
        if not reads_cause:
            # A candidate that does not read X: a derived claim X points at (the derived rule reads
            # no edges), or one derived from it. Its score did not change; DESIGN 4b emits nothing.
            continue
        scores.append(
            ClaimScore(
                claim_id=claim_id,
                trace_id=definition.trace_id,
                interval=interval,
                source_event_id=arrived.source_event_id,
                as_of=when,
                cause=SELF if claim_id == me else me,
                contradicted=interval.factors.contradiction_penalty < 1.0,
                agent_type=definition.agent_type,
            )
        )
    node = graph.get(me)
    assert node is not None
    applied = _bounded({**node.applied, arrived.source_event_id: scores[0]}, cfg.max_remembered_events)
    graph.put(me, node.model_copy(update={"applied": applied}))
    return ClaimUpdate(nodes=graph.changed, scores=tuple(scores))
