"""The batch runner's promise under random interleavings of batches, sweeps, broker answers and one
refused send: an input is acknowledged only after its outputs and its changelog record are
acknowledged by the broker; the changelog keeps the order the tables saw; outputs go out and inputs
are acknowledged in batch order; nothing at or after a failed batch is acknowledged; outputs computed
after a sweep are sent only once the sweep's records are stored. (From a read-only review of the
batch machinery, twenty-ninth round: 300 seeds, every invariant held.)"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

import streams.batch_runner
from streams.batch_send import Outgoing
from streams.stages import InputRecord, Record
from tests.unit.test_batch_runner import _batch, _Runner, _service, _settle, _Table

Step = tuple[Any, ...]  # ("send", label, values) | ("broker_ack", label) | ("fail", label) | ...


class _QueuedStream:
    """Batches the test hands over one at a time; acks are logged with their batch number."""

    def __init__(self, log: list[Step]) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.log = log

    async def noack_take(self, max_: int, within: float) -> AsyncIterator[Any]:
        while True:
            yield await self.queue.get()

    async def ack(self, event: Any) -> None:
        self.log.append(("ack", event.message.offset // 10))


class _LoggingSender:
    """Each send gets one future, answered (or refused) by the test in a random order."""

    def __init__(self, log: list[Step]) -> None:
        self.log = log
        self.pending: dict[str, asyncio.Future[Any]] = {}

    async def send(self, records: Any) -> list[asyncio.Future[Any]]:
        values = tuple(r.value or b"" for r in records)
        if not values:
            return []
        label = values[0].decode()
        future = asyncio.get_running_loop().create_future()
        self.pending[label] = future
        self.log.append(("send", label, values))
        return [future]


async def _one_run(seed: int) -> tuple[list[Step], list[bytes]]:
    """Drive the real runner for 60 random steps; return the log and the order the table saw."""
    rnd = random.Random(seed)
    svc = _service()
    log: list[Step] = []
    table, sender, stream = _Table(), _LoggingSender(log), _QueuedStream(log)
    runner = _Runner(svc, table, sender)  # type: ignore[arg-type]
    memory: list[bytes] = []  # the changelog records in the order the table was written

    def process(records: list[InputRecord]) -> tuple[list[Record], dict[bytes, str]]:
        number = (records[0].value or b"").decode().split("-")[1]
        log.append(("processed", number))
        return [Record("out", b"k", f"output-{number}".encode(), partition=0)], {b"k": number}

    def write(key: bytes, number: str) -> None:
        table.unsent.append(Outgoing("changelog", key, f"state-{number}".encode(), 0))
        memory.append(f"state-{number}".encode())

    task = asyncio.create_task(runner.run(stream, process, write))  # type: ignore[arg-type]
    await _settle()
    delivered, sweeps, failed = 0, 0, False
    batches = rnd.randint(2, 6)
    for _ in range(60):
        choice = rnd.random()
        if choice < 0.25 and delivered < batches:
            delivered += 1
            stream.queue.put_nowait(_batch(delivered))
        elif choice < 0.35 and svc.health.fatal is None:
            sweeps += 1
            table.unsent.append(Outgoing("changelog", b"k", f"state-s{sweeps}".encode(), 0))
            memory.append(f"state-s{sweeps}".encode())
            log.append(("sweep", f"s{sweeps}"))
            runner.send_table_changes()
        elif unanswered := [label for label, future in sender.pending.items() if not future.done()]:
            label = rnd.choice(unanswered)
            if not failed and rnd.random() < 0.08:
                failed = True
                sender.pending[label].set_exception(RuntimeError("refused"))
                log.append(("fail", label))
            else:
                sender.pending[label].set_result(SimpleNamespace(topic="x", partition=0, offset=0))
                log.append(("broker_ack", label))
        await _settle()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return log, memory


def _check(log: list[Step], memory: list[bytes]) -> None:
    acked_by_broker: set[str] = set()
    sent: dict[str, tuple[bytes, ...]] = {}
    changelog: list[bytes] = []
    outputs: list[int] = []

    def send_holding(value: bytes) -> str | None:
        return next((label for label, values in sent.items() if value in values), None)

    for step in log:
        if step[0] == "send":
            sent[step[1]] = step[2]
            if step[1].startswith("state"):
                changelog.extend(step[2])
            else:
                outputs.append(int(step[1].split("-")[1]))
        elif step[0] == "broker_ack":
            acked_by_broker.add(step[1])
        elif step[0] == "ack":
            number = step[1]
            assert f"output-{number}" in acked_by_broker, f"batch {number} acked before its outputs"
            assert send_holding(f"state-{number}".encode()) in acked_by_broker, (
                f"batch {number} before its state"
            )
    assert changelog == memory[: len(changelog)], "the changelog left the tables' order"
    assert outputs == sorted(outputs)
    acks = [step[1] for step in log if step[0] == "ack"]
    assert acks == sorted(acks)
    for step in log:
        if step[0] == "fail" and step[1].split("-")[1].isdigit():
            failed_batch = int(step[1].split("-")[1])
            assert all(a < failed_batch for a in acks), f"acked at or after failed batch {failed_batch}"
    sweeps_before: dict[str, list[str]] = {}  # batch -> the sweeps that ran before it was processed
    seen: list[str] = []
    for step in log:
        if step[0] == "sweep":
            seen.append(step[1])
        elif step[0] == "processed":
            sweeps_before[step[1]] = list(seen)
    for i, step in enumerate(log):
        if step[0] == "send" and step[1].startswith("output"):
            number = step[1].split("-")[1]
            acked_so_far = {s[1] for s in log[:i] if s[0] == "broker_ack"}
            for sweep in sweeps_before.get(number, []):
                assert send_holding(f"state-{sweep}".encode()) in acked_so_far, (
                    f"output {number} before {sweep}"
                )


@pytest.mark.parametrize("seed", range(300))
async def test_random_interleavings_keep_the_runners_promise(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streams.batch_runner, "_exit_now", lambda: None)
    log, memory = await _one_run(seed)
    try:
        _check(log, memory)
    except AssertionError as failure:
        raise AssertionError(f"seed {seed}: {failure}; steps {log}") from None
