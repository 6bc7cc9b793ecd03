"""The agents' produce path (`streams.batch_send`) through the broker: where records land, in what order.

Records without a partition must land where `producer.send()` (Kafka's default partitioner) puts the
same key, since consumers and Faust's router rely on it; records of one partition keep their order,
also when they span several record batches; headers and tombstones arrive as sent.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from streams.batch_send import Outgoing, RecordBatches
from streams.harness import RunningBroker
from tests.integration.fixtures import create_plain_topics

PARTITIONS = 4


async def _read(bootstrap: str, topic: str, expected: int, timeout: float = 30.0) -> list[tuple[int, object]]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    records: list[tuple[int, object]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(records) < expected and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                records += [(r.partition, (r.key, r.value, tuple(r.headers or ()))) for r in batch]
    finally:
        await consumer.stop()
    return records


def test_batches_land_where_the_default_partitioner_puts_each_key_in_order(kafka: RunningBroker) -> None:
    async def run() -> None:
        bootstrap = kafka.bootstrap_servers
        batched, reference = f"batch-send-{uuid.uuid4().hex[:8]}", f"batch-send-ref-{uuid.uuid4().hex[:8]}"
        await create_plain_topics(bootstrap, [batched, reference], PARTITIONS)
        # A small batch size, so one partition's records span several record batches.
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_batch_size=16_384, linger_ms=0)
        await producer.start()
        try:
            records = [
                Outgoing(batched, f"key-{i % 37}".encode(), f"value-{i}-".encode() * 40, None)
                for i in range(600)
            ]
            records.append(Outgoing(batched, b"", b"dead letter", None, [("error", b"why")]))
            records.append(Outgoing(batched, b"tomb", None, 2))  # a table tombstone, partition fixed
            futures = await RecordBatches(producer).send(records)
            assert 1 < len(futures) < len(records)  # several batches, far fewer than records
            await asyncio.gather(*futures)
            for record in records[:-1]:  # the reference: one producer.send per record
                await producer.send(reference, record.value, key=record.key, headers=record.headers)
            await producer.flush()
        finally:
            await producer.stop()
        got = await _read(bootstrap, batched, len(records))
        want = await _read(bootstrap, reference, len(records) - 1)
        assert len(got) == len(records)
        where = {payload: partition for partition, payload in got}
        assert where == {payload: partition for partition, payload in want} | {(b"tomb", None, ()): 2}
        for partition in range(PARTITIONS):  # per partition: exactly the order they were given in
            sent = [
                (r.key, r.value, tuple(r.headers or ()))
                for r in records
                if where.get((r.key, r.value, tuple(r.headers or ()))) == partition
            ]
            assert [payload for p, payload in got if p == partition] == sent

    asyncio.run(run())
