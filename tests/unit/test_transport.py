"""Worker tuning settings reach what they tune: CONSUMER_FETCH_MAX_WAIT_MS the aiokafka consumer Faust
builds (Faust hard-codes 1500 ms), GC_GEN0_THRESHOLD the garbage collector. And the consumer's
`getmany` never drops fetched records silently (tests/integration/test_rebalance.py end to end)."""

from __future__ import annotations

import gc
from typing import Any

from faust.types import TP

from streams.app import create_app
from streams.config import load_settings


async def test_fetch_wait_setting_reaches_the_worker_consumer() -> None:
    svc = create_app(load_settings(consumer_fetch_max_wait_ms=37))
    thread = svc.app.consumer._thread
    consumer = thread._create_worker_consumer(svc.app.transport)
    try:
        assert consumer._fetch_max_wait_ms == 37
    finally:
        await consumer.stop()


def test_gc_threshold_setting_sets_generation_0_only() -> None:
    from streams.cli import tune_gc

    before = gc.get_threshold()
    try:
        tune_gc(load_settings(gc_gen0_threshold=12_345).gc_gen0_threshold)
        assert gc.get_threshold() == (12_345, *before[1:])
        tune_gc(0)  # 0 leaves whatever is set
        assert gc.get_threshold() == (12_345, *before[1:])
    finally:
        gc.set_threshold(*before)


class _Record:
    def __init__(self, offset: int) -> None:
        self.offset = offset


def _consumer_returning(svc: Any, records: dict[TP, list[_Record]], active: set[TP]) -> Any:
    """The app's own consumer (streams/transport.py), with the fetch and the broker calls stubbed."""
    consumer = svc.app.consumer
    consumer.flow_active = True
    consumer.sought = []

    async def wait_next_records(timeout: float) -> tuple[dict[TP, list[_Record]], set[TP]]:
        return records, active

    async def seek(tp: TP, offset: int) -> None:
        consumer.sought.append((tp, offset))

    consumer._wait_next_records = wait_next_records
    consumer._to_message = lambda tp, record: (tp, record.offset)
    consumer.highwater = lambda tp: 100
    consumer.assignment = lambda: {*records}
    consumer.seek = seek
    return consumer


async def _delivered(consumer: Any) -> list[tuple[TP, int]]:
    return [message async for _, message in consumer.getmany(timeout=1.0)]


async def test_records_of_a_paused_partition_are_marked_for_the_recovery() -> None:
    svc = create_app(load_settings())
    active, paused = TP("agent-events", 0), TP("agent-events", 1)
    records = {active: [_Record(5), _Record(6)], paused: [_Record(40), _Record(41)]}
    consumer = _consumer_returning(svc, records, {active})
    svc.app.rebalancing = True

    delivered = await _delivered(consumer)

    assert delivered == [(active, 5), (active, 6)]
    assert consumer.dropped_partitions == {paused}  # the recovery seeks again before resuming it
    assert consumer.sought == []  # during a rebalance the recovery owns the position


async def test_outside_a_rebalance_a_partition_is_sought_back_to_its_first_undelivered_record() -> None:
    svc = create_app(load_settings())
    active, paused = TP("agent-events", 0), TP("agent-events", 1)
    records = {active: [_Record(5)], paused: [_Record(40), _Record(41)]}
    consumer = _consumer_returning(svc, records, {active})
    svc.app.rebalancing = False

    delivered = await _delivered(consumer)

    assert delivered == [(active, 5)]
    assert consumer.sought == [(paused, 40)]
