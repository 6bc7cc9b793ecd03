"""The service's topics: create what is missing, and check partition counts before a worker consumes.

The input topic carries raw token logprobs, the one place they ever touch disk, so it gets a short
retention (`INPUT_RETENTION_MS`, default one hour): long enough to replay a worker outage, short enough
that logprobs do not accumulate. Changelog topics are compacted, as Faust would create them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError, for_code

from streams.config import Settings

__all__ = [
    "PartitionMismatch",
    "TopicNotCreated",
    "TopicProblem",
    "config_warnings",
    "create_topics",
    "ensure_topics",
    "topic_configs",
    "topic_specs",
]

log = logging.getLogger(__name__)


class TopicProblem(RuntimeError):
    """The topics are not as the worker needs them: it must not consume (README "Guarantees")."""


class PartitionMismatch(TopicProblem):
    """A topic the worker reads exists with another partition count than TOPIC_PARTITIONS."""


class TopicNotCreated(TopicProblem):
    """The broker refused to create a missing topic (e.g. a replication factor above its brokers)."""


def topic_specs(settings: Settings, changelogs: Iterable[str] = ()) -> list[NewTopic]:
    """Every topic the service reads or writes, with its partitions and configs."""
    partitions, replication = settings.topic_partitions, settings.topic_replication_factor
    specs = [
        NewTopic(
            name,
            partitions,
            replication,
            # `delete` named, not left to the broker's default: a compacted input keeps each key's
            # latest record (and its raw logprobs) whatever its retention.
            topic_configs={"retention.ms": str(settings.input_retention_ms), "cleanup.policy": "delete"},
        )
        for name in settings.input_topic_names
    ]
    for name in (
        settings.scored_topic,
        settings.flagged_topic,
        settings.dlq_topic,
        *settings.internal_topics,
    ):
        specs.append(NewTopic(name, partitions, replication))
    for name in changelogs:
        specs.append(NewTopic(name, partitions, replication, topic_configs={"cleanup.policy": "compact"}))
    return specs


def co_partitioned(settings: Settings, changelogs: Iterable[str] = ()) -> list[str]:
    """Topics whose partition count must equal TOPIC_PARTITIONS: inputs, internal topics, changelogs.

    Stage state is co-partitioned with the topic it consumes, so a different count would send a key's
    state and its events to different workers. Output topics may have any count.
    """
    return [*settings.input_topic_names, *settings.internal_topics, *changelogs]


async def topic_configs(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, dict[str, str]]:
    """Each named (existing) topic's configs that have a value (DescribeConfigs)."""
    configs: dict[str, dict[str, str]] = {}
    if names:
        resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
        for response in await admin.describe_configs(resources):
            for _error, _message, _type, name, entries in response.resources:
                configs[name] = {entry[0]: entry[1] for entry in entries if entry[1] is not None}
    return configs


def config_warnings(
    settings: Settings, changelogs: Iterable[str], configs: dict[str, dict[str, str]]
) -> list[str]:
    """What is wrong with the configs of topics that already existed (created by someone else).

    Warnings, not errors: a longer input retention may be on purpose (replay), but it keeps raw
    logprobs on the broker, and a compacted input keeps each key's latest record for good; a shorter
    one can delete records input alignment holds back (up to half INPUT_RETENTION_MS); a changelog that
    is not compacted, or also deletes, loses table state past its retention.
    """
    warnings = []
    for name in settings.input_topic_names:
        if name not in configs:
            continue
        retention = configs[name].get("retention.ms")
        policy = configs[name].get("cleanup.policy", "delete")
        if retention is None or int(retention) < 0 or int(retention) > settings.input_retention_ms:
            kept = "the broker's default" if retention is None else f"retention.ms={retention}"
            warnings.append(
                f"input topic {name} keeps records for {kept}, longer than INPUT_RETENTION_MS="
                f"{settings.input_retention_ms}: raw token logprobs stay on the broker that long"
            )
        elif int(retention) < settings.input_retention_ms:
            warnings.append(
                f"input topic {name} keeps records for retention.ms={retention}, shorter than "
                f"INPUT_RETENTION_MS={settings.input_retention_ms}: input alignment may hold a partition "
                "back longer than its records live (set INPUT_RETENTION_MS to the topic's)"
            )
        if "compact" in policy:
            warnings.append(
                f"input topic {name} has cleanup.policy={policy}: compaction keeps each key's latest "
                "record, raw token logprobs included, whatever its retention"
            )
    for name in changelogs:
        if name not in configs:
            continue
        cleanup = configs[name].get("cleanup.policy")
        deletes = cleanup is not None and "delete" in cleanup and configs[name].get("retention.ms") != "-1"
        if cleanup is None or "compact" not in cleanup or deletes:
            warnings.append(
                f"changelog topic {name} has cleanup.policy={cleanup or 'the broker default'}, not compact "
                "alone: table state older than its retention is lost when a worker restores"
            )
    return warnings


async def create_topics(settings: Settings, changelogs: Iterable[str] = ()) -> list[str]:
    """Create the missing topics; return the names created (existing ones are left as they are)."""
    created, _, _ = await _create_missing(settings, list(changelogs))
    log.info("topics created: %s", ", ".join(created) or "none (all existed)")
    return created


async def ensure_topics(settings: Settings, changelogs: Iterable[str] = ()) -> list[str]:
    """Before a worker consumes: create what is missing, then check partition counts and configs.

    Raises `TopicNotCreated` with the broker's reason when it refuses a missing topic, and
    `PartitionMismatch` naming the topic and both counts; logs a warning for each existing topic
    whose retention or cleanup policy differs from ours; returns the names created.
    """
    changelogs = list(changelogs)
    created, partitions, configs = await _create_missing(settings, changelogs)
    for warning in config_warnings(settings, changelogs, configs):
        log.warning("%s", warning)
    for name in co_partitioned(settings, changelogs):
        found = partitions.get(name)
        if found is not None and found != settings.topic_partitions:
            raise PartitionMismatch(
                f"topic {name} has {found} partitions but TOPIC_PARTITIONS={settings.topic_partitions}: "
                "make them equal (recreate the topic or set TOPIC_PARTITIONS)"
            )
    if created:
        log.info("created missing topics: %s", ", ".join(created))
    return created


async def _create_missing(
    settings: Settings, changelogs: list[str]
) -> tuple[list[str], dict[str, int], dict[str, dict[str, str]]]:
    """Create missing topics; return (created names, partition count of every topic that existed, the
    configs of the input and changelog topics that existed)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
    await admin.start()
    created: list[str] = []
    try:
        specs = topic_specs(settings, changelogs)
        # List first: a metadata request for a missing topic auto-creates it on brokers that allow
        # auto-creation (Tansu does), with default partitions and no retention setting.
        names = set(await admin.list_topics())
        for spec in specs:
            if spec.name in names:
                continue
            # The broker answers per topic with an error code; aiokafka raises for none of them.
            response = await admin.create_topics([spec])
            for topic, code, *message in response.topic_errors:
                if code == 0:
                    created.append(topic)
                elif for_code(code) is not TopicAlreadyExistsError:  # created meanwhile: fine
                    detail = f": {message[0]}" if message and message[0] else ""
                    raise TopicNotCreated(
                        f"the broker refused to create topic {topic} ({for_code(code).__name__}{detail})"
                    )
        described = await admin.describe_topics([s.name for s in specs if s.name in names])
        existing = {t["topic"]: len(t["partitions"]) for t in described if t.get("error_code", 0) == 0}
        checked = [n for n in (*settings.input_topic_names, *changelogs) if n in existing]
        configs = await topic_configs(admin, checked)
    finally:
        await admin.close()
    return created, existing, configs
