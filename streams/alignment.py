"""Event-time alignment of the input partitions, as Flink's watermark alignment does it.

State expires against the *oldest* input partition's event time (stages.common.ExpiryClock), so
while stage 1 reads one partition far ahead of another, every claim and score the lagging partition
still holds back stays in memory. That happens when a backlog is read unevenly: a partition whose
producers were down and came back with old events, or a broker that answers a fetch with megabytes of
one partition (the embedded broker does; the full soak's input partitions drifted 18,000 records
apart and the worker's memory grew by 60 MB).

So stage 1 pauses an input partition whose event time runs more than `max_lead` ahead of the slowest
input partition that is still delivering records, and resumes it once that one has caught up (or has
stopped delivering: caught up, revoked, or stuck; a partition that delivered nothing for
`idle_seconds` holds nobody back, so alignment only ever delays and cannot stall the worker). Pausing
is Faust's own `pause_partitions`: records already fetched wait in the fetcher's buffer, and the
partition is not fetched again until it resumes. Nothing is skipped: records of a partition paused
while their fetch was under way are sought back and read again (streams/transport.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from faust.types import TP

from streams.app import Service
from streams.metrics import Metrics

__all__ = ["CHECK_INTERVAL_SECONDS", "InputAlignment", "attach_input_alignment", "partitions_ahead"]

log = logging.getLogger(__name__)

CHECK_INTERVAL_SECONDS = 0.5  # besides after every stage-1 batch: resumes when no batch comes


def partitions_ahead(
    event_times: Mapping[int, datetime], delivering: Iterable[int], max_lead: timedelta
) -> set[int]:
    """The partitions whose event time is more than `max_lead` past the slowest delivering one's."""
    behind = [event_times[p] for p in delivering if p in event_times]
    if not behind:
        return set()
    allowed = min(behind) + max_lead
    return {p for p, moment in event_times.items() if moment > allowed}


class InputAlignment:
    """Pauses and resumes stage 1's input partitions (all input topics of a partition number together).

    `check` runs after every stage-1 batch and on a timer (a paused partition must be resumed even when
    no batch comes); it leaves the consumer alone while Faust rebalances or recovers tables, which
    pause and resume partitions themselves.
    """

    def __init__(
        self,
        topics: Iterable[str],
        event_time: Callable[[int], datetime | None],
        max_lead: timedelta,
        idle_seconds: float,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.topics = frozenset(topics)
        self.event_time = event_time  # the time of the partition's latest event seen by stage 1
        self.max_lead = max_lead
        self.idle_seconds = idle_seconds
        self.metrics = metrics
        self.clock = clock
        self._delivered_at: dict[int, float] = {}  # partition -> when stage 1 last got a record of it
        self._paused: set[TP] = set()  # what this object paused (and has not resumed)
        self._last_error = ""

    def after_batch(self, app: Any, partitions: Iterable[int]) -> None:
        """Stage 1 processed records of `partitions` just now."""
        moment = self.clock()
        for partition in partitions:
            self._delivered_at[partition] = moment
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
        partitions = {tp.partition for tp in assigned}
        times = {p: moment for p in partitions if (moment := self.event_time(p)) is not None}
        now = self.clock()
        # A paused partition may count as delivering for a while: it is ahead, so it never lowers the
        # slowest time, and if it became the slowest it is resumed in this same check.
        delivering = [p for p in partitions if now - self._delivered_at.get(p, -1e18) <= self.idle_seconds]
        ahead = partitions_ahead(times, delivering, self.max_lead)
        wanted = {tp for tp in assigned if tp.partition in ahead}
        resume = {tp for tp in self._paused - wanted if tp in assigned}
        if wanted:
            consumer.pause_partitions(wanted)  # again each time: a recovery may have resumed them
        if resume:
            consumer.resume_partitions(resume)
        if wanted - self._paused or resume:
            log.info(
                "input alignment: partitions paused now: %s (more than %s ahead of the slowest delivering one)",
                sorted(ahead),
                self.max_lead,
            )
        self._paused = wanted
        self.metrics.input_partitions_paused.set(len(ahead))


def attach_input_alignment(svc: Service) -> InputAlignment | None:
    """The alignment of `svc`'s input partitions, checked on a timer too; None when it is turned off."""
    settings = svc.settings
    if settings.input_alignment_max_lead_hours <= 0:
        return None
    alignment = InputAlignment(
        settings.input_topic_names,
        svc.trace_stage.clock.latest,
        timedelta(hours=settings.input_alignment_max_lead_hours),
        settings.input_alignment_idle_seconds,
        svc.metrics,
    )

    @svc.app.timer(interval=CHECK_INTERVAL_SECONDS, name="input-alignment")  # type: ignore[untyped-decorator]
    async def check_input_alignment() -> None:
        alignment.check(svc.app)

    del check_input_alignment  # registered on the app
    return alignment
