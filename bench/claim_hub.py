"""Claim stage cost per new supporter of a claim that 0, 100, 1,000 and 10,000 claims already support.

A claim's score sums a term per supporter (seed 002 step 3), so each new supporter of a hub re-scores
it over all of them: that cost grows with the hub, by design. What it costs per supporter is what
this measures: the worker keeps each claim's `NeighbourFacts` (`agents.ClaimFacts`), where it used to
decode every supporter's node (its node cache holds 1,024) on each new supporter. Both are timed; the
baseline is a claim nobody supports, in the same run. The tenant is built directly (nodes as the
claims table stores them); each measured input is a batch of its own through `ClaimStage`, and the
nodes it changes are encoded and stored, as the worker's table write does. The caches are warmed by
one input first, as a running worker's would be. The HTTP claim view (`interval_of` at the wall
clock) reads the same supporters; it is timed with the worker's cache (warm) and decoding nodes, as
it did before the thirteenth round.
"""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime, timedelta

import orjson
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.table import Table

from bench import summary
from streams import metrics
from streams.config import load_settings, scoring_configs
from streams.decoded_states import ClaimFacts, DecodedStates
from streams.scoring.claim_graph import ClaimArrived, ClaimDefinition, ClaimNode, Relationship, interval_of
from streams.scoring.claims import Provenance
from streams.stages import ClaimStage, InputRecord
from streams.stages.claims import claim_message
from streams.state import table_key

T0 = datetime(2026, 11, 22, tzinfo=UTC)
SETTINGS = load_settings()
SIZES = (0, 100, 1_000, 10_000)
MEASURED = 20


def _definition(claim_id: str, supports_hub: bool) -> ClaimDefinition:
    return ClaimDefinition(
        claim_id=claim_id,
        trace_id="bench",
        statement=f"statement of {claim_id}",
        tier="task",
        provenance=(Provenance(source_type="agent", confidence=0.7),),
        relationships=(Relationship(type="supports", target="hub", strength=0.5),) if supports_hub else (),
        agent_type="planner",
    )


def _tenant(supporters: int) -> dict[bytes, bytes]:
    """The hub and its supporters, reverse index included, stored as JSON bytes."""
    ids = [f"supporter-{i:06d}" for i in range(supporters)]
    hub = ClaimNode(
        definition=_definition("hub", False),
        incoming={claim_id: (("supports", 0.5),) for claim_id in ids},
        last_event_time=T0,
    )
    table = {table_key("bench", "hub"): hub.model_dump_json().encode()}
    for claim_id in ids:
        node = ClaimNode(definition=_definition(claim_id, True), last_event_time=T0)
        table[table_key("bench", claim_id)] = node.model_dump_json().encode()
    return table


def _message(n: int) -> InputRecord:
    arrived = ClaimArrived(
        definition=_definition(f"new-{n:04d}", True),
        source_event_id=f"new-{n}",
        event_time=T0 + timedelta(seconds=n),
    )
    source = InputRecord("agent-events", 0, n, time.time(), b"")
    made = claim_message(SETTINGS, "bench", arrived, source)
    return InputRecord(made.topic, made.partition or 0, n, time.time(), made.value)


def _per_input_us(supporters: int, cached_facts: bool) -> float:
    stage = ClaimStage(SETTINGS, scoring_configs(SETTINGS), metrics.create(CollectorRegistry()))
    table = _tenant(supporters)
    nodes: DecodedStates[ClaimNode] = DecodedStates(table, ClaimNode)  # type: ignore[arg-type]
    facts = ClaimFacts(nodes, stage.configs.claims).get if cached_facts else None
    timings = []
    for n in range(MEASURED + 1):
        record = _message(n)
        began = time.perf_counter()
        _, written = stage.process([record], nodes.load, nodes, facts)
        for key, write in written.items():
            table[key] = nodes.encode(key, write.node)
        if n:  # the first input warms the caches
            timings.append(time.perf_counter() - began)
    assert orjson.loads(table[table_key("bench", "hub")])["incoming"].keys() >= {"new-0000"}
    return statistics.median(timings) * 1e6


def _view_us(supporters: int, cached_facts: bool) -> float:
    """One claim view of the hub, median of 5 (the worker's cache warmed by a first view)."""
    cfg = scoring_configs(SETTINGS).claims
    table = _tenant(supporters)
    nodes: DecodedStates[ClaimNode] = DecodedStates(table, ClaimNode)  # type: ignore[arg-type]
    cache = ClaimFacts(nodes, cfg)

    def load(claim_id: str) -> ClaimNode | None:  # as the view loads: decoded on each request
        raw = table.get(table_key("bench", claim_id))
        return None if raw is None else ClaimNode.model_validate_json(raw)

    facts = (lambda claim_id: cache.get(table_key("bench", claim_id))) if cached_facts else None
    timings = []
    for _ in range(6):
        began = time.perf_counter()
        interval_of(load, "hub", T0 + timedelta(hours=1), cfg, facts)
        timings.append(time.perf_counter() - began)
    return statistics.median(timings[1:]) * 1e6


def main() -> None:
    console = Console()
    table = Table(title="Claim stage: cost per new supporter of a claim with n supporters (us, median)")
    for column in ("supporters", "facts cache", "ratio", "decoding nodes", "ratio"):
        table.add_column(column, justify="right")
    rows = [(n, _per_input_us(n, True), _per_input_us(n, False)) for n in SIZES]
    base_cached, base_decoded = rows[0][1], rows[0][2]
    for n, cached, decoded in rows:
        table.add_row(
            f"{n:,}",
            f"{cached:,.0f}",
            f"{cached / base_cached:.1f}x",
            f"{decoded:,.0f}",
            f"{decoded / base_decoded:.1f}x",
        )
    console.print(table)
    summary.add(
        f"claim stage: a new supporter of a claim with {rows[-1][0]:,} supporters",
        rows[-1][1] / base_cached,
        f"{rows[0][0]:,} supporters ({base_cached:,.0f} us)",
        f"{rows[-1][1]:,.0f} us median (decoding the nodes instead of the facts cache: {rows[-1][2]:,.0f})",
    )
    view = Table(title="HTTP claim view of a claim with n supporters (us, median of 5)")
    for column in ("supporters", "facts cache", "decoding nodes"):
        view.add_column(column, justify="right")
    for n in SIZES[1:]:
        view.add_row(f"{n:,}", f"{_view_us(n, True):,.0f}", f"{_view_us(n, False):,.0f}")
    console.print(view)
    console.print(
        f"At {SIZES[-1]:,} supporters the facts cache takes {rows[-1][2] / rows[-1][1]:.1f}x less time per "
        "input than decoding the supporters' nodes; both grow with the supporters, as the score does."
    )


if __name__ == "__main__":
    main()
