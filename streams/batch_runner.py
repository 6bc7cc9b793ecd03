"""Runs a stage agent's batches: process, send the outputs, write the tables, then acknowledge.

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
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import faust

from streams.app import AckedTable, Service
from streams.batch_send import Outgoing, RecordBatches, output_records
from streams.faults import FaultPoint
from streams.stages import InputRecord, Record
from streams.stages.common import bundle, unbundle

__all__ = ["EXIT_BATCH_FAILED", "BatchRunner", "stop_worker"]

log = logging.getLogger(__name__)

EXIT_BATCH_FAILED = 70  # EX_SOFTWARE: a batch could not be completed; nothing of it was acknowledged


def _records(events: Sequence[faust.EventT[bytes]], bundled: bool) -> list[InputRecord]:
    records = [
        InputRecord(
            e.message.topic,
            e.message.partition,
            e.message.offset,
            e.message.timestamp,
            e.value,
            e.message.key,
        )
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
        "stopping the worker: %s. Nothing unprocessed is acknowledged; a restarted worker resumes from "
        "the last committed offsets.",
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
    latency_from: list[tuple[str, float]]  # of its outputs (Record.latency_from), observed on their ack
    # It carries the sweep's table changes: no input replays those after a crash, so the next batch,
    # computed on the swept tables, sends its outputs only once this changelog is acknowledged too.
    carries_sweep: bool = False


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
    (`send_table_changes`), so the changelog receives every change in the order the tables saw it;
    and the batch after them sends its outputs only once they are acknowledged: no input replays a
    sweep, so outputs computed on swept tables must never outlive a lost tombstone. Waiting for every
    ack before taking the next batch left each stage idle for them (17 ms per batch at half load) and
    every event waited for the batch before its own (docs/DECISIONS.md).
    """

    IN_FLIGHT = 2

    def __init__(self, svc: Service, agent: str, *tables: AckedTable, bundled_input: bool = False) -> None:
        self.svc = svc
        self.agent = agent
        self.tables = tables
        self.bundled_input = bundled_input  # an internal topic: records are bundles (stages.common.bundle)
        settings = svc.settings
        self.internal_topics = frozenset(settings.internal_topics)
        self.max_bundle_bytes = settings.producer_max_batch_bytes
        self._in_flight: list[_InFlight] = []  # oldest first; finished ones are dropped as new ones start
        self._unstarted: _Prepared | None = None  # processed, its state in the tables, waiting for a slot

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
                    prepared = self._unstarted = self._prepare(events, process, write)
                except Exception as exc:  # a bug outside the per-record guard: never ack, stop
                    stop_worker(self.svc, f"{self.agent} failed a batch of {len(events)}: {exc!r}")
                    await _hold_unacknowledged()
                while len(waiting := self._waiting()) >= self.IN_FLIGHT:
                    await waiting[0].task
                self._unstarted = None
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
        in flight and before the next: a batch prepared later may write the same keys again. A batch
        already processed but waiting for a slot wrote before the sweep did: its changelog takes the
        sweep's records after its own, so the changelog keeps the order the tables saw."""
        if self.svc.health.fatal is not None:
            return  # a batch failed: nothing more is stored (what it wrote in memory included)
        changelog = [record for table in self.tables for record in table.take_changelog()]
        if not changelog:
            return
        if self._unstarted is not None:
            self._unstarted.changelog.extend(changelog)
            self._unstarted.carries_sweep = True
        else:
            self._start(_Prepared(0, (), [], changelog, 0.0, [], carries_sweep=True), None)

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
        latency_from = [r.latency_from for r in outputs if r.latency_from is not None]
        seconds = time.perf_counter() - started
        return _Prepared(number, events, output_records(outputs), changelog, seconds, latency_from)

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
            self._note_internal_ends(await self._delivered(batch.outputs))
            if not batch.carries_sweep:
                outputs_acked.set()
            sent = time.perf_counter()
            acked_at = time.time()
            for event_type, received_at in batch.latency_from:
                m.child(m.processing_latency, event_type).observe(max(0.0, acked_at - received_at))
            if before is not None:
                await before.task  # its changelog is acknowledged (it never returns if it failed)
            self._inject("table", batch.number)
            await self._delivered(batch.changelog)
            outputs_acked.set()  # a batch carrying the sweep's changes lets the next one go only now
            if stream is None:
                return  # the sweep's table changes: no input to acknowledge
            m.child(m.batch_seconds, self.agent, "process").observe(batch.process_seconds)
            m.child(m.batch_seconds, self.agent, "outputs").observe(sent - started)
            m.child(m.batch_seconds, self.agent, "state").observe(time.perf_counter() - sent)
            for event in batch.events:
                await stream.ack(event)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # the runner stops: the batch stays unacknowledged and is processed again
            # A broker answer that ended cancelled while nobody stopped this batch: read as a shutdown,
            # the task would end quietly and Faust would restart the agent past unacknowledged input.
            await self._failed(batch, exc)
        except Exception as exc:  # any failure of the batch (acks included): stop with a clear error
            await self._failed(batch, exc)

    async def _failed(self, batch: _Prepared, exc: BaseException) -> None:
        what = f"a batch of {len(batch.events)}" if batch.events else "the expiry sweep's table changes"
        stop_worker(self.svc, f"{self.agent} failed {what}: {exc!r}")
        await _hold_unacknowledged()

    def sender(self) -> RecordBatches:
        return RecordBatches.of(self.svc.app)

    async def _delivered(self, records: Sequence[Outgoing]) -> list[Any]:
        """Send `records` and wait for the broker's answers, both within SEND_TIMEOUT_SECONDS.

        Queuing can wait too: a record batch waits for its partition's earlier one to drain, bounded
        only by the producer's request timeout (Faust's is 20 minutes), while /healthz said ok.
        """
        timeout = self.svc.settings.send_timeout_seconds
        started = time.monotonic()
        futures = await asyncio.wait_for(self.sender().send(records), timeout)
        return await self._acknowledged(futures, max(0.0, timeout - (time.monotonic() - started)))

    async def _acknowledged(self, futures: Sequence[Awaitable[Any]], timeout: float) -> list[Any]:
        """The broker's answers (aiokafka RecordMetadata, one per record batch), once all arrived."""
        if not futures:
            return []
        gathered = asyncio.gather(*futures)
        try:
            return list(await asyncio.wait_for(gathered, timeout))
        finally:
            # Cancelled while waiting (a shutdown, or the timeout), the gather ends with the children's
            # CancelledError, which nothing read: asyncio logged "exception was never retrieved".
            if gathered.done() and not gathered.cancelled():
                gathered.exception()

    def _note_internal_ends(self, acknowledged: list[Any]) -> None:
        """Remember how far this worker has written each internal partition (the input gate reads it)."""
        ends = self.svc.internal_ends
        for answer in acknowledged:
            if answer.topic in self.internal_topics:
                where = (answer.topic, answer.partition)
                # The batch's first record: a bundle is one record per (topic, partition) and batch.
                ends[where] = max(ends.get(where, 0), answer.offset + 1)

    def _inject(self, point: FaultPoint, batch: int) -> None:
        self.svc.faults.check(self.agent, point, batch)
