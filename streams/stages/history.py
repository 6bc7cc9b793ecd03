"""Stage 2, keyed by (tenant, agent): the composite with the agent's rolling history -> RESPONSE_SCORED.

An agent's history is a summary (`AgentHistory`: per-hour counts and the newest event time) plus, per
hour of event time, that hour's entries in chunks of at most HISTORY_CHUNK_BYTES (`HistoryHour`, one
key each). A response rewrites one chunk and the summary, never the agent's whole retained week nor a
busy hour whole; a count over a window adds whole hours from the summary and reads entries only for
the (at most two) hours the window cuts.
"""

from __future__ import annotations

import bisect
import heapq
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Literal

import orjson

from streams.config import ScoringConfigs, Settings
from streams.events import (
    LlmResponse,
    PolicyInput,
    RejectionError,
    ResponseMetadata,
    ResponseScored,
    ScoreKind,
)
from streams.ids import output_event_id
from streams.metrics import OTHER, Metrics, SharedSeries
from streams.scoring import composite, response
from streams.stages.calibration import calibration_records, hand_on_outcome, upstream
from streams.stages.common import ExpiryClock, InputRecord, Outputs, Record, is_flagged, key_partition, now
from streams.state import (
    AgentHistory,
    CalibrationItem,
    CalibrationSubject,
    HistoryEntry,
    HistoryHour,
    HourCounts,
    PendingResponse,
    ResponseOutcome,
    decode_responses_message,
    table_key,
)

__all__ = ["AgentStage", "HistoryWrite", "agent_entries", "chunked", "hour_key", "stored_hours"]

_EVENT_TIME = operator.attrgetter("event_time")
_HOUR_NUMBER = operator.attrgetter("hour")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_HOUR = timedelta(hours=1)

HistoryTable = Literal["summary", "hours"]


def hour_of(moment: datetime) -> int:
    """Hours since the epoch (integer arithmetic: no float rounding at an hour's edge)."""
    return (moment - _EPOCH) // _HOUR


def _hour_start(hour: int) -> datetime:
    return _EPOCH + hour * _HOUR


def hour_key(tenant_id: str, agent_name: str, hour: int, chunk: int = 0) -> bytes:
    """Key of one chunk of an hour of an agent's entries (chunk 0 has the key hours had before chunks)."""
    return orjson.dumps([tenant_id, agent_name, hour] if chunk == 0 else [tenant_id, agent_name, hour, chunk])


def _bounds(
    entries: tuple[HistoryEntry, ...], start: datetime, end: datetime | None, inclusive: bool = False
) -> tuple[int, int]:
    """Where the entries (sorted by event time) with start <= event_time < end (<= end if `inclusive`)
    begin and end."""
    if not entries:
        return 0, 0

    def before_end(moment: datetime) -> bool:
        return end is None or moment < end or (inclusive and moment == end)

    # A busy hour has many chunks and a window cuts few of them: most are inside or outside whole.
    first, last = entries[0].event_time, entries[-1].event_time
    if first >= start and before_end(last):
        return 0, len(entries)
    if last < start or not before_end(first):
        return 0, 0
    low = bisect.bisect_left(entries, start, key=_EVENT_TIME)
    if end is None:
        return low, len(entries)
    bound = bisect.bisect_right if inclusive else bisect.bisect_left
    return low, bound(entries, end, lo=low, key=_EVENT_TIME)


def _between(
    entries: tuple[HistoryEntry, ...], start: datetime, end: datetime | None, inclusive: bool = False
) -> tuple[HistoryEntry, ...]:
    """The entries (sorted by event time) with start <= event_time < end (<= end if `inclusive`)."""
    low, high = _bounds(entries, start, end, inclusive)
    return entries[low:high]


# What an entry adds to a stored chunk besides its id's escaped characters, at most: the entry encoded
# with an empty id and the longest values its other fields can have, and the comma before it.
_ENTRY_REST = 1 + len(
    HistoryEntry(
        event_id="",
        event_time=datetime(
            9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone(-timedelta(hours=23, minutes=59))
        ),
        threshold_met=False,
        composite=-2.2250738585072014e-308,
        blocked=False,
        history_score=-2.2250738585072014e-308,
    ).model_dump_json()
)
_CHUNK_FRAME = len(HistoryHour().model_dump_json())
_EVENT_ID = operator.attrgetter("event_id")


def chunk_bytes_bound(entries: Iterable[HistoryEntry]) -> int:
    """An upper bound of the encoded size of a chunk holding `entries`."""
    entries = tuple(entries)
    # JSON escapes one character at a time, so the ids are measured joined: one call, not one per entry.
    ids = len(orjson.dumps("".join(map(_EVENT_ID, entries)))) - 2
    return _CHUNK_FRAME + len(entries) * _ENTRY_REST + ids


def chunked(entries: list[HistoryEntry], limit: int) -> list[tuple[HistoryEntry, ...]]:
    """`entries` (one hour's, sorted) cut in order into chunks bounded by `limit` bytes (or one entry)."""
    chunks: list[list[HistoryEntry]] = []
    size = 0
    for entry in entries:
        grows = chunk_bytes_bound((entry,)) - _CHUNK_FRAME  # the bound adds up entry by entry
        if chunks and size + grows <= limit:
            chunks[-1].append(entry)
            size += grows
        else:
            chunks.append([entry])
            size = _CHUNK_FRAME + grows
    return [tuple(chunk) for chunk in chunks]


Chunk = tuple[int, int]  # (hour, chunk index)


def stored_hours(
    entries: tuple[HistoryEntry, ...], limit: int
) -> tuple[tuple[HourCounts, ...], dict[Chunk, HistoryHour]]:
    """`entries` (sorted by event time) as stored: each hour's counts, ascending, and its chunks."""
    by_hour: dict[int, list[HistoryEntry]] = {}
    for entry in entries:  # sorted by event time, so each hour's list is too
        by_hour.setdefault(hour_of(entry.event_time), []).append(entry)
    counts, chunks = [], {}
    for hour, hour_entries in sorted(by_hour.items()):
        pieces = [HistoryHour(entries=piece) for piece in chunked(hour_entries, limit)]
        chunks.update({(hour, index): piece for index, piece in enumerate(pieces)})
        met = sum(piece.met for piece in pieces)
        counts.append(HourCounts(hour=hour, total=len(hour_entries), met=met, chunks=len(pieces)))
    return tuple(counts), chunks


@dataclass(frozen=True)
class HistoryWrite:
    """A value for the summary or an hour key (None deletes it), to the partition the agent is read from."""

    table: HistoryTable
    value: AgentHistory | HistoryHour | None
    partition: int


SummaryLoader = Callable[[bytes], AgentHistory | None]
HourLoader = Callable[[bytes], HistoryHour | None]


class _Agent:
    """One agent's history while a response is applied; reads see the batch's earlier writes."""

    def __init__(
        self,
        event: LlmResponse,
        dirty: dict[bytes, HistoryWrite],
        load: SummaryLoader,
        load_hour: HourLoader,
        chunk_bytes: int,
    ) -> None:
        self.tenant_id, self.agent_name = event.tenant_id, event.agent_name
        self._dirty, self._load_hour, self._chunk_bytes = dirty, load_hour, chunk_bytes
        key = table_key(self.tenant_id, self.agent_name)
        written = dirty.get(key)
        stored = written.value if written is not None else load(key)
        assert stored is None or isinstance(stored, AgentHistory)
        self.summary = stored or AgentHistory(
            tenant_id=self.tenant_id, agent_name=self.agent_name, agent_type=event.agent_type
        )
        self._chunks: dict[Chunk, HistoryHour] = {}
        self._changed: set[Chunk] = set()
        self._gone: list[Chunk] = []
        self._summary_changed = False
        if self.summary.entries:  # a value of the old format (one list): split it by hour
            self._split_by_hour()

    def _chunk(self, hour: int, index: int) -> HistoryHour:
        if (hour, index) not in self._chunks:
            key = hour_key(self.tenant_id, self.agent_name, hour, index)
            written = self._dirty.get(key)
            stored = written.value if written is not None else self._load_hour(key)
            assert stored is None or isinstance(stored, HistoryHour)
            self._chunks[hour, index] = stored or HistoryHour()
        return self._chunks[hour, index]

    def _find(self, hour: int) -> tuple[int, HourCounts | None]:
        """Where `hour` is (or would go) in the summary's hours, and its counts if it is there."""
        hours = self.summary.hours
        at = bisect.bisect_left(hours, hour, key=_HOUR_NUMBER)
        return at, hours[at] if at < len(hours) and hours[at].hour == hour else None

    def between(
        self, hour: int, start: datetime, end: datetime | None, inclusive: bool = False
    ) -> Iterator[HistoryEntry]:
        """The entries of `hour` (any chunk) with start <= event_time < end (<= end if `inclusive`)."""
        _, counts = self._find(hour)
        for index in range(counts.chunks if counts else 0):
            yield from _between(self._chunk(hour, index).entries, start, end, inclusive)

    def add(self, entry: HistoryEntry) -> None:
        """Insert `entry` in its hour's last chunk (a new one if it would not fit), after the entries
        with the same or an earlier time, and count it."""
        hour = hour_of(entry.event_time)
        place, counts = self._find(hour)
        index = counts.chunks - 1 if counts else 0
        entries = self._chunk(hour, index).entries
        if entries and chunk_bytes_bound((*entries, entry)) > self._chunk_bytes:
            index, entries = index + 1, ()
        at = bisect.bisect_right(entries, entry.event_time, key=_EVENT_TIME)
        self._chunks[hour, index] = HistoryHour(entries=(*entries[:at], entry, *entries[at:]))
        self._changed.add((hour, index))
        hours = list(self.summary.hours)
        if counts is not None:
            hours[place] = HourCounts(
                hour=hour, total=counts.total + 1, met=counts.met + entry.threshold_met, chunks=index + 1
            )
        else:
            hours.insert(place, HourCounts(hour=hour, total=1, met=int(entry.threshold_met)))
        self.update(hours=tuple(hours))

    def update(self, **fields: object) -> None:
        self.summary = self.summary.model_copy(update=fields)
        self._summary_changed = True

    def drop_hours_before(self, horizon: datetime) -> None:
        """Hours wholly before `horizon` leave; the hour it cuts stays (counts read it from the horizon)."""
        # Hour h ends at or before the horizon exactly when h < hour_of(horizon).
        kept_from = bisect.bisect_left(self.summary.hours, hour_of(horizon), key=_HOUR_NUMBER)
        gone = [(c.hour, index) for c in self.summary.hours[:kept_from] for index in range(c.chunks)]
        if gone:
            self._gone += gone
            self._changed -= set(gone)
            self.update(hours=self.summary.hours[kept_from:])

    def count(self, start: datetime, end: datetime | None) -> tuple[int, int]:
        """(responses, those that met their threshold) with start <= event time < end (None: no end)."""
        hours = self.summary.hours
        start_hour = hour_of(start)
        # Compared as hour numbers, not datetimes (this runs for every stored hour in the window): hour h
        # begins at or after `start` from `whole_from` on, and ends at or before `end` below `end_hour`.
        whole_from = start_hour if _hour_start(start_hour) == start else start_hour + 1
        end_hour = None if end is None else hour_of(end)
        end_exact = end_hour is not None and _hour_start(end_hour) == end
        # Only the hours from start's to end's are looked at (sorted: bisection, not a scan of the week).
        low = bisect.bisect_left(hours, start_hour, key=_HOUR_NUMBER)
        high = len(hours) if end_hour is None else bisect.bisect_right(hours, end_hour, key=_HOUR_NUMBER)
        total = met = 0
        for counts in hours[low:high]:
            hour = counts.hour
            if end_exact and hour == end_hour:  # `end` is this hour's first instant: nothing to load
                continue
            if hour >= whole_from and (end_hour is None or hour < end_hour):
                total, met = total + counts.total, met + counts.met
            else:  # the window cuts this hour: whole chunks by their counts, entries where it cuts one
                for index in range(counts.chunks):
                    entries = (chunk := self._chunk(hour, index)).entries
                    low, high = _bounds(entries, start, end)
                    whole = low == 0 and high == len(entries)
                    total += high - low
                    met += chunk.met if whole else sum(e.threshold_met for e in entries[low:high])
        return total, met

    def writes(self, partition: int) -> dict[bytes, HistoryWrite]:
        """What changed, once per key: chunks, deleted chunks, the summary."""
        writes = {
            hour_key(self.tenant_id, self.agent_name, *chunk): HistoryWrite(
                "hours", self._chunks[chunk], partition
            )
            for chunk in sorted(self._changed)
        }
        for chunk in self._gone:
            writes[hour_key(self.tenant_id, self.agent_name, *chunk)] = HistoryWrite("hours", None, partition)
        if self._summary_changed:
            key = table_key(self.tenant_id, self.agent_name)
            writes[key] = HistoryWrite("summary", self.summary, partition)
        return writes

    def _split_by_hour(self) -> None:
        entries = self.summary.entries
        counts, self._chunks = stored_hours(entries, self._chunk_bytes)
        self._changed = set(self._chunks)
        self.update(entries=(), hours=counts, newest=entries[-1].event_time)


def agent_entries(summary: AgentHistory, load_hour: HourLoader, since: datetime) -> Iterator[HistoryEntry]:
    """The agent's retained entries with event time >= `since`, in event-time order (the view's input)."""
    if summary.entries:  # a value of the old format (one list), not rewritten yet
        yield from _between(summary.entries, since, None)
        return
    for counts in summary.hours:
        if _hour_start(counts.hour + 1) > since:
            chunks = [
                load_hour(hour_key(summary.tenant_id, summary.agent_name, counts.hour, index))
                for index in range(counts.chunks)
            ]
            # Chunks of one hour may overlap in time; merged in chunk order, equal times keep it.
            yield from heapq.merge(
                *(_between(chunk.entries, since, None) for chunk in chunks if chunk), key=_EVENT_TIME
            )


class AgentStage:
    """Stage 2: composite with the agent's rolling history, keyed by (tenant, agent_name)."""

    def __init__(self, settings: Settings, configs: ScoringConfigs, metrics: Metrics) -> None:
        self.settings = settings
        self.configs = configs
        self.metrics = metrics
        # Event time per responses partition, a watermark over the input partitions that feed it: an
        # agent silent for HISTORY_RETENTION_HOURS leaves (`expired`). Also bounds how far an agent's
        # newest time may run ahead of the wall clock (`bounded`).
        self.clock = ExpiryClock(
            timedelta(hours=settings.event_time_max_ahead_hours), settings.expiry_source_idle_seconds
        )
        # llm_confidence_average per label set: the rolling average's own state (0.0 is a value too).
        self._averages: dict[tuple[str, str, str], float] = {}
        # The agents that fed each average's label set: the series leaves with the last of them (moved
        # to another worker or swept), as the success rate does; a stale copy stayed on dashboards.
        self._average_feeders: dict[tuple[str, str, str], set[tuple[str, str]]] = {}
        self._averages_fed_by: dict[tuple[str, str], set[tuple[str, str, str]]] = {}
        # The success-rate series of each agent scored here, and how many agents share one agent label:
        # a swept agent's series leaves (with its last user, for an `other` one), and its label's place.
        self._rate_series: SharedSeries[tuple[str, str]] = SharedSeries()
        self._agent_label_users: Counter[str] = Counter()

    def process(
        self, records: list[InputRecord], load: SummaryLoader, load_hour: HourLoader
    ) -> tuple[list[Record], dict[bytes, HistoryWrite]]:
        """Process a batch in order; return records to send and the values to write (once per key)."""
        out = Outputs(self.settings, self.metrics)
        dirty: dict[bytes, HistoryWrite] = {}
        for record in records:
            out.guarded(record, "history stage", lambda r: self._one(r, load, load_hour, dirty, out))
        out.settle()
        return [*out.records, *calibration_records(self.settings, out)], dirty

    def _one(
        self,
        record: InputRecord,
        load: SummaryLoader,
        load_hour: HourLoader,
        dirty: dict[bytes, HistoryWrite],
        out: Outputs,
    ) -> None:
        pending = decode_responses_message(record.value or b"")
        if isinstance(pending, ResponseOutcome):
            source = upstream("responses", record.partition)
            hand_on_outcome(out, pending.outcome, pending.received_at, pending.source_partition, source)
            return
        agent = _Agent(pending.event, dirty, load, load_hour, self.settings.history_chunk_bytes)
        self._apply(agent, pending, record, out)
        # Only once the response was handled: a dead-lettered one changes nothing.
        dirty.update(agent.writes(record.partition))
        self.clock.saw(record.partition, pending.event.timestamp, source=pending.source_partition)

    def _apply(self, agent: _Agent, pending: PendingResponse, record: InputRecord, out: Outputs) -> None:
        event = pending.event
        when = event.timestamp
        retention = timedelta(hours=self.settings.history_retention_hours)
        window = timedelta(hours=self.settings.history_window_hours)
        # Entries before the retention horizon count as gone (the hour it cuts is read from it on).
        retained_from = when - window if agent.summary.newest is None else agent.summary.newest - retention
        # A re-delivered response has the same event time: only entries of its hour at that time can be it.
        same_time = agent.between(hour_of(when), when, when, inclusive=True)
        known = next((e for e in same_time if e.event_id == event.event_id), None)
        if known is not None and when >= retained_from:
            history_factor = known.history_score
        else:
            known = None
            total, met = agent.count(max(when - window, retained_from), when)
            history_factor = met / total if total else 0.5  # seed 004's rule (composite.history_score)
        output = self._scored(pending, history_factor)
        out.emit(output, event.trace_id.encode(), is_flagged(output), pending.received_at)
        if self.settings.calibration_enabled:
            self._send_subject(pending, output, record, out)
        if known is not None or pending.redelivered:
            # A re-delivery found at another time (its producer re-stamped a retry) was counted when it
            # first came: it is scored again over the current history but not kept a second time.
            return
        comp = output["composite"]
        assert isinstance(comp, dict)
        # The agent's newest time moves at most to the wall clock's bound: one response dated 2062
        # would otherwise move the retention horizon there and drop every hour the agent has.
        bounded = self.clock.bounded(when)
        newest = bounded if agent.summary.newest is None else max(agent.summary.newest, bounded)
        horizon = newest - retention
        # An older response is scored, not kept (it would be pruned at once). So is one dated past the
        # clock's bound: retention counts back from `newest`, so its hour would never leave, and each
        # such hour made the summary (one changelog record) longer for good.
        if horizon <= when <= bounded:
            agent.add(
                HistoryEntry(
                    event_id=event.event_id,
                    event_time=when,
                    threshold_met=bool(comp["threshold_met"]),
                    composite=float(comp["score"]),
                    blocked=bool(comp["should_block"]),
                    history_score=history_factor,
                )
            )
        agent.update(newest=newest, agent_type=event.agent_type)
        agent.drop_hours_before(horizon)
        # The agent's last window ends at its newest response, not at this one (which may be late).
        self._observe(pending, output, agent.count(max(newest - window, horizon), None))

    def _scored(self, pending: PendingResponse, history_factor: float) -> dict[str, object]:
        event = pending.event
        cfg = self.configs.response
        decision = response.evaluate_confidence(pending.confidence, cfg)
        result = composite.score_composite(
            agent_type=event.agent_type,
            retrieval_similarities=None
            if event.retrieval is None
            else [hit.similarity for hit in event.retrieval],
            code_validation=None
            if event.code_validation is None
            else composite.CodeValidation(**event.code_validation.model_dump()),
            response_text=event.response,
            history=history_factor,
            cfg=self.configs.composite,
        )
        flags = list(decision.flags)
        error: RejectionError | None = None
        text: str | None = event.response
        if decision.action == "reject":
            # Reject (seed 003) wins over the composite's block (DESIGN 4b).
            text = None
            error = RejectionError(
                details={"confidence": decision.confidence, "min_acceptance": cfg.min_acceptance}
            )
        elif result.should_block:
            text = composite.I_DONT_KNOW_ANSWER
        if result.should_block:
            flags.append("COMPOSITE_BLOCKED")
        return ResponseScored(
            event_id=output_event_id("RESPONSE_SCORED", event.event_id),
            source_event_id=event.event_id,
            trace_id=event.trace_id,
            tenant_id=event.tenant_id,
            scored_at=now(),
            confidence=decision.confidence,
            heuristic=pending.heuristic,
            composite=result,
            action=decision.action,
            flags=flags,
            response=text,
            error=error,
            metadata=ResponseMetadata(
                request_id=event.request_id,
                tenant_id=event.tenant_id,
                model=event.model,
                endpoint=event.endpoint,
                agent_name=event.agent_name,
                agent_type=event.agent_type,
                role=event.role,
            ),
            policy_input=PolicyInput(
                confidence=decision.confidence,
                confidence_enabled=cfg.enabled,
                request_id=event.request_id,
                tenant_id=event.tenant_id,
                endpoint=event.endpoint,
                model=event.model,
            ),
        ).model_dump(mode="json")

    def _send_subject(
        self, pending: PendingResponse, output: dict[str, object], record: InputRecord, out: Outputs
    ) -> None:
        """Tell the calibration stage which confidence and composite this response was given."""
        event = pending.event
        comp = output["composite"]
        assert isinstance(comp, dict)
        scores: dict[ScoreKind, float] = {"composite": float(comp["score"])}
        if pending.confidence is not None:
            scores["response"] = pending.confidence
        action = output["action"]
        assert action in ("allow", "flag", "reject")
        subject = CalibrationSubject(
            subject_type="response",
            subject_id=event.event_id,
            event_time=event.timestamp,
            scores=scores,
            action=action,
            model=event.model,
            agent_type=event.agent_type,
        )
        source = upstream("responses", record.partition)
        out.calibrate(
            event.tenant_id, source, CalibrationItem(subject=subject, received_at=pending.received_at)
        )

    # --- expiry (the sweep) -----------------------------------------------------------------------------

    def partition_of(self, key: bytes) -> int:
        """The partition of an agent's summary key: its responses-topic partition, as stage 1 sends."""
        return key_partition(key, self.settings.topic_partitions)

    def sweep_after(self, key: bytes, summary: AgentHistory) -> tuple[int, datetime]:
        """(partition, event time) before which the agent keeps its history: its newest response plus
        HISTORY_RETENTION_HOURS, when every entry has left the retention (its next response would
        drop them all anyway)."""
        newest = summary.newest or max((e.event_time for e in summary.entries), default=None)
        retention = timedelta(hours=self.settings.history_retention_hours)
        return self.partition_of(key), (newest or datetime.min.replace(tzinfo=UTC)) + retention

    def expired(self, key: bytes, summary: AgentHistory) -> bool:
        return self.clock.passed(*self.sweep_after(key, summary))

    def expired_keys(self, summary: AgentHistory) -> list[bytes]:
        """Every chunk key of an expired agent's hours (its summary key is the caller's)."""
        return [
            hour_key(summary.tenant_id, summary.agent_name, counts.hour, chunk)
            for counts in summary.hours
            for chunk in range(counts.chunks)
        ]

    def _observe(self, pending: PendingResponse, output: dict[str, object], recent: tuple[int, int]) -> None:
        """Metrics of one scored response; `recent` = (responses, met) of the agent's last window."""
        m = self.metrics
        event = pending.event
        labels = m.labels.combination(
            "response",
            (
                m.labels("tenant", event.tenant_id),
                m.labels("model", event.model),
                m.labels("endpoint", event.endpoint),
            ),
        )
        if pending.confidence is None:
            if self.configs.response.enabled:
                m.child(m.confidence_missing, *labels).inc()
        else:
            m.child(m.confidence_histogram, *labels).observe(pending.confidence)
            previous = self._averages.get(labels)
            average = (
                pending.confidence if previous is None else previous + 0.05 * (pending.confidence - previous)
            )
            self._averages[labels] = average
            m.child(m.confidence_average, *labels).set(average)
            feeder = (event.tenant_id, event.agent_name)
            self._average_feeders.setdefault(labels, set()).add(feeder)
            self._averages_fed_by.setdefault(feeder, set()).add(labels)
        m.child(m.response_actions, str(output["action"])).inc()
        if output["action"] == "reject":
            m.child(m.confidence_rejected, *labels).inc()
        comp = output["composite"]
        assert isinstance(comp, dict)
        if comp["should_block"]:
            m.child(m.composite_blocked, m.labels("agent_type", event.agent_type.lower())).inc()
        total, met = recent
        if total:
            m.child(m.agent_success_rate, *self._success_rate_series(event.tenant_id, event.agent_name)).set(
                met / total
            )

    def _forget_averages_of(self, feeder: tuple[str, str]) -> None:
        m = self.metrics
        for labels in self._averages_fed_by.pop(feeder, set()):
            feeders = self._average_feeders.get(labels, set())
            feeders.discard(feeder)
            if not feeders:
                self._average_feeders.pop(labels, None)
                self._averages.pop(labels, None)
                m.child.remove(m.confidence_average, *labels)

    def _success_rate_series(self, tenant: str, agent: str) -> tuple[str, ...]:
        series = self._rate_series.get((tenant, agent))
        if series is None:
            m = self.metrics
            series = (m.labels("tenant", tenant), m.labels("agent", agent))
            self._rate_series.add((tenant, agent), series)
            self._agent_label_users[series[1]] += 1
        return series

    def forget_agents_outside(self, partitions: set[int]) -> None:
        """Forget the agents whose history is on a partition this worker no longer owns: their new
        owner exports their success rate, and a stale copy here would stay on every dashboard."""
        agents = {*self._rate_series.subjects(), *self._averages_fed_by}
        moved = [k for k in agents if self.partition_of(table_key(*k)) not in partitions]
        for tenant, agent in moved:
            self.forget_agent(tenant, agent)

    def forget_agent(self, tenant: str, agent: str) -> None:
        """A swept agent's success rate stops being exported (a dead instance's rate stayed on every
        dashboard), and its agent label's place is freed for a newcomer (which became `other`). The
        confidence averages it fed leave with the last agent feeding them."""
        self._forget_averages_of((tenant, agent))
        series, unused = self._rate_series.remove((tenant, agent))
        if series is None:  # not scored by this process (restored, or never within a window)
            return
        m = self.metrics
        if unused:
            m.child.remove(m.agent_success_rate, *series)
        label = series[1]
        self._agent_label_users[label] -= 1
        if not self._agent_label_users[label]:
            del self._agent_label_users[label]
            if label != OTHER:
                m.labels.forget("agent", label)
