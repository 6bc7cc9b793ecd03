"""What the stages share: consumed and produced records, output collection, the flagged rule."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Generic, Protocol, TypeVar

import orjson
from aiokafka.partitioner import murmur2
from pydantic import BaseModel

from streams.config import Settings
from streams.dlq import DeadLetter, Reason, connect_headers, strip_logprobs
from streams.events import ID_MAX_CHARS, OutcomeEvent
from streams.metrics import Metrics
from streams.state import CalibrationItem, CalibrationMessage, CalibrationSubject

__all__ = [
    "INPUT_SOURCE_STRIDE",
    "ExpiryClock",
    "InputRecord",
    "MeasuredSizes",
    "Outputs",
    "OversizedOutput",
    "Record",
    "Rejected",
    "StateSizes",
    "ValueBound",
    "bundle",
    "is_flagged",
    "key_partition",
    "now",
    "processing_error",
    "tenant_partition",
    "unbundle",
    "with_scored_at",
    "without_scored_at",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class InputRecord:
    """The parts of a consumed Kafka record the stages need."""

    topic: str
    partition: int
    offset: int
    timestamp: float  # producer timestamp, epoch seconds
    value: bytes | None
    key: bytes | None = None  # as produced; a dead letter keeps it (Kafka Connect's DLQ does the same)


@dataclass(frozen=True, slots=True)
class Record:
    """One record to produce."""

    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] | None = None
    partition: int | None = None  # None: Kafka's default partitioner on the key
    # An output's (event type, producer timestamp of the input it answers): its end-to-end latency is
    # observed when the broker acknowledges it (batch_runner), not when it was made.
    latency_from: tuple[str, float] | None = None


class ExpiryClock:
    """Event time per partition, which state on that partition expires against.

    One clock per partition, not per worker: partitions are consumed unevenly (one may be far behind
    another), and a worker-wide newest time swept state that its own partition was still using. A
    partition fed by several upstream partitions (the responses, claims and calibration topics, and
    stage 1's with several input topics) keeps the newest
    time per upstream `source` and reads the *oldest* of those (a watermark), so a lagging upstream
    partition's state is not swept because another one ran ahead. An event time more than `max_ahead`
    past the wall clock moves the clock only to that bound, so one future-dated event cannot expire a
    partition's state.

    With several sources, `source_idle_seconds` (wall clock) is how long a source may send nothing
    before the watermark leaves it out, as Flink's `withIdleness`: a source that went quiet for good (a
    tenant that stopped sending claims) would otherwise hold the watermark, and every expiry on the
    partition, for ever. For the same span after a partition's first event the clock answers "not
    passed": after a start or a rebalance, sources not heard yet (a slower stage catching up) may still
    send older times.
    """

    def __init__(
        self,
        max_ahead: timedelta,
        source_idle_seconds: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_ahead = max_ahead
        self.source_idle_seconds = source_idle_seconds
        self._monotonic = monotonic
        self._newest: dict[int, dict[int, datetime]] = {}
        self._heard: dict[int, dict[int, float]] = {}  # partition -> source -> when it last sent
        self._first_heard: dict[int, float] = {}  # partition -> since when it is heard without a silence
        self._last_heard: dict[int, float] = {}
        self._latest_of: dict[tuple[int, int], datetime] = {}  # (partition, source) -> its latest event
        self._bound = now() + max_ahead  # cached: the wall clock only grows, so this can only lag it

    def bounded(self, event_time: datetime) -> datetime:
        """`event_time`, or the wall clock plus `max_ahead` when it is further ahead than that."""
        if event_time > self._bound:  # only an event past the cached bound needs a fresh clock read
            self._bound = now() + self.max_ahead
        return min(event_time, self._bound)

    def saw(self, partition: int, event_time: datetime, source: int = 0) -> None:
        bounded = self.bounded(event_time)
        self._latest_of[(partition, source)] = bounded
        sources = self._newest.setdefault(partition, {})
        current = sources.get(source)
        if current is None or bounded > current:
            sources[source] = bounded
        idle = self.source_idle_seconds
        if idle is not None:
            heard_at = self._monotonic()
            self._heard.setdefault(partition, {})[source] = heard_at
            last = self._last_heard.get(partition)
            if last is None or heard_at - last > idle:
                # Heard first, or again after a silence: after a start, a partition assigned here again
                # or a pause, sources not heard yet may still send older times (the grace restarts).
                self._first_heard[partition] = heard_at
            self._last_heard[partition] = heard_at

    def latest_of(self, partition: int, source: int) -> datetime | None:
        """The (bounded) event time of the most recent event of one source of the partition (stage 1:
        one input topic's partition): how far reading has got.

        Input alignment (streams/alignment.py) reads this rather than the newest time, which one
        future-dated event would pin.
        """
        return self._latest_of.get((partition, source))

    def passed(self, partition: int, moment: datetime) -> bool:
        """True once the partition's event time (its oldest active source's newest) is past `moment`."""
        sources = self._newest.get(partition)
        if not sources:
            return False
        idle = self.source_idle_seconds
        if idle is None:
            return min(sources.values()) > moment
        at = self._monotonic()
        if at - self._first_heard[partition] < idle:
            return False  # just started here: sources not heard yet may still hold the watermark back
        heard = self._heard[partition]
        active = [newest for source, newest in sources.items() if at - heard[source] <= idle]
        # Every source quiet: nothing arrives, so nothing grows; the oldest still holds.
        return min(active or sources.values()) > moment


# The later stages' expiry clocks count each input topic's partition as its own upstream source: the
# second input topic's partition p is INPUT_SOURCE_STRIDE + p (TOPIC_PARTITIONS is at most 1,024).
INPUT_SOURCE_STRIDE = 1024


def key_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2) gives `key`: the same as Faust's router's."""
    if len(key) <= _CACHED_KEY_BYTES:
        return _cached_key_partition(key, partitions)
    return (murmur2(key) & 0x7FFFFFFF) % partitions


# Ids and table keys are short; a dead letter keeps its input's key, which may be any size, and the cache
# would keep every such key (65,536 of up to 1 MB each).
_CACHED_KEY_BYTES = 512


@functools.lru_cache(maxsize=65536)  # pure Python murmur2 per record showed in profiles
def _cached_key_partition(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def tenant_partition(tenant_id: str, partitions: int) -> int:
    """A tenant's partition of the claims and calibration topics.

    Computed here rather than left to the producer, because the claims and calibration tables write
    their changelog records to the same partition (state follows the tenant) and Faust's router uses
    the same hash.
    """
    return key_partition(tenant_id.encode(), partitions)


def bundle(records: list[Record], topics: Collection[str], max_bytes: int) -> list[Record]:
    """The batch's records with those for `topics` joined into one record per (topic, partition).

    The internal topics carry one message per forwarded input or score; sent one record each, every
    stage's consumer, fetcher and producer paid per record (half the records the worker handled).
    A bundle is the messages in their order, newline-delimited (JSON never contains a raw newline),
    at most `max_bytes` each; `unbundle` splits it again, so a bundle of one is the old format. Such
    records need an explicit partition: the bundle's partition is what keeps each key in sequence.
    Records for other topics keep their order; bundles follow them.
    """
    kept: list[Record] = []
    bundles: list[Record] = []
    parts_of: dict[tuple[str, int], list[bytes]] = {}  # the open bundle per (topic, partition)
    size_of: dict[tuple[str, int], int] = {}

    def close(where: tuple[str, int]) -> None:
        size_of.pop(where)
        bundles.append(Record(where[0], b"", b"\n".join(parts_of.pop(where)), partition=where[1]))

    for record in records:
        if record.topic not in topics:
            kept.append(record)
            continue
        if record.partition is None:
            raise ValueError(f"a record for {record.topic} needs an explicit partition to be bundled")
        where = (record.topic, record.partition)
        if where in parts_of and size_of[where] + 1 + len(record.value) > max_bytes:
            close(where)
        parts_of.setdefault(where, []).append(record.value)
        size_of[where] = size_of.get(where, -1) + 1 + len(record.value)  # newline-separated
    for where in list(parts_of):
        close(where)
    return [*kept, *bundles]


def unbundle(record: InputRecord) -> list[InputRecord]:
    """The messages of a bundle (see `bundle`) as records of their own, sharing its offset."""
    if not record.value or b"\n" not in record.value:
        return [record]
    return [dataclasses.replace(record, value=part) for part in record.value.split(b"\n")]


# The longest valid trace id, in bytes (ID_MAX_CHARS characters of up to 4 bytes): producers key by it.
DEAD_LETTER_KEY_MAX_BYTES = 4 * ID_MAX_CHARS


def now() -> datetime:
    """Processing time (`scored_at`, latency); never used for scoring."""
    return datetime.now(UTC)


@dataclass
class Outputs:
    """Collects the records of one stage's batch and the metric updates they cause.

    The updates wait for `settle` at the end of the batch: a record that `guarded` drops takes its
    updates with it, so no counter counts an output that was never sent.
    """

    settings: Settings
    metrics: Metrics
    records: list[Record] = field(default_factory=list)
    # (tenant, upstream source, item) for the calibration stage, sent grouped at the end of the batch.
    calibration: list[tuple[str, int, CalibrationItem]] = field(default_factory=list)
    metered: list[Callable[[], None]] = field(default_factory=list)
    emitted_bytes: int = 0  # of the outputs emitted so far (each counted once, flagged copies aside)

    def meter(self, update: Callable[[], None]) -> None:
        """Apply `update` (a metric change) when the batch settles, unless its record is dropped."""
        self.metered.append(update)

    def settle(self) -> None:
        """Apply the batch's metric updates; call once, after the last record."""
        for update in self.metered:
            update()
        self.metered.clear()

    def calibrate(self, tenant: str, source: int, item: CalibrationItem) -> None:
        """Queue a score or an outcome for the calibration stage.

        Messages are cut at PRODUCER_MAX_BATCH_BYTES, but never below one item, and an item with ids
        of escaped characters is up to about 31 KB: under a MAX_RECORD_BYTES that low it is checked
        like any message to a later stage (the input is refused, `oversized_output`).
        """
        if _calibration_size_bound(tenant, item) > self.settings.max_record_bytes:
            message = CalibrationMessage(tenant_id=tenant, items=[item], source=source)
            self._check_size(b"", message.model_dump_json().encode(), "calibration message")
        self.calibration.append((tenant, source, item))

    def dead_letter(self, letter: DeadLetter, record: InputRecord) -> None:
        """Send the record to the DLQ (logprobs removed) with Connect-style error headers.

        The record keeps its key, unless longer than any valid one (then its SHA-256, so a key's dead
        letters still share a partition), and its value is cut to keep the dead letter within
        MAX_RECORD_BYTES: an input the broker took, with a 48 KB key, made a dead letter it refused.
        """
        self.metrics.child(self.metrics.events_dead_lettered, letter.reason).inc()
        key = record.key
        if key is not None and len(key) > DEAD_LETTER_KEY_MAX_BYTES:
            key = hashlib.sha256(key).hexdigest().encode()
        headers = connect_headers(letter, record.topic, record.partition, record.offset)
        room = self.settings.max_record_bytes - len(key or b"") - sum(len(n) + len(v) for n, v in headers)
        value = strip_logprobs(letter.raw, max(0, min(self.settings.max_event_bytes, room)))
        self.records.append(Record(self.settings.dlq_topic, key, value, headers))

    def guarded(
        self,
        record: InputRecord,
        stage: str,
        handle: Callable[[InputRecord], None],
        dead_value: Callable[[], bytes] | None = None,
    ) -> None:
        """Run `handle(record)`; if it raises, drop what it emitted and dead-letter the record instead
        (or, given `dead_value`, what it returns: the part of the record that failed).

        A scorer bug or an unreadable internal message must never stop the worker (DESIGN section 6).
        """
        mark, calibration_mark, metered_mark = len(self.records), len(self.calibration), len(self.metered)
        try:
            handle(record)
            return
        except Rejected as rejected:  # like a decode failure: the DLQ headers and a metric tell, no log
            letter = rejected.letter
        except OversizedOutput as exc:
            letter = DeadLetter(record.value or b"", "oversized_output", "OversizedOutput", str(exc))
        except Exception as exc:
            log.error(
                "dead-lettering %s[%d]@%d in the %s: %s",
                record.topic,
                record.partition,
                record.offset,
                stage,
                type(exc).__name__,
            )
            letter = processing_error(record, exc, stage)
        if dead_value is not None:
            letter = dataclasses.replace(letter, raw=self._failed_part(record, dead_value))
        del self.records[mark:]
        del self.calibration[calibration_mark:]
        del self.metered[metered_mark:]
        self.dead_letter(letter, record)

    @staticmethod
    def _failed_part(record: InputRecord, dead_value: Callable[[], bytes]) -> bytes:
        try:
            return dead_value()
        except Exception:  # never let the dead letter's own encoding fail the records handled before it
            log.exception("dead-lettering %s[%d]@%d whole", record.topic, record.partition, record.offset)
            return record.value or b""

    def emit(self, output: dict[str, object], key: bytes, flagged: bool, received_at: float) -> None:
        value = orjson.dumps(output)
        event_type = str(output["event_type"])
        self._check_size(key, value, f"{event_type} output")
        self.emitted_bytes += len(value)
        self.records.append(
            Record(self.settings.scored_topic, key, value, latency_from=(event_type, received_at))
        )
        if flagged:
            self.records.append(Record(self.settings.flagged_topic, key, value))
        m = self.metrics
        self.meter(m.child(m.outputs_emitted, event_type).inc)

    def forward(self, record: Record) -> None:
        """Queue a message for a later stage (an internal topic)."""
        self._check_size(record.key, record.value, f"message to {record.topic}")
        self.records.append(record)

    def _check_size(self, key: bytes, value: bytes, what: str) -> None:
        # The input bounds (MAX_EVENT_BYTES, array lengths, id lengths) keep almost every record small,
        # but not all: a list's entries gain their defaults in an internal message (58,000 retrieval
        # hits of 16 bytes became 1.9 MB), and a synthesis over 50 claims with long ids lists every
        # conflict. A broker refuses such a record and the worker would stop on it after every restart.
        size = len(key) + len(value)
        limit = self.settings.max_record_bytes
        if size > limit:
            raise OversizedOutput(
                f"its {what} would be {size} bytes, over MAX_RECORD_BYTES ({limit}): the input was not applied"
            )


class OversizedOutput(Exception):
    """A record a stage would send is larger than MAX_RECORD_BYTES: its input is dead-lettered instead."""


Value = TypeVar("Value", bound=BaseModel)
Measured = TypeVar("Measured", bound=BaseModel, contravariant=True)


class StateSizes(Protocol[Measured]):
    """Encoded sizes of table values, as the table stores them (decoded_states.DecodedStates)."""

    def stored_bytes(self, key: bytes) -> int:
        """Size of the value the table holds for `key`; 0 if none."""
        ...

    def measure(self, key: bytes, value: Measured) -> int:
        """Size of `value` encoded (an implementation may keep the encoding for the write)."""
        ...


class MeasuredSizes(Generic[Value]):
    """`StateSizes` for callers without a table (tests, benchmarks): values are encoded to be measured."""

    def __init__(self, load: Callable[[bytes], Value | None]) -> None:
        self.load = load

    def stored_bytes(self, key: bytes) -> int:
        value = self.load(key)
        return 0 if value is None else self.measure(key, value)

    def measure(self, key: bytes, value: Value) -> int:
        return len(value.model_dump_json().encode())


class Rejected(Exception):
    """A valid record a stage cannot take (a table value would pass its bound): dead-lettered with this letter."""

    def __init__(self, letter: DeadLetter) -> None:
        super().__init__(letter.message)
        self.letter = letter


def escaped_size(texts: Iterable[str | None]) -> int:
    """The most bytes `texts` can take in JSON: 6 per character (a control character is `\\u0001`)."""
    return 6 * sum(len(text) for text in texts if text is not None)


def subject_texts(subject: CalibrationSubject) -> tuple[str | None, ...]:
    """A calibration subject's free-text fields, which make its size."""
    return subject.subject_id, subject.model, subject.agent_type


def outcome_texts(outcome: OutcomeEvent) -> tuple[str | None, ...]:
    """An OUTCOME's ids, which make its size."""
    return outcome.event_id, outcome.tenant_id, outcome.trace_id, outcome.subject_event_id, outcome.claim_id


def _calibration_size_bound(tenant: str, item: CalibrationItem) -> int:
    """An upper bound of a one-item calibration message's size, and 1 KB for its numbers and names."""
    texts: list[str | None] = [tenant]
    if item.subject is not None:
        texts += subject_texts(item.subject)
    if item.outcome is not None:
        texts += outcome_texts(item.outcome)
    return escaped_size(texts) + 1024


@dataclass(frozen=True, slots=True)
class ValueBound:
    """A byte bound on one table value, and how an input that would pass it is refused.

    A table value is one changelog record, and a broker refuses records over its limit (Apache Kafka:
    1 MB by default), which would stop the worker on that key's batch after every restart.
    """

    limit: int
    setting: str  # its configuration name, for the dead letter's message
    what: str  # what would grow too large, e.g. "the trace's state"
    reason: Reason
    error_class: str

    def checked(self, estimate: int, exact: Callable[[], int], record: InputRecord) -> int:
        """An upper bound of the value's size: `estimate` (an upper bound the caller vouches for) while
        it is within a quarter of the limit, so small values are never encoded; else `exact()`.

        Raises `Rejected`, dead-lettering `record`, when the exact size passes the limit.
        """
        if estimate <= self.limit // 4:
            return estimate
        size = exact()
        if size > self.limit:
            raise Rejected(
                DeadLetter(
                    record.value or b"",
                    self.reason,
                    self.error_class,
                    f"{self.what} would be {size} bytes, over {self.setting} ({self.limit}): "
                    "the input was not applied",
                )
            )
        return size


def processing_error(record: InputRecord, exc: Exception, what: str) -> DeadLetter:
    """A record whose processing raised: dead-lettered so one bad record never stops the worker.

    The message names the exception class and the stage only: an exception's text could quote input.
    """
    return DeadLetter(record.value or b"", "processing_error", type(exc).__name__, f"{what} failed")


def with_scored_at(output: dict[str, object]) -> dict[str, object]:
    # As pydantic writes it in a first emission ("Z", not "+00:00"): a re-emission differs in value only.
    return {**output, "scored_at": now().isoformat().replace("+00:00", "Z")}


def without_scored_at(output: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in output.items() if k != "scored_at"}


def is_flagged(output: dict[str, object]) -> bool:
    """DESIGN section 3's rule for copying an output to flagged-events (and calibration alerts)."""
    kind = output["event_type"]
    if kind == "RESPONSE_SCORED":
        comp = output["composite"]
        assert isinstance(comp, dict)
        return output["action"] in ("flag", "reject") or bool(comp["should_block"])
    if kind == "TRACE_SCORED":
        return output["band"] in ("weak", "failed")
    if kind == "SYNTHESIS_SCORED":
        return bool(output["warnings"]) or bool(output["conflicts"])
    if kind == "CALIBRATION_UPDATED":
        return bool(output["alert"])
    if kind == "CLAIM_SCORED":
        interval = output["interval"]
        assert isinstance(interval, dict)
        factors = interval["factors"]
        assert isinstance(factors, dict)
        return float(factors["contradiction_penalty"]) < 1.0
    return False
