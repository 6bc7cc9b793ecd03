"""Faust's aiokafka transport with two changes: a configurable fetch wait, and no silently dropped fetch.

1. faust-streaming 0.15.3 hard-codes `fetch_max_wait_ms=1500` for the worker's consumer. A fetch that
   finds no data waits that long, and on brokers that hold fetches (Tansu holds each one for about
   half of it even when data is there, DESIGN section 7) every hop between stages pays it.
   `CONSUMER_FETCH_MAX_WAIT_MS` replaces that one argument.

2. Faust's `Consumer.getmany` skips fetched records of partitions that are paused (every stream
   partition is paused while a rebalance restores tables) or of a generation that changed while the
   batch was delivered. aiokafka has already moved its position past them, so they are never read
   again unless something seeks the partition back; and once a later offset is acknowledged, Faust's
   gap filling commits over them. A fetch that started before a rebalance and returns during the
   recovery does exactly that. We saw it as 200-600 inputs of a partition never scored after a
   worker left the group mid-stream, in about one run in four of
   tests/integration/test_rebalance.py. This `getmany` is Faust's, except that it records which
   partitions lost records (`dropped_partitions`): the recovery (streams/recovery.py) seeks again
   before it resumes a stream partition that lost records after its seek, and outside a rebalance
   the partition is sought straight back to its first dropped record.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, Message

__all__ = ["FetchWaitApp"]


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):  # type: ignore[misc]
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = self.app.consumer_fetch_max_wait_ms  # read by its Fetcher at start
        return consumer


class _Consumer(faust_aiokafka.Consumer):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dropped_partitions: set[TP] = set()  # read and cleared by the recovery

    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def getmany(self, timeout: float) -> AsyncIterator[tuple[TP, Message]]:
        # faust 0.15.3 Consumer.getmany, plus the bookkeeping of what it does not deliver.
        records, active_partitions = await self._wait_next_records(timeout)
        generation_id = self.app.consumer_generation_id
        if records is None or self.should_stop:
            return
        if not self.flow_active:
            # Faust's own answer when a rebalance stopped the flow: back to the committed offsets.
            try:
                await self.perform_seek()
            except Exception as exc:
                self.log.warning(f"exception performing seek when flow not active {exc}")
            return
        # Decided for the whole batch before the first yield, so the recovery (which runs only
        # between yields) sees every record of a paused partition marked before it resumes one.
        first_dropped: dict[TP, int] = {}
        deliver = []
        for tp, record in self.scheduler.iterate(records):
            if tp in first_dropped:
                continue
            if active_partitions is None or tp in active_partitions or tp in self._buffered_partitions:
                deliver.append((tp, record))
            else:
                first_dropped[tp] = record.offset
        to_message = self._to_message
        for tp, record in deliver:
            if tp in first_dropped:
                continue  # an earlier record of this partition was not delivered: keep the order
            if not self.flow_active or self.app.consumer_generation_id != generation_id:
                first_dropped[tp] = record.offset
                continue
            self.app.monitor.track_tp_end_offset(tp, self.highwater(tp))
            yield tp, to_message(tp, record)
        if first_dropped:
            await self._after_dropping(first_dropped)

    async def _after_dropping(self, first_dropped: dict[TP, int]) -> None:
        self.dropped_partitions.update(first_dropped)
        if self.app.rebalancing:
            return  # the recovery seeks every stream partition before resuming it
        assignment = self.assignment()
        for tp, offset in first_dropped.items():
            if tp not in assignment:
                continue  # revoked meanwhile: its next owner reads from the committed offset
            self.log.warning("Fetched records of %s were not delivered; reading again from %s", tp, offset)
            try:
                await self.seek(tp, offset)
            except Exception as exc:  # a rebalance began: its recovery seeks to the committed offset
                self.log.warning("Could not seek %s back to %s: %r", tp, offset, exc)


class _Transport(faust_aiokafka.Transport):  # type: ignore[misc]
    Consumer = _Consumer


class FetchWaitApp(faust.App):  # type: ignore[misc]
    """A Faust app whose worker consumer waits at most `consumer_fetch_max_wait_ms` per fetch."""

    def __init__(self, *args: Any, consumer_fetch_max_wait_ms: int = 1500, **kwargs: Any) -> None:
        self.consumer_fetch_max_wait_ms = consumer_fetch_max_wait_ms
        super().__init__(*args, **kwargs)

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)
