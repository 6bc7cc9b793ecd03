"""Faust's aiokafka transport with four changes: a configurable fetch wait, no silently dropped fetch,
a cheaper hand-over of each fetched record to the streams, and no ack of a record no stream tracked
(`_Consumer.ack`, README "Faust behaviour worth knowing"); and it times each offset commit
(`commit_running_for`, for the watchdog in streams/agents.py).

1. faust-streaming 0.15.3 hard-codes `fetch_max_wait_ms=1500` for the worker's consumer. A fetch that
   finds no data waits that long, and on brokers that hold fetches (Tansu holds each one for about
   half of it even when data is there, DESIGN section 7) every hop between stages pays it.
   `CONSUMER_FETCH_MAX_WAIT_MS` replaces that one argument. Faust does not pass aiokafka's
   `fetch_max_bytes` either (50 MB by default, which a lagging consumer holds in its fetch buffer);
   `CONSUMER_FETCH_MAX_BYTES` sets it.

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

3. Faust's `Consumer._drain_messages` hands each fetched record to the streams with
   `wait_first(callback(message), suspend_flow.wait())`: four tasks and an `asyncio.wait` per record,
   so that a hand-over blocked on a full stream buffer is given up when a rebalance suspends the flow.
   That cost about 45 us of CPU per record (bench: with it removed the naive passthrough went from 157
   to 110 us per event, the batched one from 85 to 41). A
   hand-over almost never waits, so this loop first runs it directly (`_deliver`); one that does wait
   is finished under Faust's `wait_first`, with the same effect as before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any, cast

import faust
from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, Message

__all__ = ["SKIPPED_OFFSETS", "FetchWaitApp"]

# In the log line of offsets a fetch skipped on a topic that never has gaps (`_Consumer._warn_gap`):
# test and benchmark timeouts look for it in the workers' logs.
SKIPPED_OFFSETS = "skipped by the fetch"


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):  # type: ignore[misc]
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # Both read by its Fetcher at start.
        consumer._fetch_max_wait_ms = self.app.consumer_fetch_max_wait_ms
        consumer._fetch_max_bytes = self.app.consumer_fetch_max_bytes
        return consumer


class _Consumer(faust_aiokafka.Consumer):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dropped_partitions: set[TP] = set()  # read and cleared by the recovery
        self._commit_started: float | None = None

    async def force_commit(self, *args: Any, **kwargs: Any) -> bool:
        # Timed, because aiokafka retries a commit the broker refuses with a retriable error (the topic
        # of one of its partitions deleted, say) for ever: offsets stop moving while all looks well.
        self._commit_started = time.monotonic()
        try:
            return bool(await super().force_commit(*args, **kwargs))
        finally:
            self._commit_started = None

    def commit_running_for(self) -> float:
        """Seconds the offset commit in progress has taken so far; 0 when none is in progress."""
        started = self._commit_started
        return 0.0 if started is None else time.monotonic() - started

    def ack(self, message: Message) -> bool:
        # Faust's pure-Python stream loop acks a record it skipped (the flow stopped, or its generation
        # changed in a rebalance) though no agent saw it, and Faust's commit could then pass it before
        # the recovery's seek delivers it again. A stream tracks every record before an agent gets it,
        # so an untracked ack is such a skip: not recorded. (The Cython loop never acks one.)
        if not message.tracked:
            return False
        return bool(super().ack(message))

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

    async def _drain_messages(self, fetcher: Any) -> None:
        # faust 0.15.3 Consumer._drain_messages; the one change is `_deliver` instead of
        # `await self.wait_first(callback(message), self.suspend_flow.wait())`.
        getmany = self.getmany
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        get_read_offset = self._read_offset.__getitem__
        set_read_offset = self._read_offset.__setitem__
        acks_enabled_for = self.app.topics.acks_enabled_for
        gapless = self.app.gapless_topics
        commit_every = self._commit_every
        yield_every = 100
        num_since_yield = 0
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                self.diag.set_flag(CONSUMER_FETCHING)
                ait = getmany(timeout=1.0)
                await self.sleep(0)  # getmany can return at once many times in a row
                if not self.should_stop:
                    async for tp, message in ait:
                        num_since_yield += 1
                        if num_since_yield > yield_every:
                            await asyncio.sleep(0)
                            num_since_yield = 0
                        offset = message.offset
                        r_offset = get_read_offset(tp)
                        if r_offset is None or offset >= r_offset:
                            gap = offset - (r_offset or 0)
                            if gap > 1 and r_offset is not None and message.topic in gapless:
                                self._warn_gap(tp, r_offset + 1, offset)  # after offset 0 too
                            if gap > 1 and r_offset and acks_enabled_for(message.topic):
                                await self._add_gap(tp, r_offset + 1, offset)
                            if commit_every is not None and self._n_acked >= commit_every:
                                self._n_acked = 0
                                await self.commit()
                            await self._deliver(message)
                            set_read_offset(tp, offset)
                        else:
                            self.log.dev(
                                "DROPPED MESSAGE ROFF %r: k=%r v=%r", offset, message.key, message.value
                            )
                    self.diag.unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                self.log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                self.log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            self.diag.unset_flag(CONSUMER_FETCHING)

    def _warn_gap(self, tp: TP, start: int, end: int) -> None:
        # Faust acknowledges offsets a fetch skipped, as compaction or transaction markers leave them.
        # This worker's internal topics have neither, so on Apache Kafka they never skip: a skip means
        # the broker handed out a later record before earlier ones (Tansu does under concurrent
        # appends, README "Brokers"), and those records are committed past unprocessed.
        self.log.warning(
            "offsets %d-%d of %s[%d] were %s and are acknowledged unread: this topic never has gaps "
            "on Apache Kafka, so the broker handed out a later record first",
            start,
            end - 1,
            tp.topic,
            tp.partition,
            SKIPPED_OFFSETS,
        )

    async def _deliver(self, message: Message) -> None:
        """Hand `message` to its streams; give up, as Faust does, if it has to wait and the flow stops.

        The hand-over (Faust's conductor putting the event on each stream's buffer) is run one step
        by hand. Almost always it finishes in that step and no task is needed. If it has to wait (a
        full buffer, or suspended flow control), the rest runs under Faust's `wait_first` against
        `suspend_flow`, exactly as Faust runs the whole of it.
        """
        delivery = cast(Coroutine[Any, Any, Any], self.callback(message))  # Faust's conductor: a coroutine
        try:
            awaiting = delivery.send(None)
        except StopIteration:
            return
        await self.wait_first(_finish(delivery, awaiting), self.suspend_flow.wait())

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


async def _finish(coroutine: Coroutine[Any, Any, Any], awaiting: Any) -> Any:
    """Run `coroutine` to its end as a task would, after its first step yielded `awaiting`.

    A coroutine yields to its task the future it waits for (or None: "run me again soon"); the task
    resumes it when that future is done, and the coroutine reads the future's result itself. If this
    task is cancelled, it cancels the future the coroutine waits for and throws the cancellation into
    the coroutine, as a task does (a future left pending could still be completed for nobody).
    """
    while True:
        cancelled: asyncio.CancelledError | None = None
        try:
            if awaiting is None:
                await asyncio.sleep(0)
            else:
                awaiting._asyncio_future_blocking = False  # what a task does with a future it waits for
                await asyncio.wait((awaiting,))  # done, whatever its outcome: the coroutine reads it
        except asyncio.CancelledError as exc:
            cancelled = exc
            if awaiting is not None:
                awaiting.cancel()
        try:
            awaiting = coroutine.send(None) if cancelled is None else coroutine.throw(cancelled)
        except StopIteration as done:
            return done.value


class _Transport(faust_aiokafka.Transport):  # type: ignore[misc]
    Consumer = _Consumer


class FetchWaitApp(faust.App):  # type: ignore[misc]
    """A Faust app whose worker consumer waits at most `consumer_fetch_max_wait_ms` per fetch and
    fetches at most `consumer_fetch_max_bytes` at a time (Faust sets neither; the defaults are its and
    aiokafka's)."""

    def __init__(
        self,
        *args: Any,
        consumer_fetch_max_wait_ms: int = 1500,
        consumer_fetch_max_bytes: int = 52_428_800,
        **kwargs: Any,
    ) -> None:
        self.consumer_fetch_max_wait_ms = consumer_fetch_max_wait_ms
        self.consumer_fetch_max_bytes = consumer_fetch_max_bytes
        # Topics only this app writes, without transactions or compaction: a skipped offset there is a
        # broker fault, logged as such (`_Consumer._warn_gap`).
        self.gapless_topics: frozenset[str] = frozenset()
        super().__init__(*args, **kwargs)

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)
