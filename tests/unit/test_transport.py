"""Worker tuning settings reach what they tune: CONSUMER_FETCH_MAX_WAIT_MS and CONSUMER_FETCH_MAX_BYTES
the aiokafka consumer Faust builds (Faust hard-codes 1500 ms and leaves aiokafka's 50 MB),
GC_GEN0_THRESHOLD the garbage collector. The consumer's `getmany` never drops fetched records silently
(tests/integration/test_rebalance.py end to end), and its cheaper hand-over of each record behaves as
Faust's `wait_first` does (delivered, or given up when a rebalance suspends the flow)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from faust.events import Event
from faust.types import TP, ConsumerMessage, Message

from streams.app import create_app
from streams.config import load_settings


async def test_fetch_settings_reach_the_worker_consumer() -> None:
    svc = create_app(load_settings(consumer_fetch_max_wait_ms=37, consumer_fetch_max_bytes=65_432))
    thread = svc.app.consumer._thread
    consumer = thread._create_worker_consumer(svc.app.transport)
    try:
        assert consumer._fetch_max_wait_ms == 37
        assert consumer._fetch_max_bytes == 65_432
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


async def test_a_generation_change_mid_batch_seeks_back_to_the_first_record_not_delivered() -> None:
    """Review (mutations): no test changed the generation while a batch was delivered. Its later records
    are not delivered, and outside a rebalance the partition is sought back to the first of them, not
    to a later one (which would skip the first)."""
    svc = create_app(load_settings())
    first, other = TP("agent-events", 0), TP("agent-events", 1)
    records = {first: [_Record(5)], other: [_Record(40), _Record(41)]}
    consumer = _consumer_returning(svc, records, {first, other})
    svc.app.rebalancing = False
    delivered = []
    async for _, message in consumer.getmany(timeout=1.0):
        delivered.append(message)
        svc.app.consumer_generation_id += 1  # a rebalance came and went while this record was handled
    assert delivered == [(first, 5)]
    assert consumer.sought == [(other, 40)]
    assert consumer.dropped_partitions == {other}


async def test_records_of_a_partition_whose_stream_buffer_is_full_are_still_delivered() -> None:
    """Review (mutations): Faust takes a partition out of the active ones while its stream buffer is
    full (`_buffered_partitions`) and still delivers what was fetched for it; dropped and sought back,
    those records would be fetched again for as long as the buffer stays full."""
    svc = create_app(load_settings())
    active, buffered = TP("agent-events", 0), TP("agent-events", 1)
    records = {active: [_Record(5)], buffered: [_Record(40)]}
    consumer = _consumer_returning(svc, records, {active})
    consumer._buffered_partitions = {buffered}
    svc.app.rebalancing = False

    assert sorted(await _delivered(consumer)) == [(active, 5), (buffered, 40)]
    assert (consumer.sought, consumer.dropped_partitions) == ([], set())


async def test_a_partition_revoked_before_its_records_were_dropped_is_not_sought() -> None:
    """Review (mutations): its next owner reads it from the committed offset. Sought here, aiokafka
    raises for a partition no longer assigned, after Faust's `seek` has already moved its read offset."""
    svc = create_app(load_settings())
    kept, revoked = TP("agent-events", 0), TP("agent-events", 1)
    consumer = _consumer_returning(svc, {kept: [_Record(5)], revoked: [_Record(40)]}, {kept})
    consumer.assignment = lambda: {kept}
    svc.app.rebalancing = False

    assert await _delivered(consumer) == [(kept, 5)]
    assert consumer.sought == []
    assert consumer.dropped_partitions == {revoked}


# --- the hand-over of each fetched record (`_deliver`) ------------------------------------------------


def _consumer_with_callback(callback: Any) -> Any:
    consumer = create_app(load_settings()).app.consumer
    consumer.callback = callback
    return consumer


async def test_a_hand_over_that_does_not_wait_runs_without_faust_wait_first() -> None:
    delivered: list[str] = []

    async def callback(message: str) -> None:
        delivered.append(message)

    consumer = _consumer_with_callback(callback)

    async def no_wait_first(*coros: Any, timeout: Any = None) -> None:
        raise AssertionError("wait_first (four tasks per record) should not be needed")

    consumer.wait_first = no_wait_first
    await consumer._deliver("m1")
    assert delivered == ["m1"]


async def test_a_hand_over_that_waits_finishes_with_the_result_it_waited_for() -> None:
    loop = asyncio.get_running_loop()
    room: asyncio.Future[str] = loop.create_future()
    delivered: list[tuple[str, str]] = []

    async def callback(message: str) -> None:
        await asyncio.sleep(0)  # a bare yield first, then a future
        delivered.append((message, await room))

    consumer = _consumer_with_callback(callback)
    delivery = asyncio.create_task(consumer._deliver("m1"))
    await asyncio.sleep(0.01)
    assert not delivery.done() and delivered == []
    room.set_result("room")
    await asyncio.wait_for(delivery, 1)
    assert delivered == [("m1", "room")]


async def test_a_failure_the_hand_over_waited_on_reaches_it() -> None:
    loop = asyncio.get_running_loop()
    room: asyncio.Future[None] = loop.create_future()
    seen: list[str] = []

    async def callback(message: str) -> None:
        try:
            await room
        except KeyError as exc:
            seen.append(f"{message}: {exc!r}")

    consumer = _consumer_with_callback(callback)
    delivery = asyncio.create_task(consumer._deliver("m1"))
    await asyncio.sleep(0.01)
    room.set_exception(KeyError("gone"))
    await asyncio.wait_for(delivery, 1)
    assert seen == ["m1: KeyError('gone')"]


async def test_a_waiting_hand_over_is_given_up_when_a_rebalance_suspends_the_flow() -> None:
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    outcome: list[str] = []

    async def callback(message: str) -> None:
        try:
            await never  # a full stream buffer
            outcome.append("delivered")
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise

    consumer = _consumer_with_callback(callback)
    delivery = asyncio.create_task(consumer._deliver("m1"))
    await asyncio.sleep(0.01)
    consumer.suspend_flow.set()  # what Faust does when partitions are revoked
    await asyncio.wait_for(delivery, 1)  # the drain loop goes on; the record is read again later
    assert outcome == ["cancelled"]
    assert never.cancelled()  # as a task cancels the future it waits for


# --- acks of records no stream handed to an agent ------------------------------------------------------


def _message(svc: Any, offset: int, tracked: bool) -> Message:
    topic = svc.settings.input_topic_names[0]
    message = ConsumerMessage(topic, 0, offset, 0.0, 0, None, b"k", b"v", None, tp=TP(topic, 0))
    message.tracked = tracked
    return message


def _acked(svc: Any) -> list[int]:
    return list(svc.app.consumer._acked[TP(svc.settings.input_topic_names[0], 0)])


def test_an_ack_of_a_record_no_stream_tracked_is_not_recorded() -> None:
    """Faust's pure-Python stream loop acks a record it skipped (the flow stopped, or its generation
    changed in a rebalance) though no agent saw it; recorded, Faust's commit could pass it before the
    recovery's seek delivers it again."""
    svc = create_app(load_settings())
    svc.app.topics._acking_topics.add(svc.settings.input_topic_names[0])

    assert svc.app.consumer.ack(_message(svc, 7, tracked=False)) is False
    assert _acked(svc) == []
    assert svc.app.consumer.ack(_message(svc, 7, tracked=True)) is True  # delivered again, then processed
    assert _acked(svc) == [7]


async def test_faust_python_stream_loop_acks_a_skipped_record_and_the_guard_drops_it() -> None:
    """Drives Faust's own pure-Python stream loop (`Stream._py_aiter`): a record from an older consumer
    generation is skipped, never yielded, yet its ack reaches `Consumer.ack`, where the guard refuses
    it. (Faust's Cython loop, used when it imports, drops such an event before its ack.)"""
    svc = create_app(load_settings())
    app = svc.app
    app.topics._acking_topics.add(svc.settings.input_topic_names[0])
    app.flow_control.resume()
    channel = app.channel().clone(is_iterator=True)
    stale = _message(svc, 8, tracked=False)
    stale.generation_id = app.consumer_generation_id
    app.consumer_generation_id += 1  # a rebalance since the stale record was fetched
    current = _message(svc, 9, tracked=False)
    current.generation_id = app.consumer_generation_id
    acks: list[int] = []
    original = app.consumer.ack

    def spy(m: Message) -> bool:
        acks.append(m.offset)
        return bool(original(m))

    app.consumer.ack = spy
    loop = app.stream(channel)._py_aiter()
    first = asyncio.ensure_future(loop.__anext__())  # the loop starts before records arrive, as live
    await channel.put(Event(app, b"k", b"stale", {}, stale))
    await channel.put(Event(app, b"k", b"current", {}, current))

    assert await asyncio.wait_for(first, timeout=5) == b"current"
    assert acks == [8]  # the skipped record was acked by Faust's loop ...
    assert _acked(svc) == []  # ... and not recorded as safe to commit
    assert current.tracked and not current.acked  # the yielded one awaits its agent
    await loop.aclose()
