"""`confidence-streams topics describe`: every topic of the service, its offsets and the group's lag.

For each topic the service creates (inputs, outputs, DLQ, internal repartition topics, table
changelogs; not Faust's own `<APP_ID>-__assignor-__leader`, which carries no data): partitions,
`retention.ms` and `cleanup.policy` (DescribeConfigs), the end offset of each partition (ListOffsets),
and the consumer group's (`APP_ID`) committed offset and lag per partition. Committed offsets are read
with a consumer in the group that never joins it and never commits (OffsetFetch through
`AIOKafkaConsumer.committed`), which every broker we run on answers; the admin client's
`list_consumer_group_offsets` is not answered by the embedded broker.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Literal

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import for_code
from rich.table import Table

from streams.config import Settings
from streams.topics import topic_configs, topic_specs

__all__ = [
    "PartitionState",
    "Role",
    "TopicState",
    "describe_topics",
    "human_ms",
    "roles",
    "table_of",
    "to_json",
]

Role = Literal["input", "scored", "flagged", "dlq", "repartition", "changelog"]
# The group reads these roles from the committed offset on (Faust: earliest when nothing is committed),
# so their lag counts from 0 when nothing is committed yet. It never commits the others.
CONSUMED: frozenset[Role] = frozenset({"input", "repartition"})


@dataclass(frozen=True, slots=True)
class PartitionState:
    """One partition: its end offset, the group's committed offset (next to read) and the lag."""

    partition: int
    end_offset: int
    committed: int | None  # None: the group has committed nothing here
    lag: int | None  # None: the group does not consume this topic


@dataclass(frozen=True, slots=True)
class TopicState:
    """One topic of the service as the broker describes it."""

    topic: str
    role: Role
    exists: bool
    retention_ms: int | None  # None: not set on the topic (the broker's default applies)
    cleanup_policy: str | None
    partitions: tuple[PartitionState, ...]
    # The broker's error for this topic's metadata (a leader being elected, say): it exists, but its
    # partitions are not known.
    error: str | None = None

    @property
    def end_offsets_total(self) -> int:
        return sum(p.end_offset for p in self.partitions)

    @property
    def lag_total(self) -> int | None:
        lags = [p.lag for p in self.partitions if p.lag is not None]
        return sum(lags) if lags else None


def roles(settings: Settings, changelogs: Iterable[str]) -> list[tuple[str, Role]]:
    """Every topic the service creates (`topic_specs`, as `topics create` and the worker do), with its role.

    A topic that is neither an input, an output, the DLQ nor a changelog is a repartition topic between
    stages, whichever stages the service has.
    """
    changelogs = list(changelogs)
    outputs: dict[str, Role] = {
        settings.scored_topic: "scored",
        settings.flagged_topic: "flagged",
        settings.dlq_topic: "dlq",
    }
    named: list[tuple[str, Role]] = []
    for spec in topic_specs(settings, changelogs):
        if spec.name in settings.input_topic_names:
            named.append((spec.name, "input"))
        elif spec.name in changelogs:
            named.append((spec.name, "changelog"))
        else:
            named.append((spec.name, outputs.get(spec.name, "repartition")))
    return named


def lag_of(role: Role, end_offset: int, committed: int | None, beginning: int = 0) -> int | None:
    """Records after the committed offset still on the partition (retention deletes the oldest: with
    nothing committed the group starts at the earliest kept); never negative (a broker's end offset may
    lag, DESIGN 7)."""
    if role not in CONSUMED:
        return None
    start = beginning if committed is None else max(committed, beginning)
    return max(0, end_offset - start)


async def describe_topics(settings: Settings, changelogs: Iterable[str]) -> list[TopicState]:
    """Describe every topic of the service; a missing topic is reported, never created."""
    named = roles(settings, changelogs)
    bootstrap = settings.kafka_bootstrap_servers
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        # List first: on brokers that auto-create topics, describing a missing one would create it.
        existing = set(await admin.list_topics())
        present = [name for name, _ in named if name in existing]
        partition_ids: dict[str, list[int]] = {}
        errors: dict[str, str] = {}
        if present:
            for meta in await admin.describe_topics(present):
                if meta.get("error_code"):
                    code = meta["error_code"]
                    errors[meta["topic"]] = f"{for_code(code).__name__} ({code})"
                    continue
                partition_ids[meta["topic"]] = sorted(p["partition"] for p in meta["partitions"])
        configs = await topic_configs(admin, present)
    finally:
        await admin.close()

    tps = [TopicPartition(name, p) for name in present for p in partition_ids.get(name, [])]
    ends: dict[TopicPartition, int] = {}
    beginnings: dict[TopicPartition, int] = {}
    committed: dict[TopicPartition, int | None] = {}
    if tps:
        # In the group, but never subscribed: it does not join, so the running workers keep their
        # assignment; auto-commit off, so it never moves an offset.
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=settings.app_id, enable_auto_commit=False
        )
        await consumer.start()
        try:
            ends = await consumer.end_offsets(tps)
            beginnings = await consumer.beginning_offsets(tps)
            for tp in tps:
                committed[tp] = await consumer.committed(tp)
        finally:
            await consumer.stop()

    states = []
    for name, role in named:
        config = configs.get(name, {})
        retention = config.get("retention.ms")
        partitions = tuple(
            PartitionState(
                p,
                ends[TopicPartition(name, p)],
                committed[TopicPartition(name, p)],
                lag_of(
                    role,
                    ends[TopicPartition(name, p)],
                    committed[TopicPartition(name, p)],
                    beginnings[TopicPartition(name, p)],
                ),
            )
            for p in partition_ids.get(name, [])
        )
        states.append(
            TopicState(
                topic=name,
                role=role,
                exists=name in existing,
                retention_ms=int(retention) if retention is not None else None,
                cleanup_policy=config.get("cleanup.policy"),
                partitions=partitions,
                error=errors.get(name),
            )
        )
    return states


def human_ms(ms: int | None) -> str:
    """`retention.ms` for people: 1h, 7d, forever; `default` when the topic does not set it."""
    if ms is None:
        return "default"
    if ms < 0:
        return "forever"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms} ms"


def _opt(value: int | None) -> str:
    return "-" if value is None else str(value)


def table_of(states: list[TopicState], group: str) -> Table:
    """One row per partition; topic, role, retention and cleanup policy on each topic's first row."""
    table = Table(title=f"topics of consumer group {group}")
    table.add_column("topic")
    table.add_column("role")
    table.add_column("retention", justify="right")
    table.add_column("cleanup")
    table.add_column("partition", justify="right")
    table.add_column("end offset", justify="right")
    table.add_column("committed", justify="right")
    table.add_column("lag", justify="right")
    for state in states:
        head = [state.topic, state.role, human_ms(state.retention_ms), state.cleanup_policy or "-"]
        if not state.exists:
            table.add_row(state.topic, state.role, "", "", "[red]missing[/]", "", "", "", end_section=True)
            continue
        if not state.partitions:
            problem = f"error: {state.error}" if state.error else "no partitions"
            table.add_row(*head, f"[red]{problem}[/]", "", "", "", end_section=True)
            continue
        for index, p in enumerate(state.partitions):
            lag = _opt(p.lag)
            table.add_row(
                *(head if index == 0 else ["", "", "", ""]),
                str(p.partition),
                str(p.end_offset),
                _opt(p.committed),
                f"[yellow]{lag}[/]" if p.lag else lag,
                end_section=index == len(state.partitions) - 1,
            )
    behind = sum(
        1 for s in states for p in s.partitions if p.committed is not None and p.committed > p.end_offset
    )
    if behind:
        # Never true on Apache Kafka; the embedded broker's ListOffsets lags after multi-record batches.
        table.caption = (
            f"{behind} partition(s) report an end offset below the committed offset: the broker's "
            "ListOffsets is behind its log (the embedded Tansu broker does this after multi-record batches)"
        )
    return table


def to_json(states: list[TopicState], group: str, bootstrap: str) -> dict[str, object]:
    """The same facts for scripts: one object, topics in table order, totals per topic."""
    return {
        "bootstrap_servers": bootstrap,
        "group": group,
        "topics": [
            {
                "topic": s.topic,
                "role": s.role,
                "exists": s.exists,
                "error": s.error,
                "partition_count": len(s.partitions),
                "retention_ms": s.retention_ms,
                "cleanup_policy": s.cleanup_policy,
                "end_offsets_total": s.end_offsets_total,
                "lag_total": s.lag_total,
                "partitions": [asdict(p) for p in s.partitions],
            }
            for s in states
        ],
    }
