"""Agent-history cost per LLM response through stage 2: by retained entries, and by responses per hour.

Issue 10: a write must cost the agent's current hour, not its whole retained week. Each response is
one batch, as at low load (the dearest case: nothing shared between responses). Table values are kept
as JSON bytes and decoded on load, and every write is encoded, as the worker's tables do. The baseline,
measured in the same run, is encoding the same agent's entries as one value: the layout before
(one key per agent), which every response rewrote.

The second table is one busy agent name: its current hour already holds all but the last 500 of 720,
7,200 or 72,000 responses (one every 5 s, 0.5 s, 50 ms), and the last 500 are timed. A response must not
cost the number of responses before it in its hour (the seventeenth round's per-chunk counts).
"""

from __future__ import annotations

import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.table import Table

from bench import summary
from streams import metrics
from streams.config import load_settings, scoring_configs
from streams.decoded_states import DecodedStates
from streams.stages import AgentStage, InputRecord, TraceStage
from streams.stages.history import HistoryTable, hour_key, stored_hours
from streams.state import AgentHistory, HistoryEntry, HistoryHour, encode_history_hour, table_key

T0 = datetime(2026, 11, 22, tzinfo=UTC)
RESPONSES = 500
EXAMPLE = orjson.loads((Path(__file__).parents[1] / "schemas/examples/LLM_RESPONSE.json").read_bytes())
SETTINGS = load_settings()


def _entry(index: int, event_time: datetime) -> HistoryEntry:
    return HistoryEntry(
        event_id=str(uuid.UUID(int=index)),
        event_time=event_time,
        threshold_met=index % 3 != 0,
        composite=0.7,
        blocked=False,
        history_score=0.6,
    )


def _entries(size: int) -> list[HistoryEntry]:
    """`size` responses spread evenly over the retention window, ending at T0."""
    span = timedelta(hours=SETTINGS.history_retention_hours) * 0.99
    return [_entry(i, T0 - span + span * i / size) for i in range(size)]


def _busy_hour(per_hour: int) -> tuple[list[HistoryEntry], timedelta]:
    """The hour from T0 of an agent answering `per_hour` times an hour, but for its last RESPONSES."""
    step = timedelta(hours=1) / per_hour
    return [_entry(i, T0 + step * i) for i in range(per_hour - RESPONSES)], step


def _stored(entries: list[HistoryEntry]) -> dict[HistoryTable, dict[bytes, bytes]]:
    """The agent's summary and hour chunks, as the two tables hold them (JSON bytes)."""
    tenant, agent = EXAMPLE["tenant_id"], EXAMPLE["agent_name"]
    counts, chunks = stored_hours(tuple(entries), SETTINGS.history_chunk_bytes)
    summary = AgentHistory(
        tenant_id=tenant,
        agent_name=agent,
        agent_type=EXAMPLE["agent_type"],
        newest=entries[-1].event_time,
        hours=counts,
    )
    return {
        "summary": {table_key(tenant, agent): summary.model_dump_json().encode()},
        "hours": {
            hour_key(tenant, agent, hour, index): chunk.model_dump_json().encode()
            for (hour, index), chunk in chunks.items()
        },
    }


def _responses(first: datetime = T0, step: timedelta = timedelta(seconds=7)) -> list[bytes]:
    """Stage 1's forwarded responses (logprobs replaced by their confidence), `step` apart from `first`."""
    configs = scoring_configs(SETTINGS)
    stage = TraceStage(SETTINGS, configs, metrics.create(CollectorRegistry()))
    forwarded = []
    for i in range(RESPONSES):
        event = {
            **EXAMPLE,
            "event_id": str(uuid.uuid4()),
            "timestamp": (first + step * i).isoformat(),
        }
        record = InputRecord("in", 0, i, 1.0, orjson.dumps(event), str(event["trace_id"]).encode())
        out, _ = stage.process([record], lambda k: None)
        forwarded.append(next(r.value for r in out if r.topic == SETTINGS.responses_topic))
    return forwarded


def _per_response_us(entries: list[HistoryEntry], forwarded: list[bytes]) -> tuple[float, float, int]:
    tables = _stored(entries)
    stage = AgentStage(SETTINGS, scoring_configs(SETTINGS), metrics.create(CollectorRegistry()))
    # As the worker reads its tables: a model written by an earlier batch is kept beside its bytes and
    # not decoded again; the stored week is decoded on first use.
    states: dict[HistoryTable, DecodedStates[Any]] = {
        "summary": DecodedStates(tables["summary"], AgentHistory),  # type: ignore[arg-type]
        "hours": DecodedStates(tables["hours"], HistoryHour, encoder=encode_history_hour),  # type: ignore[arg-type]
    }
    samples, written = [], 0
    for offset, value in enumerate(forwarded):
        record = InputRecord(SETTINGS.responses_topic, 0, offset, 1.0, value)
        start = time.perf_counter_ns()
        _, writes = stage.process([record], states["summary"].load, states["hours"].load)
        for key, write in writes.items():
            if write.value is None:
                del tables[write.table][key]
                states[write.table].forget(key)
            else:
                tables[write.table][key] = encoded = states[write.table].encode(key, write.value)
                written += len(encoded)
        samples.append((time.perf_counter_ns() - start) / 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1], written // len(forwarded)


def _one_value_us(size: int) -> float:
    """Encoding the agent's whole history as one value (the layout before), median of 20."""
    history = AgentHistory(
        tenant_id="t", agent_name="a", agent_type="planner", entries=tuple(_entries(size)), newest=T0
    )
    samples = []
    for _ in range(20):
        start = time.perf_counter_ns()
        history.model_dump_json().encode()
        samples.append((time.perf_counter_ns() - start) / 1000)
    return statistics.median(samples)


def main() -> None:
    forwarded = _responses()
    table = Table(
        title=f"agent history: stage 2 cost per LLM response ({RESPONSES} responses, one per batch)"
    )
    for column in (
        "retained entries",
        "median us",
        "p99 us",
        "bytes written per response",
        "x 100-entry median",
        "encoding one value us (layout before; encode only)",
        "x encoding one value",
    ):
        table.add_column(column, justify="right")
    base = None
    for size in (100, 10_000, 100_000):
        median, p99, written = _per_response_us(_entries(size), forwarded)
        before = _one_value_us(size)
        base = base or median
        table.add_row(
            f"{size:,}",
            f"{median:.0f}",
            f"{p99:.0f}",
            f"{written:,}",
            f"{median / base:.2f}",
            f"{before:,.0f}",
            f"{median / before:.3f}",
        )
        if size != 100:  # not the baseline itself
            summary.add(
                f"agent history: an LLM response with {size:,} retained entries",
                median / base,
                "100 retained entries",
                f"{median:.0f} us median, {p99:.0f} p99, {written:,} bytes written per response",
            )
    Console().print(table)
    busy = Table(title=f"one busy agent: stage 2 cost of the last {RESPONSES} responses of its hour")
    for column in ("responses in the hour", "median us", "p99 us", "bytes written per response", "x 720"):
        busy.add_column(column, justify="right")
    base = None
    for per_hour in (720, 7_200, 72_000):
        entries, step = _busy_hour(per_hour)
        median, p99, written = _per_response_us(entries, _responses(T0 + step * len(entries), step))
        base = base or median
        busy.add_row(f"{per_hour:,}", f"{median:.0f}", f"{p99:.0f}", f"{written:,}", f"{median / base:.2f}")
        if per_hour != 720:  # not the baseline itself
            summary.add(
                f"agent history: a response of a busy agent, {per_hour:,} in its hour",
                median / base,
                "720 in its hour",
                f"{median:.0f} us median, {p99:.0f} p99, {written:,} bytes written per response",
            )
    Console().print(busy)


if __name__ == "__main__":
    main()
