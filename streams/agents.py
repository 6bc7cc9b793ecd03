"""Thin Faust agents: the four stage agents and the expiry sweep, wired onto the app.

Each agent hands its batches to a `BatchRunner` (streams/batch_runner.py: outputs, then state, then
the ack, README "Guarantees") with its stage's `process` and a writer for its tables; table values are
read and written through `DecodedStates` (streams/decoded_states.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

import faust
from faust.tables.recovery import Recovery
from faust.types import TP
from pydantic import BaseModel

from streams.alignment import attach_input_alignment
from streams.app import Service, SourcePartitionedTable
from streams.batch_runner import BatchRunner, stop_worker
from streams.decoded_states import ClaimFacts, DecodedStates
from streams.recovery import SeekThenResumeRecovery
from streams.scoring.claim_graph import ClaimNode
from streams.stages import InputRecord, Record
from streams.stages.calibration import CalibrationWrite, Table, hour_key
from streams.stages.claims import ClaimWrite
from streams.stages.common import ExpiryClock
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

__all__ = ["active_partitions", "attach_agents", "owned"]

log = logging.getLogger(__name__)

COMMIT_CHECK_SECONDS = 1.0  # how often the offset-commit watchdog looks

_Result = TypeVar("_Result")  # what a stage's process returns (outputs, table writes)


def attach_agents(svc: Service) -> ClaimFacts:
    """Register the four stage agents and the state sweeps on `svc.app`; return the claim agent's
    neighbour facts cache, which the claim view reads too (same event loop, nothing awaited inside)."""
    app, settings = svc.app, svc.settings
    calibration = svc.calibration_stage
    m = svc.metrics

    def undecodable(table: str) -> None:
        m.child(m.state_undecodable, table).inc()

    traces = DecodedStates(
        svc.traces, TraceState, sweep_after=svc.trace_stage.sweep_after, on_undecodable=undecodable
    )
    histories: dict[str, DecodedStates[Any]] = {
        "summary": DecodedStates(
            svc.agents_history,
            AgentHistory,
            sweep_after=svc.agent_stage.sweep_after,
            on_undecodable=undecodable,
        ),
        "hours": DecodedStates(svc.agent_history_hours, HistoryHour, encoder=encode_history_hour),
    }
    claims = DecodedStates(
        svc.claims, ClaimNode, sweep_after=svc.claim_stage.sweep_after, on_undecodable=undecodable
    )
    claim_facts = ClaimFacts(claims, svc.configs.claims)
    calibration_states: dict[Table, DecodedStates[Any]] = {
        # A score is read again only when its outcome arrives: caching its model would only hold memory.
        "subjects": DecodedStates(
            svc.calibration_subjects,
            SubjectEntry,
            max_entries=64,
            sweep_after=calibration.subject_sweep_after,
            on_undecodable=undecodable,
        ),
        "groups": DecodedStates(
            svc.calibration_groups,
            GroupCalibration,
            sweep_after=calibration.group_sweep_after,
            on_undecodable=undecodable,
        ),
        "hours": DecodedStates(svc.calibration_hours, HourBucket),
    }

    def write_trace(key: bytes, state: TraceState) -> None:
        svc.traces.set_from(key, traces.encode(key, state), state.partition)

    def write_claim(key: bytes, write: ClaimWrite) -> None:
        svc.claims.set_from(key, claims.encode(key, write.node), write.partition)
        claim_facts.forget(key)  # its entry would hold the replaced bytes until read again

    def load_calibration(table: Table, key: bytes) -> BaseModel | None:
        return calibration_states[table].load(key)

    table_recovery = app.tables.recovery
    if isinstance(table_recovery, SeekThenResumeRecovery):  # a recovery that cannot finish stops the worker
        table_recovery.on_failure = lambda reason: stop_worker(svc, reason)

    # Made here, not in the agents, so the sweep can send its table changes through them (in order).
    trace_runner = BatchRunner(svc, "score-events", svc.traces)
    history_runner = BatchRunner(
        svc, "score-responses", svc.agents_history, svc.agent_history_hours, bundled_input=True
    )
    claim_runner = BatchRunner(svc, "score-claims", svc.claims, bundled_input=True)
    calibration_runner = BatchRunner(
        svc,
        "calibrate",
        svc.calibration_subjects,
        svc.calibration_groups,
        svc.calibration_hours,
        bundled_input=True,
    )

    alignment = attach_input_alignment(svc)  # None when alignment and the backlog gate are both off

    def score_trace_batch(records: list[InputRecord]) -> tuple[list[Record], dict[bytes, TraceState]]:
        scored = svc.trace_stage.process(records, traces.load, traces)
        if alignment is not None:
            alignment.after_batch(app, {TP(record.topic, record.partition) for record in records})
        return scored

    def later_stage(
        process: Callable[[list[InputRecord]], _Result],
    ) -> Callable[[list[InputRecord]], _Result]:
        """`process`, then, while input is held back for the later stages, a check whether it may flow
        again: at once rather than on the next tick, so that those stages do not run out of work."""

        def run(records: list[InputRecord]) -> _Result:
            result = process(records)
            if alignment is not None and alignment.holding:
                alignment.check(app)
            return result

        return run

    @app.agent(svc.input_topic, name="score-events")
    async def score_events(stream: faust.StreamT[bytes]) -> None:
        await trace_runner.run(stream, score_trace_batch, write_trace)

    @app.agent(svc.responses_topic, name="score-responses")
    async def score_responses(stream: faust.StreamT[bytes]) -> None:
        await history_runner.run(
            stream,
            later_stage(
                lambda records: svc.agent_stage.process(
                    records, histories["summary"].load, histories["hours"].load
                )
            ),
            _writer(histories),
        )

    @app.agent(svc.claims_topic, name="score-claims")
    async def score_claims(stream: faust.StreamT[bytes]) -> None:
        await claim_runner.run(
            stream,
            later_stage(
                lambda records: svc.claim_stage.process(records, claims.load, claims, claim_facts.get)
            ),
            write_claim,
        )

    @app.agent(svc.calibration_topic, name="calibrate")
    async def calibrate(stream: faust.StreamT[bytes]) -> None:
        await calibration_runner.run(
            stream,
            later_stage(lambda records: svc.calibration_stage.process(records, load_calibration)),
            _writer(calibration_states),
        )

    @app.timer(interval=settings.sweep_interval_seconds)
    async def sweep_expired_state() -> None:
        recovery: Recovery = app.tables.recovery  # type: ignore[attr-defined]
        if svc.health.fatal is not None or app.rebalancing or not recovery.completed.is_set():
            return  # partitions are moving or the worker is stopping: the next tick sweeps what it owns
        try:
            sweep(recovery)
        except Exception as exc:
            # A timer's exception crashes the app through Faust's graceful shutdown, whose streams may
            # still acknowledge what they deliver, with /healthz "ok" meanwhile. Stop as a failed batch
            # does: the sweep's table changes were not sent, and nothing is stored once `fatal` is set.
            stop_worker(svc, f"the expiry sweep failed: {exc!r}")

    @app.timer(interval=COMMIT_CHECK_SECONDS)
    async def watch_offset_commits() -> None:
        # An offset commit the broker keeps refusing would leave offsets where they are for ever while
        # /healthz says "ok", and every input since would be processed again after a restart, which
        # recreates a missing topic (the topics review: an internal topic deleted under the worker).
        running_for = app.consumer.commit_running_for()
        if running_for > settings.send_timeout_seconds:
            stop_worker(
                svc, f"an offset commit has not finished in {running_for:.0f} s (SEND_TIMEOUT_SECONDS)"
            )

    def sweep(recovery: Recovery) -> None:
        """Drop traces and claims past their TTL, agents' histories past HISTORY_RETENTION_HOURS and
        calibration scores, outcomes and groups past their windows (event time, this worker's
        partitions); then set `confidence_table_keys` and send the table changes."""
        svc.faults.check_sweep()
        started = time.perf_counter()
        expired_traces = [
            (key, state.partition)
            for key, state in traces.due(owned(recovery, svc.traces, svc.trace_stage.clock))
            if svc.trace_stage.expired(state)
        ]
        for key, partition in expired_traces:
            svc.traces.set_from(key, None, partition)
            traces.forget(key)
        expired_claims, rewrites = svc.claim_stage.sweep(
            [
                (key, node)
                for key, node in claims.due(owned(recovery, svc.claims, svc.claim_stage.clock))
                if svc.claim_stage.expired(key, node)
            ],
            svc.claims.__contains__,
            claims.load,
        )
        # Before the deletes: the claims they pointed at drop their entries.
        for key, write in rewrites.items():
            write_claim(key, write)
        for key in expired_claims:
            svc.claims.set_from(key, None, svc.claim_stage.partition_of(key))
            claims.forget(key)
            claim_facts.forget(key)
        expired_agents = _sweep_histories(svc, histories, recovery)
        unmatched = _sweep_calibration(svc, calibration_states, recovery)
        m.child(m.batch_seconds, "sweep", "process").observe(time.perf_counter() - started)
        for label, table in (
            ("traces", svc.traces),
            ("agent-history", svc.agents_history),
            ("agent-history-hours", svc.agent_history_hours),
            ("claims", svc.claims),
            ("calibration-subjects", svc.calibration_subjects),
            ("calibration-groups", svc.calibration_groups),
            ("calibration-hours", svc.calibration_hours),
        ):  # this worker's partitions: not the standby copies its store also holds
            m.table_keys.labels(label).set(table.keys_on(active_partitions(recovery, table)))
        if expired_traces or expired_claims or expired_agents:
            log.info(
                "swept %d expired traces, %d expired claims and %d agents' histories",
                len(expired_traces),
                len(expired_claims),
                expired_agents,
            )
        # Not tied to an input offset, but ordered with the batches that write the same tables: a batch
        # still waiting to send its changelog may hold an older value of a key deleted here.
        for runner in (trace_runner, history_runner, claim_runner, calibration_runner):
            runner.send_table_changes()
        if unmatched:
            log.info("swept %d outcomes whose score never arrived (unmatched)", unmatched)

    del score_events, score_responses, score_claims, calibrate, sweep_expired_state  # registered on the app
    return claim_facts


def _writer(
    states: Mapping[Any, DecodedStates[Any]],
) -> Callable[[bytes, HistoryWrite | CalibrationWrite], None]:
    """Writes a stage's (table, value or None to delete, partition) to the named table."""

    def write(key: bytes, write: HistoryWrite | CalibrationWrite) -> None:
        table = states[write.table]
        if write.value is None:
            table.table.set_from(key, None, write.partition)
            table.forget(key)
        else:
            table.table.set_from(key, table.encode(key, write.value), write.partition)

    return write


def owned(
    recovery: Recovery, table: SourcePartitionedTable, clock: ExpiryClock
) -> Callable[[int, datetime], bool]:
    """When the sweep may look at a key of `table`: its partition's event time passed the key's moment,
    and the partition is one this worker owns now. The store also holds standby copies of other
    workers' partitions (and a partition this worker had before keeps its old clock here): their
    owners write those changelog partitions, never this worker."""
    active = active_partitions(recovery, table)
    return lambda partition, moment: partition in active and clock.passed(partition, moment)


def active_partitions(recovery: Recovery, table: SourcePartitionedTable) -> set[int]:
    """The partitions of `table` this worker owns now (Faust's assignment; not its standby copies)."""
    return {tp.partition for tp in recovery.actives_for_table.get(table, ())}


def _sweep_histories(svc: Service, histories: dict[str, DecodedStates[Any]], recovery: Recovery) -> int:
    """Delete the history of agents silent past HISTORY_RETENTION_HOURS (summary and every chunk);
    return how many. Agent names need not be a fixed set (one per instance), so they must leave."""
    stage = svc.agent_stage
    summaries, hours = histories["summary"], histories["hours"]
    expired = [
        (key, summary)
        for key, summary in summaries.due(owned(recovery, svc.agents_history, stage.clock))
        if stage.expired(key, summary)
    ]
    for key, summary in expired:
        partition = stage.partition_of(key)
        for chunk_key in stage.expired_keys(summary):
            svc.agent_history_hours.set_from(chunk_key, None, partition)
            hours.forget(chunk_key)
        svc.agents_history.set_from(key, None, partition)
        summaries.forget(key)
        stage.forget_agent(summary.tenant_id, summary.agent_name)
    stage.forget_agents_outside(active_partitions(recovery, svc.agents_history))
    return len(expired)


def _sweep_calibration(svc: Service, states: dict[Table, DecodedStates[Any]], recovery: Recovery) -> int:
    """Expire scores past the join window, unmatched outcomes and idle groups; return the unmatched."""
    stage = svc.calibration_stage
    unmatched = 0
    subjects = states["subjects"]
    for key, entry in subjects.due(owned(recovery, svc.calibration_subjects, stage.clock)):
        kept, dropped = stage.sweep_subject(key, entry)
        unmatched += dropped
        if kept is None:
            svc.calibration_subjects.set_from(key, None, stage.partition_of(key))
            subjects.forget(key)
        elif kept is not entry:
            svc.calibration_subjects.set_from(key, subjects.encode(key, kept), stage.partition_of(key))
    svc.metrics.outcomes_unmatched.inc(unmatched)
    for key, group in states["groups"].due(owned(recovery, svc.calibration_groups, stage.clock)):
        if stage.group_expired(key, group):
            partition = stage.partition_of(key)
            for hour in group.hours:
                svc.calibration_hours.set_from(hour_key(group, hour), None, partition)
                states["hours"].forget(hour_key(group, hour))
            svc.calibration_groups.set_from(key, None, partition)
            states["groups"].forget(key)
            stage.forget_group(group)
    stage.forget_groups_outside(active_partitions(recovery, svc.calibration_groups))
    return unmatched
