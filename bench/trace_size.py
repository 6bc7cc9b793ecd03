"""Stage 1 cost per TOOL_INVOCATION for a trace with 10, 100 and 1,000 earlier tool invocations.

Issue 10 asks that cost follow the work, not the state's size; `bench/history.py` and
`bench/claims.py` show that for agent history and claim graphs, this for a trace (eleventh round,
docs/DECISIONS.md). Seed 001's convergence compared every target of the trace with every other on
each input: 282 ms per input at 1,000 targets, 952x the small trace. The evidence state now keeps
a match index (`EvidenceState.matched`), so a new target is compared once with each listed one. What
still grows with the trace is linear: the trace state keeps every input's outputs for re-delivery
(since the twelfth round in compressed blocks of 64 inputs, about 50 B per input instead of 0.5 KB)
and is encoded whole on each write. The trace is built directly (distinct file targets over read,
search, git and verification, the index as `update` keeps it, one remembered output per earlier
input, kept as the stage keeps it); each measured input is a batch of its own and its state is
encoded, as the worker's table write does. The baseline is the 10-input trace in the same run.
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
from streams.decoded_states import DecodedStates
from streams.ids import output_event_id
from streams.scoring.evidence import EvidenceState, _all_matches
from streams.stages import InputRecord, TraceStage
from streams.state import TraceState, remembering, table_key

T0 = datetime(2026, 11, 22, tzinfo=UTC)
SETTINGS = load_settings()
MEASURED = 20


def _tool(i: int, tool: str, target: str) -> dict[str, object]:
    return {
        "event_id": f"tool-{i}",
        "event_type": "TOOL_INVOCATION",
        "timestamp": (T0 + timedelta(seconds=i)).isoformat(),
        "tenant_id": "bench",
        "trace_id": "long-trace",
        "agent_name": "investigator",
        "agent_type": "planner",
        "schema_version": 1,
        "tool": tool,
        "target": target,
        "status": "ok",
        "result_count": 2,
    }


def _trace(size: int, stage: TraceStage) -> TraceState:
    """A trace after `size` tool invocations, each on a file of its own."""
    targets = [f"src/module_{i}/handler_{i}.py" for i in range(size)]
    evidence = EvidenceState(
        reads=tuple(targets[0::3]),
        search_hits={"grep": tuple(targets[1::6]), "find": tuple(targets[4::6])},
        git_targets=tuple(targets[2::6]),
        verification_targets=tuple(targets[5::6]),
        build_latest=True,
        applied=tuple(f"tool-{i}" for i in range(size)),
    )
    evidence = evidence.model_copy(update={"matched": _all_matches(evidence)})  # as `update` keeps it
    # One real TRACE_SCORED output: the template of each earlier input's (its ids and score varied below).
    first = _tool(0, "read", targets[0])
    out, _ = stage.process(
        [InputRecord("in", 0, 0, 1.0, orjson.dumps(first), str(first["trace_id"]).encode())], lambda _: None
    )
    output = orjson.loads(next(r.value for r in out if r.topic == SETTINGS.scored_topic))
    output.pop("scored_at")
    state = TraceState(
        tenant_id="bench",
        trace_id="long-trace",
        partition=0,
        last_event_time=T0 + timedelta(seconds=size),
        evidence=evidence,
    )
    for i in range(size):  # remembered as the stage keeps it: older inputs in compressed blocks
        output = {
            **output,
            "event_id": output_event_id("TRACE_SCORED", f"tool-{i}"),
            "source_event_id": f"tool-{i}",
            "score": round(0.5 + (i % 50) / 100, 3),
        }
        state = state.model_copy(update=remembering(state, f"tool-{i}", [output]))
    return state


def _per_input(size: int) -> tuple[float, int]:
    """(median microseconds per input, state bytes after them) for a trace of `size` inputs."""
    stage = TraceStage(SETTINGS, scoring_configs(SETTINGS), metrics.create(CollectorRegistry()))
    state = _trace(size, stage)
    key = table_key("bench", "long-trace")
    table: dict[bytes, bytes] = {}
    states: DecodedStates[TraceState] = DecodedStates(table, TraceState)  # type: ignore[arg-type]
    table[key] = states.encode(key, state)
    samples = []
    for n in range(MEASURED):
        i = size + n
        event = _tool(i, ("read", "grep", "git")[n % 3], f"src/new_{i}.py")
        record = InputRecord("in", 0, i, 1.0, orjson.dumps(event), str(event["trace_id"]).encode())
        began = time.perf_counter_ns()
        _, written = stage.process([record], states.load, states)
        table[key] = states.encode(key, written[key])  # the table write
        samples.append((time.perf_counter_ns() - began) / 1000)
    return statistics.median(samples), len(table[key])


def main() -> None:
    table = Table(
        title=f"trace size: stage 1 cost per TOOL_INVOCATION ({MEASURED} inputs per size, one per batch, "
        "state encoded)"
    )
    for column in ("earlier inputs in the trace", "median us", "trace state KB", "x 10-input trace"):
        table.add_column(column, justify="right")
    base = None
    for size in (10, 100, 1_000):
        median, state_bytes = _per_input(size)
        base = base or median
        table.add_row(f"{size:,}", f"{median:,.0f}", f"{state_bytes / 1024:,.0f}", f"{median / base:,.1f}x")
        if size != 10:  # not the baseline itself
            summary.add(
                f"trace size: a TOOL_INVOCATION after {size:,} earlier inputs of its trace",
                median / base,
                "after 10 earlier inputs",
                f"{median:,.0f} us median, trace state {state_bytes / 1024:,.0f} KB",
            )
    Console().print(table)


if __name__ == "__main__":
    main()
