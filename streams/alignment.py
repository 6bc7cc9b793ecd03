"""Event-time alignment of the input partitions, as Flink's watermark alignment does it.

State expires against the *oldest* input partition's event time (stages.common.ExpiryClock), so
while stage 1 reads one partition far ahead of another, every claim and score the lagging partition
still holds back stays in memory. That happens when a backlog is read unevenly: a partition whose
producers were down and came back with old events, or a broker that answers a fetch with megabytes of
one partition (the embedded broker does; the full soak's input partitions drifted 18,000 records
apart and the worker's memory grew by 60 MB).

So stage 1 pauses an input partition whose event time runs more than `max_lead` ahead of the slowest
input partition that is still delivering records, and resumes it once that one has caught up (or has
stopped delivering: caught up, revoked, or stuck). Delivering means moving its event time on: a
partition whose event time did not pass its highest for `idle_seconds` holds nobody back, whatever
records it still gets (dead letters, or a producer whose clock is behind, held the others for as long
as they came). And no partition stays paused by alignment longer than `max_hold_seconds` in a row:
its records age in the broker meanwhile, and the input topic keeps them for an hour by default.
So alignment only ever delays, and for a bounded time. Pausing
is Faust's own `pause_partitions`: records already fetched wait in the fetcher's buffer, and the
partition is not fetched again until it resumes. Nothing is skipped: records of a partition paused
while their fetch was under way are sought back and read again (streams/transport.py).

The same gate holds *all* input back while the worker's later stages lag its stage 1: past
`INTERNAL_BACKLOG_MAX_RECORDS` records on its internal-topic partitions not yet handed to those
stages, until at most half of that is left (`InternalBacklog`). Without it a saturated worker's stage 1
ran thousands of bundles ahead of its own later stages, and the calibration scores, which expire
against the oldest upstream stage, piled up (the full soak's memory bound failed on it). Time held
back does not count as a partition's idle time, so alignment resumes where it was.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

from faust.types import TP

from streams.app import Service
from streams.lag import unread_records
from streams.metrics import Metrics

__all__ = [
    "CHECK_INTERVAL_SECONDS",
    "InputAlignment",
    "InternalBacklog",
    "attach_input_alignment",
    "partitions_ahead",
]

log = logging.getLogger(__name__)

K = TypeVar("K", int, TP)  # a partition number, or an input topic's partition

CHECK_INTERVAL_SECONDS = 0.5  # besides after every stage-1 batch: resumes when no batch comes


def partitions_ahead(
    event_times: Mapping[K, datetime], delivering: Iterable[K], max_lead: timedelta
) -> set[K]:
    """The partitions whose event time is more than `max_lead` past the slowest delivering one's."""
    behind = [event_times[p] for p in delivering if p in event_times]
    if not behind:
        return set()
    allowed = min(behind) + max_lead
    return {p for p, moment in event_times.items() if moment > allowed}


class InternalBacklog:
    """Whether stage 1 should hold all input back until the later stages catch up.

    Past `high` unread records on the internal topics input is held; it flows again once at most half
    of `high` is left, so the later stages still have work while stage 1's next fetch comes back.
    """

    def __init__(
        self, topics: Iterable[str], high: int, metrics: Metrics, written: Mapping[tuple[str, int], int]
    ) -> None:
        self.topics = frozenset(topics)
        self.high = high
        self.metrics = metrics
        self.written = written  # Service.internal_ends: how far this worker wrote each partition

    def hold(self, consumer: Any, held: bool) -> bool:
        """Whether to hold input back now, given whether it is held already."""
        unread = unread_records(consumer, self.topics, self.written)
        self.metrics.internal_backlog.set(unread)
        return unread > self.high or (held and unread > self.high // 2)


class InputAlignment:
    """Pauses and resumes stage 1's input partitions, each input topic's partition on its own.

    With several input topics, one topic's partition read ahead of another's backlog is held back like
    any partition: keyed by partition number (before the thirty-first round), the topics of one number
    were paused together and read by whichever record came last, so neither was held back.

    `check` runs after every stage-1 batch and on a timer (a paused partition must be resumed even when
    no batch comes); it leaves the consumer alone while Faust rebalances or recovers tables, which
    pause and resume partitions themselves.
    """

    def __init__(
        self,
        topics: Iterable[str],
        event_time: Callable[[str, int], datetime | None],
        max_lead: timedelta | None,
        idle_seconds: float,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        backlog: InternalBacklog | None = None,
        max_hold_seconds: float = float("inf"),
    ) -> None:
        self.topics = frozenset(topics)
        self.event_time = event_time  # (topic, partition) -> its latest event's time seen by stage 1
        self.max_lead = max_lead  # None: no alignment, only the backlog gate
        self.idle_seconds = idle_seconds
        self.max_hold_seconds = max_hold_seconds
        self.metrics = metrics
        self.clock = clock
        self.backlog = backlog
        self._delivered_at: dict[TP, float] = {}  # when the partition's event time last moved on
        self._highest: dict[TP, datetime] = {}  # the highest event time the partition reached
        self._ahead_since: dict[TP, float] = {}  # since when alignment holds the partition back
        self._released: set[TP] = set()  # held for max_hold_seconds: left alone until no longer ahead
        self._paused: set[TP] = set()  # what this object paused (and has not resumed)
        self._ahead: set[TP] = set()  # the partitions alignment held back at its last decision
        self._held_since: float | None = None  # when the backlog gate began holding all input back
        self._last_error = ""

    @property
    def holding(self) -> bool:
        """Whether all input is held back for the later stages (since the last check)."""
        return self._held_since is not None

    def after_batch(self, app: Any, partitions: Iterable[TP]) -> None:
        """Stage 1 processed records of these input topics' `partitions` just now."""
        now = self.clock()
        for tp in partitions:
            moment = self.event_time(tp.topic, tp.partition)
            highest = self._highest.get(tp)
            if moment is not None and (highest is None or moment > highest):
                self._highest[tp] = moment
                self._delivered_at[tp] = now
        self.check(app)

    def check(self, app: Any) -> None:
        """Pause the input partitions that run ahead; resume the ones this paused that no longer do.

        Never raises: alignment only ever delays input, and a failure here must not stop the worker.
        """
        try:
            self._check(app)
            self._last_error = ""
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            if message != self._last_error:
                log.warning("input alignment not checked: %s", message)
                self._last_error = message

    def _check(self, app: Any) -> None:
        if app.rebalancing or getattr(app, "in_recovery", False):
            return  # Faust pauses and resumes every partition itself meanwhile
        consumer = app.consumer
        assigned = {tp for tp in consumer.assignment() if tp.topic in self.topics}
        # A partition assigned here again starts over: it resumes below the highest time it reached.
        self._highest = {tp: moment for tp, moment in self._highest.items() if tp in assigned}
        now = self.clock()
        holding = self._holding(consumer, now)
        paused: set[TP]
        if holding:
            paused = assigned
        elif self.max_lead is None:
            paused = set()
        else:
            times = {
                tp: moment
                for tp in assigned
                if (moment := self.event_time(tp.topic, tp.partition)) is not None
            }
            # A paused partition may count as delivering for a while: it is ahead, so it never lowers
            # the slowest time, and if it became the slowest it is resumed in this same check.
            delivering = [
                tp for tp in assigned if now - self._delivered_at.get(tp, -1e18) <= self.idle_seconds
            ]
            paused = self._bounded_hold(partitions_ahead(times, delivering, self.max_lead), now)
        resume = {tp for tp in self._paused - paused if tp in assigned}
        if paused:
            consumer.pause_partitions(paused)  # again each time: a recovery may have resumed them
        if resume:
            consumer.resume_partitions(resume)
        if not holding and paused != self._ahead:  # logged as alignment decides, not per hold
            log.info(
                "input alignment: partitions paused now: %s (more than %s ahead of the slowest delivering one)",
                [f"{tp.topic}[{tp.partition}]" for tp in sorted(paused)],  # t[2] before t[10]
                self.max_lead,
            )
            self._ahead = paused
        self._paused = paused
        self.metrics.input_partitions_paused.set(len(paused))

    def _bounded_hold(self, ahead: set[TP], now: float) -> set[TP]:
        """`ahead` without the partitions held back `max_hold_seconds` in a row already."""
        self._ahead_since = {tp: self._ahead_since.get(tp, now) for tp in ahead}
        self._released &= ahead  # caught up: it may be held back again later
        for tp, since in self._ahead_since.items():
            if tp not in self._released and now - since >= self.max_hold_seconds:
                self._released.add(tp)
                log.warning(
                    "input alignment: partition %s[%d] released after %.0f s held back; it stays ahead "
                    "of the slowest delivering partition (state expires later until that one catches up)",
                    tp.topic,
                    tp.partition,
                    now - since,
                )
        return ahead - self._released

    def _holding(self, consumer: Any, now: float) -> bool:
        """Ask the backlog gate; when it lets go, the time held counts as no partition's idle time."""
        if self.backlog is None:
            return False
        holding = self.backlog.hold(consumer, held=self._held_since is not None)
        if holding and self._held_since is None:
            self._held_since = now
            self.metrics.input_holds.inc()
            # Debug, not info: a saturated worker holds about once a second (the counter shows it).
            log.debug("input held back: more than %d internal records unread", self.backlog.high)
        elif not holding and self._held_since is not None:
            # Each partition is given back the part of the hold it spent idle: all of it, or what
            # followed its delivery during the hold (a batch already in the stream when it began).
            since = self._held_since
            self._delivered_at = {
                p: moment + now - max(moment, since) for p, moment in self._delivered_at.items()
            }
            self._held_since = None
        return holding


def attach_input_alignment(svc: Service) -> InputAlignment | None:
    """The gate of `svc`'s input partitions (alignment, backlog), checked on a timer too; None when
    both are turned off."""
    settings = svc.settings
    lead = settings.input_alignment_max_lead_hours
    high = settings.internal_backlog_max_records
    if lead <= 0 and high <= 0:
        return None
    alignment = InputAlignment(
        settings.input_topic_names,
        svc.trace_stage.input_latest,
        timedelta(hours=lead) if lead > 0 else None,
        settings.input_alignment_idle_seconds,
        svc.metrics,
        backlog=InternalBacklog(settings.internal_topics, high, svc.metrics, svc.internal_ends)
        if high > 0
        else None,
        max_hold_seconds=settings.alignment_max_hold_seconds,
    )

    @svc.app.timer(interval=CHECK_INTERVAL_SECONDS, name="input-alignment")  # type: ignore[untyped-decorator]
    async def check_input_alignment() -> None:
        alignment.check(svc.app)

    del check_input_alignment  # registered on the app
    return alignment
