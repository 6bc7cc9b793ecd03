"""`confidence-streams topics create|describe` against the broker: topics, partitions, retention, offsets, lag."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from streams.app import changelog_topics, create_app
from streams.config import Settings
from streams.demo import encode
from streams.describe import TopicState, describe_topics
from streams.harness import RunningBroker
from streams.topics import topic_configs
from tests.integration.fixtures import EventFactory, deploy


async def _describe(bootstrap: str, topic: str) -> tuple[int, dict[str, str]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        meta = await admin.describe_topics([topic])
        partitions = len(meta[0]["partitions"])
        configs = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        entries = {name: value for name, value, *_ in configs[0].resources[0][4]}
        return partitions, entries
    finally:
        await admin.close()


def _topics_create(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`confidence-streams topics create` as a user runs it: only `env`, nothing of the test's own."""
    return subprocess.run(
        [sys.executable, "-m", "streams.cli", "topics", "create", *args],
        env={**env, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_topics_create_command(kafka: RunningBroker) -> None:
    suffix = uuid.uuid4().hex[:6]
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "APP_ID": f"topics-{suffix}",
        "INPUT_TOPICS": f"in-a-{suffix},in-b-{suffix}",
        "SCORED_TOPIC": f"scored-{suffix}",
        "FLAGGED_TOPIC": f"flagged-{suffix}",
        "DLQ_TOPIC": f"dlq-{suffix}",
    }
    done = _topics_create(env, "--partitions", "3", "--input-retention-ms", "120000")
    assert done.returncode == 0, done.stderr
    for topic in (f"in-a-{suffix}", f"in-b-{suffix}"):
        partitions, configs = asyncio.run(_describe(kafka.bootstrap_servers, topic))
        assert partitions == 3
        assert configs["retention.ms"] == "120000"
    for topic in (
        f"scored-{suffix}",
        f"flagged-{suffix}",
        f"dlq-{suffix}",
        f"topics-{suffix}-responses-by-agent",
        f"topics-{suffix}-claims-by-tenant",
    ):
        partitions, configs = asyncio.run(_describe(kafka.bootstrap_servers, topic))
        assert partitions == 3
        assert configs.get("retention.ms") != "120000"
    again = _topics_create(env, "--partitions", "3")
    assert again.returncode == 0 and "nothing (all topics existed)" in again.stdout
    # Asked for another partition count than the existing topics have: said, not "created: nothing".
    other = _topics_create(env, "--partitions", "8")
    assert other.returncode == 2, other.stdout
    assert "has 3 partitions but TOPIC_PARTITIONS=8" in other.stderr


def test_topics_create_names_an_input_topic_someone_else_created_without_short_retention(
    kafka: RunningBroker,
) -> None:
    """A producer that ran first auto-created the input topic (or a platform team made it by hand):
    partitions fine, retention the broker's default. Raw logprobs would stay that long: said."""
    suffix = uuid.uuid4().hex[:6]
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers, "APP_ID": f"retention-{suffix}"}
    env["INPUT_TOPICS"] = f"in-{suffix}"

    async def create_plain() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(f"in-{suffix}", 4, 1)])  # no retention.ms
        finally:
            await admin.close()

    asyncio.run(create_plain())
    done = _topics_create(env)
    assert done.returncode == 0, done.stderr
    assert f"input topic in-{suffix} keeps records for" in done.stderr
    assert "raw token logprobs" in done.stderr


def test_topics_create_names_a_compacted_input_topic_and_creates_inputs_with_delete(
    kafka: RunningBroker,
) -> None:
    """A compacted input keeps each trace's latest record, raw logprobs included, whatever its retention:
    said, though its retention is short. The input topics this command creates say `delete` themselves."""
    suffix = uuid.uuid4().hex[:6]
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers, "APP_ID": f"compacted-{suffix}"}
    env["INPUT_TOPICS"] = f"in-{suffix},fresh-{suffix}"
    compacted = {"cleanup.policy": "compact", "retention.ms": "3600000"}
    env["INPUT_RETENTION_MS"] = compacted["retention.ms"]

    async def admin_call(call: Callable[[AIOKafkaAdminClient], Awaitable[Any]]) -> Any:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
        await admin.start()
        try:
            return await call(admin)
        finally:
            await admin.close()

    asyncio.run(
        admin_call(lambda a: a.create_topics([NewTopic(f"in-{suffix}", 4, 1, topic_configs=compacted)]))
    )
    done = _topics_create(env)
    assert done.returncode == 0, done.stderr
    assert f"input topic in-{suffix} has cleanup.policy=compact" in done.stderr
    assert f"input topic fresh-{suffix}" not in done.stderr
    configs = asyncio.run(admin_call(lambda a: topic_configs(a, [f"in-{suffix}", f"fresh-{suffix}"])))
    assert configs[f"in-{suffix}"].get("cleanup.policy") == "compact"  # the premise: the broker kept it
    assert configs[f"fresh-{suffix}"].get("cleanup.policy") == "delete"


async def _produce_one_by_one(bootstrap: str, topic: str, events: list[dict[str, Any]]) -> Counter[int]:
    """Each record in its own batch (send and wait): records per partition.

    One record per batch keeps the embedded broker's ListOffsets exact (DESIGN 7: after a multi-record
    batch it reports the last batch's base offset + 1), so end offsets can be compared on every broker.
    """
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    per_partition: Counter[int] = Counter()
    try:
        for event in events:
            meta = await producer.send_and_wait(topic, encode(event), key=str(event["trace_id"]).encode())
            per_partition[meta.partition] += 1
    finally:
        await producer.stop()
    return per_partition


def _describe_until(
    settings: Settings, done: Callable[[dict[str, TopicState]], bool]
) -> dict[str, TopicState]:
    deadline = time.monotonic() + 90
    while True:
        states = {s.topic: s for s in asyncio.run(describe_topics(settings, _changelogs(settings)))}
        if done(states):
            return states
        assert time.monotonic() < deadline, f"describe never satisfied the condition: {states}"
        time.sleep(0.5)


def _changelogs(settings: Settings) -> list[str]:
    """The worker's table changelogs, named by its Faust app (deploy() sets WEB_PORT=0, which Faust
    refuses; naming topics binds no port)."""
    return changelog_topics(create_app(settings.model_copy(update={"web_port": 6066})))


async def _topics_on_broker(bootstrap: str, suffix: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {name for name in await admin.list_topics() if suffix in name}
    finally:
        await admin.close()


def _cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "streams.cli", "topics", "describe", *args],
        env={**os.environ, **env, "COLUMNS": "200", "WEB_PORT": "6066"},  # validated, never bound
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_topics_describe_after_a_worker_processed_events(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=2)
    s = d.settings
    d.start_worker()
    f = EventFactory(tenant="describe")
    events = [
        f.response(f"dt-{i}", token_logprobs=[-0.1, -0.2])
        if i % 3 == 0
        else f.tool(f"dt-{i}", "find", "Parser", result_count=1)
        if i % 3 == 1
        else f.claim(f"dt-{i}", f"c-{i}")
        for i in range(9)
    ]
    try:
        produced = asyncio.run(_produce_one_by_one(kafka.bootstrap_servers, s.input_topic_names[0], events))
        records = d.collect(lambda rs: len(d.outputs(rs)) >= len(events))
        outputs = d.outputs(records)
        # Processed means committed: wait until the group's committed offsets reach the input's end.
        states = _describe_until(s, lambda st: st[s.input_topic_names[0]].lag_total == 0)
        table = _cli(d.env)
        as_json = orjson.loads(_cli(d.env, "--json"))
        on_broker = asyncio.run(_topics_on_broker(kafka.bootstrap_servers, d.suffix))
    finally:
        d.stop()

    # Every topic of this deployment on the broker, but Faust's own leader-election topic (no data).
    on_broker.discard(f"{s.app_id}-__assignor-__leader")
    fixed = {s.input_topic_names[0]: "input", s.scored_topic: "scored", s.flagged_topic: "flagged"}
    fixed[s.dlq_topic] = "dlq"
    changelogs = _changelogs(s)
    expected_roles = {
        name: fixed.get(name, "changelog" if name in changelogs else "repartition") for name in on_broker
    }
    assert {name: state.role for name, state in states.items()} == expected_roles
    assert {s.responses_topic, s.claims_topic} <= {n for n, r in expected_roles.items() if r == "repartition"}
    assert len(changelogs) >= 3 and set(changelogs) <= on_broker
    for state in states.values():
        assert state.exists and [p.partition for p in state.partitions] == [0, 1]
    inputs = states[s.input_topic_names[0]]
    assert inputs.retention_ms == s.input_retention_ms
    assert {p.partition: p.end_offset for p in inputs.partitions} == {p: produced[p] for p in (0, 1)}
    assert [(p.committed, p.lag) for p in inputs.partitions] == [(produced[0], 0), (produced[1], 0)]
    for name in _changelogs(s):
        assert states[name].cleanup_policy == "compact"
        assert all(p.lag is None for p in states[name].partitions)  # the group never commits changelogs
    for name, role in expected_roles.items():  # repartition topics are the group's: lag counted
        if role == "repartition":
            assert all(p.lag is not None for p in states[name].partitions)
    scored_total = states[s.scored_topic].end_offsets_total
    if kafka.is_tansu:
        # The worker's producer sends multi-record batches, after which the embedded broker's ListOffsets
        # stops at the last batch's base offset + 1 (DESIGN 7): the end offsets may fall short.
        assert 0 < scored_total <= len(outputs)
    else:
        assert scored_total == len(outputs)

    # The command line shows the same: one JSON object, and a table naming every topic.
    by_topic = {t["topic"]: t for t in as_json["topics"]}
    assert as_json["group"] == s.app_id and set(by_topic) == set(expected_roles)
    assert by_topic[inputs.topic]["partitions"] == [
        {"partition": p, "end_offset": produced[p], "committed": produced[p], "lag": 0} for p in (0, 1)
    ]
    assert by_topic[inputs.topic]["retention_ms"] == s.input_retention_ms
    for name in expected_roles:
        assert name in table
    assert "1h" in table and "compact" in table  # the input's retention, the changelogs' policy
