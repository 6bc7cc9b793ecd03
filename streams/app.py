"""Builds the Faust app, its topics and tables from one `Settings` (a factory: nothing happens at import)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import faust
from prometheus_client import CollectorRegistry

from streams import metrics as metrics_module
from streams.batch_send import Outgoing
from streams.config import ScoringConfigs, Settings, scoring_configs
from streams.faults import FaultInjector
from streams.health import Health
from streams.recovery import SeekThenResumeTableManager
from streams.stages import AgentStage, CalibrationStage, ClaimStage, TraceStage
from streams.transport import FetchWaitApp

__all__ = [
    "AckedTable",
    "DeadlinedWorker",
    "Service",
    "SourcePartitionedTable",
    "changelog_topics",
    "create_app",
]


class AckedTable(faust.Table):  # type: ignore[misc]
    """A table whose changelog records the agent publishes itself, and waits for the broker to have.

    An offset must not be committed before the state change it caused is stored (at-least-once), so
    the agents send what `take_changelog()` returns and await the acks (streams/batch_send.py).
    Faust's own path (`send_soon` into its producer buffer, drained by a background task) cost 12-50
    ms per batch at 400 events/s; sent directly, as the outputs are, the state step is as fast as the
    output step. Keys and values are bytes already (raw serializers), so a write queues the record as
    it will be sent, not Faust's `FutureMessage` (an asyncio future, a message and codec calls per
    write): the worker's CPU per event went down 3-4 % in A/B runs (docs/DECISIONS.md, fifth round).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unsent: list[Outgoing] = []

    # Faust's versions also keep key TTLs, which only windowed tables use; these tables are not windowed.
    def on_key_set(self, key: bytes, value: bytes) -> None:
        self._unsent.append(self._changelog_record(key, value))
        self._sensor_on_set(self, key, value)

    def on_key_del(self, key: bytes) -> None:
        self._unsent.append(self._changelog_record(key, None))  # a tombstone
        self._sensor_on_del(self, key)

    def _changelog_record(self, key: bytes, value: bytes | None) -> Outgoing:
        partition = self.partition_for_key(key)
        if partition is None:  # Faust's use_partitioner tables: not used here, the partition must be known
            raise TypeError(f"table {self.name}: no changelog partition for key {key!r}")
        return Outgoing(self.changelog_topic.get_topic_name(), key, value, partition)

    def take_changelog(self) -> list[Outgoing]:
        """The changelog records written since the last call, not sent yet (see streams/batch_send.py)."""
        unsent, self._unsent = self._unsent, []
        return unsent


class SourcePartitionedTable(AckedTable):
    """A table whose changelog record goes to the partition its key's source record came from.

    Agents take batches that span partitions, so Faust's default (the partition of the *current* event)
    would be wrong, and `use_partitioner=True` assumes producers used Kafka's default partitioner for
    the trace key. Recording each key's source partition keeps state and input co-partitioned whatever
    partitioner the producers used.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._source_partitions: dict[Any, int] = {}

    def set_from(self, key: bytes, value: bytes | None, partition: int) -> None:
        """Write (or delete, for None) `key`, logging the change to `partition` of the changelog."""
        self._source_partitions[key] = partition
        try:
            if value is None:
                self.pop(key, None)
                self._key_partitions.pop(key, None)
            else:
                self[key] = value
                self._key_partitions[key] = partition
        finally:
            self._source_partitions.pop(key, None)

    @property
    def _key_partitions(self) -> dict[Any, int]:
        """Faust's memory store's key -> partition map. The store fills it only for keys it restores,
        and after a rebalance drops the keys of partitions this worker no longer has
        (`on_recovery_completed`); keys written here must be in it too, or they stay behind: a sweep
        would then write to another worker's partitions, and a partition coming back would keep keys
        its new owner deleted (README "Guarantees")."""
        return self.data._key_partition  # type: ignore[attr-defined,no-any-return]

    def partition_for_key(self, key: Any) -> int | None:
        return self._source_partitions.get(key)

    def keys_on(self, partitions: Collection[int]) -> int:
        """How many keys the store holds on `partitions` (one pass over its keys)."""
        return sum(partition in partitions for partition in self._key_partitions.values())


@dataclass(frozen=True)
class Service:
    """The app and everything agents and views share (no module-level globals)."""

    settings: Settings
    app: faust.App
    registry: CollectorRegistry
    metrics: metrics_module.Metrics
    configs: ScoringConfigs
    input_topic: faust.TopicT
    responses_topic: faust.TopicT
    claims_topic: faust.TopicT
    calibration_topic: faust.TopicT
    output_topics: tuple[faust.TopicT, ...]
    traces: SourcePartitionedTable
    agents_history: SourcePartitionedTable
    agent_history_hours: SourcePartitionedTable
    claims: SourcePartitionedTable
    calibration_subjects: SourcePartitionedTable
    calibration_groups: SourcePartitionedTable
    calibration_hours: SourcePartitionedTable
    trace_stage: TraceStage
    agent_stage: AgentStage
    claim_stage: ClaimStage
    calibration_stage: CalibrationStage
    faults: FaultInjector
    health: Health = field(default_factory=Health)
    # (topic, partition) -> past the last internal-topic record this worker produced and saw
    # acknowledged: the partition's end as far as this worker knows, without a broker round trip
    # (a fetch's high watermark goes stale while the partition's fetched records wait to be read).
    internal_ends: dict[tuple[str, int], int] = field(default_factory=dict)


def changelog_topics(svc: Service) -> list[str]:
    """The changelog topic of every table (Faust names them `<app_id>-<table>-changelog`)."""
    return [table.changelog_topic.get_topic_name() for table in svc.app.tables.values()]


def create_app(settings: Settings, registry: CollectorRegistry | None = None) -> Service:
    """Build the Faust app for `settings`; agents and views are attached by `streams.agents`/`views`."""
    registry = registry if registry is not None else CollectorRegistry()
    app = FetchWaitApp(
        settings.app_id,
        consumer_fetch_max_wait_ms=settings.consumer_fetch_max_wait_ms,
        consumer_fetch_max_bytes=settings.consumer_fetch_max_bytes,
        broker=[f"kafka://{server.strip()}" for server in settings.kafka_bootstrap_servers.split(",")],
        store="memory://",
        key_serializer="raw",
        value_serializer="raw",
        autodiscover=False,
        datadir=settings.data_dir,
        topic_partitions=settings.topic_partitions,
        topic_replication_factor=settings.topic_replication_factor,
        web_enabled=True,
        web_host=settings.web_host,
        web_port=settings.web_port,
        web_bind=settings.web_bind,
        table_standby_replicas=settings.table_standby_replicas,
        # Faust reads its own environment variables over these arguments (PRODUCER_MAX_BATCH_SIZE,
        # CONSUMER_AUTO_OFFSET_RESET, ...), past streams/config.py's validation: one set for another
        # purpose could skip existing input or stop the worker. Every setting comes from `settings`.
        env={},
        # Faust's import-time FAUST_*/F_* variables are defaults of its own; WEB_TRANSPORT would move
        # the web server (health, metrics, views) off WEB_PORT.
        web_transport="tcp://",
        broker_session_timeout=settings.broker_session_timeout_seconds,
        broker_heartbeat_interval=settings.broker_heartbeat_interval_seconds,
        broker_rebalance_timeout=settings.broker_rebalance_timeout_seconds,
        producer_max_batch_size=settings.producer_max_batch_bytes,
        producer_linger_ms=settings.producer_linger_ms,
        consumer_auto_offset_reset="earliest",
        # Records a lagging agent may have waiting (Faust's default is 4096 per stream): a stage that
        # falls behind holds two batches in memory, not thousands of records.
        stream_buffer_maxsize=2 * settings.batch_size,
        # At most a batch per fetch hand-over (Faust's default hands over all that was fetched, which the
        # embedded broker makes MBs of one partition): a paused partition stops within a batch.
        broker_max_poll_records=settings.batch_size,
        table_cleanup_interval=settings.sweep_interval_seconds,
        recovery_consistency_check=settings.recovery_consistency_check,
        TableManager=SeekThenResumeTableManager,  # fixes a record-loss race on restart, see streams/recovery.py
    )
    app.gapless_topics = frozenset(settings.internal_topics)
    metrics = metrics_module.create(registry, settings.metrics_label_cap)
    configs = scoring_configs(settings)
    input_topic = app.topic(*settings.input_topic_names, key_type=bytes, value_type=bytes)

    def internal_topic(name: str) -> faust.TopicT:
        # Its records are bundles: buffer as many as two batches take, like the input's stream.
        maxsize = 2 * settings.internal_batch_records
        return app.topic(
            name, key_type=bytes, value_type=bytes, partitions=settings.topic_partitions, maxsize=maxsize
        )

    responses_topic = internal_topic(settings.responses_topic)
    claims_topic = internal_topic(settings.claims_topic)
    calibration_topic = internal_topic(settings.calibration_topic)
    output_topics = tuple(
        app.topic(name, key_type=bytes, value_type=bytes, partitions=settings.topic_partitions)
        for name in (settings.scored_topic, settings.flagged_topic, settings.dlq_topic)
    )

    def table(name: str, description: str) -> SourcePartitionedTable:
        created = SourcePartitionedTable(
            app,
            name=name,
            beacon=app.tables.beacon,
            partitions=settings.topic_partitions,
            key_type=bytes,
            value_type=bytes,
            help=description,
        )
        app.tables.add(created)
        return created

    traces = table("traces", "Per-trace evidence, sub results, claims and remembered outputs.")
    # Keyed (tenant, agent) and (tenant, agent, hour); both written to the partition the agent's
    # responses are consumed from, so an agent's summary and hours move together.
    agents_history = table("agent-history", "Per (tenant, agent): per-hour response counts, newest time.")
    agent_history_hours = table("agent-history-hours", "Per (tenant, agent, hour): that hour's responses.")

    # Claim nodes are keyed (tenant, claim) but consumed by tenant: changelog records follow the tenant.
    claims = table("claims", "Claim graph nodes per (tenant, claim_id), partitioned by tenant.")
    # The calibration join, keyed (tenant, ...) and consumed by tenant like the claims.
    calibration_subjects = table(
        "calibration-subjects",
        "Per scored subject: its latest score, counted outcomes and outcomes waiting for it.",
    )
    calibration_groups = table(
        "calibration-groups", "Per (tenant, model or agent type, score kind): the window's reliability bins."
    )
    calibration_hours = table(
        "calibration-hours",
        "Per calibration group and hour: the bins to subtract when the hour leaves the window.",
    )
    return Service(
        settings=settings,
        app=app,
        registry=registry,
        metrics=metrics,
        configs=configs,
        input_topic=input_topic,
        responses_topic=responses_topic,
        claims_topic=claims_topic,
        calibration_topic=calibration_topic,
        output_topics=output_topics,
        traces=traces,
        agents_history=agents_history,
        agent_history_hours=agent_history_hours,
        claims=claims,
        calibration_subjects=calibration_subjects,
        calibration_groups=calibration_groups,
        calibration_hours=calibration_hours,
        trace_stage=TraceStage(settings, configs, metrics),
        agent_stage=AgentStage(settings, configs, metrics),
        claim_stage=ClaimStage(settings, configs, metrics),
        calibration_stage=CalibrationStage(settings, configs, metrics),
        faults=FaultInjector.parse(settings.fault_injection),
    )


class DeadlinedWorker(faust.Worker):  # type: ignore[misc]
    """Faust's worker, whose graceful stop on SIGTERM or Ctrl-C ends by `shutdown_timeout_seconds`.

    Faust's stop waits for the streams to empty and commits their offsets, and aiokafka retries a
    commit the broker refuses with a retriable error for ever (an internal topic deleted, the broker
    gone): the worker hung until SIGKILL, answering 503 "stopping" (the topics review). Past the
    deadline it exits 70 from a thread, since the event loop may be the thing waiting; nothing
    unprocessed was acknowledged, so the next worker processes the uncommitted inputs again.
    """

    shutdown_timeout_seconds = 25.0
    _deadline: threading.Timer | None = None

    def _schedule_shutdown(self, signum: signal.Signals) -> None:
        if not self._signal_stop_time:  # the first signal starts the stop, and the deadline
            self._deadline = threading.Timer(
                self.shutdown_timeout_seconds, _stop_overran, (self.shutdown_timeout_seconds,)
            )
            self._deadline.daemon = True
            self._deadline.start()
        super()._schedule_shutdown(signum)

    def _shutdown_loop(self) -> None:
        # The stop is over (offsets committed): mode's own teardown of the loop follows, bounded (a
        # few seconds of gathering and a sentinel task), and must not be reported as an overrun.
        if self._deadline is not None:
            self._deadline.cancel()
        super()._shutdown_loop()


def _stop_overran(seconds: float) -> None:
    from streams.batch_runner import EXIT_BATCH_FAILED

    logging.getLogger(__name__).critical(
        "the graceful stop did not finish in %g s (SHUTDOWN_TIMEOUT_SECONDS): exiting without it; "
        "inputs not committed are processed again by the next worker",
        seconds,
    )
    logging.shutdown()
    os._exit(EXIT_BATCH_FAILED)
