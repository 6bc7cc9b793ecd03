"""CLAIM_NODE_MAX_BYTES: no claim's table record grows past it, whatever the batches, and a claim input
that would grow one goes to the DLQ with reason `claim_node_full` and changes no node (a changelog
record over the broker's limit would stop the worker on that tenant after every restart).

A claim's node keeps an entry per claim that supports, contradicts or derives from it, so a claim many
others point at is the one that grows."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from streams import metrics
from streams.config import load_settings, scoring_configs
from streams.decoded_states import ClaimFacts, DecodedStates
from streams.events import ClaimEvent
from streams.scoring.claim_graph import ClaimArrived, ClaimNode
from streams.stages import ClaimStage, InputRecord, Record
from streams.stages.claims import _Batch, claim_message
from streams.stages.common import Outputs
from streams.stages.trace import claim_definition
from tests.unit import stage_records

LIMIT = 16_384  # the smallest bound the settings accept
T0 = datetime(2026, 11, 22, 10, tzinfo=UTC)


def _claim(n: int, claim_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "event_id": f"e{n}",
        "event_type": "CLAIM",
        "timestamp": (T0 + timedelta(seconds=n)).isoformat(),
        "tenant_id": "t",
        "trace_id": f"trace-{n % 7}",
        "agent_name": "a",
        "agent_type": "planner",
        "schema_version": 1,
        "claim_id": claim_id,
        "statement": f"statement of {claim_id}",
        "tier": "task",
        "provenance": [{"source_type": "agent", "confidence": 0.8}],
        **fields,
    }


def _supports(target: str, strength: float = 0.5) -> dict[str, Any]:
    return {"type": "supports", "target": target, "strength": strength}


class _Worker:
    """The claim stage over an in-memory table that holds encoded values, as the worker's table does."""

    def __init__(self, limit: int = LIMIT, facts: bool = True) -> None:
        self.settings = load_settings(claim_node_max_bytes=limit)
        self.registry = CollectorRegistry()
        self.stage = ClaimStage(self.settings, scoring_configs(self.settings), metrics.create(self.registry))
        self.table: dict[bytes, bytes] = {}
        self.nodes: DecodedStates[ClaimNode] = DecodedStates(self.table, ClaimNode)  # type: ignore[arg-type]
        # As the worker does: neighbours' facts from a cache (False: from their decoded nodes).
        self.facts = ClaimFacts(self.nodes, self.stage.configs.claims, max_entries=8) if facts else None
        self.largest_write = 0  # key and value

    def message(self, offset: int, event: dict[str, Any]) -> InputRecord:
        """The claims-topic record stage 1 makes of a CLAIM input."""
        claim = ClaimEvent.model_validate(event)
        arrived = ClaimArrived(
            definition=claim_definition(claim), source_event_id=claim.event_id, event_time=claim.timestamp
        )
        source = InputRecord("agent-events", 0, offset, 1.0, orjson.dumps(event))
        made = claim_message(self.settings, claim.tenant_id, arrived, source)
        return InputRecord(made.topic, made.partition or 0, offset, 1.0, made.value)

    def run(self, events: Sequence[dict[str, Any]], batches: Sequence[int]) -> list[Record]:
        """Process `events` in batches of the given sizes (the rest in one last batch); all records."""
        records = [self.message(i, e) for i, e in enumerate(events)]
        sent: list[Record] = []
        start = 0
        for size in [*batches, len(records)]:
            batch, start = records[start : start + size], start + size
            if not batch:
                continue
            facts = self.facts.get if self.facts is not None else None
            out, written = self.stage.process(batch, self.nodes.load, self.nodes, facts)
            for key, write in written.items():
                self.table[key] = self.nodes.encode(key, write.node)
                self.largest_write = max(self.largest_write, len(key) + len(self.table[key]))
            sent += out
        return sent

    def node(self, claim_id: str) -> dict[str, Any]:
        return orjson.loads(self.table[orjson.dumps(["t", claim_id])])

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


def test_a_claim_at_the_bound_refuses_what_would_grow_it_and_nothing_else() -> None:
    w = _Worker()
    events = [_claim(0, "hub")]
    for i in range(1, 700):  # every 10th claim stands alone; the others support the hub
        fields = {} if i % 10 == 0 else {"relationships": [_supports("hub")]}
        events.append(_claim(i, f"claim-{i:04d}", **fields))
    records = w.run(events, [1] * len(events))

    dead = stage_records.dead(records)
    assert dead and all(reason == b"claim_node_full" for _, reason in dead)
    first_refused = dead[0][0]
    assert 100 < first_refused < 600, "the bound is reached after some inputs, not at once or never"
    # Every later supporter is refused; the claims that stand alone are not.
    assert [offset for offset, _ in dead] == [i for i in range(first_refused, 700) if i % 10]
    assert w.largest_write <= LIMIT
    assert w.largest_write > LIMIT * 0.95, "the hub got close to the bound"
    # A refused input changed no node: neither the hub's index nor a node of its own.
    refused_ids = {f"claim-{offset:04d}" for offset, _ in dead}
    assert not refused_ids & set(w.node("hub")["incoming"])
    assert all(orjson.dumps(["t", claim_id]) not in w.table for claim_id in refused_ids)
    scored = stage_records.scored(records)
    assert {o["source_event_id"] for o in scored} == {f"e{i}" for i in range(700)} - {
        f"e{offset}" for offset, _ in dead
    }
    # The DLQ holds the claim message, which names the input.
    letter = next(r for r in records if r.topic == "agent-events-dlq")
    assert orjson.loads(letter.value)["arrived"]["source_event_id"] == f"e{first_refused}"
    # Metrics count what was sent: no CLAIM_SCORED is counted for a refused input.
    assert w.metric("confidence_outputs_emitted_total", event_type="CLAIM_SCORED") == len(scored)
    assert w.metric("confidence_events_dead_lettered_total", reason="claim_node_full") == len(dead)

    # A re-delivered input the graph took still re-emits its own score; a refused one is refused again.
    again = w.run([events[3], events[first_refused]], [1])
    first_time = next(o for o in scored if o["source_event_id"] == "e3" and o["cause"] == "self")
    assert [(o["event_id"], o["interval"]) for o in stage_records.scored(again)] == [
        (first_time["event_id"], first_time["interval"])
    ]
    assert [reason for _, reason in stage_records.dead(again)] == [b"claim_node_full"]


def test_an_input_is_refused_whole_when_one_of_its_targets_is_full() -> None:
    w = _Worker()
    w.run(
        [_claim(0, "hub"), *[_claim(i, f"c{i}", relationships=[_supports("hub")]) for i in range(1, 700)]], []
    )
    before = dict(w.table)
    records = w.run([_claim(700, "late", relationships=[_supports("fresh"), _supports("hub")])], [])
    assert [reason for _, reason in stage_records.dead(records)] == [b"claim_node_full"]
    assert w.table == before, "not even the stub of the other target was written"
    assert not stage_records.scored(records)


def test_a_derived_claim_is_refused_when_its_constituents_index_is_full() -> None:
    w = _Worker()
    events = [_claim(0, "base")]
    events += [_claim(i, f"derived-claim-{i:05d}", derived_from=["base"]) for i in range(1, 1000)]
    records = w.run(events, [50] * 20)
    dead = stage_records.dead(records)
    assert dead and {reason for _, reason in dead} == {b"claim_node_full"}
    assert w.largest_write <= LIMIT
    assert len(w.node("base")["derived_by"]) == dead[0][0] - 1


@st.composite
def _inputs(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[int]]:
    """Claims over few ids (replaced, supported, contradicted, derived, with other provenance, tier and
    staleness), statements of any size, long ids that point at a few hubs; then a split into batches."""
    ids = ["a", "b", "c", "d", "hub"]
    events = []
    for n in range(draw(st.integers(20, 120))):
        if draw(st.booleans()):
            claim_id = f"long-claim-id-{n}-" + "x" * draw(st.integers(0, 300))
        else:
            claim_id = draw(st.sampled_from(ids))
        relationships = [
            {"type": kind, "target": target, "strength": strength}
            for kind, target, strength in draw(
                st.lists(
                    st.tuples(
                        st.sampled_from(["supports", "contradicts"]),
                        st.sampled_from(ids),
                        st.sampled_from([0.1, 0.5, 0.9]),
                    ),
                    max_size=3,
                )
            )
        ]
        derived = draw(st.lists(st.sampled_from(ids), max_size=2, unique=True))
        statement = "word " * draw(st.integers(0, 800))
        stale_hours = draw(st.none() | st.integers(-2, 2))
        staleness_at = None if stale_hours is None else (T0 + timedelta(hours=stale_hours)).isoformat()
        events.append(
            _claim(
                n,
                claim_id,
                relationships=relationships,
                derived_from=derived,
                statement=statement or "s",
                provenance=[{"source_type": "agent", "confidence": draw(st.sampled_from([0.3, 0.6, 0.9]))}],
                tier=draw(st.sampled_from(["ephemeral", "task"])),
                staleness_at=staleness_at,
            )
        )
    batches = draw(st.lists(st.integers(1, 40), max_size=20))
    return events, batches


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_inputs())
def test_the_bound_holds_and_decides_the_same_whatever_the_batches(
    case: tuple[list[dict[str, Any]], list[int]],
) -> None:
    events, batches = case
    stage_records.check_batching_changes_nothing(_Worker, events, batches, LIMIT, b"claim_node_full")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_inputs())
def test_the_size_estimate_of_each_input_is_an_upper_bound(
    case: tuple[list[dict[str, Any]], list[int]],
) -> None:
    """Below a quarter of the limit the stage estimates instead of encoding; the estimate must never be
    below the truth. Each input is its own batch over the stored nodes, under a limit never reached, so
    every bound is an estimate."""
    events, _ = case
    w = _Worker(limit=64_000_000)
    for offset, event in enumerate(events):
        assert w.facts is not None
        batch = _Batch(w.nodes.load, w.nodes, w.facts.get, w.stage.configs.claims)
        out = Outputs(w.settings, w.stage.metrics)
        out.guarded(w.message(offset, event), "test", functools.partial(w.stage._one, batch=batch, out=out))
        assert not stage_records.dead(out.records)
        for key, write in batch.dirty.items():
            w.table[key] = w.nodes.encode(key, write.node)
            assert len(key) + len(w.table[key]) <= batch.size_bound[key], f"input {offset}"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_inputs())
def test_cached_neighbour_facts_score_as_the_nodes_do(case: tuple[list[dict[str, Any]], list[int]]) -> None:
    """The worker reads neighbours' facts from `ClaimFacts` (a small cache here, so entries are evicted
    and read again); a claim replaced with another provenance, tier or staleness must be read anew."""
    events, batches = case
    cached, decoded = _Worker(facts=True), _Worker(facts=False)
    with_cache, without = cached.run(events, batches), decoded.run(events, batches)
    assert stage_records.outputs(with_cache) == stage_records.outputs(without)
    assert stage_records.dead(with_cache) == stage_records.dead(without)
    assert cached.table == decoded.table


def test_a_replaced_supporter_counts_with_its_new_provenance() -> None:
    """The case a stale cache gets wrong: P's facts are read (and kept) when T is scored for Q, then P
    is replaced with another provenance, then T is scored again for R."""
    events = [
        _claim(0, "T"),
        _claim(1, "P", relationships=[_supports("T")]),
        _claim(2, "Q", relationships=[_supports("T")]),
        _claim(
            3, "P", relationships=[_supports("T")], provenance=[{"source_type": "user", "confidence": 0.2}]
        ),
        _claim(4, "R", relationships=[_supports("T")]),
    ]
    cached, decoded = _Worker(facts=True), _Worker(facts=False)
    with_cache, without = cached.run(events, [1] * 5), decoded.run(events, [1] * 5)
    assert stage_records.outputs(with_cache) == stage_records.outputs(without)
    boosts = {
        o["source_event_id"]: o["interval"]["factors"]["support_boost"]
        for o in stage_records.scored(with_cache)
        if o["claim_id"] == "T"
    }
    # Boost 1 + 0.1 x sum(upper x strength 0.5): P's upper is 0.8, then 0.2; Q's and R's 0.8.
    assert boosts["e2"] == pytest.approx(1 + 0.1 * 0.5 * (0.8 + 0.8))
    assert boosts["e4"] == pytest.approx(1 + 0.1 * 0.5 * (0.2 + 0.8 + 0.8))


def test_a_claim_whose_derivations_are_too_entangled_is_dead_lettered_and_changes_nothing() -> None:
    """Nine claims each derived from all others: scoring the last ones would walk every simple path
    (seconds each); they are refused with reason claim_graph_too_complex, the worker goes on."""
    w = _Worker(limit=1_040_000)
    ids = [f"c{i}" for i in range(9)]
    events = [_claim(i, c, derived_from=[d for d in ids if d != c]) for i, c in enumerate(ids)]
    events.append(_claim(9, "alone"))
    records = w.run(events, [1] * len(events))
    dead = stage_records.dead(records)
    assert dead and all(reason == b"claim_graph_too_complex" for _, reason in dead)
    assert 9 not in {offset for offset, _ in dead}  # the next claim is scored as usual
    refused = {ids[offset] for offset, _ in dead}
    # No definition stored (a node may exist as a stub: earlier claims derive from it).
    assert all(w.node(c).get("definition") is None for c in refused if orjson.dumps(["t", c]) in w.table)
    assert "e9" in {o["source_event_id"] for o in stage_records.scored(records)}


def test_a_far_future_claim_expires_from_the_clocks_bound_not_its_date() -> None:
    """Its node, and the neighbour it touches, count their TTL from the wall clock plus
    EVENT_TIME_MAX_AHEAD_HOURS: stored as 2999 they would never be swept."""
    w = _Worker(limit=1_040_000)
    future = _claim(1, "future", relationships=[_supports("target")])
    future["timestamp"] = "2999-01-01T00:00:00+00:00"
    records = w.run([_claim(0, "target"), future], [1, 1])
    bound = datetime.now(UTC) + timedelta(hours=w.settings.event_time_max_ahead_hours, minutes=1)
    for claim_id in ("future", "target"):
        assert datetime.fromisoformat(w.node(claim_id)["last_event_time"]) <= bound, claim_id
    # Scoring still uses the event's own time (staleness as of 2999).
    own = next(o for o in stage_records.scored(records) if o["claim_id"] == "future")
    assert own["as_of"].startswith("2999-01-01")


def test_a_re_delivered_claim_re_emits_its_score_but_sends_calibration_nothing() -> None:
    """Calibration keeps each subject's latest score by arrival: a re-delivered old input must not send
    its remembered score again, or it would replace the score the claim has now."""
    w = _Worker(limit=1_040_000)
    x = _claim(0, "x")
    contradicting = _claim(1, "y", relationships=[{"type": "contradicts", "target": "x", "strength": 0.9}])
    records = w.run([x, contradicting, x], [1, 1, 1])

    def calibration_items(offset_records: list[Record]) -> list[dict[str, Any]]:
        return [
            item
            for r in offset_records
            if r.topic == w.settings.calibration_topic
            for part in r.value.split(b"\n")
            for item in orjson.loads(part)["items"]
        ]

    subjects = [i["subject"]["subject_id"] for i in calibration_items(records)]
    assert subjects == ["x", "y", "x"]  # x, then y's score and x's re-score; nothing for the re-delivery
    assert sum(o["claim_id"] == "x" for o in stage_records.scored(records)) == 3  # re-emitted all the same
