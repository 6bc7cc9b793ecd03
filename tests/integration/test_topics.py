"""`confidence-streams topics create` against the broker: every topic, partitions, input retention."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from streams.harness import RunningBroker


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
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "streams.cli",
            "topics",
            "create",
            "--partitions",
            "3",
            "--input-retention-ms",
            "120000",
        ],
        env={**env, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
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
    again = subprocess.run(
        [sys.executable, "-m", "streams.cli", "topics", "create"],
        env={**env, "PATH": "/usr/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 0 and "nothing (all topics existed)" in again.stdout
