"""Thin Faust agents: take a batch, hand it to its stage, send the outputs, write the tables, then ack.

At-least-once (README "Guarantees"): a batch's input offsets are acknowledged only after the broker
acknowledged every output it caused and then every changelog record of its state. Outputs go first: a
stage that finds an input already applied re-emits what it remembers, so state must never be stored
(in the changelog) ahead of outputs that could still be lost. If any step fails, the batch stays
unacknowledged and the worker exits with status 70 after one clear log line; its successor processes
the batch again (the stages are idempotent by input event id). Faust's own `take_events` would ack a
batch even when the body raised, which is why the agents use `noack_take` and ack by hand. The next
batch is processed while one waits for its acks (`BatchRunner`); the sends keep the batches' order.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

import faust
from pydantic import BaseModel

from streams.alignment import attach_input_alignment
from streams.app import AckedTable, Service, SourcePartitionedTable
from streams.batch_send import Outgoing, RecordBatches, output_records
from streams.faults import FaultPoint
from streams.scoring.claim_graph import ClaimNode, NeighbourFacts, neighbour_facts
from streams.scoring.claims import ClaimsConfig
from streams.stages import InputRecord, Record
from streams.stages.calibration import CalibrationWrite, Table, hour_key
from streams.stages.claims import ClaimWrite
from streams.stages.common import bundle, unbundle
from streams.stages.history import HistoryWrite
from streams.state import (
    AgentHistory,
    GroupCalibration,
    HistoryHour,
    HourBucket,
    SubjectEntry,
    TraceState,
)

__all__ = ["EXIT_BATCH_FAILED", "attach_agents"]

log = logging.getLogger(__name__)

EXIT_BATCH_FAILED = 70  # EX_SOFTWARE: a batch could not be completed; nothing of it was acknowledged

M = TypeVar("M", bound=BaseModel)


SweepAfter = Callable[[bytes, M], tuple[int, datetime] | None]


class DecodedStates(Generic[M]):
    """A table's values as models: decoded once, reused while the table still holds the same bytes.

    Each input loads several states (a claim input about 40 nodes) and pydantic's `validate_json` was
    most of the claim stage's time. The memory store returns the very bytes object that was written,
    so an identity check tells whether the cached model is still current (a restore or another
    writer leaves new bytes and the value is decoded again). Bounded: oldest entries are dropped.

    With `sweep_after` it also indexes, per key, the (partition, event time) before which the expiry
    sweep need not look at the value: one min-heap of (event time, key) per partition, so a sweep pops
    the keys that are due instead of visiting every key (at 300k calibration scores, a 1 s sweep
    interval spent a third of the worker's time walking the table). Values enter the index when
    written through `encode`; values restored from the changelog enter it by a full scan after each
    recovery (`restored`), the only other way values reach these tables.
    """

    def __init__(
        self,
        table: SourcePartitionedTable,
        model: type[M],
        max_entries: int = 1024,
        sweep_after: SweepAfter[M] | None = None,
    ) -> None:
        self.table = table
        self.model = model
        self.max_entries = max_entries
        self.sweep_after = sweep_after
        self._decoded: OrderedDict[bytes, tuple[bytes, M]] = OrderedDict()
        self._measured: dict[bytes, tuple[M, bytes]] = {}  # key -> (value, its encoding): `measure`
        # key -> (the bytes it was computed from, when the sweep must look again); every indexed key.
        self._due: dict[bytes, tuple[bytes, tuple[int, datetime] | None]] = {}
        # partition -> heap of (sweep moment, key). An entry counts only while `_due` holds the same
        # moment for its key; older ones (the key was rewritten or forgotten) are dropped when popped.
        self._moments: dict[int, list[tuple[datetime, bytes]]] = {}
        self._indexed = 0  # entries in all heaps, current or not
        self._scan_needed = True  # the table may hold values the index has not seen (start, restore)
        if sweep_after is not None and hasattr(table, "on_recover"):
            table.on_recover(self._on_recover)

    async def _on_recover(self) -> None:
        self.restored()

    def restored(self) -> None:
        """Values entered the table without `encode` (a changelog recovery): index them on the next sweep."""
        self._scan_needed = True

    def load(self, key: bytes) -> M | None:
        raw = self.table.get(key)
        if raw is None:
            self.forget(key)
            return None
        return self._model(key, raw)

    def stored_bytes(self, key: bytes) -> int:
        """Size of the value stored for `key`; 0 if none."""
        raw = self.table.get(key)
        return 0 if raw is None else len(raw)

    def measure(self, key: bytes, value: M) -> int:
        """Size of `value` encoded; the encoding is kept in case `value` is the one written next."""
        raw = value.model_dump_json().encode()
        self._measured[key] = (value, raw)
        if len(self._measured) > 64:  # values measured but never written (rejected inputs)
            self._measured.clear()
        return len(raw)

    def encode(self, key: bytes, value: M) -> bytes:
        """The bytes to write for `value` (remembered with it, so the next load skips decoding)."""
        measured = self._measured.pop(key, None)
        raw = (
            measured[1] if measured is not None and measured[0] is value else value.model_dump_json().encode()
        )
        self._remember(key, raw, value)
        if self.sweep_after is not None:
            self._note_due(key, raw, value)
        return raw

    def forget(self, key: bytes) -> None:
        """Drop `key` (its state left the table)."""
        self._decoded.pop(key, None)
        self._due.pop(key, None)
        self._measured.pop(key, None)

    def due(self, passed: Callable[[int, datetime], bool]) -> list[tuple[bytes, M]]:
        """The keys whose sweep moment `passed`, decoded; the others are not looked at.

        A key stays due (and is returned again by the next sweep) until it is rewritten or forgotten.
        """
        if self._scan_needed:
            self._scan()
        due: list[tuple[bytes, M]] = []
        seen: set[bytes] = set()
        for partition, heap in self._moments.items():
            returned: list[tuple[datetime, bytes]] = []
            while heap and passed(partition, heap[0][0]):
                moment, key = heapq.heappop(heap)
                self._indexed -= 1
                known = self._due.get(key)
                if known is None or known[1] != (partition, moment) or key in seen:
                    continue  # rewritten (a newer entry exists), forgotten, or a copy (moment A, B, A)
                seen.add(key)
                raw = self.table.get(key)
                if raw is None:  # left with a revoked partition
                    self.forget(key)
                elif raw is not known[0]:  # not written through encode: index what is there now
                    del self._due[key]  # its heap entry is gone: push the new moment even if equal
                    self._note_due(key, raw, self._model(key, raw))
                    seen.discard(key)  # and if that moment passed too, pop it in this sweep
                else:
                    due.append((key, self._model(key, raw)))
                    returned.append((moment, key))
            for entry in returned:
                heapq.heappush(heap, entry)
            self._indexed += len(returned)
        return due

    def _scan(self) -> None:
        """Index every value the table holds that was not written through `encode`; drop keys gone."""
        for key, raw in list(self.table.items()):
            known = self._due.get(key)
            if known is None or known[0] is not raw:
                self._note_due(key, raw, self._model(key, raw))
        if len(self._due) > len(self.table):
            self._due = {key: value for key, value in self._due.items() if key in self.table}
        self._scan_needed = False

    def _model(self, key: bytes, raw: bytes) -> M:
        hit = self._decoded.get(key)
        if hit is not None and hit[0] is raw:
            return hit[1]
        value = self.model.model_validate_json(raw)
        self._remember(key, raw, value)
        return value

    def _remember(self, key: bytes, raw: bytes, value: M) -> None:
        self._decoded[key] = (raw, value)
        self._decoded.move_to_end(key)
        while len(self._decoded) > self.max_entries:
            self._decoded.popitem(last=False)

    def _note_due(self, key: bytes, raw: bytes, value: M) -> None:
        assert self.sweep_after is not None, "the sweep index needs sweep_after"
        where = self.sweep_after(key, value)
        previous = self._due.get(key)
        self._due[key] = (raw, where)
        if where is None or (previous is not None and previous[1] == where):
            return  # never due, or already in the heap with this moment
        heapq.heappush(self._moments.setdefault(where[0], []), (where[1], key))
        self._indexed += 1
        if self._indexed > 2 * len(self._due) + 1024:  # mostly superseded entries: rebuild
            self._rebuild()

    def _rebuild(self) -> None:
        self._moments = {}
        for key, (_, where) in self._due.items():
            if where is not None:
                self._moments.setdefault(where[0], []).append((where[1], key))
        for heap in self._moments.values():
            heapq.heapify(heap)
        self._indexed = sum(len(heap) for heap in self._moments.values())


class ClaimFacts:
    """`neighbour_facts` of stored claim nodes, kept for many more claims than `DecodedStates` keeps nodes.

    A claim's score reads every claim that supports or contradicts it, so a new supporter of a claim
    with n supporters reads n nodes. Decoding them (the node cache holds 1,024) cost 85 ms per input at
    2,000 supporters; a facts tuple is small, and is computed again only when its node's bytes change
    (the same identity check as `DecodedStates`; the worker also drops an entry when it writes the node).
    """

    def __init__(self, nodes: DecodedStates[ClaimNode], cfg: ClaimsConfig, max_entries: int = 32_768) -> None:
        self.nodes = nodes
        self.cfg = cfg
        self.max_entries = max_entries
        self._facts: dict[bytes, tuple[bytes, NeighbourFacts | None]] = {}

    def get(self, key: bytes) -> NeighbourFacts | None:
        raw = self.nodes.table.get(key)
        if raw is None:
            self._facts.pop(key, None)
            return None
        hit = self._facts.get(key)
        if hit is not None and hit[0] is raw:
            return hit[1]
        facts = neighbour_facts(self.nodes.load(key), self.cfg)
        if hit is None and len(self._facts) >= self.max_entries:
            del self._facts[next(iter(self._facts))]  # the oldest entry
        self._facts[key] = (raw, facts)
        return facts

    def forget(self, key: bytes) -> None:
        self._facts.pop(key, None)


def _records(events: Sequence[faust.EventT[bytes]], bundled: bool) -> list[InputRecord]:
    records = [
        InputRecord(e.message.topic, e.message.partition, e.message.offset, e.message.timestamp, e.value)
        for e in events
    ]
    return [one for record in records for one in unbundle(record)] if bundled else records


def stop_worker(svc: Service, reason: str) -> None:
    """Report the failure, stop acknowledging anything, and exit with status 70 shortly after.

    The exit is immediate (no graceful shutdown): Faust's shutdown would end the agents' batch
    generators, after which its stream acks what it still delivers without processing it. The
    delay only lets a probe or a final scrape see the reason on /healthz and /readyz (503).
    """
    if svc.health.fatal is not None:
        return
    svc.health.fatal = reason
    log.critical(
        "stopping the worker: %s. The batch was not acknowledged; a restarted worker processes it again.",
        reason,
    )
    asyncio.get_running_loop().call_later(svc.settings.fatal_exit_delay_seconds, _exit_now)


def _exit_now() -> None:
    logging.shutdown()  # flush the log: os._exit skips the interpreter's own clean-up
    os._exit(EXIT_BATCH_FAILED)


async def _hold_unacknowledged() -> None:
    """Park the agent inside its batch until the process exits, so nothing more is acknowledged."""
    await asyncio.Event().wait()


@dataclass
class _Prepared:
    """A processed batch waiting for its sends: outputs first, then its state's changelog, then the ack."""

    number: int  # the agent's batch count (fault injection)
    events: Sequence[faust.EventT[bytes]]
    outputs: list[Outgoing]
    changelog: list[Outgoing]
    process_seconds: float


@dataclass(frozen=True)
class _InFlight:
    """A batch whose sends are under way; the next batch's sends wait on it."""

    outputs_acked: asyncio.Event
    task: asyncio.Task[None]


class BatchRunner:
    """Runs one stage's batches with the at-least-once order: outputs, then state, then ack.

    Batches overlap: while batch k waits for the broker's acks, batch k+1 is taken and processed (its
    state goes to the in-memory tables at once, so it reads k's). The sends keep two orders:

    - outputs(k+1) are sent once outputs(k) are acknowledged, so downstream sees batches in order and
      never k+1 without k;
    - changelog(k) is sent once outputs(k) and changelog(k-1) are acknowledged, and the offsets of k
      are acked after changelog(k): the changelog never holds a batch whose outputs could be lost.

    If any send of batch k fails, the worker stops and nothing from k on is acknowledged; its successor
    restores the tables from the changelog and processes those batches again (their acknowledged
    outputs again, with the same ids). At most `IN_FLIGHT` batches wait for their sends while the next
    one is processed. Changes the sweep makes to this runner's tables join the same sequence
    (`send_table_changes`), so the changelog receives every change in the order the tables saw it.
    Waiting for every ack before taking the next batch left each stage idle for them (17 ms per batch
    at half load) and every event waited for the batch before its own (docs/DECISIONS.md).
    """

    IN_FLIGHT = 2

    def __init__(self, svc: Service, agent: str, *tables: AckedTable, bundled_input: bool = False) -> None:
        self.svc = svc
        self.agent = agent
        self.tables = tables
        self.bundled_input = bundled_input  # an internal topic: records are bundles (stages.bundle)
        settings = svc.settings
        self.internal_topics = frozenset(settings.internal_topics)
        self.max_bundle_bytes = settings.producer_max_batch_bytes
        self._in_flight: list[_InFlight] = []  # oldest first; finished ones are dropped as new ones start

    async def run(
        self,
        stream: faust.StreamT[bytes],
        process: Callable[[list[InputRecord]], tuple[list[Record], Mapping[bytes, Any]]],
        write: Callable[[bytes, Any], None],
    ) -> None:
        settings = self.svc.settings
        try:
            take = settings.internal_batch_records if self.bundled_input else settings.batch_size
            async for events in stream.noack_take(take, within=settings.batch_within_seconds):
                if self.svc.health.fatal is not None:
                    await _hold_unacknowledged()  # another agent failed: acknowledge nothing more
                try:
                    prepared = self._prepare(events, process, write)
                except Exception as exc:  # a bug outside the per-record guard: never ack, stop
                    stop_worker(self.svc, f"{self.agent} failed a batch of {len(events)}: {exc!r}")
                    await _hold_unacknowledged()
                while len(waiting := self._waiting()) >= self.IN_FLIGHT:
                    await waiting[0].task
                self._start(prepared, stream)
        except Exception as exc:
            # Faust's own stream machinery failed. A restarted agent would resume after records nobody
            # acknowledged, so stop instead and let a successor re-read them from the committed offset.
            self.svc.health.agent_crashed(self.agent)
            stop_worker(self.svc, f"agent {self.agent} crashed: {exc!r}")
            await _hold_unacknowledged()
        finally:
            # Stopping (or crashed): batches still in flight are not acknowledged; they are processed again.
            for batch in self._in_flight:
                batch.task.cancel()

    def send_table_changes(self) -> None:
        """Send what was written to this runner's tables outside a batch (the sweep), after the batches
        in flight and before the next: a batch prepared later may write the same keys again."""
        changelog = [record for table in self.tables for record in table.take_changelog()]
        if changelog:
            self._start(_Prepared(0, (), [], changelog, 0.0), None)

    def _waiting(self) -> list[_InFlight]:
        """The batches whose sends are not done yet (the finished ones are forgotten here)."""
        self._in_flight = [b for b in self._in_flight if not b.task.done()]
        return self._in_flight

    def _start(self, batch: _Prepared, stream: faust.StreamT[bytes] | None) -> None:
        waiting = self._waiting()
        before = waiting[-1] if waiting else None  # None: everything before is acknowledged
        outputs_acked = asyncio.Event()
        task = asyncio.create_task(self._complete(stream, batch, outputs_acked, before))
        waiting.append(_InFlight(outputs_acked, task))

    def _prepare(
        self,
        events: Sequence[faust.EventT[bytes]],
        process: Callable[[list[InputRecord]], tuple[list[Record], Mapping[bytes, Any]]],
        write: Callable[[bytes, Any], None],
    ) -> _Prepared:
        """Process the batch and write its state to the in-memory tables (no await: nothing interleaves)."""
        started = time.perf_counter()
        number = self.svc.faults.next_batch(self.agent)
        outputs, states = process(_records(events, self.bundled_input))
        outputs = bundle(outputs, self.internal_topics, self.max_bundle_bytes)
        for key, state in states.items():
            write(key, state)
        # Taken from every table at once: this batch's records, and any a sweep left since the last batch.
        changelog = [record for table in self.tables for record in table.take_changelog()]
        return _Prepared(number, events, output_records(outputs), changelog, time.perf_counter() - started)

    async def _complete(
        self,
        stream: faust.StreamT[bytes] | None,
        batch: _Prepared,
        outputs_acked: asyncio.Event,
        before: _InFlight | None,
    ) -> None:
        """Send the outputs, then the changelog, each in the order described above; then ack."""
        m = self.svc.metrics
        try:
            if before is not None:
                await before.outputs_acked.wait()
            started = time.perf_counter()
            self._inject("send", batch.number)
            await self._acknowledged(await self.sender().send(batch.outputs))
            outputs_acked.set()
            sent = time.perf_counter()
            if before is not None:
                await before.task  # its changelog is acknowledged (it never returns if it failed)
            self._inject("table", batch.number)
            await self._acknowledged(await self.sender().send(batch.changelog))
            if stream is None:
                return  # the sweep's table changes: no input to acknowledge
            m.child(m.batch_seconds, self.agent, "process").observe(batch.process_seconds)
            m.child(m.batch_seconds, self.agent, "outputs").observe(sent - started)
            m.child(m.batch_seconds, self.agent, "state").observe(time.perf_counter() - sent)
            for event in batch.events:
                await stream.ack(event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure of the batch (acks included): stop with a clear error
            stop_worker(self.svc, f"{self.agent} failed a batch of {len(batch.events)}: {exc!r}")
            await _hold_unacknowledged()

    def sender(self) -> RecordBatches:
        return RecordBatches.of(self.svc.app)

    async def _acknowledged(self, futures: Sequence[Awaitable[Any]]) -> None:
        if futures:
            await asyncio.wait_for(asyncio.gather(*futures), self.svc.settings.send_timeout_seconds)

    def _inject(self, point: FaultPoint, batch: int) -> None:
        self.svc.faults.check(self.agent, point, batch)


def attach_agents(svc: Service) -> ClaimFacts:
    """Register the four stage agents and the state sweeps on `svc.app`; return the claim agent's
    neighbour facts cache, which the claim view reads too (same event loop, nothing awaited inside)."""
    app, settings = svc.app, svc.settings
    calibration = svc.calibration_stage
    traces = DecodedStates(svc.traces, TraceState, sweep_after=svc.trace_stage.sweep_after)
    histories: dict[str, DecodedStates[Any]] = {
        "summary": DecodedStates(svc.agents_history, AgentHistory),
        "hours": DecodedStates(svc.agent_history_hours, HistoryHour),
    }
    claims = DecodedStates(svc.claims, ClaimNode, sweep_after=svc.claim_stage.sweep_after)
    claim_facts = ClaimFacts(claims, svc.configs.claims)
    calibration_states: dict[Table, DecodedStates[Any]] = {
        # A score is read again only when its outcome arrives: caching its model would only hold memory.
        "subjects": DecodedStates(
            svc.calibration_subjects,
            SubjectEntry,
            max_entries=64,
            sweep_after=calibration.subject_sweep_after,
        ),
        "groups": DecodedStates(
            svc.calibration_groups, GroupCalibration, sweep_after=calibration.group_sweep_after
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

    alignment = attach_input_alignment(svc)  # None when INPUT_ALIGNMENT_MAX_LEAD_HOURS=0

    def score_trace_batch(records: list[InputRecord]) -> tuple[list[Record], dict[bytes, TraceState]]:
        scored = svc.trace_stage.process(records, traces.load, traces)
        if alignment is not None:
            alignment.after_batch(app, {record.partition for record in records})
        return scored

    @app.agent(svc.input_topic, name="score-events")
    async def score_events(stream: faust.StreamT[bytes]) -> None:
        await trace_runner.run(stream, score_trace_batch, write_trace)

    @app.agent(svc.responses_topic, name="score-responses")
    async def score_responses(stream: faust.StreamT[bytes]) -> None:
        await history_runner.run(
            stream,
            lambda records: svc.agent_stage.process(
                records, histories["summary"].load, histories["hours"].load
            ),
            _writer(histories),
        )

    @app.agent(svc.claims_topic, name="score-claims")
    async def score_claims(stream: faust.StreamT[bytes]) -> None:
        await claim_runner.run(
            stream,
            lambda records: svc.claim_stage.process(records, claims.load, claims, claim_facts.get),
            write_claim,
        )

    @app.agent(svc.calibration_topic, name="calibrate")
    async def calibrate(stream: faust.StreamT[bytes]) -> None:
        await calibration_runner.run(
            stream,
            lambda records: svc.calibration_stage.process(records, load_calibration),
            _writer(calibration_states),
        )

    @app.timer(interval=settings.sweep_interval_seconds)
    async def sweep_expired_state() -> None:
        """Drop traces idle past their TTL and claims past theirs (event time, this worker's partitions)."""
        started = time.perf_counter()
        expired_traces = [
            (key, state.partition)
            for key, state in traces.due(svc.trace_stage.clock.passed)
            if svc.trace_stage.expired(state)
        ]
        for key, partition in expired_traces:
            svc.traces.set_from(key, None, partition)
            traces.forget(key)
        expired_claims = [
            key
            for key, node in claims.due(svc.claim_stage.clock.passed)
            if svc.claim_stage.expired(key, node)
        ]
        for key in expired_claims:
            svc.claims.set_from(key, None, svc.claim_stage.partition_of(key))
            claims.forget(key)
            claim_facts.forget(key)
        unmatched = _sweep_calibration(svc, calibration_states)
        m = svc.metrics
        m.child(m.batch_seconds, "sweep", "process").observe(time.perf_counter() - started)
        m.table_keys.labels("traces").set(len(svc.traces))
        m.table_keys.labels("agent-history").set(len(svc.agents_history))
        m.table_keys.labels("agent-history-hours").set(len(svc.agent_history_hours))
        m.table_keys.labels("claims").set(len(svc.claims))
        m.table_keys.labels("calibration-subjects").set(len(svc.calibration_subjects))
        m.table_keys.labels("calibration-groups").set(len(svc.calibration_groups))
        m.table_keys.labels("calibration-hours").set(len(svc.calibration_hours))
        if expired_traces or expired_claims:
            log.info(
                "swept %d expired traces and %d expired claims", len(expired_traces), len(expired_claims)
            )
        # Not tied to an input offset, but ordered with the batches that write the same tables: a batch
        # still waiting to send its changelog may hold an older value of a key deleted here.
        for runner in (trace_runner, claim_runner, calibration_runner):
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


def _sweep_calibration(svc: Service, states: dict[Table, DecodedStates[Any]]) -> int:
    """Expire scores past the join window, unmatched outcomes and idle groups; return the unmatched."""
    stage = svc.calibration_stage
    unmatched = 0
    subjects = states["subjects"]
    for key, entry in subjects.due(stage.clock.passed):
        kept, dropped = stage.sweep_subject(key, entry)
        unmatched += dropped
        if kept is None:
            svc.calibration_subjects.set_from(key, None, stage.partition_of(key))
            subjects.forget(key)
        elif kept is not entry:
            svc.calibration_subjects.set_from(key, subjects.encode(key, kept), stage.partition_of(key))
    svc.metrics.outcomes_unmatched.inc(unmatched)
    for key, group in states["groups"].due(stage.clock.passed):
        if stage.group_expired(key, group):
            partition = stage.partition_of(key)
            for hour in group.hours:
                svc.calibration_hours.set_from(hour_key(group, hour), None, partition)
                states["hours"].forget(hour_key(group, hour))
            svc.calibration_groups.set_from(key, None, partition)
            states["groups"].forget(key)
    return unmatched
