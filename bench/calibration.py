"""Calibration cost per OUTCOME through the calibration stage, vs `json.loads` of the same message.

An outcome for a response updates four groups (model and agent type x response and composite), each
with a week of hourly buckets in the window; ECE and Brier are recomputed from the window totals, and
with one outcome a second the oldest hour leaves the window every hour (its bins are subtracted).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from bench import summary
from streams import metrics
from streams.config import load_settings, scoring_configs
from streams.events import OutcomeEvent
from streams.scoring import calibration
from streams.stages.calibration import CalibrationStage, group_key, hour_key, subject_key
from streams.stages.common import InputRecord
from streams.state import (
    CalibrationItem,
    CalibrationMessage,
    CalibrationSubject,
    GroupCalibration,
    HourBucket,
    SubjectEntry,
)

T0 = datetime(2026, 11, 22, tzinfo=UTC)
OUTCOMES = 4000
HOURS = 168


def _preloaded() -> dict[bytes, BaseModel]:
    """Four groups, each with a week of hours in its window (30 of 100 bins filled per hour)."""
    state: dict[bytes, BaseModel] = {}
    first_hour = int(T0.timestamp() // 3600) - HOURS + 1
    for dimension, value in (("model", "m"), ("agent_type", "planner")):
        for kind in ("response", "composite"):
            group = GroupCalibration(
                tenant_id="t", dimension=dimension, value=value, kind=kind, newest=T0 - timedelta(hours=1)
            )
            bins: dict[int, calibration.BinStats] = {}
            for hour in range(first_hour, first_hour + HOURS):
                hour_bins: dict[int, calibration.BinStats] = {}
                for i in range(30):
                    hour_bins = calibration.add(hour_bins, (i * 3 + hour % 3) / 100, float(i % 2))
                state[hour_key(group, hour)] = HourBucket(bins=hour_bins)
                bins = calibration.merge([bins, hour_bins])
            hours = tuple(range(first_hour, first_hour + HOURS))
            key = group_key("t", dimension, value, kind)
            state[key] = group.model_copy(update={"bins": bins, "hours": hours})
    return state


def _outcome_record(i: int, state: dict[bytes, BaseModel]) -> InputRecord:
    subject = CalibrationSubject(
        subject_type="response",
        subject_id=f"r{i}",
        event_time=T0,
        scores={"response": (i % 100) / 100, "composite": 0.8},
        action="allow",
        model="m",
        agent_type="planner",
    )
    state[subject_key("t", "response", f"r{i}")] = SubjectEntry(subject=subject)
    outcome = OutcomeEvent.model_validate_json(
        json.dumps(
            {
                "event_type": "OUTCOME",
                "event_id": f"o{i}",
                "timestamp": (T0 + timedelta(seconds=i)).isoformat(),
                "tenant_id": "t",
                "trace_id": "tr",
                "schema_version": 1,
                "subject_event_id": f"r{i}",
                "correct": i % 3 != 0,
                "source": "judge",
            }
        )
    )
    message = CalibrationMessage(
        tenant_id="t", items=[CalibrationItem(outcome=outcome, received_at=0.0)], source=0
    )
    return InputRecord("calibration", 0, i, 0.0, message.model_dump_json().encode())


def main() -> None:
    settings = load_settings(calibration_min_samples=10**9)  # measure the join and update, not the emit
    stage = CalibrationStage(settings, scoring_configs(settings), metrics.create(CollectorRegistry()))
    # The worker's tables hold JSON bytes and its DecodedStates cache keeps the decoded models of what
    # it wrote, so the stage sees models: the bench keeps models and applies each batch's writes.
    state = _preloaded()
    messages = [_outcome_record(i, state) for i in range(OUTCOMES)]

    def process(batch: list[InputRecord]) -> None:
        _, writes = stage.process(batch, lambda table, key: state.get(key))
        for key, write in writes.items():
            if write.value is None:
                state.pop(key, None)
            else:
                write.value.model_dump_json()  # the changelog write encodes each value once per batch
                state[key] = write.value

    def timed(fn: Callable[[InputRecord], object], items: list[InputRecord]) -> list[float]:
        samples = []
        for record in items:
            start = time.perf_counter_ns()
            fn(record)
            samples.append((time.perf_counter_ns() - start) / 1000)
        return sorted(samples)

    baseline = timed(lambda r: json.loads(r.value or b""), messages)
    half = OUTCOMES // 2
    # Each outcome in a batch of its own (the worst case), then batches of 100.
    per_outcome = timed(lambda r: process([r]), messages[:half])
    batched_start = time.perf_counter_ns()
    for start in range(half, OUTCOMES, 100):
        process(messages[start : start + 100])
    batched = (time.perf_counter_ns() - batched_start) / 1000 / (OUTCOMES - half)

    table = Table(title=f"calibration cost per OUTCOME ({OUTCOMES} outcomes, 4 groups of {HOURS} hours)")
    for column in ("case", "median us", "p99 us", "x json.loads"):
        table.add_column(column, justify="right" if column != "case" else "left")
    base = statistics.median(baseline)
    for name, samples in (
        ("baseline: json.loads of the message", baseline),
        ("outcome, batch of 1", per_outcome),
    ):
        median, p99 = statistics.median(samples), samples[int(len(samples) * 0.99) - 1]
        table.add_row(name, f"{median:.1f}", f"{p99:.1f}", f"{median / base:.2f}")
    table.add_row("outcome, batches of 100 (mean)", f"{batched:.1f}", "", f"{batched / base:.2f}")
    single = statistics.median(per_outcome)
    for name, value in (("in a batch of its own (median)", single), ("in batches of 100 (mean)", batched)):
        summary.add(
            f"calibration: an OUTCOME {name}",
            value / base,
            f"json.loads of the message ({base:.1f} us)",
            f"{value:.1f} us",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
