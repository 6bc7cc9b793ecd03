"""Plain aiokafka producer/consumer helpers shared by the demo, `tail`, tests and benchmarks."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord

__all__ = ["Consumed", "WorkerProcess", "collect", "produce"]


@dataclass(frozen=True, slots=True)
class Consumed:
    """One consumed record."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int

    @classmethod
    def of(cls, message: ConsumerRecord[bytes, bytes]) -> Consumed:
        """The parts of an aiokafka record the callers read (a missing value becomes b"")."""
        return cls(
            message.topic,
            message.partition,
            message.offset,
            message.key,
            message.value or b"",
            tuple((k, v) for k, v in (message.headers or ())),
            message.timestamp,
        )


async def produce(bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes]]) -> int:
    """Send every (key, value) with Kafka's default partitioner; return how many were sent."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=262_144)
    await producer.start()
    sent = 0
    try:
        futures = []
        for key, value in records:
            futures.append(await producer.send(topic, value, key=key))
            sent += 1
        await producer.flush()
        for future in futures:
            await future
    finally:
        await producer.stop()
    return sent


async def collect(
    bootstrap: str,
    topics: Iterable[str],
    done: Callable[[list[Consumed]], bool],
    timeout: float,
) -> list[Consumed]:
    """Read the topics from the beginning until `done(records)` holds; TimeoutError after `timeout` s."""
    consumer = AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    records: list[Consumed] = []
    deadline = time.monotonic() + timeout
    try:
        while not done(records):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"condition not met after {timeout:.0f}s with {len(records)} records")
            batches = await consumer.getmany(timeout_ms=int(min(remaining, 0.5) * 1000))
            for batch in batches.values():
                records.extend(Consumed.of(m) for m in batch)
    finally:
        await consumer.stop()
    return records


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def dies_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that has Linux send the child SIGTERM when this process dies, also by SIGKILL
    (a CI runner's, pytest-timeout's), so a broker or worker it started is not left running (its
    `finally` never runs then). None elsewhere, and off the main thread: the signal follows the
    thread that started the child, and a helper thread's end would stop it."""
    if _LIBC is None or threading.current_thread() is not threading.main_thread():
        return None
    libc, parent = _LIBC, os.getpid()

    def in_child() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the prctl: no signal will come
            os._exit(1)

    return in_child


class WorkerProcess:
    """A `confidence-streams worker` subprocess with its own environment; stopped with SIGTERM."""

    def __init__(self, env: Mapping[str, str], log_path: str) -> None:
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen(
            [sys.executable, "-m", "streams.cli", "worker"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=dies_with_parent(),  # one prctl call in the child
        )
        return self

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (graceful: Faust finishes, commits and flushes), then SIGKILL after `timeout`."""
        process = self.process
        if process is None:
            return 0
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        return int(process.returncode)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
