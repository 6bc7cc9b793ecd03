"""Tests for the mutants of the user-facing modules (producer kit, topic setup, `topics describe`) that the
mutation review left alive. Offline: aiokafka's producer, admin client and consumer are replaced by fakes.
Expected values come from DESIGN.md and README.md ("Producing events", "Topics", "topics describe")."""

from __future__ import annotations

import asyncio
import io
import logging
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import NewTopic
from rich.console import Console

import streams.describe
import streams.producer
import streams.topics
from streams.config import Settings, load_settings
from streams.describe import PartitionState, TopicState, describe_topics, to_json
from streams.events import RetrievalHit, ToolInvocation
from streams.producer import EventProducer, build, encode
from streams.topics import PartitionMismatch, config_warnings, ensure_topics, topic_specs

COMMON: dict[str, Any] = {
    "tenant_id": "acme",
    "trace_id": "trace-7f3a",
    "agent_name": "planner-1",
    "agent_type": "planner",
}


# --- producer kit -------------------------------------------------------------------------------------


class _Producer:
    """Stands in for AIOKafkaProducer: keeps its options and the sends; each ack is resolved by hand."""

    made: ClassVar[list[_Producer]] = []
    fail_start: ClassVar[bool] = False

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.sends: list[tuple[str, bytes, bytes | None]] = []
        self.acks: list[asyncio.Future[Any]] = []
        self.stopped = False
        _Producer.made.append(self)

    async def start(self) -> None:
        if self.fail_start:
            raise ConnectionError("no broker")

    async def stop(self) -> None:
        self.stopped = True

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> asyncio.Future[Any]:
        self.sends.append((topic, value, key))
        self.acks.append(asyncio.get_running_loop().create_future())
        return self.acks[-1]


@pytest.fixture
def kafka(monkeypatch: pytest.MonkeyPatch) -> type[_Producer]:
    monkeypatch.setattr(streams.producer, "AIOKafkaProducer", _Producer)
    _Producer.made, _Producer.fail_start = [], False
    return _Producer


def _tool(target: str) -> ToolInvocation:
    return build(ToolInvocation, **COMMON, tool="find", target=target, status="ok")


async def test_sends_go_to_the_input_topic_keyed_by_trace_id_and_wait_for_the_ack(
    kafka: type[_Producer],
) -> None:
    """README: the record key is the trace_id as UTF-8; `send` waits for acks=all and returns the ack."""
    async with EventProducer(bootstrap_servers="k:9092", topic="agent-events") as producer:
        sending = asyncio.create_task(producer.send(_tool("parse_config")))
        await asyncio.sleep(0.01)
        (fake,) = kafka.made
        assert not sending.done()  # not before the broker acknowledged it
        fake.acks[0].set_result("metadata-0")
        assert await sending == "metadata-0"
    assert fake.sends[0][0] == "agent-events"
    assert fake.sends[0][2] == b"trace-7f3a"
    assert fake.options["bootstrap_servers"] == "k:9092"


async def test_send_many_returns_every_ack_in_order(kafka: type[_Producer]) -> None:
    events = [_tool(str(i)) for i in range(3)]
    async with EventProducer(bootstrap_servers="k:9092", topic="agent-events") as producer:

        async def acks() -> None:
            await asyncio.sleep(0.01)
            for i, ack in enumerate(kafka.made[0].acks):
                ack.set_result(f"m{i}")

        acker = asyncio.create_task(acks())
        assert await producer.send_many(events) == ["m0", "m1", "m2"]
        await acker
    assert [key for _, _, key in kafka.made[0].sends] == [b"trace-7f3a"] * 3


def test_the_producer_waits_for_all_replicas_and_idempotence_is_off_by_default(
    kafka: type[_Producer],
) -> None:
    """README: `send` waits for acks=all; idempotence is off by default, `enable_idempotence=True` turns
    it on; `kafka_options` go to aiokafka's producer."""

    async def options(**kwargs: Any) -> dict[str, Any]:
        producer = EventProducer(bootstrap_servers="k:9092", topic="agent-events", **kwargs)
        await producer.start()
        await producer.stop()
        return kafka.made[-1].options

    default = asyncio.run(options())
    assert default["acks"] in ("all", -1)
    assert default["enable_idempotence"] is False
    chosen = asyncio.run(options(enable_idempotence=True, compression_type="gzip", security_protocol="SSL"))
    assert chosen["enable_idempotence"] is True
    assert (chosen["compression_type"], chosen["security_protocol"]) == ("gzip", "SSL")


def test_a_failed_start_closes_the_producer_it_made(kafka: type[_Producer]) -> None:
    kafka.fail_start = True
    producer = EventProducer(bootstrap_servers="k:9092", topic="agent-events")
    with pytest.raises(ConnectionError):
        asyncio.run(producer.start())
    assert kafka.made[0].stopped


def test_encode_refuses_what_is_not_an_input_event() -> None:
    with pytest.raises(TypeError, match="not an input event"):
        encode(RetrievalHit(similarity=0.5))


# --- topic creation and checks ------------------------------------------------------------------------


def _settings(**overrides: Any) -> Settings:
    return load_settings(input_topics="in", app_id="cs", **overrides)


def test_every_topic_gets_the_configured_partitions_and_replication_and_its_configs() -> None:
    """DESIGN 1: the input topic gets a short, configurable retention; README: changelogs are compacted."""
    settings = _settings(topic_partitions=6, topic_replication_factor=3, input_retention_ms=7_200_000)
    changelogs = ["cs-traces-changelog"]
    specs = {spec.name: spec for spec in topic_specs(settings, changelogs)}
    assert len(specs) == 5 + len(settings.internal_topics)  # input, 3 outputs, changelog, internal
    for spec in specs.values():
        assert (spec.num_partitions, spec.replication_factor) == (6, 3), spec.name
    assert specs["in"].topic_configs["retention.ms"] == "7200000"
    assert specs["cs-traces-changelog"].topic_configs == {"cleanup.policy": "compact"}
    assert "retention.ms" not in specs["scored-events"].topic_configs
    assert load_settings().input_retention_ms == 3_600_000  # README: default 1 h


class _Admin:
    """A broker's admin API: `partitions[name]` for existing topics, `configs[name]` from DescribeConfigs."""

    partitions: ClassVar[dict[str, int]] = {}
    configs: ClassVar[dict[str, dict[str, str]]] = {}
    errors: ClassVar[dict[str, int]] = {}

    def __init__(self, **_: Any) -> None:
        pass

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def list_topics(self) -> list[str]:
        return sorted(self.partitions)

    async def create_topics(self, specs: list[NewTopic]) -> Any:
        # TOPIC_ALREADY_EXISTS (36) for a topic that exists, as a broker answers.
        return SimpleNamespace(
            topic_errors=[(s.name, 36 if s.name in self.partitions else 0, None) for s in specs]
        )

    async def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        return [
            {
                "topic": n,
                "error_code": self.errors.get(n, 0),
                "partitions": []
                if n in self.errors
                else [{"partition": p} for p in range(self.partitions[n])],
            }
            for n in names
        ]

    async def describe_configs(self, resources: list[Any]) -> list[Any]:
        rows = [
            (0, None, 2, r.name, [(k, v) for k, v in self.configs.get(r.name, {}).items()]) for r in resources
        ]
        return [SimpleNamespace(resources=rows)]


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> type[_Admin]:
    monkeypatch.setattr(streams.topics, "AIOKafkaAdminClient", _Admin)
    _Admin.partitions, _Admin.configs, _Admin.errors = {}, {}, {}
    return _Admin


def _all_existing(settings: Settings, changelogs: list[str]) -> dict[str, int]:
    return {spec.name: settings.topic_partitions for spec in topic_specs(settings, changelogs)}


@pytest.mark.parametrize("found", [2, 8])
@pytest.mark.parametrize("which", ["input", "repartition", "changelog"])
def test_a_partition_mismatch_refuses_and_names_the_topic_and_both_counts(
    admin: type[_Admin], which: str, found: int
) -> None:
    """README: the worker refuses to start, with one line naming the topic and both counts, when an input,
    repartition or changelog topic has a partition count other than TOPIC_PARTITIONS."""
    settings = _settings(topic_partitions=4)
    changelogs = ["cs-traces-changelog"]
    name = {"input": "in", "repartition": settings.internal_topics[0], "changelog": changelogs[0]}[which]
    admin.partitions = {**_all_existing(settings, changelogs), name: found}
    with pytest.raises(PartitionMismatch) as err:
        asyncio.run(ensure_topics(settings, changelogs))
    message = str(err.value)
    assert name in message and str(found) in message and "TOPIC_PARTITIONS=4" in message
    assert "\n" not in message


def test_a_topic_the_broker_describes_with_an_error_is_not_a_partition_mismatch(admin: type[_Admin]) -> None:
    """A topic listed but answered with an error code (e.g. LEADER_NOT_AVAILABLE while another worker
    creates it) has no known partition count: no refusal claiming it has 0 partitions."""
    settings = _settings()
    admin.partitions = _all_existing(settings, [])
    admin.errors = {"in": 5}
    asyncio.run(ensure_topics(settings))


def test_ensure_topics_warns_about_existing_input_and_changelog_configs(
    admin: type[_Admin], caplog: pytest.LogCaptureFixture
) -> None:
    """README: the worker also warns (log) when an existing input topic keeps records longer than
    INPUT_RETENTION_MS or a changelog is not compacted alone; it goes on."""
    settings = _settings(input_retention_ms=3_600_000)
    changelogs = ["cs-traces-changelog"]
    admin.partitions = _all_existing(settings, changelogs)
    admin.configs = {
        "in": {"retention.ms": "604800000", "cleanup.policy": "delete"},
        "cs-traces-changelog": {"cleanup.policy": "delete"},
    }
    with caplog.at_level(logging.WARNING, logger="streams.topics"):
        assert asyncio.run(ensure_topics(settings, changelogs)) == []
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.startswith("input topic in keeps records for retention.ms=604800000") for m in logged)
    assert any(m.startswith("changelog topic cs-traces-changelog has cleanup.policy=delete") for m in logged)


def test_an_input_kept_forever_is_named_as_longer_not_shorter() -> None:
    settings = _settings(input_retention_ms=3_600_000)
    (warning,) = config_warnings(settings, [], {"in": {"retention.ms": "-1", "cleanup.policy": "delete"}})
    assert "longer than INPUT_RETENTION_MS" in warning and "raw token logprobs" in warning


def test_a_changelog_without_a_cleanup_policy_is_named() -> None:
    """The broker's default policy is delete: table state past its retention would be lost on restore."""
    (warning,) = config_warnings(_settings(), ["c"], {"c": {}})
    assert warning.startswith("changelog topic c has cleanup.policy=the broker default")


# --- topics describe ----------------------------------------------------------------------------------


class _DescribeAdmin(_Admin):
    asked: ClassVar[list[list[str]]] = []

    async def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        self.asked.append(list(names))
        # Partitions in the broker's order, not sorted.
        return [{"topic": n, "partitions": [{"partition": 1}, {"partition": 0}]} for n in names]

    async def describe_configs(self, resources: list[Any]) -> list[Any]:
        self.asked.append([r.name for r in resources])
        return await super().describe_configs(resources)


class _Consumer:
    """Offsets of every partition: end 100 / 50, earliest kept 40 / 0, committed 30 / none."""

    options: ClassVar[dict[str, Any]] = {}

    def __init__(self, **options: Any) -> None:
        _Consumer.options = options

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: 100 if tp.partition == 0 else 50 for tp in tps}

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: 40 if tp.partition == 0 else 0 for tp in tps}

    async def committed(self, tp: TopicPartition) -> int | None:
        return 30 if tp.partition == 0 else None


def test_describe_reports_configs_offsets_and_lag_and_never_touches_missing_topics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """README "topics describe": role, retention.ms, cleanup.policy, per partition the end offset, the
    group's (APP_ID) committed offset and the lag, counted from the committed offset or the earliest
    record still kept; a missing topic is reported (and, on brokers that auto-create, never described)."""
    monkeypatch.setattr(streams.describe, "AIOKafkaAdminClient", _DescribeAdmin)
    monkeypatch.setattr(streams.describe, "AIOKafkaConsumer", _Consumer)
    settings = _settings()
    changelogs = ["cs-traces-changelog"]
    _DescribeAdmin.partitions = _all_existing(settings, changelogs)
    del _DescribeAdmin.partitions["flagged-events"]
    _DescribeAdmin.configs = {
        "in": {"retention.ms": "3600000", "cleanup.policy": "delete"},
        "cs-traces-changelog": {"cleanup.policy": "compact"},
    }
    _DescribeAdmin.asked = []
    states = {s.topic: s for s in asyncio.run(describe_topics(settings, changelogs))}

    assert all("flagged-events" not in names for names in _DescribeAdmin.asked)
    assert states["flagged-events"].exists is False and states["flagged-events"].partitions == ()
    assert states["in"].exists is True
    assert (states["in"].retention_ms, states["in"].cleanup_policy) == (3_600_000, "delete")
    assert (states["cs-traces-changelog"].retention_ms, states["cs-traces-changelog"].cleanup_policy) == (
        None,
        "compact",
    )
    # Committed 30 but only offsets 40.. kept: lag 60; nothing committed: from the earliest kept, 50.
    assert states["in"].partitions == (PartitionState(0, 100, 30, 60), PartitionState(1, 50, None, 50))
    assert [(p.partition, p.end_offset, p.lag) for p in states["cs-traces-changelog"].partitions] == [
        (0, 100, None),  # not the group's to consume: no lag
        (1, 50, None),
    ]
    # The group's committed offsets, read without committing anything.
    assert _Consumer.options["group_id"] == "cs"
    assert _Consumer.options["enable_auto_commit"] is False


def test_json_gives_retention_in_milliseconds() -> None:
    state = TopicState("in", "input", True, 3_600_000, "delete", (PartitionState(0, 1, 1, 0),))
    topics = to_json([state], "cs", "k:9092")["topics"]
    assert isinstance(topics, list)
    assert topics[0]["retention_ms"] == 3_600_000


def test_a_topic_whose_metadata_the_broker_answers_with_an_error_is_listed_with_that_error(
    monkeypatch: pytest.MonkeyPatch, admin: type[_Admin]
) -> None:
    """README: `topics describe` lists every topic the service creates. One the broker lists but whose
    metadata it answers with an error (a leader being elected) had no row at all: neither its partitions
    nor "missing". Now it has one naming the error, in the table and in `--json`."""

    admin.partitions, admin.errors = {"in": 0}, {"in": 5}  # LEADER_NOT_AVAILABLE: no partitions known
    monkeypatch.setattr(streams.describe, "AIOKafkaAdminClient", admin)
    settings = load_settings(input_topics="in", app_id="cs")
    states = asyncio.run(describe_topics(settings, []))
    (state,) = [s for s in states if s.topic == "in"]
    assert (state.exists, state.partitions, state.error) == (True, (), "LeaderNotAvailableError (5)")
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(streams.describe.table_of(states, "cs"))
    (row,) = [line for line in out.getvalue().splitlines() if line.startswith("│ in ")]
    assert "error: LeaderNotAvailableError (5)" in row
    topics: list[dict[str, Any]] = to_json(states, "cs", "b")["topics"]  # type: ignore[assignment]
    (as_json,) = [t for t in topics if t["topic"] == "in"]
    assert as_json["error"] == "LeaderNotAvailableError (5)"
