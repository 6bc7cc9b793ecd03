"""The plain aiokafka helpers (`streams.kafka_io`) against fakes: what they send, read and stop.

The demo, `tail` and the integration tests use them with a broker; these pin, without one, the record
conversion, the count `produce` returns, `collect`'s stop condition and deadline, and how
`WorkerProcess.stop` escalates from SIGTERM to SIGKILL.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from typing import Any, ClassVar

import pytest
from aiokafka import ConsumerRecord

from streams import kafka_io
from streams.kafka_io import Consumed, WorkerProcess, collect, produce


def _message(offset: int, value: bytes | None, headers: Any) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("t", 1, offset, 1_700_000_000_000, 0, b"k", value, None, 1, 0, headers)


def test_consumed_of_keeps_every_part_and_reads_a_missing_value_as_empty() -> None:
    assert Consumed.of(_message(7, None, None)) == Consumed("t", 1, 7, b"k", b"", (), 1_700_000_000_000)
    assert Consumed.of(_message(8, b"v", [("h", b"1")])).headers == (("h", b"1"),)


class FakeProducer:
    instances: ClassVar[list[FakeProducer]] = []

    def __init__(self, **config: Any) -> None:
        self.sent: list[tuple[str, bytes, bytes | None]] = []
        self.stopped = False
        FakeProducer.instances.append(self)

    async def start(self) -> None:
        pass

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> asyncio.Future[None]:
        self.sent.append((topic, value, key))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    async def flush(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True


def test_produce_sends_every_record_and_counts_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_io, "AIOKafkaProducer", FakeProducer)
    FakeProducer.instances.clear()
    sent = asyncio.run(produce("b:9092", "in", [(b"a", b"1"), (None, b"2"), (b"c", b"3")]))
    (producer,) = FakeProducer.instances
    assert sent == 3
    assert producer.sent == [("in", b"1", b"a"), ("in", b"2", None), ("in", b"3", b"c")]
    assert producer.stopped


def test_produce_raises_when_a_record_is_not_delivered(monkeypatch: pytest.MonkeyPatch) -> None:
    class FailingProducer(FakeProducer):
        async def send(self, topic: str, value: bytes, key: bytes | None = None) -> asyncio.Future[None]:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if value == b"2":
                future.set_exception(RuntimeError("not delivered"))
            else:
                future.set_result(None)
            return future

    monkeypatch.setattr(kafka_io, "AIOKafkaProducer", FailingProducer)
    FakeProducer.instances.clear()
    with pytest.raises(RuntimeError, match="not delivered"):
        asyncio.run(produce("b:9092", "in", [(b"a", b"1"), (b"b", b"2")]))
    assert FakeProducer.instances[0].stopped


class FakeConsumer:
    """Returns one record per `getmany`, `records` of them, then nothing."""

    records = 0

    def __init__(self, *topics: str, **config: Any) -> None:
        self.polled = 0

    async def start(self) -> None:
        pass

    async def getmany(self, timeout_ms: int) -> dict[str, list[ConsumerRecord[bytes, bytes]]]:
        self.polled += 1
        if self.polled > FakeConsumer.records:
            await asyncio.sleep(timeout_ms / 1000)
            return {}
        return {"tp": [_message(self.polled, b"v", None)]}

    async def stop(self) -> None:
        pass


def test_collect_reads_until_the_condition_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_io, "AIOKafkaConsumer", FakeConsumer)
    FakeConsumer.records = 5
    records = asyncio.run(collect("b:9092", ["out"], lambda got: len(got) >= 3, timeout=5.0))
    assert [r.offset for r in records] == [1, 2, 3]


class Clock:
    """`kafka_io`'s monotonic clock, moved on by each poll's timeout (the fake consumer waits no time)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.polls: list[int] = []

    def monotonic(self) -> float:
        return self.now

    def poll(self, timeout_ms: int) -> None:
        self.polls.append(timeout_ms)
        self.now += max(timeout_ms, 100) / 1000


def test_collect_raises_once_the_timeout_has_passed_and_polls_no_longer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()

    class QuietConsumer(FakeConsumer):
        async def getmany(self, timeout_ms: int) -> dict[str, list[ConsumerRecord[bytes, bytes]]]:
            clock.poll(timeout_ms)
            return {}

    monkeypatch.setattr(kafka_io, "AIOKafkaConsumer", QuietConsumer)
    monkeypatch.setattr(kafka_io, "time", clock)
    with pytest.raises(TimeoutError, match="after 2s with 0 records"):
        asyncio.run(collect("b:9092", ["out"], lambda got: len(got) >= 1, timeout=2.0))
    assert clock.polls == [500, 500, 500, 500]  # at most half a second each, none past the deadline


class FakeProcess:
    """A `Popen` that exits on SIGTERM, or only when killed when `ignores_term`."""

    def __init__(self, ignores_term: bool) -> None:
        self.ignores_term = ignores_term
        self.returncode: int | None = None
        self.signals: list[int] = []
        self.killed = False

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if not self.ignores_term:
            self.returncode = 0

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            raise subprocess.TimeoutExpired("worker", timeout or 0)
        return self.returncode

    def kill(self) -> None:
        self.killed = True
        self.returncode = -9


def _worker(process: FakeProcess | None) -> WorkerProcess:
    worker = WorkerProcess({"WORKER_ENV": "1"}, "/dev/null")
    worker.process = process  # type: ignore[assignment]
    return worker


def test_stop_sends_sigterm_and_kills_only_a_worker_that_does_not_exit() -> None:
    graceful = FakeProcess(ignores_term=False)
    worker = _worker(graceful)
    assert worker.alive()
    assert worker.stop(timeout=0.1) == 0
    assert graceful.signals == [signal.SIGTERM] and not graceful.killed
    assert not worker.alive()

    stuck = FakeProcess(ignores_term=True)
    assert _worker(stuck).stop(timeout=0.1) == -9
    assert stuck.signals == [signal.SIGTERM] and stuck.killed


def test_stop_leaves_an_exited_or_unstarted_worker_alone() -> None:
    exited = FakeProcess(ignores_term=False)
    exited.returncode = 3
    assert _worker(exited).stop() == 3
    assert exited.signals == []
    assert _worker(None).stop() == 0
    assert not _worker(None).alive()


def test_the_workers_environment_overrides_the_callers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_ENV", "from-the-caller")
    assert _worker(None).env["WORKER_ENV"] == "1"
