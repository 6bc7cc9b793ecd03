"""TRACE_STATE_MAX_BYTES: no trace's state grows past it, whatever the batches, and what it refuses goes
to the DLQ with reason `trace_state_full` (a changelog record over the broker's limit would stop the
worker on that trace after every restart)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from streams import metrics
from streams.config import load_settings, scoring_configs
from streams.decoded_states import DecodedStates
from streams.stages import InputRecord, Record, TraceStage
from streams.stages.common import Outputs
from streams.stages.trace import _Batch
from streams.state import TraceState
from tests.unit import stage_records
from tests.unit.stage_records import keyed

LIMIT = 16_384  # the smallest bound the settings accept
T0 = datetime(2026, 11, 22, 10, tzinfo=UTC)


def _event(n: int, kind: str, trace: str = "long", **fields: Any) -> dict[str, Any]:
    return {
        "event_id": f"e{n}",
        "event_type": kind,
        "timestamp": (T0 + timedelta(seconds=n)).isoformat(),
        "tenant_id": "t",
        "trace_id": trace,
        "agent_name": "a",
        "agent_type": "planner",
        "schema_version": 1,
        **fields,
    }


def _tool(n: int, target: str, tool: str = "read", trace: str = "long") -> dict[str, Any]:
    return _event(n, "TOOL_INVOCATION", trace, tool=tool, target=target, status="ok", result_count=1)


def _response(n: int, role: str, text: str) -> dict[str, Any]:
    fields = {"request_id": f"r{n}", "model": "m", "endpoint": "/v1", "response": text, "role": role}
    if role == "sub_call":
        fields["sub_call_id"] = f"s{n}"
    return _event(n, "LLM_RESPONSE", **fields)


def _claim(n: int, statement: str) -> dict[str, Any]:
    provenance = [{"source_type": "agent", "confidence": 0.8}]
    return _event(n, "CLAIM", claim_id=f"c{n}", statement=statement, tier="task", provenance=provenance)


class _Worker:
    """Stage 1 over an in-memory table that holds encoded values, as the worker's table does."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.settings = load_settings(trace_state_max_bytes=limit)
        self.registry = CollectorRegistry()
        self.stage = TraceStage(self.settings, scoring_configs(self.settings), metrics.create(self.registry))
        self.table: dict[bytes, bytes] = {}
        self.states: DecodedStates[TraceState] = DecodedStates(self.table, TraceState)  # type: ignore[arg-type]
        self.largest_write = 0

    def run(self, events: Sequence[dict[str, Any]], batches: Sequence[int]) -> list[Record]:
        """Process `events` in batches of the given sizes (the rest in one last batch); all records."""
        records = [
            keyed(InputRecord("agent-events", 0, i, 1.0, orjson.dumps(e))) for i, e in enumerate(events)
        ]
        sent: list[Record] = []
        start = 0
        for size in [*batches, len(records)]:
            batch, start = records[start : start + size], start + size
            if not batch:
                continue
            out, written = self.stage.process(batch, self.states.load, self.states)
            for key, state in written.items():
                self.table[key] = self.states.encode(key, state)
                self.largest_write = max(self.largest_write, len(self.table[key]))
            sent += out
        return sent

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


def test_a_trace_at_the_bound_dead_letters_what_would_grow_it_and_nothing_else() -> None:
    w = _Worker()
    events = [_tool(i, f"src/module_{i}/handler_{i}.py", ("read", "grep", "git")[i % 3]) for i in range(80)]
    events.append(_tool(80, "src/other.py", trace="short"))  # another trace is not affected
    records = w.run(events, [1] * len(events))  # one input per batch, as a slow trace arrives

    dead = stage_records.dead(records)
    assert dead and all(reason == b"trace_state_full" for _, reason in dead)
    first_refused = dead[0][0]
    assert 10 < first_refused < 60, "the bound is reached after some inputs, not at once or never"
    # Every later input of that trace grows it (a new target each) and is refused; the other trace's is not.
    assert [offset for offset, _ in dead] == list(range(first_refused, 80))
    assert w.largest_write <= LIMIT
    scored = stage_records.scored(records)
    assert [o["source_event_id"] for o in scored] == [f"e{i}" for i in range(first_refused)] + ["e80"]
    # Metrics count what was sent: no TRACE_SCORED is counted for a refused input.
    assert w.metric("confidence_outputs_emitted_total", event_type="TRACE_SCORED") == len(scored)
    assert w.metric("confidence_events_dead_lettered_total", reason="trace_state_full") == len(dead)
    # Each input is either processed or dead-lettered, never both.
    assert w.metric("confidence_events_processed_total", event_type="TOOL_INVOCATION") == len(scored)
    assert sum(
        w.metric("confidence_evidence_band_total", band=b) for b in ("strong", "adequate", "weak", "failed")
    ) == len(scored)

    # A re-delivered input the trace took still re-emits its output; a refused one is refused again.
    again = w.run([events[3], events[first_refused]], [1])
    assert [o["event_id"] for o in stage_records.scored(again)] == [scored[3]["event_id"]]
    assert stage_records.scored(again)[0]["score"] == scored[3]["score"]
    assert [reason for _, reason in stage_records.dead(again)] == [b"trace_state_full"]


def test_one_oversized_sub_result_is_refused_even_in_an_empty_trace() -> None:
    w = _Worker()
    records = w.run([_response(0, "sub_call", "x" * (LIMIT + 100)), _response(1, "sub_call", "short")], [])
    assert [offset for offset, _ in stage_records.dead(records)] == [0]
    assert w.largest_write <= LIMIT


@st.composite
def _inputs(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[int]]:
    """Tools over few targets (the match index grows), sub results of any size, claims that conflict
    (synthesis outputs grow with the claims), synthesis responses; then a split into batches."""
    words = ["cache", "server", "handler", "config", "a", "src", "src/cache", "src/cache/server.py"]
    events = []
    for n in range(draw(st.integers(20, 90))):
        kind = draw(st.sampled_from(["tool", "tool", "tool", "sub_call", "claim", "synthesis"]))
        if kind == "tool":
            target = "/".join(draw(st.lists(st.sampled_from(words), min_size=1, max_size=3)))
            events.append(_tool(n, target, draw(st.sampled_from(["read", "grep", "find", "git", "cmake"]))))
        elif kind == "sub_call":
            events.append(_response(n, "sub_call", "word " * draw(st.integers(0, 1500))))
        elif kind == "claim":
            negated = draw(st.booleans())
            events.append(_claim(n, f"the cache server is {'not ' if negated else ''}ready {n}"))
        else:
            events.append(_response(n, "synthesis", "summary"))
    batches = draw(st.lists(st.integers(1, 30), max_size=20))
    return events, batches


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_inputs())
def test_the_bound_holds_and_decides_the_same_whatever_the_batches(
    case: tuple[list[dict[str, Any]], list[int]],
) -> None:
    events, batches = case
    stage_records.check_batching_changes_nothing(_Worker, events, batches, LIMIT, b"trace_state_full")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_inputs())
def test_the_size_estimate_of_each_input_is_an_upper_bound(
    case: tuple[list[dict[str, Any]], list[int]],
) -> None:
    """Below a quarter of the limit the stage estimates instead of encoding; the estimate must never be
    below the truth. Each input is its own batch over its stored state, under a limit never reached,
    so every bound is an estimate (the quarter is a margin on top, not tested here)."""
    events, _ = case
    w = _Worker(limit=64_000_000)
    for offset, event in enumerate(events):
        batch, out = _Batch(w.states.load, w.states), Outputs(w.settings, w.stage.metrics)
        record = keyed(InputRecord("agent-events", 0, offset, 1.0, orjson.dumps(event)))
        out.guarded(record, "test", functools.partial(w.stage._one, batch=batch, out=out))
        for key, state in batch.dirty.items():
            w.table[key] = w.states.encode(key, state)
            assert len(w.table[key]) <= batch.size_bound[key], f"input {offset} ({event['event_type']})"
