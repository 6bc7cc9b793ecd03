"""Every setting of the service, read once from the environment (or `.env`) into one frozen class.

Seed 003's variable names are kept (`CONFIDENCE_ENABLED`, `CONFIDENCE_AGGREGATION`, ...); every other
setting is the upper-cased field name (`SCORED_TOPIC`, `TOPIC_PARTITIONS`, ...). Invalid values stop the
process at start-up with pydantic's message naming the variable.
"""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from streams.faults import FaultInjector
from streams.scoring.claims import ClaimsConfig
from streams.scoring.composite import CompositeConfig
from streams.scoring.evidence import CATEGORY_ORDER, EvidenceConfig
from streams.scoring.response import ResponseConfig
from streams.scoring.synthesis import SynthesisConfig

__all__ = ["ScoringConfigs", "Settings", "configured_bootstrap_servers", "load_settings", "scoring_configs"]


# Spans of event time are added to event times (years 1900-8999, streams/events.py): a TTL of `inf`
# ("never expire") or 1e9 hours overflowed a datetime on the first write and stopped the worker on
# every restart. A century is beyond any retention and still leaves the year 9999 out of reach.
SPAN_MAX_HOURS = 100 * 8766
# An agent's history summary and a calibration group list every hour of their span with data, and each
# is one changelog record: an hour takes at most 63 bytes in the first (`HourCounts`, counts under ten
# million an hour) and 9 in the second (an epoch hour). Past MAX_RECORD_BYTES the broker refuses the
# record and the worker stops on it after every restart. The names and keys get the rest of a record.
SUMMARY_HOUR_BYTES = {"HISTORY_RETENTION_HOURS": 63, "CALIBRATION_WINDOW_HOURS": 9}
SUMMARY_OTHER_BYTES = 4096


class Settings(BaseSettings):
    """All configuration; build it once with :func:`load_settings` and pass it down."""

    # allow_inf_nan=False: `inf` and `nan` pass every `gt`/`le` check of a float setting and broke the
    # worker later (a TTL's datetime overflow, a timeout that never fires); refused at start instead.
    model_config = SettingsConfigDict(
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        frozen=True,
        case_sensitive=False,
        allow_inf_nan=False,
    )

    # --- Kafka and Faust -------------------------------------------------------------------------
    kafka_bootstrap_servers: str = Field("localhost:9092", description="Kafka bootstrap address(es).")
    app_id: str = Field("confidence-streams", description="Faust app id = consumer group id.")
    input_topics: str = Field("agent-events", description="Comma-separated input topics, keyed by trace_id.")
    scored_topic: str = "scored-events"
    flagged_topic: str = "flagged-events"
    dlq_topic: str = "agent-events-dlq"
    topic_partitions: int = Field(4, ge=1, le=1024)
    topic_replication_factor: int = Field(1, ge=1, le=16)
    input_retention_ms: int = Field(
        3_600_000, ge=60_000, description="Retention of the input topic: raw logprobs live there."
    )
    # Faust's default: the name other workers reach this one's views at (its canonical URL). The web
    # server listens where WEB_BIND says (every interface by default); 0.0.0.0 here made every
    # worker advertise one URL.
    web_host: str = Field(
        default_factory=socket.gethostname, description="Host name other workers reach this worker at."
    )
    web_port: int = Field(6066, ge=0, le=65535)
    # Faust's two settings a deployment changes, read here like every other (the app is built with
    # Faust's own environment reading off, see streams/app.py).
    web_bind: str = Field("0.0.0.0", description="Address the web server listens on (Faust's WEB_BIND).")
    table_standby_replicas: int = Field(
        1, ge=0, le=16, description="Standby copies of each table partition other workers keep (Faust's)."
    )
    data_dir: str = "./confidence-streams-data"
    batch_size: int = Field(500, ge=1, le=100_000, description="Max events per agent batch.")
    # 10 ms, not 50: at half load every hop waited most of the window (RESPONSE_SCORED crosses two).
    batch_within_seconds: float = Field(0.01, gt=0, le=10)
    broker_session_timeout_seconds: float = Field(10.0, gt=0)
    broker_heartbeat_interval_seconds: float = Field(1.0, gt=0)
    broker_rebalance_timeout_seconds: float = Field(10.0, gt=0)
    # Record batches and internal bundles are sized by this; the broker refuses a larger one than its
    # message.max.bytes (Apache Kafka's default 1,048,588), which stops the worker on every restart.
    producer_max_batch_bytes: int = Field(262_144, ge=16_384, le=1_000_000)
    # 0: aiokafka still batches what accumulates while a request is in flight; lingering only delayed acks.
    # Below SEND_TIMEOUT_SECONDS (checked below): a batch lingering past it would stop the worker.
    producer_linger_ms: int = Field(0, ge=0)
    consumer_fetch_max_wait_ms: int = Field(
        20, ge=0, le=60_000, description="Longest a consumer fetch waits for data (Faust's own is 1500)."
    )
    # aiokafka's default is 50 MB per fetch. Records fetched wait in its buffer until the streams take
    # them, so a stage that falls behind held a fetch-sized backlog of every partition it lagged on
    # (the full soak: RSS followed the internal topics' lag). A record larger than this still comes back
    # alone, so it never stalls a partition.
    consumer_fetch_max_bytes: int = Field(
        1_048_576, ge=1024, description="Most bytes one consumer fetch returns over all its partitions."
    )
    # Faust's start-of-recovery check that a standby has not read past the changelog's end. With the
    # in-memory store it can only fire on a broker reporting a stale end offset (the embedded test
    # broker does, DESIGN section 7); the harness turns it off there, never by default.
    recovery_consistency_check: bool = True
    # Python collects its youngest generation every 700 allocations by default; the worker allocates
    # models per event, so a larger generation 0 cut its CPU per event by about 15 % (README Performance).
    gc_gen0_threshold: int = Field(
        10_000, ge=0, description="Worker's gc generation-0 threshold; 0 keeps Python's default (700)."
    )
    # Only these two: at `warn` or above Faust installs its spinner and sets the root logger to DEBUG,
    # which slows the worker badly (DESIGN section 10).
    log_level: Literal["debug", "info"] = "info"

    # --- Bad input ----------------------------------------------------------------------------------
    # 1,000,000, not 1 MiB: every output and dead letter then fits in one record under Apache Kafka's
    # default limit (message.max.bytes 1,048,588 with the batch header). A RESPONSE_SCORED carries
    # the response text and a dead letter the input (capped here) plus its headers.
    max_event_bytes: int = Field(1_000_000, ge=1024, description="Larger records are dead-lettered.")
    max_array_items: int = Field(100_000, ge=1, description="Longest accepted list in an event.")
    # The backstop for what the input bounds cannot see: the size of what an input makes (stages/common).
    # The default leaves room under Apache Kafka's 1,048,588 bytes for a record's framing and headers.
    max_record_bytes: int = Field(
        1_040_000,
        ge=16_384,
        description="An input whose output or internal message (key and value, one record) would be "
        "larger is dead-lettered (reason oversized_output).",
    )

    # --- Seed 003: per-response logprob confidence --------------------------------------------------
    confidence_enabled: bool = True
    confidence_aggregation: Literal["average", "min", "percentile_90"] = "average"
    confidence_min_acceptance: float = Field(0.40, ge=0.0, le=1.0)
    confidence_on_low: Literal["allow", "flag", "reject"] = "flag"
    confidence_treat_null_as_low: bool = False
    confidence_precision_decimals: int = Field(3, ge=0, le=12)

    # --- Seed 004: composite and agent history -------------------------------------------------------
    composite_default_threshold: float = Field(0.75, ge=0.0, le=1.0)
    history_window_hours: float = Field(24.0, gt=0, le=SPAN_MAX_HOURS)
    history_retention_hours: float = Field(
        168.0, gt=0, le=SPAN_MAX_HOURS, description="Agent history kept for statistics."
    )
    # An hour of one agent's entries is stored as chunks of at most this many bytes (a chunk holds at
    # least one entry), so a busy agent's hour never makes a record over the broker's limit and a
    # response rewrites one chunk, not its whole hour.
    history_chunk_bytes: int = Field(65_536, gt=0, description="Largest stored chunk of an agent's hour.")
    kb_relevance_threshold: float = Field(0.7, ge=0.0, le=1.0)

    # --- Seed 001: evidence -----------------------------------------------------------------------
    evidence_recovery_threshold: float = Field(0.50, ge=0.0, le=1.0)
    evidence_stop_threshold: float = Field(0.20, ge=0.0, le=1.0)
    evidence_tool_categories: str = Field(
        "find=search,grep=search,references=search,read=read,discovery=discovery,"
        "cmake=verification,ctest=verification,git=git,gh=ci",
        description="tool=category pairs, comma-separated.",
    )

    # --- Seed 002: claims -------------------------------------------------------------------------
    claims_boost_factor: float = Field(0.1, ge=0.0)
    claims_penalty_factor: float = Field(0.2, ge=0.0)
    claims_diversity_max_types: int = Field(3, ge=1)
    staleness_half_life_ephemeral_hours: float = Field(4.0, gt=0, le=SPAN_MAX_HOURS)
    staleness_half_life_task_hours: float = Field(72.0, gt=0, le=SPAN_MAX_HOURS)
    staleness_half_life_project_hours: float = Field(672.0, gt=0, le=SPAN_MAX_HOURS)
    staleness_half_life_persistent_hours: float = Field(4380.0, gt=0, le=SPAN_MAX_HOURS)

    # --- Seed 000: synthesis ----------------------------------------------------------------------
    synthesis_min_confidence: float = Field(0.3, ge=0.0, le=1.0)
    synthesis_conflict_threshold: float = Field(0.5, ge=0.0, le=1.0)
    synthesis_max_claims: int = Field(50, ge=1)

    # --- State lifetime (event time) --------------------------------------------------------------
    trace_ttl_hours: float = Field(
        24.0, gt=0, le=SPAN_MAX_HOURS, description="Per-trace state expires after this idle time."
    )
    # A trace's state is one table value, written whole to its changelog; Apache Kafka refuses a record
    # over the topic's max.message.bytes (1 MB by default), which would stop the worker on that trace
    # after every restart. Half of that leaves room for the batch between two exact checks (stages/trace).
    trace_state_max_bytes: int = Field(
        524_288,
        ge=16_384,
        description="An input that would grow its trace's encoded state past this is dead-lettered "
        "(reason trace_state_full).",
    )
    claim_ttl_days: float = Field(
        30.0, gt=0, le=SPAN_MAX_HOURS / 24, description="Claims expire this long after their last update."
    )
    # A claim's node keeps an entry per claim that supports, contradicts or derives from it, and is one
    # changelog record too. The default leaves room below Apache Kafka's 1,048,588 bytes for a record's
    # framing and for the node of a claim as large as MAX_EVENT_BYTES allows.
    claim_node_max_bytes: int = Field(
        1_040_000,
        ge=16_384,
        description="An input that would make a claim's table record (key and encoded node) larger than "
        "this is dead-lettered (reason claim_node_full).",
    )
    sweep_interval_seconds: float = Field(60.0, gt=0)
    expiry_source_idle_seconds: float = Field(
        300.0,
        gt=0,
        description="The expiry watermark of the claims, calibration and agent-history partitions (and, "
        "with several INPUT_TOPICS, of stage 1's trace partitions) leaves out an upstream partition that "
        "sent nothing this long (wall clock), and sweeps nothing this long after a partition's first event.",
    )
    event_time_max_ahead_hours: float = Field(
        1.0,
        gt=0,
        le=SPAN_MAX_HOURS,
        description="Expiry clocks never run further ahead of the wall clock than this.",
    )

    # Input alignment (streams/alignment.py). Keep it above event_time_max_ahead_hours: a producer
    # whose clock runs ahead would otherwise have its partition held back.
    input_alignment_max_lead_hours: float = Field(
        2.0,
        ge=0,
        le=SPAN_MAX_HOURS,
        description="An input partition whose event time runs this far ahead of the slowest one still "
        "delivering is paused until that one catches up; 0 turns alignment off.",
    )
    input_alignment_idle_seconds: float = Field(
        2.0,
        gt=0,
        description="A partition whose event time did not move on this long holds no other back.",
    )
    input_alignment_max_hold_seconds: float = Field(
        600.0,
        gt=0,
        description="Alignment holds a partition back at most this long in a row, and at most half "
        "INPUT_RETENTION_MS (its records age in the broker meanwhile).",
    )
    internal_backlog_max_records: int = Field(
        200,
        ge=0,
        description="Past this many records on the worker's internal-topic partitions not yet read by "
        "its later stages, stage 1 holds all input back until at most half are left; 0 turns it off.",
    )

    # --- Reliability ------------------------------------------------------------------------------
    send_timeout_seconds: float = Field(
        60.0,
        gt=0,
        description="A batch whose outputs or state writes are not queued and acknowledged in time stops the worker.",
    )
    shutdown_timeout_seconds: float = Field(
        25.0,
        gt=0,
        le=3600,
        description="A graceful stop (SIGTERM) not finished in this long ends in exit 70 without it: an "
        "offset commit the broker keeps refusing would hold it for ever. Uncommitted inputs are "
        "processed again by the next worker.",
    )
    fatal_exit_delay_seconds: float = Field(
        3.0,
        ge=0,
        le=60,
        description="After a failed batch: seconds /healthz and /readyz report it before exit 70.",
    )
    fault_injection: str = Field(
        "",
        description="Tests only: `<send|table>:<agent>:<batch number>` makes that batch fail, "
        "`sweep:expiry:<n>` the n-th expiry sweep (see streams/faults.py).",
    )

    # --- Calibration (outcome feedback, README "Calibration") ---------------------------------------
    calibration_enabled: bool = Field(
        True, description="Join OUTCOME events with scores; off: outcomes are counted and dropped."
    )
    # Counted in whole hours (hourly buckets): a window under one hour would hold no bucket at all.
    calibration_window_hours: float = Field(
        168.0, ge=1, le=SPAN_MAX_HOURS, description="Sliding event-time window of outcomes (at least 1)."
    )
    calibration_join_window_hours: float = Field(
        168.0,
        gt=0,
        le=SPAN_MAX_HOURS,
        description="How long a score is kept for outcomes to join (event time).",
    )
    calibration_outcome_wait_hours: float = Field(
        1.0,
        gt=0,
        le=SPAN_MAX_HOURS,
        description="How long an outcome waits for its score before it counts as unmatched.",
    )
    # A subject's entry (its score, the outcomes applied to it, those waiting for it) is one changelog
    # record; this caps the work per subject, and its bytes are checked against MAX_RECORD_BYTES (ids
    # of escaped characters, 6 bytes each in JSON, made 48 outcomes 1.2 MB). More are dropped.
    calibration_max_outcomes_per_subject: int = Field(
        32,
        ge=1,
        le=48,
        description="Outcomes one scored response, trace or claim takes (applied and waiting); more are "
        "counted as over_limit and dropped.",
    )
    calibration_min_samples: int = Field(20, ge=1, description="Outcomes in a group before it reports.")
    calibration_ece_change: float = Field(
        0.02, ge=0, le=1, description="ECE move that emits CALIBRATION_UPDATED."
    )
    calibration_update_min_interval_minutes: float = Field(
        10.0,
        ge=0,
        le=SPAN_MAX_HOURS * 60,
        description="At most one CALIBRATION_UPDATED per group per this much event time.",
    )
    calibration_ece_alert: float = Field(
        0.1, ge=0, le=1, description="ECE at or above this copies CALIBRATION_UPDATED to flagged-events."
    )

    # --- Metrics ----------------------------------------------------------------------------------
    metrics_label_cap: int = Field(100, ge=1, description="Distinct label values before `other`.")

    @field_validator(
        "staleness_half_life_ephemeral_hours",
        "staleness_half_life_task_hours",
        "staleness_half_life_project_hours",
        "staleness_half_life_persistent_hours",
    )
    @classmethod
    def _half_life_of_a_microsecond_or_more(cls, value: float) -> float:
        # Used as a timedelta, which keeps microseconds: a shorter one became 0 and stage 3 divided by it.
        if timedelta(hours=value) <= timedelta(0):
            raise ValueError("a staleness half-life must be at least one microsecond")
        return value

    @field_validator("input_topics")
    @classmethod
    def _non_empty_topics(cls, value: str) -> str:
        if not [t for t in value.split(",") if t.strip()]:
            raise ValueError("INPUT_TOPICS must name at least one topic")
        return value

    @field_validator("fault_injection")
    @classmethod
    def _valid_fault(cls, value: str) -> str:
        FaultInjector.parse(value)  # at start-up, one line, not a traceback when the app is built
        return value

    @field_validator("evidence_tool_categories")
    @classmethod
    def _valid_mapping(cls, value: str) -> str:
        for pair in value.split(","):
            if pair.strip() and "=" not in pair:
                raise ValueError(f"EVIDENCE_TOOL_CATEGORIES entry {pair!r} is not tool=category")
            category = pair.split("=", 1)[-1].strip()
            if pair.strip() and category not in CATEGORY_ORDER:  # a typo would score the tool 0, silently
                raise ValueError(
                    f"EVIDENCE_TOOL_CATEGORIES entry {pair.strip()!r}: unknown category {category!r}, "
                    f"expected one of {', '.join(CATEGORY_ORDER)}"
                )
        return value

    @field_validator("kafka_bootstrap_servers", mode="before")
    @classmethod
    def _every_server_named(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():  # set but empty: unset, as the harness reads it
            return cls.model_fields["kafka_bootstrap_servers"].default
        if isinstance(value, str) and not all(server.strip() for server in value.split(",")):
            raise ValueError(
                "names an empty broker address (a stray comma?); give host:port, comma-separated"
            )
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_case_level(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value  # INFO as well as info

    @model_validator(mode="after")
    def _timeouts_consistent(self) -> Settings:
        if self.broker_heartbeat_interval_seconds >= self.broker_session_timeout_seconds:
            raise ValueError("BROKER_HEARTBEAT_INTERVAL_SECONDS must be below BROKER_SESSION_TIMEOUT_SECONDS")
        return self

    @model_validator(mode="after")
    def _sends_fit_their_bounds(self) -> Settings:
        # Internal bundles and record batches are sized by PRODUCER_MAX_BATCH_BYTES, one output by
        # MAX_RECORD_BYTES: a broker whose topics take MAX_RECORD_BYTES would refuse a larger batch,
        # and the worker would stop on it at every restart.
        if self.producer_max_batch_bytes > self.max_record_bytes:
            raise ValueError("PRODUCER_MAX_BATCH_BYTES must not exceed MAX_RECORD_BYTES")
        if self.producer_linger_ms >= self.send_timeout_seconds * 1000:
            raise ValueError(
                "PRODUCER_LINGER_MS must be below SEND_TIMEOUT_SECONDS (a batch lingers that long)"
            )
        return self

    @model_validator(mode="after")
    def _inputs_are_not_outputs(self) -> Settings:
        # An output, dead-letter or internal topic read as input would feed the worker its own records.
        written = {self.scored_topic, self.flagged_topic, self.dlq_topic, *self.internal_topics}
        if looped := sorted(written.intersection(self.input_topic_names)):
            raise ValueError(f"INPUT_TOPICS names a topic the worker writes: {', '.join(looped)}")
        return self

    @model_validator(mode="after")
    def _history_kept_for_its_window(self) -> Settings:
        # A shorter retention silently shortens seed 004's history window to it.
        if self.history_retention_hours < self.history_window_hours:
            raise ValueError("HISTORY_RETENTION_HOURS must be at least HISTORY_WINDOW_HOURS")
        return self

    @model_validator(mode="after")
    def _summaries_fit_one_record(self) -> Settings:
        spans = {
            "HISTORY_RETENTION_HOURS": self.history_retention_hours,
            "CALIBRATION_WINDOW_HOURS": self.calibration_window_hours,
        }
        for name, hours in spans.items():
            fits = (self.max_record_bytes - SUMMARY_OTHER_BYTES) // SUMMARY_HOUR_BYTES[name] - 1
            if math.ceil(hours) > fits:
                raise ValueError(
                    f"{name} must be at most {fits} with MAX_RECORD_BYTES={self.max_record_bytes}: "
                    "each hour of it takes a place in one changelog record"
                )
        return self

    @property
    def alignment_max_hold_seconds(self) -> float:
        """INPUT_ALIGNMENT_MAX_HOLD_SECONDS, at most half the input retention: a partition held back
        past the retention would lose its oldest records."""
        return min(self.input_alignment_max_hold_seconds, self.input_retention_ms / 2000)

    @cached_property
    def input_topic_names(self) -> tuple[str, ...]:
        """The input topics as a tuple (all keyed by trace_id and co-partitioned)."""
        # A topic named twice is one topic (it would count as two sources of stage 1's clock).
        return tuple(dict.fromkeys(t.strip() for t in self.input_topics.split(",") if t.strip()))

    @cached_property
    def tool_categories(self) -> dict[str, str]:
        """The tool -> evidence category mapping."""
        pairs = (p.split("=", 1) for p in self.evidence_tool_categories.split(",") if p.strip())
        return {tool.strip().lower(): category.strip() for tool, category in pairs}

    @property
    def responses_topic(self) -> str:
        """Internal repartition topic: scored responses keyed by (tenant, agent), no logprobs."""
        return f"{self.app_id}-responses-by-agent"

    @property
    def claims_topic(self) -> str:
        """Internal repartition topic: CLAIM inputs keyed by tenant (one claim graph per tenant)."""
        return f"{self.app_id}-claims-by-tenant"

    @property
    def calibration_topic(self) -> str:
        """Internal repartition topic: scores and outcomes keyed by tenant, for the calibration join."""
        return f"{self.app_id}-calibration-by-tenant"

    @property
    def internal_batch_records(self) -> int:
        """Records an internal-topic agent takes per batch (and buffers, twice that).

        Internal records are bundles of up to one upstream batch's messages (streams.stages.common.bundle),
        so a lagging stage takes about as many messages per batch as an input batch holds, not
        `batch_size` bundles of them.
        """
        return max(1, self.batch_size // 100)

    @property
    def internal_topics(self) -> tuple[str, ...]:
        """The repartition topics between stages (written and read only by the workers)."""
        return (self.responses_topic, self.claims_topic, self.calibration_topic)


class _BrokerAddress(BaseSettings):
    """`KAFKA_BOOTSTRAP_SERVERS` alone, read as `Settings` reads it: the broker harness needs only it,
    and must not fail on another setting that would not validate."""

    model_config = Settings.model_config
    kafka_bootstrap_servers: str = ""


def configured_bootstrap_servers() -> str:
    """`KAFKA_BOOTSTRAP_SERVERS` as the worker reads it (the environment, else `.env`, any case); "" if
    neither sets it. The harness read the environment only, so a cluster named only in `.env` got a
    demo on the embedded broker."""
    return _BrokerAddress().kafka_bootstrap_servers.strip()


def load_settings(**overrides: object) -> Settings:
    """Read the environment once; keyword overrides win (tests build their own settings this way)."""
    return Settings(**overrides)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ScoringConfigs:
    """The pure scorers' configuration objects, built once from the settings."""

    response: ResponseConfig
    composite: CompositeConfig
    evidence: EvidenceConfig
    claims: ClaimsConfig
    synthesis: SynthesisConfig


def scoring_configs(settings: Settings) -> ScoringConfigs:
    """Translate environment settings into the scorers' frozen configs."""
    base_composite = CompositeConfig()
    base_evidence = EvidenceConfig()
    return ScoringConfigs(
        response=ResponseConfig(
            enabled=settings.confidence_enabled,
            aggregation=settings.confidence_aggregation,
            min_acceptance=settings.confidence_min_acceptance,
            on_low=settings.confidence_on_low,
            treat_null_as_low=settings.confidence_treat_null_as_low,
            precision=settings.confidence_precision_decimals,
        ),
        composite=CompositeConfig(
            weights=base_composite.weights,
            thresholds=base_composite.thresholds,
            default_threshold=settings.composite_default_threshold,
            kb_relevance_threshold=settings.kb_relevance_threshold,
        ),
        evidence=EvidenceConfig(
            tool_categories=settings.tool_categories,
            weights=base_evidence.weights,
            recovery_threshold=settings.evidence_recovery_threshold,
            stop_threshold=settings.evidence_stop_threshold,
        ),
        claims=ClaimsConfig(
            boost_factor=settings.claims_boost_factor,
            penalty_factor=settings.claims_penalty_factor,
            diversity_max_types=settings.claims_diversity_max_types,
            half_lives={
                "ephemeral": timedelta(hours=settings.staleness_half_life_ephemeral_hours),
                "task": timedelta(hours=settings.staleness_half_life_task_hours),
                "project": timedelta(hours=settings.staleness_half_life_project_hours),
                "persistent": timedelta(hours=settings.staleness_half_life_persistent_hours),
            },
        ),
        synthesis=SynthesisConfig(
            min_confidence=settings.synthesis_min_confidence,
            conflict_threshold=settings.synthesis_conflict_threshold,
            max_claims=settings.synthesis_max_claims,
        ),
    )
