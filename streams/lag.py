"""Consumer lag per assigned partition, sampled by a Faust timer into `confidence_consumer_lag`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from faust.types import TP

from streams.app import Service
from streams.metrics import Metrics

__all__ = ["LAG_INTERVAL_SECONDS", "LagMonitor", "attach_lag_monitor", "partition_lag", "unread_records"]

log = logging.getLogger(__name__)

LAG_INTERVAL_SECONDS = 5.0
_POSITION_TIMEOUT_SECONDS = 2.0


class LagSource(Protocol):
    """The part of Faust's consumer the monitor reads (a fake in unit tests)."""

    def assignment(self) -> set[TP]: ...

    async def highwaters(self, *partitions: TP) -> Mapping[TP, int]: ...

    async def position(self, tp: TP) -> int | None: ...


def partition_lag(end: int | None, committed: int | None, position: int | None) -> int | None:
    """Records between a partition's end and where the group resumes reading; None when unknown.

    `committed` is the next offset to read, as Kafka tools count lag; before the group's first commit
    on the partition, the consumer's position stands in. Tansu's end offset can trail the real end
    after multi-record batches (DESIGN 7), so a negative difference reads as 0.
    """
    start = committed if committed is not None else position
    if end is None or start is None:
        return None
    return max(0, end - start)


def _committed(consumer: Any, tp: TP) -> int | None:
    # Faust keeps the offsets it committed (the next offset to read) in a private mapping, updated on
    # every commit and after each rebalance's seek; reading it costs no broker round trip.
    offsets = getattr(consumer, "_committed_offset", None)
    return None if offsets is None else offsets.get(tp)


def unread_records(consumer: Any, topics: Iterable[str], written: Mapping[tuple[str, int], int]) -> int:
    """Records of the assigned partitions of `topics` that this worker's streams have not been handed.

    Without a broker round trip: a partition's end is the later of its last fetch's high watermark
    (stale while fetched records wait to be read) and `written`, past what this worker produced to it
    itself; the start is past the last offset Faust delivered to the streams (before the first, the
    committed one). Records other workers wrote since the last fetch are not seen, so it can count
    low, never high. A partition whose end is not known yet counts 0.
    """
    wanted = frozenset(topics)
    read_offsets = getattr(consumer, "_read_offset", {})  # Faust's: the last offset delivered
    total = 0
    for tp in consumer.assignment():
        if tp.topic not in wanted:
            continue
        ends = [
            end for end in (consumer.highwater(tp), written.get((tp.topic, tp.partition))) if end is not None
        ]
        read = read_offsets.get(tp)
        start = read + 1 if read is not None else _committed(consumer, tp)
        total += partition_lag(max(ends, default=None), start, None) or 0
    return total


class LagMonitor:
    """Samples lag of the stage topics' assigned partitions and keeps the gauge to exactly those."""

    def __init__(self, metrics: Metrics, topics: Iterable[str]) -> None:
        self.metrics = metrics
        self.topics = frozenset(topics)
        self._exported: set[tuple[str, str]] = set()
        self._last_error = ""

    async def sample(self, consumer: LagSource) -> tuple[dict[TP, int], set[TP]]:
        """Lag of every assigned stage-topic partition whose end and start are known, and the
        partitions whose start could not be read this time (their last value stays)."""
        # Changelog partitions are assigned too but only read during recovery, so they are left out.
        assigned = sorted(tp for tp in consumer.assignment() if tp.topic in self.topics)
        if not assigned:
            return {}, set()
        # A ListOffsets request rather than the last fetch's cached high watermark: the cache goes
        # stale for a partition the consumer is not fetching (paused, buffers full), which is exactly
        # when the lag matters.
        ends = await consumer.highwaters(*assigned)
        lags: dict[TP, int] = {}
        unread: set[TP] = set()
        for tp in assigned:
            committed = _committed(consumer, tp)
            position = None
            if committed is None:
                try:
                    position = await asyncio.wait_for(consumer.position(tp), _POSITION_TIMEOUT_SECONDS)
                except Exception as exc:  # one slow partition (being restored, say) must not freeze all
                    self._warn(f"position of {tp.topic}[{tp.partition}] not read: {exc!r}")
                    unread.add(tp)
                    continue
            lag = partition_lag(ends.get(tp), committed, position)
            if lag is not None:
                lags[tp] = lag
        return lags, unread

    def export(self, lags: Mapping[TP, int], unread: Iterable[TP] = ()) -> None:
        """Set the gauge per partition and drop partitions this worker no longer owns (rebalance)."""
        m = self.metrics
        current: dict[tuple[str, str], int] = {}
        for tp, lag in lags.items():
            # Topics come from configuration, partitions are below TOPIC_PARTITIONS: both bounded.
            current[(m.labels("topic", tp.topic), str(tp.partition))] = lag
        kept = {(m.labels("topic", tp.topic), str(tp.partition)) for tp in unread} & self._exported
        for labels in self._exported - current.keys() - kept:
            m.consumer_lag.remove(*labels)
        for labels, lag in current.items():
            m.consumer_lag.labels(*labels).set(lag)
        self._exported = set(current) | kept

    def _warn(self, message: str) -> None:
        """Log `message` unless it is the one logged last (a timer repeats every few seconds)."""
        if message != self._last_error:
            log.warning("consumer lag not sampled: %s", message)
            self._last_error = message

    async def tick(self, consumer: LagSource) -> None:
        """One sample; a failure is logged (once per distinct message) and never stops the worker."""
        try:
            lags, unread = await self.sample(consumer)
            self.export(lags, unread)
            if not unread:
                self._last_error = ""
        except Exception as exc:  # a timer that raises would take the whole app down
            self._warn(repr(exc))  # repr: a TimeoutError's str is empty
            try:
                self.keep_only_assigned(consumer)
            except Exception as again:  # the consumer's assignment may not be readable either
                self._warn(f"assignment not read: {again!r}")

    def keep_only_assigned(self, consumer: LagSource) -> None:
        """Drop the series of partitions no longer assigned here, keeping the others' last values: a
        sample that fails (often right when partitions move) must not leave a moved partition counted
        by two workers. Needs no broker call."""
        m = self.metrics
        owned = {
            (m.labels("topic", tp.topic), str(tp.partition))
            for tp in consumer.assignment()
            if tp.topic in self.topics
        }
        for labels in self._exported - owned:
            m.consumer_lag.remove(*labels)
        self._exported &= owned


def attach_lag_monitor(svc: Service, interval: float = LAG_INTERVAL_SECONDS) -> LagMonitor:
    """Register a timer on `svc.app` that exports `confidence_consumer_lag` every `interval` seconds."""
    settings = svc.settings
    monitor = LagMonitor(svc.metrics, (*settings.input_topic_names, *settings.internal_topics))

    @svc.app.timer(interval=interval, name="consumer-lag")  # type: ignore[untyped-decorator]
    async def sample_consumer_lag() -> None:
        await monitor.tick(svc.app.consumer)

    del sample_consumer_lag  # registered on the app
    return monitor
