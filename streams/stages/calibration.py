"""Stage 4, keyed by tenant: join OUTCOME events with the scores they judge -> calibration per group.

The other stages send each score they emit here (`subject_message`: the numbers and labels only) and
stage 1 forwards each OUTCOME (`outcome_message`); both are keyed by tenant, so one owner sees a
tenant's scores and outcomes in sequence. A score is kept `CALIBRATION_JOIN_WINDOW_HOURS` of event
time; an outcome that arrives before its score waits up to `CALIBRATION_OUTCOME_WAIT_HOURS` and is
then counted as unmatched. A matched outcome updates one group per (model or agent type, score kind):
hourly buckets of fine bins (`streams.scoring.calibration`) over a sliding window of event time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

import orjson

from streams.config import ScoringConfigs, Settings
from streams.events import CalibrationGroup, CalibrationUpdated, OutcomeEvent
from streams.ids import output_event_id
from streams.metrics import Metrics
from streams.scoring import calibration
from streams.stages.common import ExpiryClock, InputRecord, Outputs, Record, now, tenant_partition
from streams.state import (
    CalibrationMessage,
    CalibrationSubject,
    GroupCalibration,
    HourBucket,
    SubjectEntry,
)

__all__ = [
    "CalibrationStage",
    "CalibrationWrite",
    "group_key",
    "outcome_message",
    "subject_key",
    "subject_message",
    "upstream",
    "window_histogram",
]

Upstream = Literal["trace", "responses", "claims"]
_UPSTREAM_CODE: dict[Upstream, int] = {"trace": 1, "responses": 2, "claims": 3}
Dimension = Literal["model", "agent_type"]


def upstream(stage: Upstream, partition: int) -> int:
    """One number per upstream (stage, partition): the expiry watermark's source."""
    return _UPSTREAM_CODE[stage] * 1_000_000 + partition


def subject_key(tenant_id: str, subject_type: str, subject_id: str) -> bytes:
    return orjson.dumps([tenant_id, "subject", subject_type, subject_id])


def group_key(tenant_id: str, dimension: str, value: str, kind: str) -> bytes:
    return orjson.dumps([tenant_id, "group", dimension, value, kind])


def _message(settings: Settings, message: CalibrationMessage) -> Record:
    tenant = message.tenant_id
    return Record(
        settings.calibration_topic,
        tenant.encode(),
        message.model_dump_json().encode(),
        partition=tenant_partition(tenant, settings.topic_partitions),
    )


def subject_message(
    settings: Settings, tenant_id: str, subject: CalibrationSubject, received_at: float, source: int
) -> Record:
    """The record that tells the calibration stage about a score just emitted."""
    return _message(
        settings,
        CalibrationMessage(tenant_id=tenant_id, subject=subject, received_at=received_at, source=source),
    )


def outcome_message(settings: Settings, outcome: OutcomeEvent, received_at: float, source: int) -> Record:
    """The record that carries an OUTCOME input from stage 1 to the calibration stage."""
    return _message(
        settings,
        CalibrationMessage(
            tenant_id=outcome.tenant_id, outcome=outcome, received_at=received_at, source=source
        ),
    )


def _hour(moment: datetime) -> int:
    return int(moment.timestamp() // 3600)


def window_histogram(group: GroupCalibration, window: timedelta) -> dict[int, calibration.BinStats]:
    """The group's fine bins summed over the hours of the window that ends at its newest outcome."""
    first = _hour(group.newest - window) + 1
    return calibration.merge(b.bins for hour, b in group.buckets.items() if hour >= first)


def window_actions(group: GroupCalibration, window: timedelta) -> dict[str, calibration.ActionStats]:
    """Outcomes per action (allow / flag / reject) over the window."""
    first = _hour(group.newest - window) + 1
    totals: dict[str, calibration.ActionStats] = {}
    for hour, bucket in group.buckets.items():
        if hour >= first:
            for action, stats in bucket.actions.items():
                current = totals.get(action)
                totals[action] = stats if current is None else current.plus(stats)
    return totals


@dataclass(frozen=True, slots=True)
class CalibrationWrite:
    """A calibration table value to write (subject entry or group), to its tenant's partition."""

    value: SubjectEntry | GroupCalibration
    partition: int


class CalibrationStage:
    """Stage 4: the outcome join and the calibration groups of each tenant."""

    def __init__(self, settings: Settings, configs: ScoringConfigs, metrics: Metrics) -> None:
        self.settings = settings
        self.configs = configs
        self.metrics = metrics
        self.clock = ExpiryClock(timedelta(hours=settings.event_time_max_ahead_hours))
        self.window = timedelta(hours=settings.calibration_window_hours)

    def process(
        self,
        records: list[InputRecord],
        load_subject: Callable[[bytes], SubjectEntry | None],
        load_group: Callable[[bytes], GroupCalibration | None],
    ) -> tuple[list[Record], dict[bytes, CalibrationWrite]]:
        """Process a batch in order; return records to send and the table values to write (once each)."""
        out = Outputs(self.settings, self.metrics)
        dirty: dict[bytes, CalibrationWrite] = {}
        for record in records:
            out.guarded(
                record, "calibration stage", lambda r: self._one(r, load_subject, load_group, dirty, out)
            )
        return out.records, dirty

    def _one(
        self,
        record: InputRecord,
        load_subject: Callable[[bytes], SubjectEntry | None],
        load_group: Callable[[bytes], GroupCalibration | None],
        dirty: dict[bytes, CalibrationWrite],
        out: Outputs,
    ) -> None:
        message = CalibrationMessage.model_validate_json(record.value or b"")
        tenant = message.tenant_id

        def entry_of(key: bytes) -> SubjectEntry:
            write = dirty.get(key)
            if write is not None:
                assert isinstance(write.value, SubjectEntry)
                return write.value
            return load_subject(key) or SubjectEntry()

        def group_of(key: bytes) -> GroupCalibration | None:
            write = dirty.get(key)
            if write is not None:
                assert isinstance(write.value, GroupCalibration)
                return write.value
            return load_group(key)

        def apply(subject: CalibrationSubject, outcome: OutcomeEvent) -> None:
            for key, group in self._apply(tenant, subject, outcome, group_of, message.received_at, out):
                dirty[key] = CalibrationWrite(group, record.partition)

        if message.subject is not None:
            subject = message.subject
            key = subject_key(tenant, subject.subject_type, subject.subject_id)
            entry = entry_of(key)
            self.clock.saw(record.partition, subject.event_time, source=message.source)
            if entry.subject is not None and entry.subject.event_time > subject.event_time:
                return  # an older score (re-delivered or overtaken): keep the newer one
            for outcome in entry.waiting:
                apply(subject, outcome)
                self.metrics.outcomes.labels("matched").inc()
            applied = (*entry.applied, *(o.event_id for o in entry.waiting))
            dirty[key] = CalibrationWrite(
                SubjectEntry(subject=subject, applied=applied, waiting=()), record.partition
            )
        if message.outcome is not None:
            outcome = message.outcome
            key = subject_key(tenant, outcome.subject_type, outcome.subject_id)
            entry = entry_of(key)
            self.clock.saw(record.partition, outcome.timestamp, source=message.source)
            if outcome.event_id in entry.applied or any(
                w.event_id == outcome.event_id for w in entry.waiting
            ):
                self.metrics.outcomes.labels("duplicate").inc()
                return
            if entry.subject is None:
                self.metrics.outcomes.labels("waiting").inc()
                update = {"waiting": (*entry.waiting, outcome)}
            else:
                apply(entry.subject, outcome)
                self.metrics.outcomes.labels("matched").inc()
                update = {"applied": (*entry.applied, outcome.event_id)}
            dirty[key] = CalibrationWrite(entry.model_copy(update=update), record.partition)

    def _apply(
        self,
        tenant: str,
        subject: CalibrationSubject,
        outcome: OutcomeEvent,
        group_of: Callable[[bytes], GroupCalibration | None],
        received_at: float,
        out: Outputs,
    ) -> list[tuple[bytes, GroupCalibration]]:
        """Count one (score, outcome) pair in every group the subject belongs to."""
        groups: list[tuple[Dimension, str | None]] = [
            ("model", subject.model),
            ("agent_type", subject.agent_type),
        ]
        changed = []
        for kind, predicted in subject.scores.items():
            for dimension, value in groups:
                if value is None:
                    continue
                key = group_key(tenant, dimension, value, kind)
                group = group_of(key) or GroupCalibration(
                    tenant_id=tenant, dimension=dimension, value=value, kind=kind, newest=outcome.timestamp
                )
                group = self._count(group, predicted, outcome, subject.action if kind == "response" else None)
                group = self._report(group, outcome, received_at, out)
                changed.append((key, group))
        return changed

    def _count(
        self, group: GroupCalibration, predicted: float, outcome: OutcomeEvent, action: str | None
    ) -> GroupCalibration:
        hour = _hour(outcome.timestamp)
        bucket = group.buckets.get(hour) or HourBucket()
        actions = bucket.actions
        if action is not None:
            one = calibration.ActionStats(count=1, sum_observed=outcome.observed)
            actions = {**actions, action: one if action not in actions else actions[action].plus(one)}
        bucket = HourBucket(bins=calibration.add(bucket.bins, predicted, outcome.observed), actions=actions)
        newest = max(group.newest, outcome.timestamp)
        first = _hour(newest - self.window) + 1  # hours that left the window are dropped
        buckets = {h: b for h, b in {**group.buckets, hour: bucket}.items() if h >= first}
        return group.model_copy(update={"buckets": buckets, "newest": newest})

    def _report(
        self, group: GroupCalibration, outcome: OutcomeEvent, received_at: float, out: Outputs
    ) -> GroupCalibration:
        """Update the gauges; emit CALIBRATION_UPDATED when ECE moved enough, at most every N minutes."""
        histogram = window_histogram(group, self.window)
        ece, brier, samples = (
            calibration.ece(histogram),
            calibration.brier(histogram),
            calibration.total(histogram),
        )
        if ece is None or brier is None:
            return group
        m = self.metrics
        labels = (
            m.labels("tenant", group.tenant_id),
            group.dimension,
            m.labels(group.dimension, group.value),
            group.kind,
        )
        m.calibration_ece.labels(*labels).set(ece)
        m.calibration_brier.labels(*labels).set(brier)
        settings = self.settings
        if samples < settings.calibration_min_samples:
            return group
        if (
            group.last_emitted_ece is not None
            and abs(ece - group.last_emitted_ece) < settings.calibration_ece_change
        ):
            return group
        min_interval = timedelta(minutes=settings.calibration_update_min_interval_minutes)
        if group.last_emitted_at is not None and outcome.timestamp - group.last_emitted_at < min_interval:
            return group
        alert = ece >= settings.calibration_ece_alert
        output = CalibrationUpdated(
            event_id=output_event_id(
                "CALIBRATION_UPDATED",
                outcome.event_id,
                group.tenant_id,
                group.dimension,
                group.value,
                group.kind,
            ),
            source_event_id=outcome.event_id,
            trace_id=outcome.trace_id,
            tenant_id=group.tenant_id,
            scored_at=now(),
            group=CalibrationGroup(dimension=group.dimension, value=group.value, kind=group.kind),
            ece=ece,
            previous_ece=group.last_emitted_ece,
            brier=brier,
            samples=samples,
            window_hours=settings.calibration_window_hours,
            alert=alert,
            bins=calibration.reliability(histogram),
        ).model_dump(mode="json")
        out.emit(output, outcome.trace_id.encode(), alert, received_at)
        return group.model_copy(update={"last_emitted_ece": ece, "last_emitted_at": outcome.timestamp})

    # --- expiry (the sweep) -----------------------------------------------------------------------------

    def partition_of(self, key: bytes) -> int:
        """The changelog partition of a calibration table key: its tenant's."""
        tenant = orjson.loads(key)[0]
        return tenant_partition(str(tenant), self.settings.topic_partitions)

    def sweep_subject(self, key: bytes, entry: SubjectEntry) -> tuple[SubjectEntry | None, int]:
        """(what to keep of an entry or None to delete it, how many waiting outcomes became unmatched)."""
        partition = self.partition_of(key)
        wait = timedelta(hours=self.settings.calibration_outcome_wait_hours)
        still_waiting = tuple(
            o for o in entry.waiting if not self.clock.idle_longer_than(partition, o.timestamp, wait)
        )
        unmatched = len(entry.waiting) - len(still_waiting)
        subject = entry.subject
        join_window = timedelta(hours=self.settings.calibration_join_window_hours)
        if subject is not None and self.clock.idle_longer_than(partition, subject.event_time, join_window):
            subject = None
        if subject is None and not still_waiting:
            return None, unmatched
        if unmatched == 0 and subject is entry.subject:
            return entry, 0
        return SubjectEntry(
            subject=subject, applied=entry.applied if subject else (), waiting=still_waiting
        ), unmatched

    def group_expired(self, key: bytes, group: GroupCalibration) -> bool:
        """A group whose newest outcome left the window: every bucket is out of it."""
        return self.clock.idle_longer_than(self.partition_of(key), group.newest, self.window)
