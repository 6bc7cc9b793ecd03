"""The agents' produce path (`streams.batch_send`) against a fake producer: partitions, order, batches.

The broker round trip is tests/integration/test_batch_send.py; these pin, without a broker, which
partition each record's batch goes to, that a partition's records keep their order when they span
several batches, and that keys, values, headers and tombstones reach the batch as given.
"""

from __future__ import annotations

import asyncio
from typing import Any

from streams.batch_send import Outgoing, RecordBatches, output_records
from streams.stages import Record
from streams.stages.common import key_partition

Appended = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]


class FakeBatch:
    """A `BatchBuilder` that takes at most `capacity` records (`append` answers None when full)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.records: list[Appended] = []

    def append(
        self, *, key: bytes | None, value: bytes | None, timestamp: int | None, headers: Any
    ) -> object | None:
        if len(self.records) >= self.capacity:
            return None
        self.records.append((key, value, tuple(headers or ())))
        return object()


class FakeProducer:
    def __init__(self, partitions: dict[str, int], capacity: int) -> None:
        self.partitions = partitions
        self.capacity = capacity
        self.sent: list[tuple[str, int, list[Appended]]] = []

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(self.partitions[topic]))

    def create_batch(self) -> FakeBatch:
        return FakeBatch(self.capacity)

    async def send_batch(self, batch: FakeBatch, topic: str, partition: int) -> asyncio.Future[Any]:
        self.sent.append((topic, partition, batch.records))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


def _send(producer: FakeProducer, records: list[Outgoing]) -> list[asyncio.Future[Any]]:
    async def run() -> list[asyncio.Future[Any]]:
        return await RecordBatches(producer).send(records)  # type: ignore[arg-type]

    return asyncio.run(run())


def test_each_record_lands_in_its_keys_partition_in_the_order_given_across_batches() -> None:
    producer = FakeProducer({"scored": 4, "changelog": 8}, capacity=3)
    records = [Outgoing("scored", f"key-{i % 7}".encode(), f"value-{i}".encode(), None) for i in range(40)]
    records.append(Outgoing("scored", None, b"no key", None, [("error", b"why")]))
    records.append(Outgoing("changelog", b"tomb", None, 5))  # a tombstone with its partition fixed
    records.append(Outgoing("changelog", b"k", b"state", 6))
    records.append(Outgoing("changelog", b"key-3", b"state", 0))  # partition 0 given, not the key's
    futures = _send(producer, records)

    assert len(futures) == len(producer.sent)
    assert all(0 < len(batch) <= 3 for _, _, batch in producer.sent)
    for topic, count in producer.partitions.items():
        for partition in range(count):
            got = [
                record for t, p, batch in producer.sent if (t, p) == (topic, partition) for record in batch
            ]
            want = [
                (r.key, r.value, tuple(r.headers or ()))
                for r in records
                if r.topic == topic
                and (r.partition if r.partition is not None else key_partition(r.key or b"", count))
                == partition
            ]
            assert got == want, (topic, partition)


def test_output_records_keep_each_field() -> None:
    records = [
        Record("dlq", b"k", b"v", [("h", b"1")], partition=None),
        Record("responses", b"", b"m", None, partition=3, latency_from=("LLM_RESPONSE", 1.0)),
    ]
    assert output_records(records) == [
        Outgoing("dlq", b"k", b"v", None, [("h", b"1")]),
        Outgoing("responses", b"", b"m", 3, None),
    ]
