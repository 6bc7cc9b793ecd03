"""The claim graph as a per-claim actor: each claim key's owner holds only that key's state.

In the service, claims are repartitioned by (tenant, claim_id). `handle(state, claim_id, message)`
returns the new state, the CLAIM_SCOREDs to emit and the `PeerUpdate`s to send to other claim keys
(through the same topic). A claim tells a neighbour its snapshot (steps 1-2 inputs and its effective
interval) whenever the neighbour needs it:
- on arrival or replacement, to every old and new relationship target and derived-from constituent,
  and to known peers whose score uses it (they contradict it, or are derived from it);
- on request (`want_reply`, when the sender needs the recipient's data and does not have it yet);
- when its effective interval changes, to the claims derived from it (transitive; compared at 12
  decimals, so cycles end).
Unknown neighbours are ignored until they arrive; a message to an unknown claim leaves a stub that the
claim's arrival completes. An update that changes nothing emits and sends nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict

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

__all__ = [
    "ClaimArrived",
    "ClaimDefinition",
    "ClaimScore",
    "ClaimState",
    "HandleOutput",
    "PeerInfo",
    "PeerUpdate",
    "Relationship",
    "Snapshot",
    "handle",
    "interval_at",
]

SELF = "self"
Edge = tuple[str, float]


class Relationship(BaseModel):
    """'This claim supports / contradicts `target`'."""

    model_config = ConfigDict(frozen=True)
    type: Literal["supports", "contradicts"]
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
    staleness_at: datetime | None = None
    relationships: tuple[Relationship, ...] = ()
    derived_from: tuple[str, ...] = ()
    assessed_upper: float | None = None
    instance_trust: float = 1.0


class Snapshot(BaseModel):
    """What a claim tells its neighbours."""

    model_config = ConfigDict(frozen=True)
    aggregate_lower: float
    aggregate_upper: float
    staleness_at: datetime | None
    tier: Tier
    effective_lower: float
    effective_upper: float


class PeerInfo(BaseModel):
    """The latest snapshot of a neighbour and its edges towards this claim."""

    model_config = ConfigDict(frozen=True)
    snapshot: Snapshot
    edges_to_me: tuple[Edge, ...] = ()
    derives_from_me: bool = False


class ClaimScore(BaseModel):
    """One CLAIM_SCORED to emit."""

    model_config = ConfigDict(frozen=True)
    claim_id: str
    trace_id: str
    interval: ClaimInterval
    source_event_id: str
    as_of: datetime
    cause: str
    sequence: int = 0
    contradicted: bool


class ClaimState(BaseModel):
    """One claim key's state (definition None = a stub: neighbours spoke before the claim arrived)."""

    model_config = ConfigDict(frozen=True)
    definition: ClaimDefinition | None = None
    peers: dict[str, PeerInfo] = {}
    last_interval: ClaimInterval | None = None
    last_event_time: datetime | None = None
    applied: dict[str, ClaimScore] = {}
    emissions: dict[str, int] = {}  # (source event id, cause) -> scores emitted, for distinct output ids


class ClaimArrived(BaseModel):
    """A claim's own input."""

    model_config = ConfigDict(frozen=True)
    definition: ClaimDefinition
    source_event_id: str
    event_time: datetime


class PeerUpdate(BaseModel):
    """A neighbour's snapshot and its edges towards the recipient."""

    model_config = ConfigDict(frozen=True)
    sender: str
    snapshot: Snapshot
    edges_to_recipient: tuple[Edge, ...] = ()
    derives_from_recipient: bool = False
    want_reply: bool = False
    source_event_id: str
    event_time: datetime


class HandleOutput(BaseModel):
    """What one message produced."""

    model_config = ConfigDict(frozen=True)
    scores: tuple[ClaimScore, ...] = ()
    messages: tuple[tuple[str, PeerUpdate], ...] = ()


def _edges_to(definition: ClaimDefinition, target: str) -> tuple[Edge, ...]:
    if target == definition.claim_id:
        return ()
    return tuple((r.type, r.strength) for r in definition.relationships if r.target == target)


def _needs(definition: ClaimDefinition, other: str) -> bool:
    """Does this claim's score use `other`'s data?"""
    return other != definition.claim_id and (
        other in definition.derived_from
        or any(r.type == "contradicts" and r.target == other for r in definition.relationships)
    )


def _stale_upper(snapshot: Snapshot, as_of: datetime, cfg: ClaimsConfig) -> float:
    return snapshot.aggregate_upper * staleness_factor(snapshot.staleness_at, as_of, snapshot.tier, cfg)


def _compute(
    definition: ClaimDefinition, peers: dict[str, PeerInfo], as_of: datetime, cfg: ClaimsConfig
) -> ClaimInterval:
    own = aggregate(definition.provenance, cfg)
    me = definition.claim_id
    constituents = [
        (peers[c].snapshot.effective_lower, peers[c].snapshot.effective_upper)
        for c in dict.fromkeys(definition.derived_from)
        if c != me and c in peers
    ]
    if constituents:
        return derived_interval(constituents, definition.assessed_upper, own)
    supports: list[tuple[float, float]] = []
    contradictions: list[tuple[float, float]] = []
    for peer_id, info in sorted(peers.items()):
        if peer_id == me:
            continue
        upper = _stale_upper(info.snapshot, as_of, cfg)
        supports.extend((upper, s) for kind, s in info.edges_to_me if kind == "supports")
        strengths = [s for kind, s in info.edges_to_me if kind == "contradicts"]
        strengths += [
            r.strength for r in definition.relationships if r.type == "contradicts" and r.target == peer_id
        ]
        if strengths:
            contradictions.append((upper, max(strengths)))
    staleness = staleness_factor(definition.staleness_at, as_of, definition.tier, cfg)
    return effective_interval(
        own[0], own[1], own[2], staleness, supports, contradictions, definition.instance_trust, cfg
    )


def interval_at(state: ClaimState, as_of: datetime, cfg: ClaimsConfig) -> ClaimInterval:
    """The claim re-scored at `as_of` with the neighbours it knows (the HTTP view uses the wall clock)."""
    if state.definition is None:
        raise ValueError("claim has not arrived")
    return _compute(state.definition, state.peers, as_of, cfg)


def _snapshot(definition: ClaimDefinition, interval: ClaimInterval, cfg: ClaimsConfig) -> Snapshot:
    lower, upper, _ = aggregate(definition.provenance, cfg)
    return Snapshot(
        aggregate_lower=lower,
        aggregate_upper=upper,
        staleness_at=definition.staleness_at,
        tier=definition.tier,
        effective_lower=interval.lower,
        effective_upper=interval.upper,
    )


def _changed(a: ClaimInterval | None, b: ClaimInterval) -> bool:
    return a is None or round(a.lower, 12) != round(b.lower, 12) or round(a.upper, 12) != round(b.upper, 12)


V = TypeVar("V")


def _bounded(items: dict[str, V], limit: int) -> dict[str, V]:
    if len(items) <= limit:
        return items
    return dict(list(items.items())[-limit:])


def _score(
    state: ClaimState,
    interval: ClaimInterval,
    source_event_id: str,
    as_of: datetime,
    cause: str,
    cfg: ClaimsConfig,
) -> tuple[ClaimScore, dict[str, int]]:
    assert state.definition is not None
    slot = f"{source_event_id}\x1f{cause}"
    sequence = state.emissions.get(slot, 0)
    score = ClaimScore(
        claim_id=state.definition.claim_id,
        trace_id=state.definition.trace_id,
        interval=interval,
        source_event_id=source_event_id,
        as_of=as_of,
        cause=cause,
        sequence=sequence,
        contradicted=interval.factors.contradiction_penalty < 1.0,
    )
    emissions = {k: v for k, v in state.emissions.items() if k != slot}
    emissions[slot] = sequence + 1
    return score, _bounded(emissions, cfg.max_remembered_events)


def _update_for(
    definition: ClaimDefinition,
    snapshot: Snapshot,
    recipient: str,
    want_reply: bool,
    source: str,
    when: datetime,
) -> tuple[str, PeerUpdate]:
    return recipient, PeerUpdate(
        sender=definition.claim_id,
        snapshot=snapshot,
        edges_to_recipient=_edges_to(definition, recipient),
        derives_from_recipient=recipient in definition.derived_from,
        want_reply=want_reply,
        source_event_id=source,
        event_time=when,
    )


def _arrived(state: ClaimState, message: ClaimArrived, cfg: ClaimsConfig) -> tuple[ClaimState, HandleOutput]:
    remembered = state.applied.get(message.source_event_id)
    if remembered is not None:
        return state, HandleOutput(scores=(remembered,))
    old, new = state.definition, message.definition
    interval = _compute(new, state.peers, message.event_time, cfg)
    staged = state.model_copy(update={"definition": new})
    score, emissions = _score(staged, interval, message.source_event_id, message.event_time, SELF, cfg)
    snapshot = _snapshot(new, interval, cfg)
    me = new.claim_id
    recipients: set[str] = {r.target for r in new.relationships} | set(new.derived_from)
    if old is not None:
        recipients |= {r.target for r in old.relationships} | set(old.derived_from)
    recipients |= {
        peer
        for peer, info in state.peers.items()
        if info.derives_from_me or any(kind == "contradicts" for kind, _ in info.edges_to_me)
    }
    recipients.discard(me)
    messages = tuple(
        _update_for(
            new,
            snapshot,
            r,
            _needs(new, r) and r not in state.peers,
            message.source_event_id,
            message.event_time,
        )
        for r in sorted(recipients)
    )
    applied = _bounded({**state.applied, message.source_event_id: score}, cfg.max_remembered_events)
    new_state = staged.model_copy(
        update={
            "last_interval": interval,
            "last_event_time": message.event_time,
            "applied": applied,
            "emissions": emissions,
        }
    )
    return new_state, HandleOutput(scores=(score,), messages=messages)


def _peer(
    state: ClaimState, claim_id: str, message: PeerUpdate, cfg: ClaimsConfig
) -> tuple[ClaimState, HandleOutput]:
    sender = message.sender
    if sender == claim_id:
        return state, HandleOutput()
    old_info = state.peers.get(sender)
    info = PeerInfo(
        snapshot=message.snapshot,
        edges_to_me=message.edges_to_recipient,
        derives_from_me=message.derives_from_recipient,
    )
    peers = {**state.peers, sender: info}
    state = state.model_copy(update={"peers": peers})
    definition = state.definition
    if definition is None:
        # A stub still ages by the event time of what it heard, so a target that never arrives expires.
        heard_at = max(filter(None, (state.last_event_time, message.event_time)))
        return state.model_copy(update={"last_event_time": heard_at}), HandleOutput()
    scores: tuple[ClaimScore, ...] = ()
    messages: list[tuple[str, PeerUpdate]] = []
    interval = state.last_interval
    uses_sender = (
        bool(info.edges_to_me) or bool(old_info and old_info.edges_to_me) or _needs(definition, sender)
    )
    if info != old_info and uses_sender:
        interval = _compute(definition, peers, message.event_time, cfg)
        score, emissions = _score(state, interval, message.source_event_id, message.event_time, sender, cfg)
        scores = (score,)
        previous = state.last_interval
        state = state.model_copy(
            update={"last_interval": interval, "last_event_time": message.event_time, "emissions": emissions}
        )
        if _changed(previous, interval):
            snapshot = _snapshot(definition, interval, cfg)
            messages += [
                _update_for(definition, snapshot, peer, False, message.source_event_id, message.event_time)
                for peer, peer_info in sorted(peers.items())
                if peer_info.derives_from_me and peer != sender
            ]
    if message.want_reply and interval is not None:
        snapshot = _snapshot(definition, interval, cfg)
        messages.append(
            _update_for(definition, snapshot, sender, False, message.source_event_id, message.event_time)
        )
    return state, HandleOutput(scores=scores, messages=tuple(messages))


def handle(
    state: ClaimState | None, claim_id: str, message: ClaimArrived | PeerUpdate, cfg: ClaimsConfig
) -> tuple[ClaimState, HandleOutput]:
    """Apply one message to one claim key's state."""
    current = state if state is not None else ClaimState()
    if isinstance(message, ClaimArrived):
        return _arrived(current, message, cfg)
    return _peer(current, claim_id, message, cfg)
