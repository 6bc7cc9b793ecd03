"""Stage 4, keyed by tenant: join OUTCOME events with the scores they judge -> calibration per group.

The other stages send each score they emit here (the numbers and labels only) and stage 1 forwards
each OUTCOME (one that judges a claim or a known response through the stage that scores it, behind its
scores), grouped per tenant and batch (`calibration_records`); keyed by tenant, so one owner sees a
tenant's scores and outcomes in sequence. A score is kept `CALIBRATION_JOIN_WINDOW_HOURS` of event
time; an outcome that arrives before its score waits up to `CALIBRATION_OUTCOME_WAIT_HOURS` and is
then counted as unmatched. A matched outcome updates one group per (model or agent type, score kind):
hourly buckets of fine bins (`streams.scoring.calibration`) over a sliding window of event time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Literal

import orjson
from pydantic import BaseModel

from streams.config import ScoringConfigs, Settings
from streams.events import CalibrationGroup, CalibrationUpdated, OutcomeEvent
from streams.ids import output_event_id
from streams.metrics import Metrics, SharedSeries
from streams.scoring import calibration
from streams.stages.common import (
    ExpiryClock,
    InputRecord,
    Outputs,
    Record,
    ValueBound,
    escaped_size,
    is_flagged,
    now,
    outcome_texts,
    subject_texts,
    tenant_partition,
)
from streams.state import (
    CalibrationItem,
    CalibrationMessage,
    CalibrationSubject,
    GroupCalibration,
    HourBucket,
    SubjectEntry,
)

__all__ = [
    "CalibrationStage",
    "CalibrationWrite",
    "Table",
    "calibration_records",
    "group_key",
    "hand_on_outcome",
    "hour_key",
    "subject_key",
    "upstream",
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


def hour_key(group: GroupCalibration, hour: int) -> bytes:
    return orjson.dumps([group.tenant_id, "hour", group.dimension, group.value, group.kind, hour])


def calibration_records(settings: Settings, outputs: Outputs) -> list[Record]:
    """The batch's queued calibration items as one record per (tenant, upstream source), in order.

    One record per tenant, upstream source and batch (more past PRODUCER_MAX_BATCH_BYTES) instead of
    one per score: under load that is a few records per batch rather than one more per output, and
    the order within a tenant and source is kept.
    """
    grouped: dict[tuple[str, int], list[CalibrationItem]] = {}
    for tenant, source, item in outputs.calibration:
        grouped.setdefault((tenant, source), []).append(item)
    return [
        Record(
            settings.calibration_topic,
            tenant.encode(),
            value,
            partition=tenant_partition(tenant, settings.topic_partitions),
        )
        for (tenant, source), items in grouped.items()
        for value in _messages(tenant, source, items, settings.producer_max_batch_bytes)
    ]


def hand_on_outcome(
    out: Outputs, outcome: OutcomeEvent, received_at: float, input_partition: int, source: int
) -> None:
    """Queue an OUTCOME that the claim or agent stage carried, behind the scores queued before it.

    One message per tenant and `source`, in order, so it reaches this stage after them; the stage
    de-duplicates a re-delivered outcome. Its date moves its input partition's clock source, as when
    stage 1 sent it, not that of the scores it travels with.
    """
    if not out.settings.calibration_enabled:  # turned off since stage 1 forwarded it
        out.meter(out.metrics.child(out.metrics.outcomes, "disabled").inc)
        return
    item = CalibrationItem(
        outcome=outcome, received_at=received_at, clock_source=upstream("trace", input_partition)
    )
    out.calibrate(outcome.tenant_id, source, item)


def _messages(tenant: str, source: int, items: list[CalibrationItem], max_bytes: int) -> list[bytes]:
    """The items as one message, or, past `max_bytes`, as several in order: a batch of many scores with
    long ids could otherwise make one record over the broker's limit (refused on every restart)."""
    value = CalibrationMessage(tenant_id=tenant, items=items, source=source).model_dump_json().encode()
    if len(value) <= max_bytes or len(items) == 1:
        return [value]
    half = len(items) // 2
    return [
        *_messages(tenant, source, items[:half], max_bytes),
        *_messages(tenant, source, items[half:], max_bytes),
    ]


def _hour(moment: datetime) -> int:
    return int(moment.timestamp() // 3600)


Table = Literal["subjects", "groups", "hours"]


@dataclass(frozen=True, slots=True)
class CalibrationWrite:
    """A value for one of the calibration tables (None deletes the key), to its tenant's partition."""

    table: Table
    value: SubjectEntry | GroupCalibration | HourBucket | None
    partition: int


def _plus(
    actions: dict[str, calibration.ActionStats], action: str, one: calibration.ActionStats
) -> dict[str, calibration.ActionStats]:
    current = actions.get(action)
    return {**actions, action: one if current is None else current.plus(one)}


def _entry_size_bound(key: bytes, entry: SubjectEntry) -> int:
    """An upper bound of a subject entry's record size, without encoding it: its ids at their longest
    in JSON and a generous allowance for each item's other fields."""
    texts: list[str | None] = [*entry.applied]
    texts += (text for outcome in entry.waiting for text in outcome_texts(outcome))
    if entry.subject is not None:
        texts += subject_texts(entry.subject)
    return len(key) + escaped_size(texts) + 512 * (2 + len(entry.applied) + len(entry.waiting))


class _Batch:
    """One item's view of the three tables: its own writes win over the batch's, which win over stored
    ones. Its writes join the batch's only once the whole item is handled (`commit`): an item that
    fails half-way is dead-lettered and must leave no count behind."""

    def __init__(
        self,
        load: Callable[[Table, bytes], BaseModel | None],
        dirty: dict[bytes, CalibrationWrite],
        record: InputRecord,
    ) -> None:
        self._load, self._dirty, self.record, self.partition = load, dirty, record, record.partition
        self._written: dict[bytes, CalibrationWrite] = {}

    def _get(self, table: Table, key: bytes) -> BaseModel | None:
        write = self._written.get(key) or self._dirty.get(key)
        return write.value if write is not None else self._load(table, key)

    def subject(self, key: bytes) -> SubjectEntry:
        value = self._get("subjects", key)
        assert value is None or isinstance(value, SubjectEntry)
        return value or SubjectEntry()

    def group(self, key: bytes) -> GroupCalibration | None:
        value = self._get("groups", key)
        assert value is None or isinstance(value, GroupCalibration)
        return value

    def hour(self, key: bytes) -> HourBucket | None:
        value = self._get("hours", key)
        assert value is None or isinstance(value, HourBucket)
        return value

    def write(
        self, table: Table, key: bytes, value: SubjectEntry | GroupCalibration | HourBucket | None
    ) -> None:
        self._written[key] = CalibrationWrite(table, value, self.partition)

    def commit(self) -> None:
        self._dirty.update(self._written)


class CalibrationStage:
    """Stage 4: the outcome join and the calibration groups of each tenant."""

    def __init__(self, settings: Settings, configs: ScoringConfigs, metrics: Metrics) -> None:
        self.settings = settings
        self.configs = configs
        self.metrics = metrics
        self.clock = ExpiryClock(
            timedelta(hours=settings.event_time_max_ahead_hours), settings.expiry_source_idle_seconds
        )
        self.window = timedelta(hours=settings.calibration_window_hours)
        # A subject's entry is one changelog record. CALIBRATION_MAX_OUTCOMES_PER_SUBJECT bounds its
        # outcomes by count; ids of escaped characters (6 bytes each in JSON) can still make 48 of them
        # 1.2 MB, and MAX_RECORD_BYTES may be set far lower: the entry's bytes are checked too.
        self.entry_bound = ValueBound(
            settings.max_record_bytes,
            "MAX_RECORD_BYTES",
            "the subject's calibration entry",
            "oversized_output",
            "OversizedOutput",
        )
        # Every group whose gauges this process set, (tenant, dimension, value, kind), with its series'
        # labels, until it expires or its tenant's partition moves away (`forget_groups_outside`).
        self._exported: SharedSeries[tuple[str, str, str, str]] = SharedSeries()

    def process(
        self, records: list[InputRecord], load: Callable[[Table, bytes], BaseModel | None]
    ) -> tuple[list[Record], dict[bytes, CalibrationWrite]]:
        """Process a batch in order; return records to send and the table values to write (once each).

        `load(table, key)` reads the stored value of `key` in one of the three calibration tables.
        """
        out = Outputs(self.settings, self.metrics)
        dirty: dict[bytes, CalibrationWrite] = {}
        for record in records:
            out.guarded(record, "calibration stage", lambda r: self._one(r, load, dirty, out))
        out.settle()
        return out.records, dirty

    def _one(
        self,
        record: InputRecord,
        load: Callable[[Table, bytes], BaseModel | None],
        dirty: dict[bytes, CalibrationWrite],
        out: Outputs,
    ) -> None:
        message = CalibrationMessage.model_validate_json(record.value or b"")
        for item in message.items:
            # Each item alone: a message holds a tenant's scores and outcomes of a whole upstream
            # batch, and one that fails (an unreadable group, a bug) dead-lettered all the others.
            out.guarded(
                record,
                "calibration stage",
                lambda r, item=item: self._item(message, item, _Batch(load, dirty, r), out),
                dead_value=lambda item=item: (
                    message.model_copy(update={"items": [item]}).model_dump_json().encode()
                ),
            )

    def _item(self, message: CalibrationMessage, item: CalibrationItem, batch: _Batch, out: Outputs) -> None:
        partition = batch.partition
        if item.subject is not None:
            self.clock.saw(partition, item.subject.event_time, source=message.source)
            self._subject(message.tenant_id, item.subject, item.received_at, batch, out)
        if item.outcome is not None:
            # An outcome handed on by the claim or agent stage moves its input partition's clock source,
            # not the claims' or responses' it travels with: a late verdict must not expire their scores.
            source = message.source if item.clock_source is None else item.clock_source
            self.clock.saw(partition, item.outcome.timestamp, source=source)
            self._outcome(message.tenant_id, item.outcome, item.received_at, batch, out)
        batch.commit()

    def _subject(
        self, tenant: str, subject: CalibrationSubject, received_at: float, batch: _Batch, out: Outputs
    ) -> None:
        key = subject_key(tenant, subject.subject_type, subject.subject_id)
        entry = batch.subject(key)
        # The latest score wins by arrival, not event time: a subject's scores all come from one
        # upstream partition (its trace's, its tenant and agent's, its tenant's), in the order they
        # were made; a re-delivered input sends no new score (a claim none, a response the same one
        # again), and a replayed batch sends the same scores in the same order. A trace re-scored by
        # an input with an earlier timestamp is judged by its new score.
        subject = self._bounded_subject(subject)
        # The pair joins by `_pairs`, the rule `_outcome` applies when the outcome is the second to arrive.
        # An outcome whose wait had ended by this score's event time is unmatched, as the sweep would
        # have made it; one dated past this score's join window waits on for a newer score, as it would
        # had it arrived second: whether the sweep ran, or which arrived first, must not decide (for
        # items that arrive before the clock passes their windows; README "One limit: expiry").
        joined: list[OutcomeEvent] = []
        waiting: list[OutcomeEvent] = []
        unmatched = 0
        for outcome in entry.waiting:
            if self._pairs(subject, outcome):
                joined.append(outcome)
            elif subject.event_time > self._wait_until(outcome):
                unmatched += 1
            else:
                waiting.append(outcome)
        for outcome in joined:
            self._apply(tenant, subject, outcome, batch, received_at, out)
            out.meter(self.metrics.child(self.metrics.outcomes, "matched").inc)
        if unmatched:
            out.meter(partial(self.metrics.outcomes_unmatched.inc, unmatched))
        counted = self._counted(entry, joined)
        self._write_entry(key, SubjectEntry(subject=subject, waiting=tuple(waiting), **counted), batch)

    def _outcome(
        self, tenant: str, outcome: OutcomeEvent, received_at: float, batch: _Batch, out: Outputs
    ) -> None:
        key = subject_key(tenant, outcome.subject_type, outcome.subject_id)
        entry = batch.subject(key)
        if outcome.event_id in entry.applied or any(w.event_id == outcome.event_id for w in entry.waiting):
            out.meter(self.metrics.child(self.metrics.outcomes, "duplicate").inc)
            return
        if len(entry.applied) + len(entry.waiting) >= self.settings.calibration_max_outcomes_per_subject:
            out.meter(self.metrics.child(self.metrics.outcomes, "over_limit").inc)
            return  # the entry is one changelog record: it must stay under the broker's record limit
        outcome = self._bounded_outcome(outcome)
        if entry.subject is None or not self._pairs(entry.subject, outcome):
            # No score yet, or one whose join window had ended by the outcome's event time (the sweep
            # deletes such a score, and whether it ran yet must not decide), or one dated after the
            # outcome's wait: wait for a newer score; the sweep counts it unmatched after its wait.
            out.meter(self.metrics.child(self.metrics.outcomes, "waiting").inc)
            entry = entry.model_copy(update={"waiting": (*entry.waiting, outcome)})
        else:
            self._apply(tenant, entry.subject, outcome, batch, received_at, out)
            out.meter(self.metrics.child(self.metrics.outcomes, "matched").inc)
            entry = entry.model_copy(update=self._counted(entry, [outcome]))
        self._write_entry(key, entry, batch)

    def _write_entry(self, key: bytes, entry: SubjectEntry, batch: _Batch) -> None:
        """Write a subject's entry, or refuse the item (dead-lettered, nothing counted) if the entry
        would be a record over MAX_RECORD_BYTES: the broker would refuse it at every restart."""
        self.entry_bound.checked(
            _entry_size_bound(key, entry),
            lambda: len(key) + len(entry.model_dump_json().encode()),
            batch.record,
        )
        batch.write("subjects", key, entry)

    # A far-future event time (a mistyped year) counts as the expiry clock's bound: stored as it is, it
    # would keep its entry for ever and pin a group's window there, so that no later outcome counted.
    def _bounded_subject(self, subject: CalibrationSubject) -> CalibrationSubject:
        bounded = self.clock.bounded(subject.event_time)
        return (
            subject if bounded is subject.event_time else subject.model_copy(update={"event_time": bounded})
        )

    def _bounded_outcome(self, outcome: OutcomeEvent) -> OutcomeEvent:
        bounded = self.clock.bounded(outcome.timestamp)
        return outcome if bounded is outcome.timestamp else outcome.model_copy(update={"timestamp": bounded})

    def _apply(
        self,
        tenant: str,
        subject: CalibrationSubject,
        outcome: OutcomeEvent,
        batch: _Batch,
        received_at: float,
        out: Outputs,
    ) -> None:
        """Count one (score, outcome) pair in every group the subject belongs to."""
        # Agent types group lower-cased: the composite threshold they advise on matches them
        # case-insensitively (DESIGN section 4b), so "Planner" and "planner" are one group.
        agent_type = None if subject.agent_type is None else subject.agent_type.lower()
        groups: list[tuple[Dimension, str | None]] = [("model", subject.model), ("agent_type", agent_type)]
        for kind, predicted in subject.scores.items():
            for dimension, value in groups:
                if value is None:
                    continue
                key = group_key(tenant, dimension, value, kind)
                group = batch.group(key) or GroupCalibration(
                    tenant_id=tenant, dimension=dimension, value=value, kind=kind, newest=outcome.timestamp
                )
                action = subject.action if kind == "response" else None
                group = self._count(group, predicted, outcome, action, batch)
                batch.write("groups", key, self._report(group, outcome, received_at, out))

    def _count(
        self,
        group: GroupCalibration,
        predicted: float,
        outcome: OutcomeEvent,
        action: str | None,
        batch: _Batch,
    ) -> GroupCalibration:
        """Add the pair to its hour's bucket and to the window totals; drop hours that left the window."""
        observed = outcome.observed
        hour = _hour(outcome.timestamp)
        newest = max(group.newest, outcome.timestamp)
        # An hour leaves once it is wholly older than the window: the window holds W to W + 1 hours of
        # outcomes (it held W - 1 to W, so a one-hour window dropped a one-minute-old outcome on the hour).
        first = _hour(newest - self.window)
        if hour < first:
            return group  # judges an hour that already left the window: nothing to count it in
        bucket = batch.hour(hour_key(group, hour)) or HourBucket()
        bins, actions, bucket_actions = group.bins, group.actions, bucket.actions
        if action is not None:
            one = calibration.ActionStats(1, observed)
            bucket_actions = _plus(bucket_actions, action, one)
            actions = _plus(actions, action, one)
        # model_construct: built here from validated values, so no second validation (hot path).
        batch.write(
            "hours",
            hour_key(group, hour),
            HourBucket.model_construct(
                bins=calibration.add(bucket.bins, predicted, observed), actions=bucket_actions
            ),
        )
        bins = calibration.add(bins, predicted, observed)
        hours = group.hours if hour in group.hours else tuple(sorted((*group.hours, hour)))
        while hours and hours[0] < first:  # oldest first: subtract the hours that left the window
            leaving = batch.hour(hour_key(group, hours[0]))
            if leaving is not None:
                bins = calibration.subtract(bins, leaving.bins)
                actions = calibration.subtract(actions, leaving.actions)
            batch.write("hours", hour_key(group, hours[0]), None)
            hours = hours[1:]
        return group.model_copy(update={"bins": bins, "actions": actions, "hours": hours, "newest": newest})

    def _report(
        self, group: GroupCalibration, outcome: OutcomeEvent, received_at: float, out: Outputs
    ) -> GroupCalibration:
        """Update the gauges; emit CALIBRATION_UPDATED when ECE moved enough, at most every N minutes."""
        samples, ece, brier = calibration.summary(group.bins)
        if ece is None or brier is None:
            return group
        m = self.metrics

        def publish() -> None:  # with the batch, unless this item is dead-lettered
            # Labels too: a capped label takes its place, and a series exists, only once published.
            labels = (
                m.labels("tenant", group.tenant_id),
                group.dimension,
                m.labels(group.dimension, group.value),
                group.kind,
            )
            m.child(m.calibration_ece, *labels).set(ece)
            m.child(m.calibration_brier, *labels).set(brier)
            self._exported.add((group.tenant_id, group.dimension, group.value, group.kind), labels)

        out.meter(publish)
        settings = self.settings
        if samples < settings.calibration_min_samples:
            return group
        if (
            group.last_emitted_ece is not None
            and round(abs(ece - group.last_emitted_ece), 9) < settings.calibration_ece_change
        ):
            return group
        min_interval = timedelta(minutes=settings.calibration_update_min_interval_minutes)
        if group.last_emitted_at is not None and outcome.timestamp - group.last_emitted_at < min_interval:
            return group
        alert = round(ece, 9) >= settings.calibration_ece_alert  # compared as every score is (DESIGN 4b)
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
            bins=calibration.reliability(group.bins),
        ).model_dump(mode="json")
        out.emit(output, outcome.trace_id.encode(), is_flagged(output), received_at)
        return group.model_copy(update={"last_emitted_ece": ece, "last_emitted_at": outcome.timestamp})

    # --- expiry (the sweep) -----------------------------------------------------------------------------

    def partition_of(self, key: bytes) -> int:
        """The changelog partition of a calibration table key: its tenant's."""
        tenant = orjson.loads(key)[0]
        return tenant_partition(str(tenant), self.settings.topic_partitions)

    def sweep_subject(self, key: bytes, entry: SubjectEntry) -> tuple[SubjectEntry | None, int]:
        """(what to keep of an entry or None to delete it, how many waiting outcomes became unmatched)."""
        partition = self.partition_of(key)
        still_waiting = tuple(
            o for o in entry.waiting if not self.clock.passed(partition, self._wait_until(o))
        )
        unmatched = len(entry.waiting) - len(still_waiting)
        subject = entry.subject
        if subject is not None and self.clock.passed(partition, self._join_until(subject)):
            subject = None
        # The counted ids outlive the score while a newer score could still join one of those outcomes:
        # a re-delivered one is then a duplicate whether or not the sweep ran in between.
        until = entry.applied_until
        remember = subject is not None or (until is not None and not self.clock.passed(partition, until))
        applied = entry.applied if remember else ()
        if subject is None and not still_waiting and not applied:
            return None, unmatched
        if unmatched == 0 and subject is entry.subject and applied == entry.applied:
            return entry, 0
        kept = {
            "subject": subject,
            "applied": applied,
            "applied_until": until if applied else None,
            "waiting": still_waiting,
        }
        return entry.model_copy(update=kept), unmatched

    def subject_sweep_after(self, key: bytes, entry: SubjectEntry) -> tuple[int, datetime]:
        """(partition, event time) before which `sweep_subject` would keep the entry as it is."""
        moments = [self._wait_until(o) for o in entry.waiting]
        if entry.subject is not None:
            moments.append(self._join_until(entry.subject))
        elif entry.applied:  # kept past the score: until no newer score could join them
            moments.append(entry.applied_until or datetime.min.replace(tzinfo=UTC))
        # Neither (not written by the stage): due at once, and `sweep_subject` deletes it.
        return self.partition_of(key), min(moments, default=datetime.min.replace(tzinfo=UTC))

    def _counted(self, entry: SubjectEntry, outcomes: list[OutcomeEvent]) -> dict[str, Any]:
        """The entry's `applied` fields once `outcomes` are counted: their ids, and the last event time a
        newer score could join one of them (the end of its wait)."""
        ends = [self._wait_until(o) for o in outcomes]
        if entry.applied_until is not None:
            ends.append(entry.applied_until)
        return {
            "applied": (*entry.applied, *(o.event_id for o in outcomes)),
            "applied_until": max(ends, default=None),
        }

    def _pairs(self, subject: CalibrationSubject, outcome: OutcomeEvent) -> bool:
        """A score and an outcome join when each is within the other's window, whichever came first: the
        outcome by the score's join window, the score by the outcome's wait."""
        within_join_window = outcome.timestamp <= self._join_until(subject)
        within_wait = subject.event_time <= self._wait_until(outcome)
        return within_join_window and within_wait

    def _wait_until(self, outcome: OutcomeEvent) -> datetime:
        """An early outcome waits this long (event time) for its score, then counts as unmatched."""
        return outcome.timestamp + timedelta(hours=self.settings.calibration_outcome_wait_hours)

    def _join_until(self, subject: CalibrationSubject) -> datetime:
        """A score can be joined with an outcome until this event time."""
        return subject.event_time + timedelta(hours=self.settings.calibration_join_window_hours)

    def forget_group(self, group: GroupCalibration) -> None:
        """An expired group's ECE and Brier series stop being exported (they kept their last value)."""
        self._forget_series(group.tenant_id, group.dimension, group.value, group.kind)

    def forget_groups_outside(self, partitions: set[int]) -> None:
        """Forget the series of groups whose tenant's partition this worker no longer owns: the new
        owner exports them, and a stale copy here would stay on every dashboard beside its own."""
        n = self.settings.topic_partitions
        for group in [g for g in self._exported.subjects() if tenant_partition(g[0], n) not in partitions]:
            self._forget_series(*group)

    def _forget_series(self, tenant: str, dimension: str, value: str, kind: str) -> None:
        """The group no longer counts here; its series leaves with the last group using it."""
        labels, unused = self._exported.remove((tenant, dimension, value, kind))
        if labels is None or not unused:  # never set here, or an `other` series groups here still share
            return
        m = self.metrics
        m.child.remove(m.calibration_ece, *labels)
        m.child.remove(m.calibration_brier, *labels)

    def group_expired(self, key: bytes, group: GroupCalibration) -> bool:
        """A group whose newest outcome left the window: every bucket is out of it (delete them all)."""
        return self.clock.passed(*self.group_sweep_after(key, group))

    def group_sweep_after(self, key: bytes, group: GroupCalibration) -> tuple[int, datetime]:
        """(partition, event time) before which the group is not expired."""
        return self.partition_of(key), group.newest + self.window + timedelta(hours=1)
