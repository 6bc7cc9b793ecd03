"""Prometheus collectors, created per registry, with label values bounded by a cap."""

from __future__ import annotations

from collections import Counter as Tally  # prometheus_client.Counter is the Counter here
from collections.abc import Hashable
from typing import Any, Generic, NamedTuple, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["OTHER", "ChildCache", "LabelCap", "Metrics", "SharedSeries", "create"]

Subject = TypeVar("Subject", bound=Hashable)

OTHER = "other"
_UNIT_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_LINEAR_0_1 = tuple(round(0.1 * i, 1) for i in range(11))  # prometheus.LinearBuckets(0, 0.1, 11)
_LINEAR_COUNTS = tuple(float(i) for i in range(10))  # prometheus.LinearBuckets(0, 1, 10)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class LabelCap:
    """Keeps at most `cap` distinct values per label; later newcomers are reported as `other`.

    Values capped label by label still multiply: (tenant, model, endpoint) could make 101^3 series,
    about 4.4 KB of memory each in this process and on every scrape. `combination` caps the label
    sets of such a family at `COMBINATIONS_PER_CAP` x `cap`; newer sets share the all-`other` series.
    """

    COMBINATIONS_PER_CAP = 10

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._seen: dict[str, set[str]] = {}
        self._combinations: dict[str, set[tuple[str, ...]]] = {}

    def __call__(self, label: str, value: str) -> str:
        seen = self._seen.setdefault(label, set())
        if value in seen:
            return value
        if len(seen) >= self._cap:
            return OTHER
        seen.add(value)
        return value

    def combination(self, family: str, values: tuple[str, ...]) -> tuple[str, ...]:
        """`values` (each already capped), or all `other` once `family` has its share of label sets."""
        seen = self._combinations.setdefault(family, set())
        if values in seen:
            return values
        if len(seen) >= self.COMBINATIONS_PER_CAP * self._cap:
            return (OTHER,) * len(values)
        seen.add(values)
        return values

    def forget(self, label: str, value: str) -> None:
        """Free `value`'s place (its series was removed), so a newcomer need not become `other`."""
        self._seen.get(label, set()).discard(value)


class ChildCache:
    """`metric.labels(*values)` remembered: prometheus_client validates and locks on every call, and the
    stages ask for the same few children for every event. Bounded, since label values are capped."""

    def __init__(self) -> None:
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def __call__(self, metric: Any, *values: str) -> Any:
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def remove(self, metric: Any, *values: str) -> None:
        """Stop exporting a series whose subject is gone (a swept agent, an expired group)."""
        if self._children.pop((id(metric), values), None) is not None:
            metric.remove(*values)


class SharedSeries(Generic[Subject]):
    """The series each exported subject (an agent, a calibration group) is reported under, and how many
    subjects share each one: subjects whose labels were capped share an `other` series, which must
    leave with the last of them, not the first."""

    def __init__(self) -> None:
        self._series: dict[Subject, tuple[str, ...]] = {}
        self._users: Tally[tuple[str, ...]] = Tally()

    def get(self, subject: Subject) -> tuple[str, ...] | None:
        return self._series.get(subject)

    def add(self, subject: Subject, series: tuple[str, ...]) -> None:
        if subject not in self._series:
            self._series[subject] = series
            self._users[series] += 1

    def subjects(self) -> list[Subject]:
        return list(self._series)

    def remove(self, subject: Subject) -> tuple[tuple[str, ...] | None, bool]:
        """Forget `subject`: (its series or None if it had none, whether that series has no user left)."""
        series = self._series.pop(subject, None)
        if series is None:
            return None, False
        self._users[series] -= 1
        if self._users[series]:
            return series, False
        del self._users[series]
        return series, True


class Metrics(NamedTuple):
    """Every collector the service exports."""

    confidence_histogram: Histogram
    confidence_average: Gauge
    confidence_missing: Counter
    confidence_rejected: Counter
    synthesis_confidence: Histogram
    synthesis_conflicts: Histogram
    synthesis_filtered: Histogram
    events_processed: Counter
    events_dead_lettered: Counter
    outputs_emitted: Counter
    evidence_band: Counter
    recovery_recommended: Counter
    composite_blocked: Counter
    agent_success_rate: Gauge
    processing_latency: Histogram
    table_keys: Gauge
    state_undecodable: Counter
    calibration_ece: Gauge
    calibration_brier: Gauge
    outcomes: Counter
    outcomes_unmatched: Counter
    response_actions: Counter
    consumer_lag: Gauge
    input_partitions_paused: Gauge
    internal_backlog: Gauge
    input_holds: Counter
    batch_seconds: Histogram
    labels: LabelCap
    child: ChildCache


def create(registry: CollectorRegistry, label_cap: int = 100) -> Metrics:
    """Register every collector in `registry` (tests pass a fresh one)."""
    response_labels = ("tenant", "model", "endpoint")
    calibration_labels = ("tenant", "dimension", "group", "kind")
    return Metrics(
        confidence_histogram=Histogram(
            "llm_confidence_histogram",
            "Distribution of LLM confidence scores",
            response_labels,
            buckets=_UNIT_BUCKETS,
            registry=registry,
        ),
        confidence_average=Gauge(
            "llm_confidence_average",
            "Rolling average of LLM confidence scores (exponentially weighted, alpha 0.05)",
            response_labels,
            registry=registry,
        ),
        confidence_missing=Counter(
            "llm_confidence_missing",
            "Count of responses where logprobs were unavailable",
            response_labels,
            registry=registry,
        ),
        confidence_rejected=Counter(
            "llm_confidence_rejected",
            "Count of responses rejected due to low confidence",
            response_labels,
            registry=registry,
        ),
        synthesis_confidence=Histogram(
            "rlm_synthesis_confidence",
            "Distribution of synthesis confidence scores",
            buckets=_LINEAR_0_1,
            registry=registry,
        ),
        synthesis_conflicts=Histogram(
            "rlm_synthesis_conflicts",
            "Number of conflicts per synthesis",
            buckets=_LINEAR_COUNTS,
            registry=registry,
        ),
        synthesis_filtered=Histogram(
            "rlm_synthesis_filtered_results",
            "Results filtered due to low confidence",
            buckets=_LINEAR_COUNTS,
            registry=registry,
        ),
        events_processed=Counter(
            "confidence_events_processed",
            "Input events decoded and scored, by event type",
            ("event_type",),
            registry=registry,
        ),
        events_dead_lettered=Counter(
            "confidence_events_dead_lettered",
            "Input records sent to the dead-letter topic, by reason",
            ("reason",),
            registry=registry,
        ),
        outputs_emitted=Counter(
            "confidence_outputs_emitted",
            "Output events sent to the scored topic, by event type",
            ("event_type",),
            registry=registry,
        ),
        evidence_band=Counter(
            "confidence_evidence_band",
            "TRACE_SCORED outputs by evidence band",
            ("band",),
            registry=registry,
        ),
        recovery_recommended=Counter(
            "confidence_recovery_recommended",
            "TRACE_SCORED outputs that recommend recovery",
            registry=registry,
        ),
        composite_blocked=Counter(
            "confidence_composite_blocked",
            "Responses blocked by the 4-factor composite, by agent type",
            ("agent_type",),
            registry=registry,
        ),
        agent_success_rate=Gauge(
            "confidence_agent_success_rate",
            "Share of an agent's responses in the history window that met its threshold",
            ("tenant", "agent"),
            registry=registry,
        ),
        processing_latency=Histogram(
            "confidence_processing_latency_seconds",
            "Producer timestamp of the input to the broker's acknowledgement of its output",
            ("event_type",),
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        ),
        table_keys=Gauge(
            "confidence_table_keys",
            "Keys held in each state table on this worker, as of the last expiry sweep",
            ("table",),
            registry=registry,
        ),
        state_undecodable=Counter(
            "confidence_state_undecodable",
            "Stored table values the expiry sweep could not decode (left in place and skipped)",
            ("table",),
            registry=registry,
        ),
        calibration_ece=Gauge(
            "confidence_calibration_ece",
            "Expected calibration error (10 bins) of a group's scores over the calibration window",
            calibration_labels,
            registry=registry,
        ),
        calibration_brier=Gauge(
            "confidence_calibration_brier",
            "Brier score of a group's scores over the calibration window",
            calibration_labels,
            registry=registry,
        ),
        outcomes=Counter(
            "confidence_outcomes",
            "OUTCOME events by what happened to them: matched, waiting (score not seen yet), duplicate, "
            "over_limit (CALIBRATION_MAX_OUTCOMES_PER_SUBJECT reached), disabled (CALIBRATION_ENABLED=false)",
            ("status",),
            registry=registry,
        ),
        outcomes_unmatched=Counter(
            "confidence_outcomes_unmatched",
            "OUTCOME events dropped because their score never arrived, arrived dated past the outcome's wait, "
            "or had expired",
            registry=registry,
        ),
        response_actions=Counter(
            "confidence_response_actions",
            "RESPONSE_SCORED outputs by seed 003 action (allow, flag, reject)",
            ("action",),
            registry=registry,
        ),
        consumer_lag=Gauge(
            "confidence_consumer_lag",
            "Records behind the end of each assigned input or repartition partition (streams/lag.py)",
            ("topic", "partition"),
            registry=registry,
        ),
        input_partitions_paused=Gauge(
            "confidence_input_partitions_paused",
            "Input partitions this worker holds back: their event time runs ahead of the slowest one "
            "still delivering (INPUT_ALIGNMENT_MAX_LEAD_HOURS), or all of them while its later stages "
            "lag (INTERNAL_BACKLOG_MAX_RECORDS); streams/alignment.py",
            registry=registry,
        ),
        internal_backlog=Gauge(
            "confidence_internal_backlog_records",
            "Records on this worker's internal-topic partitions not yet handed to its later stages, "
            "after every stage-1 batch and every 0.5 s (streams/alignment.py)",
            registry=registry,
        ),
        input_holds=Counter(
            "confidence_input_holds",
            "Times this worker's stage 1 held all its input back because its later stages lagged "
            "(INTERNAL_BACKLOG_MAX_RECORDS, streams/alignment.py)",
            registry=registry,
        ),
        batch_seconds=Histogram(
            "confidence_batch_seconds",
            "Time of each step of an agent's batch: process (stage code and in-memory table writes), "
            "outputs (send and broker acks, after the previous batch's outputs), state (the previous "
            "batch's changelog, then this batch's changelog send and acks)",
            ("agent", "phase"),
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        ),
        labels=LabelCap(label_cap),
        child=ChildCache(),
    )
