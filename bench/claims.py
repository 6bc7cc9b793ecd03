"""Claim graph cost per CLAIM input for a tenant with 1k vs 100k claims (average degree 3).

Issue: cost must follow the work (X, its neighbours and dependents), not the tenant's size. Nodes are
kept as JSON bytes and decoded on load, as the claims table does.
"""

from __future__ import annotations

import random
import statistics
import time
from datetime import UTC, datetime, timedelta

from rich.console import Console
from rich.table import Table

from bench import summary
from streams.scoring.claim_graph import (
    ClaimArrived,
    ClaimDefinition,
    ClaimNode,
    Relationship,
    apply_claim,
)
from streams.scoring.claims import ClaimsConfig, Provenance

T0 = datetime(2026, 11, 22, tzinfo=UTC)
CFG = ClaimsConfig()
INPUTS = 1000


def _definition(rng: random.Random, claim_id: str, population: int) -> ClaimDefinition:
    targets = [f"c{rng.randrange(population)}" for _ in range(3)]  # out-degree 3
    derived = [f"c{rng.randrange(population)}"] if rng.random() < 0.05 else []
    return ClaimDefinition(
        claim_id=claim_id,
        trace_id="bench",
        statement=claim_id,
        tier="task",
        provenance=(
            Provenance(source_type="agent", confidence=0.7),
            Provenance(source_type="user", confidence=0.6),
        ),
        relationships=tuple(
            Relationship(type=rng.choice(["supports", "contradicts"]), target=t, strength=0.5)
            for t in targets
        ),
        derived_from=tuple(derived),
    )


def _graph(size: int, rng: random.Random) -> dict[str, bytes]:
    """A tenant of `size` claims built directly (reverse index included), stored as JSON bytes."""
    definitions = {f"c{i}": _definition(rng, f"c{i}", size) for i in range(size)}
    incoming: dict[str, dict[str, list[tuple[str, float]]]] = {c: {} for c in definitions}
    derived_by: dict[str, set[str]] = {c: set() for c in definitions}
    for cid, d in definitions.items():
        for r in d.relationships:
            if r.target != cid:
                incoming[r.target].setdefault(cid, []).append((r.type, r.strength))
        for c in set(d.derived_from) - {cid}:
            derived_by[c].add(cid)
    return {
        cid: ClaimNode(
            definition=d,
            incoming={k: tuple(v) for k, v in incoming[cid].items()},  # type: ignore[misc]
            derived_by=tuple(sorted(derived_by[cid])),
            last_event_time=T0,
        )
        .model_dump_json()
        .encode()
        for cid, d in definitions.items()
    }


def _per_input_us(size: int) -> tuple[float, float, float]:
    rng = random.Random(size)
    table = _graph(size, rng)

    def load(claim_id: str) -> ClaimNode | None:
        raw = table.get(claim_id)
        return None if raw is None else ClaimNode.model_validate_json(raw)

    samples, outputs = [], 0
    for i in range(INPUTS):
        claim_id = f"c{rng.randrange(size)}"  # replacements of existing claims, new edges each time
        arrived = ClaimArrived(
            definition=_definition(rng, claim_id, size),
            source_event_id=f"e{i}",
            event_time=T0 + timedelta(seconds=i),
        )
        start = time.perf_counter_ns()
        update = apply_claim(load, arrived, CFG)
        for key, node in update.nodes.items():
            table[key] = node.model_dump_json().encode()
        samples.append((time.perf_counter_ns() - start) / 1000)
        outputs += len(update.scores)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1], outputs / INPUTS


def main() -> None:
    table = Table(title=f"claim graph: cost per CLAIM input ({INPUTS} inputs, out-degree 3, 5% derived)")
    for column in ("tenant size", "median us", "p99 us", "outputs per input", "x 1k median"):
        table.add_column(column, justify="right")
    base = None
    for size in (1_000, 100_000):
        median, p99, per_input = _per_input_us(size)
        base = base or median
        table.add_row(f"{size:,}", f"{median:.0f}", f"{p99:.0f}", f"{per_input:.2f}", f"{median / base:.2f}")
        if size != 1_000:  # not the baseline itself
            summary.add(
                f"claim graph: a CLAIM input in a tenant of {size:,} claims",
                median / base,
                "a tenant of 1,000 claims",
                f"{median:.0f} us median, {p99:.0f} p99, {per_input:.2f} outputs per input",
            )
    Console().print(table)


if __name__ == "__main__":
    main()
