"""The agents' batch order without Kafka: overlapping batches keep outputs, changelog and acks in order.

A fake stream yields batches, a fake sender records what is sent and returns futures the test resolves
one at a time, so each step of `BatchRunner` can be observed: what is sent, processed and acked when.
The same order through the real broker is what test_reliability.py checks under injected failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import streams.batch_runner
from streams import metrics
from streams.batch_runner import BatchRunner
from streams.batch_send import Outgoing
from streams.config import load_settings
from streams.faults import FaultInjector
from streams.health import Health
from streams.stages import InputRecord, Record


@dataclass(frozen=True)
class _Message:
    topic: str
    partition: int
    offset: int
    timestamp: float
    key: bytes | None = None


@dataclass(frozen=True)
class _Event:
    message: _Message
    value: bytes


class _Stream:
    """Yields the given batches, then waits (a stream never ends by itself); records acks."""

    def __init__(self, batches: list[list[_Event]]) -> None:
        self.batches = batches
        self.acked: list[int] = []

    async def noack_take(self, max_: int, within: float) -> AsyncIterator[list[_Event]]:
        for batch in self.batches:
            yield batch
        await asyncio.Event().wait()

    async def ack(self, event: _Event) -> None:
        self.acked.append(event.message.offset)


@dataclass
class _Sender:
    """Records each send as (what, batch) and hands back one future the test resolves."""

    sent: list[tuple[str, str]] = field(default_factory=list)
    values: dict[tuple[str, str], list[bytes]] = field(default_factory=dict)  # each send's values
    pending: dict[tuple[str, str], asyncio.Future[Any]] = field(default_factory=dict)
    where: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)

    async def send(self, records: Iterable[Outgoing]) -> list[asyncio.Future[Any]]:
        records = list(records)
        if not records:
            return []
        first = records[0].value or b""
        label = ("changelog" if first.startswith(b"state") else "outputs", first.decode().split("-")[1])
        self.sent.append(label)
        self.values[label] = [r.value or b"" for r in records]
        self.where[label] = (records[0].topic, records[0].partition or 0)
        future = asyncio.get_running_loop().create_future()
        self.pending[label] = future
        return [future]

    def ack(self, what: str, batch: int | str, offset: int = 0) -> None:
        """The broker's answer for the send: aiokafka's RecordMetadata has these fields (and more)."""
        topic, partition = self.where[(what, str(batch))]
        self.pending[(what, str(batch))].set_result(
            SimpleNamespace(topic=topic, partition=partition, offset=offset)
        )

    def fail(self, what: str, batch: int) -> None:
        self.pending[(what, str(batch))].set_exception(RuntimeError("broker refused"))


class _Table:
    def __init__(self) -> None:
        self.unsent: list[Outgoing] = []

    def take_changelog(self) -> list[Outgoing]:
        unsent, self.unsent = self.unsent, []
        return unsent


class _Runner(BatchRunner):
    def __init__(self, svc: Any, table: _Table, sender: _Sender) -> None:
        super().__init__(svc, "test-agent", table)  # type: ignore[arg-type]
        self._sender = sender

    def sender(self) -> Any:
        return self._sender


def _batch(number: int, size: int = 2) -> list[_Event]:
    return [
        _Event(_Message("in", 0, number * 10 + i, 1.0), f"event-{number}-{i}".encode()) for i in range(size)
    ]


async def _settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait for `condition` (e.g. the exit stop_worker schedules with call_later), failing after `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """stop_worker's delayed os._exit, recorded instead."""
    calls: list[str] = []
    monkeypatch.setattr(streams.batch_runner, "_exit_now", lambda: calls.append("exit"))
    return calls


@dataclass
class _Rig:
    """A runner on a fake stream and sender, running in a task; what it processed, sent and acked."""

    svc: Any
    stream: _Stream
    table: _Table
    sender: _Sender
    runner: _Runner
    processed: list[str]


def _service(send_timeout_seconds: float = 30.0) -> Any:
    """What a runner reads of the worker's service: settings (exit at once), metrics, faults, health."""
    settings = load_settings().model_copy(
        update={"fatal_exit_delay_seconds": 0.0, "send_timeout_seconds": send_timeout_seconds}
    )
    registry = CollectorRegistry()
    return SimpleNamespace(
        settings=settings,
        registry=registry,
        metrics=metrics.create(registry),
        faults=FaultInjector(),
        health=Health(),
        internal_ends={},
    )


@contextlib.asynccontextmanager
async def _running(
    batches: int,
    output_topic: str = "out",
    stream: _Stream | None = None,
    fail_processing: str | None = None,
    send_timeout_seconds: float = 30.0,
) -> AsyncIterator[_Rig]:
    svc = _service(send_timeout_seconds)
    table, sender = _Table(), _Sender()
    rig = _Rig(
        svc,
        stream or _Stream([_batch(n) for n in range(1, batches + 1)]),
        table,
        sender,
        _Runner(svc, table, sender),
        [],
    )

    def process(records: list[InputRecord]) -> tuple[list[Record], dict[bytes, str]]:
        number = (records[0].value or b"").decode().split("-")[1]
        if number == fail_processing:
            raise ValueError(f"a bug while processing batch {number}")
        rig.processed.append(number)
        # Its input was produced 2 s before: the latency histogram must count from there to the ack.
        answers = ("TEST_SCORED", time.time() - 2.0)
        output = Record(output_topic, b"k", f"output-{number}".encode(), partition=1, latency_from=answers)
        return [output], {b"k": number}

    def write(key: bytes, number: str) -> None:
        table.unsent.append(Outgoing("changelog", key, f"state-{number}".encode(), 0))

    task = asyncio.create_task(rig.runner.run(rig.stream, process, write))  # type: ignore[arg-type]
    try:
        await _settle()
        yield rig
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_overlapping_batches_send_outputs_then_changelog_in_order_then_ack(exits: list[str]) -> None:
    async with _running(batches=3) as rig:
        svc, stream, sender = rig.svc, rig.stream, rig.sender
        # Batch 2 is processed while batch 1's outputs wait for their ack; nothing of 2 is sent yet.
        assert rig.processed[:2] == ["1", "2"]
        assert sender.sent == [("outputs", "1")]
        sender.ack("outputs", 1)
        await _settle()
        assert set(sender.sent) == {("outputs", "1"), ("outputs", "2"), ("changelog", "1")}
        assert stream.acked == []  # batch 1's state is not acknowledged yet
        sender.ack("outputs", 2)
        await _settle()
        assert ("changelog", "2") not in sender.sent  # waits for changelog 1
        assert ("outputs", "3") not in sender.sent  # two batches in flight already: 3 waits for 1
        sender.ack("changelog", 1)
        await _settle()
        assert stream.acked == [10, 11]
        assert set(sender.sent[-2:]) == {("changelog", "2"), ("outputs", "3")}
        sender.ack("outputs", 3)
        sender.ack("changelog", 2)
        await _settle()
        sender.ack("changelog", 3)
        await _settle()
        assert stream.acked == [10, 11, 20, 21, 30, 31]
        assert svc.health.fatal is None and exits == []


async def test_a_failed_send_stops_the_worker_and_acknowledges_nothing_after_it(exits: list[str]) -> None:
    async with _running(batches=3) as rig:
        svc, stream, sender = rig.svc, rig.stream, rig.sender
        sender.ack("outputs", 1)
        await _settle()
        sender.fail("outputs", 2)  # batch 2's outputs refused; batch 1's changelog still pending
        await _settle()
        sender.ack("changelog", 1)
        await _settle()
        await _until(lambda: exits == ["exit"])  # the exit is scheduled with call_later(0)
        assert svc.health.fatal is not None and "broker refused" in svc.health.fatal
        assert exits == ["exit"]
        assert stream.acked == [10, 11]  # batch 1 completed before the failure; nothing after it
        assert ("changelog", "2") not in sender.sent and ("outputs", "3") not in sender.sent


async def test_a_broker_answer_that_ends_cancelled_is_a_failed_batch(exits: list[str]) -> None:
    """A send's future that ends cancelled while the runner is not stopping was read as a shutdown:
    the batch's task ended quietly, no one stopped the worker, and the runner ended cancelled, which
    Faust takes for a rebalance and restarts the agent after input nobody acknowledged."""
    async with _running(batches=3) as rig:
        rig.sender.pending[("outputs", "1")].cancel()
        await _settle()
        await _until(lambda: exits == ["exit"])
        assert rig.svc.health.fatal is not None and "CancelledError" in rig.svc.health.fatal
        assert rig.stream.acked == []
        assert ("changelog", "1") not in rig.sender.sent


async def test_a_changelog_failure_leaves_the_batch_and_later_ones_unacknowledged(exits: list[str]) -> None:
    async with _running(batches=2) as rig:
        svc, stream, sender = rig.svc, rig.stream, rig.sender
        sender.ack("outputs", 1)
        await _settle()
        sender.ack("outputs", 2)
        sender.fail("changelog", 1)
        await _settle()
        await _until(lambda: exits == ["exit"])
        assert svc.health.fatal is not None
        assert stream.acked == []
        assert ("changelog", "2") not in sender.sent  # never stored ahead of the batch before it


async def test_a_batch_whose_processing_raises_is_never_acknowledged_and_stops_the_worker(
    exits: list[str],
) -> None:
    """A bug outside the per-record guard: skipping the batch would let batch 3's ack commit past it."""
    async with _running(batches=3, fail_processing="2") as rig:
        svc, stream, sender = rig.svc, rig.stream, rig.sender
        await _until(lambda: exits == ["exit"])
        assert svc.health.fatal is not None and "a bug while processing batch 2" in svc.health.fatal
        sender.ack("outputs", 1)
        await _settle()
        sender.ack("changelog", 1)  # batch 1, processed before, still completes
        await _settle()
        assert rig.processed == ["1"]  # batch 3 is never taken: the agent holds inside batch 2
        assert stream.acked == [10, 11]
        assert sender.sent == [("outputs", "1"), ("changelog", "1")]


async def test_a_send_the_broker_never_answers_stops_the_worker_after_the_send_timeout(
    exits: list[str],
) -> None:
    async with _running(batches=1, send_timeout_seconds=0.05) as rig:
        await _until(lambda: exits == ["exit"])  # no ack ever comes
        assert rig.svc.health.fatal is not None and "TimeoutError" in rig.svc.health.fatal
        assert rig.stream.acked == []


async def test_once_another_agent_failed_this_one_processes_and_acknowledges_nothing_more(
    exits: list[str],
) -> None:
    stream = _GatedStream(first=1)
    async with _running(batches=0, stream=stream) as rig:
        rig.svc.health.fatal = "score-claims failed a batch of 3: ..."  # set by another agent
        stream.go.set()  # batch 2 arrives after the failure
        rig.sender.ack("outputs", 1)
        await _settle()
        rig.sender.ack("changelog", 1)
        await _settle()
        assert rig.processed == ["1"]
        assert ("outputs", "2") not in rig.sender.sent
        assert rig.stream.acked == [10, 11]  # batch 1 was processed before the failure


async def test_the_sweeps_table_changes_are_sent_in_order_with_the_batches(exits: list[str]) -> None:
    async with _running(batches=2) as rig:
        svc, stream, sender = rig.svc, rig.stream, rig.sender
        assert rig.processed == ["1", "2"]
        # A sweep deletes a key now: batch 2's changelog (taken before) holds an older value of it.
        rig.table.unsent.append(Outgoing("changelog", b"k", b"state-sweep", 0))
        rig.runner.send_table_changes()
        for step in [("outputs", 1), ("outputs", 2), ("changelog", 1)]:
            sender.ack(*step)
            await _settle()
        assert ("changelog", "sweep") not in sender.sent
        sender.ack("changelog", 2)
        await _settle()
        assert sender.sent[-1] == ("changelog", "sweep")
        sender.ack("changelog", "sweep")
        await _settle()
        assert stream.acked == [10, 11, 20, 21] and svc.health.fatal is None


async def test_a_failed_sweep_send_is_reported_as_the_sweeps(exits: list[str]) -> None:
    """A sweep's table changes that the broker refused were reported as "failed a batch of 0"."""
    async with _running(batches=0) as rig:
        rig.table.unsent.append(Outgoing("changelog", b"k", b"state-sweep", 0))
        rig.runner.send_table_changes()
        await _settle()
        rig.sender.pending[("changelog", "sweep")].set_exception(RuntimeError("broker refused"))
        await _until(lambda: exits == ["exit"])
        assert rig.svc.health.fatal is not None
        assert (
            "failed the expiry sweep's table changes: RuntimeError('broker refused')" in rig.svc.health.fatal
        )


async def test_a_sweep_while_a_processed_batch_waits_for_a_slot_goes_after_that_batch(
    exits: list[str],
) -> None:
    """Batch 3 wrote its state in memory and waits (two batches in flight); a sweep then changes the
    same key. The changelog must get batch 3's value first and the sweep's after it, as memory did."""
    async with _running(batches=3) as rig:
        svc, stream, sender = rig.svc, rig.stream, rig.sender
        assert rig.processed == ["1", "2", "3"] and sender.sent == [("outputs", "1")]
        rig.table.unsent.append(Outgoing("changelog", b"k", b"state-sweep", 0))
        rig.runner.send_table_changes()
        await _settle()
        for step in [("outputs", 1), ("outputs", 2), ("changelog", 1), ("outputs", 3), ("changelog", 2)]:
            sender.ack(*step)
            await _settle()
        assert sender.sent[-1] == ("changelog", "3")
        assert sender.values["changelog", "3"] == [b"state-3", b"state-sweep"]
        sender.ack("changelog", 3)
        await _settle()
        assert stream.acked == [10, 11, 20, 21, 30, 31] and svc.health.fatal is None


async def test_after_a_failed_batch_the_sweep_stores_nothing(exits: list[str]) -> None:
    async with _running(batches=1) as rig:
        rig.sender.fail("outputs", 1)
        await _settle()
        assert rig.svc.health.fatal is not None
        rig.table.unsent.append(Outgoing("changelog", b"k", b"state-sweep", 0))
        rig.runner.send_table_changes()
        await _settle()
        assert rig.sender.sent == [("outputs", "1")]


async def test_how_far_the_worker_wrote_each_internal_partition_is_noted_on_the_ack(exits: list[str]) -> None:
    internal = load_settings().responses_topic
    async with _running(batches=2, output_topic=internal) as rig:
        assert rig.sender.sent == [("outputs", "1")]
        assert rig.svc.internal_ends == {}  # not before the broker acknowledged it
        rig.sender.ack("outputs", 1, offset=41)
        await _settle()
        assert rig.svc.internal_ends == {(internal, 1): 42}
        rig.sender.ack("changelog", 1)
        await _settle()
        rig.sender.ack("outputs", 2, offset=42)
        await _settle()
        assert rig.svc.internal_ends == {(internal, 1): 43}
        rig.sender.ack("changelog", 2)
        await _settle()
    async with _running(batches=1) as rig:  # not an internal topic: nothing to note
        rig.sender.ack("outputs", 1, offset=7)
        await _settle()
        assert rig.svc.internal_ends == {}
        rig.sender.ack("changelog", 1)
        await _settle()


async def test_latency_is_observed_when_the_broker_acknowledges_the_outputs(exits: list[str]) -> None:
    """The histogram is the input's producer timestamp to the output's send: it was observed when the
    output was made, leaving out the send, the ack and the wait behind the batch before."""
    async with _running(batches=1) as rig:

        def latency(sample: str) -> float | None:
            return rig.svc.registry.get_sample_value(  # type: ignore[no-any-return]
                f"confidence_processing_latency_seconds_{sample}", {"event_type": "TEST_SCORED"}
            )

        assert rig.sender.sent == [("outputs", "1")]
        assert latency("count") is None  # processed and sent, not acknowledged yet
        await asyncio.sleep(0.3)
        rig.sender.ack("outputs", 1)
        await _settle()
        assert latency("count") == 1.0
        seconds = latency("sum")
        assert seconds is not None and seconds >= 2.3


class _GatedStream(_Stream):
    """Yields batches 1 to `first`, then batch `first + 1` only once `go` is set (after a sweep)."""

    def __init__(self, first: int) -> None:
        super().__init__([])
        self.first = first
        self.go = asyncio.Event()

    async def noack_take(self, max_: int, within: float) -> AsyncIterator[list[_Event]]:
        for number in range(1, self.first + 1):
            yield _batch(number)
        await self.go.wait()
        yield _batch(self.first + 1)
        await asyncio.Event().wait()


def _sweep(rig: _Rig) -> None:
    """The expiry sweep deletes key k: a tombstone no input will replay."""
    rig.table.unsent.append(Outgoing("changelog", b"k", b"state-sweep", 0))
    rig.runner.send_table_changes()


async def test_the_batch_after_a_sweep_sends_outputs_once_the_sweeps_tombstone_is_stored(
    exits: list[str],
) -> None:
    """Batch 2, processed on the swept table, had its outputs acknowledged while the tombstone was
    unsent: had it been lost, the successor would restore the old value and score batch 2's inputs
    again, differently, under the same output ids."""
    stream = _GatedStream(first=1)
    async with _running(batches=0, stream=stream) as rig:
        sender = rig.sender
        sender.ack("outputs", 1)  # batch 1's changelog is on its way
        await _settle()
        _sweep(rig)  # a batch of its own, after batch 1
        stream.go.set()
        await _settle()
        sender.ack("changelog", 1)
        await _settle()
        assert ("changelog", "sweep") in sender.sent
        assert ("outputs", "2") not in sender.sent  # the tombstone is not stored yet
        sender.ack("changelog", "sweep")
        await _settle()
        assert ("outputs", "2") in sender.sent
        assert exits == []


async def test_a_sweep_joining_a_waiting_batch_holds_the_next_batchs_outputs_too(exits: list[str]) -> None:
    """The sweep's changes join batch 3's changelog while it waits for a slot; batch 4, processed
    after the sweep, must wait for that changelog, not only for batch 3's outputs."""
    stream = _GatedStream(first=3)
    async with _running(batches=0, stream=stream) as rig:
        sender = rig.sender
        assert rig.processed == ["1", "2", "3"]  # 1 and 2 in flight, 3 waits for a slot
        _sweep(rig)
        stream.go.set()
        for step in (("outputs", 1), ("outputs", 2), ("changelog", 1), ("changelog", 2), ("outputs", 3)):
            sender.ack(*step)
            await _settle()
        assert rig.processed == ["1", "2", "3", "4"]
        assert sender.values[("changelog", "3")] == [b"state-3", b"state-sweep"]
        assert ("outputs", "4") not in sender.sent  # batch 3's changelog carries the tombstone
        sender.ack("changelog", 3)
        await _settle()
        assert ("outputs", "4") in sender.sent
        assert exits == []


async def test_a_send_that_cannot_even_be_queued_stops_the_worker_after_the_send_timeout(
    exits: list[str],
) -> None:
    """Queuing a record batch waits for its partition's earlier one to drain, bounded only by the
    producer's request timeout (Faust's: 20 minutes): outside SEND_TIMEOUT_SECONDS, the agent stalled
    that long while /healthz said ok (found by review)."""
    async with _running(batches=1, send_timeout_seconds=0.05) as rig:

        async def never_queued(records: Any) -> list[Any]:
            await asyncio.Event().wait()
            return []

        rig.sender.send = never_queued  # type: ignore[method-assign]
        rig.sender.ack("outputs", 1)  # the batch's outputs are answered: its changelog is never queued
        await _until(lambda: exits == ["exit"])
        assert rig.svc.health.fatal is not None and "TimeoutError" in rig.svc.health.fatal
        assert rig.stream.acked == []


async def test_a_shutdown_while_a_send_waits_for_its_ack_leaves_no_unretrieved_exception(
    exits: list[str],
) -> None:
    """Cancelling the wait for the broker's answers (a worker's shutdown) left the gathered answers'
    CancelledError unread, and asyncio logged "exception was never retrieved" for it."""
    reported: list[str] = []
    loop = asyncio.get_running_loop()
    gc.collect()  # what earlier tests on this loop left is reported to their handler, not this one
    before = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context["message"]))
    try:
        async with _running(batches=0) as rig:
            unanswered = loop.create_future()
            waiting = asyncio.create_task(rig.runner._acknowledged([unanswered], 30.0))
            await _settle()
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            assert unanswered.cancelled()
            del waiting  # its CancelledError's traceback holds the gathered future
            gc.collect()  # asyncio reports an unread exception when the future is collected
        assert reported == []
    finally:
        loop.set_exception_handler(before)
