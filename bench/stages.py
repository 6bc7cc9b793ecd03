"""The four stages alone, without Kafka or Faust: CPU per input event on the pipeline benchmark's mix.

The worker's throughput moves with the host and the broker; this does not touch either, so it is the
figure to compare two versions of the stage code by (run it alternately, as `make bench` does not).
Stage 1 gets the mix in batches of 100 (about what it takes per batch at full load); the records it
sends to the internal topics are bundled and handed to the next stages in memory, as the worker's
agents would after a fetch. Tables are dicts of JSON bytes read through `DecodedStates`, as the
worker's are, and every write is encoded. The baseline, measured in the same run, is decoding and
validating the inputs alone (`streams.decode.decode`), which every input event costs stage 1. Times
are this process's CPU time, so other work on the machine does not inflate them.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections import Counter, defaultdict
from typing import Any

from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.table import Table

from bench import summary
from bench.mix import Mix, build_mix
from bench.pipeline import MIX_EVENTS, MIX_TRACES, spread
from streams import metrics
from streams.cli import tune_gc
from streams.config import Settings, load_settings, scoring_configs
from streams.decode import decode
from streams.decoded_states import ClaimFacts, DecodedStates
from streams.scoring.claim_graph import ClaimNode
from streams.stages import AgentStage, CalibrationStage, ClaimStage, InputRecord, Record, TraceStage
from streams.stages.calibration import CalibrationWrite
from streams.stages.common import bundle, unbundle
from streams.stages.history import HistoryWrite
from streams.state import (
    AgentHistory,
    GroupCalibration,
    HistoryHour,
    HourBucket,
    SubjectEntry,
    TraceState,
    encode_history_hour,
)

BATCH = 100
RUNS = 5
STAGES = ("stage 1 (trace)", "stage 2 (history)", "claims", "calibration")


class _Pipeline:
    """One worker's four stages and tables, fed in memory."""

    def __init__(self, settings: Settings) -> None:
        configs, registry = scoring_configs(settings), metrics.create(CollectorRegistry())
        self.settings = settings
        self.trace = TraceStage(settings, configs, registry)
        self.history = AgentStage(settings, configs, registry)
        self.claims = ClaimStage(settings, configs, registry)
        self.calibration = CalibrationStage(settings, configs, registry)
        self.traces: DecodedStates[TraceState] = DecodedStates({}, TraceState)  # type: ignore[arg-type]
        self.histories: dict[str, DecodedStates[Any]] = {
            "summary": DecodedStates({}, AgentHistory),  # type: ignore[arg-type]
            "hours": DecodedStates({}, HistoryHour, encoder=encode_history_hour),  # type: ignore[arg-type]
        }
        self.claim_nodes: DecodedStates[ClaimNode] = DecodedStates({}, ClaimNode)  # type: ignore[arg-type]
        self.claim_facts = ClaimFacts(self.claim_nodes, configs.claims)
        self.scores: dict[str, DecodedStates[Any]] = {
            "subjects": DecodedStates({}, SubjectEntry, max_entries=64),  # type: ignore[arg-type]
            "groups": DecodedStates({}, GroupCalibration),  # type: ignore[arg-type]
            "hours": DecodedStates({}, HourBucket),  # type: ignore[arg-type]
        }
        self.internal = set(settings.internal_topics)
        self.waiting: dict[str, list[InputRecord]] = defaultdict(list)
        self.seconds: Counter[str] = Counter()
        self.outputs = 0

    def run(self, mix: Mix) -> None:
        topic = self.settings.input_topics[0]
        for start in range(0, len(mix.records), BATCH):
            batch = [
                InputRecord(topic, 0, start + i, time.time(), value, key)
                for i, (key, value) in enumerate(mix.records[start : start + BATCH])
            ]
            began = time.process_time()
            records, traces = self.trace.process(batch, self.traces.load, self.traces)
            for key, state in traces.items():
                self.traces.table[key] = self.traces.encode(key, state)  # type: ignore[index]
            self.seconds[STAGES[0]] += time.process_time() - began
            self._send(records)
            self._drain()
        self._drain()  # the last batch's scores reach calibration one round later
        self._drain()

    def _send(self, records: list[Record]) -> None:
        for record in bundle(records, self.internal, self.settings.producer_max_batch_bytes):
            if record.topic == self.settings.dlq_topic:  # the mix is clean: a dead letter is a bug
                raise RuntimeError(f"the mix dead-lettered an input: {dict(record.headers or [])}")
            if record.topic in self.internal:
                self.waiting[record.topic].append(
                    InputRecord(record.topic, record.partition or 0, 0, time.time(), record.value)
                )
            else:
                self.outputs += 1

    def _drain(self) -> None:
        settings = self.settings
        for topic, stage in (
            (settings.responses_topic, STAGES[1]),
            (settings.claims_topic, STAGES[2]),
            (settings.calibration_topic, STAGES[3]),
        ):
            batch = [part for record in self.waiting.pop(topic, []) for part in unbundle(record)]
            if not batch:
                continue
            began = time.process_time()
            if stage == STAGES[1]:
                records, history = self.history.process(
                    batch, self.histories["summary"].load, self.histories["hours"].load
                )
                _write(self.histories, history)
            elif stage == STAGES[2]:
                records, nodes = self.claims.process(
                    batch, self.claim_nodes.load, self.claim_nodes, self.claim_facts.get
                )
                for key, write in nodes.items():
                    self.claim_nodes.table[key] = self.claim_nodes.encode(key, write.node)  # type: ignore[index]
            else:
                records, scores = self.calibration.process(
                    batch, lambda table, key: self.scores[table].load(key)
                )
                _write(self.scores, scores)
            self.seconds[stage] += time.process_time() - began
            self._send(records)


def _write(
    states: dict[str, DecodedStates[Any]], writes: dict[bytes, HistoryWrite] | dict[bytes, CalibrationWrite]
) -> None:
    for key, write in writes.items():
        state = states[write.table]
        if write.value is None:
            state.table.pop(key, None)  # type: ignore[attr-defined]
            state.forget(key)
        else:
            state.table[key] = state.encode(key, write.value)  # type: ignore[index]


def main() -> None:
    settings = load_settings()
    tune_gc(settings.gc_gen0_threshold)  # as the worker does at start
    mix = build_mix(MIX_EVENTS, MIX_TRACES)
    events = len(mix.records)
    per_stage: dict[str, list[float]] = defaultdict(list)
    totals: list[float] = []
    baseline: list[float] = []
    outputs = 0
    for _ in range(RUNS):
        began = time.process_time()
        for _, value in mix.records:
            decode(value, settings.max_event_bytes, settings.max_array_items)
        baseline.append((time.process_time() - began) / events * 1e6)
        pipeline = _Pipeline(settings)
        pipeline.run(mix)
        for stage in STAGES:
            per_stage[stage].append(pipeline.seconds[stage] / events * 1e6)
        totals.append(sum(pipeline.seconds.values()) / events * 1e6)
        outputs = pipeline.outputs
        gc.collect()

    base = statistics.median(baseline)
    table = Table(
        title=f"the four stages alone, no Kafka: CPU per input event, {events:,} mix events in batches of "
        f"{BATCH}, {outputs:,} records out, {RUNS} runs (median \\[min-max])"
    )
    for column in ("case", "us per input event", "x decode"):
        table.add_column(column, justify="left" if column == "case" else "right")

    def row(name: str, samples: list[float]) -> None:
        middle = statistics.median(samples)
        table.add_row(name, spread(samples, ".1f"), f"{middle / base:.1f}x")

    row("baseline: decode and validate the input", baseline)
    for stage in STAGES:
        row(f"  {stage}", per_stage[stage])
    row("all four stages, state encoding included", totals)
    for stage in STAGES:
        middle = statistics.median(per_stage[stage])
        summary.add(
            f"stages without Kafka: {stage}",
            middle / base,
            f"decoding the input ({base:.1f} us)",
            f"{spread(per_stage[stage], '.1f')} us CPU per input event",
        )
    summary.add(
        "stages without Kafka: all four, state encoding included",
        statistics.median(totals) / base,
        f"decoding the input ({base:.1f} us)",
        f"{spread(totals, '.1f')} us CPU per input event ({events:,} mix events in batches of {BATCH})",
    )
    Console().print(table)


if __name__ == "__main__":
    main()
