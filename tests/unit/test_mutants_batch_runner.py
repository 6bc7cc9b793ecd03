"""Mutation review (thirty-second round): what `test_batch_runner.py` left open in streams/batch_runner.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import streams.batch_runner
from streams.batch_runner import stop_worker
from streams.batch_send import Outgoing
from streams.config import load_settings
from streams.stages import InputRecord, Record
from tests.unit.test_batch_runner import (
    _batch,
    _Event,
    _Message,
    _Runner,
    _running,
    _Sender,
    _service,
    _settle,
    _Stream,
    _Table,
    _until,
)


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """stop_worker's delayed os._exit, recorded instead (as in test_batch_runner.py)."""
    calls: list[str] = []
    monkeypatch.setattr(streams.batch_runner, "_exit_now", lambda: calls.append("exit"))
    return calls


async def test_after_another_agent_failed_the_sweep_stores_nothing(exits: list[str]) -> None:
    """Mutation `if self.svc.health.fatal is not None: return` dropped in `send_table_changes`: with no
    batch of its own in flight (the failure was another agent's), the sweep's tombstones were still sent."""
    async with _running(batches=1) as rig:
        rig.sender.ack("outputs", 1)
        await _settle()
        rig.sender.ack("changelog", 1)
        await _settle()
        assert rig.stream.acked == [10, 11]
        rig.svc.health.fatal = "score-claims failed a batch of 3: ..."  # another agent's failure
        rig.table.unsent.append(Outgoing("changelog", b"k", b"state-sweep", 0))
        rig.runner.send_table_changes()
        await _settle()
        assert rig.sender.sent == [("outputs", "1"), ("changelog", "1")]


async def test_a_runner_that_stops_sends_and_acknowledges_nothing_more_of_its_batches_in_flight(
    exits: list[str],
) -> None:
    """Mutation `batch.task.cancel()` dropped: the batches in flight went on after the runner stopped
    (a rebalance): their changelog was sent and their input acknowledged by an agent that was gone."""
    svc = _service()
    table, sender, stream = _Table(), _Sender(), _Stream([_batch(1)])
    runner = _Runner(svc, table, sender)

    def process(records: list[InputRecord]) -> tuple[list[Record], dict[bytes, str]]:
        return [Record("out", b"k", b"output-1", partition=1)], {b"k": "1"}

    def write(key: bytes, number: str) -> None:
        table.unsent.append(Outgoing("changelog", key, f"state-{number}".encode(), 0))

    task = asyncio.create_task(runner.run(stream, process, write))  # type: ignore[arg-type]
    await _settle()
    assert sender.sent == [("outputs", "1")]
    task.cancel()  # the agent stops
    await asyncio.gather(task, return_exceptions=True)
    if not sender.pending["outputs", "1"].done():  # cancelled with the batch's task, as it should be
        sender.ack("outputs", 1)
    await _settle()
    assert sender.sent == [("outputs", "1")]  # no changelog of a batch the successor processes again
    assert stream.acked == []
    assert svc.health.fatal is None and exits == []


async def test_the_first_failure_is_the_one_reported(exits: list[str]) -> None:
    """Mutation: `stop_worker` without its `if svc.health.fatal is not None: return`: a second failure
    (another agent's, or the same batch's later step) replaced the first on /healthz and scheduled
    another exit."""
    svc = _service()
    stop_worker(svc, "score-traces failed a batch of 2: RuntimeError('broker refused')")
    stop_worker(svc, "agent score-claims crashed: CancelledError()")
    await _until(lambda: exits == ["exit"])
    await asyncio.sleep(0.05)
    assert svc.health.fatal == "score-traces failed a batch of 2: RuntimeError('broker refused')"
    assert exits == ["exit"]


class _TakeStream(_Stream):
    """Records how many records each `noack_take` asks for."""

    def __init__(self, batches: list[list[_Event]]) -> None:
        super().__init__(batches)
        self.takes: list[int] = []

    async def noack_take(self, max_: int, within: float) -> AsyncIterator[list[_Event]]:
        self.takes.append(max_)
        async for batch in super().noack_take(max_, within):
            yield batch


async def test_a_runner_of_an_internal_topic_splits_bundles_and_takes_fewer_records(exits: list[str]) -> None:
    """Mutation `if bundled else records` -> never unbundled: a later stage got a bundle of several
    messages as one record. Mutation of the take size: an internal topic's batch is
    `internal_batch_records` bundles, not `batch_size` of them."""
    svc = _service()
    table, sender = _Table(), _Sender()
    runner = _Runner(svc, table, sender)
    runner.bundled_input = True
    stream = _TakeStream([[_Event(_Message("internal", 0, 10, 1.0), b"event-1-a\nevent-1-b")]])
    seen: list[Any] = []

    def process(records: list[InputRecord]) -> tuple[list[Record], dict[bytes, str]]:
        seen.extend((r.offset, r.value) for r in records)
        return [], {}

    task = asyncio.create_task(runner.run(stream, process, lambda key, state: None))  # type: ignore[arg-type]
    try:
        await _settle()
        assert seen == [(10, b"event-1-a"), (10, b"event-1-b")]
        assert stream.takes == [svc.settings.internal_batch_records]
        assert svc.settings.internal_batch_records != svc.settings.batch_size
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_an_older_ack_does_not_lower_how_far_another_agent_wrote_an_internal_partition(
    exits: list[str],
) -> None:
    """Stages share `internal_ends` (the calibration topic is written by three of them). Mutation
    `max(ends.get(where, 0), answer.offset + 1)` -> `answer.offset + 1`: a later answer for a lower
    offset moved it back, and the input gate counted records this worker wrote as not written."""
    internal = load_settings().responses_topic
    async with _running(batches=1, output_topic=internal) as rig:
        rig.svc.internal_ends[(internal, 1)] = 100  # another agent's send to the partition, answered
        rig.sender.ack("outputs", 1, offset=41)
        await _settle()
        assert rig.svc.internal_ends == {(internal, 1): 100}
        rig.sender.ack("changelog", 1)
        await _settle()


async def test_the_send_timeout_bounds_the_queuing_and_the_acks_together(exits: list[str]) -> None:
    """Mutation: the acks waited a whole SEND_TIMEOUT_SECONDS after a send that had already queued for
    part of it, so a stuck broker kept the worker up to twice the bound before it stopped."""
    svc = _service(send_timeout_seconds=5.0)

    class _SlowSender(_Sender):
        async def send(self, records: Any) -> list[asyncio.Future[Any]]:
            await asyncio.sleep(0.2)  # queued behind the partition's earlier batch
            return await super().send(records)

    waited: list[float] = []

    class _Recording(_Runner):
        async def _acknowledged(self, futures: Any, timeout: float) -> list[Any]:
            waited.append(timeout)
            return []

    runner = _Recording(svc, _Table(), _SlowSender())
    await runner._delivered([Outgoing("out", b"k", b"output-1", 0)])
    assert waited and waited[0] <= 5.0 - 0.2
