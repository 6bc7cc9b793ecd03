"""Creates the service's topics: input (short retention), outputs, DLQ and the internal repartition topics.

The input topic carries raw token logprobs, the one place they ever touch disk, so it gets a short
retention (`INPUT_RETENTION_MS`, default one hour): long enough to replay a worker outage, short enough
that logprobs do not accumulate.
"""

from __future__ import annotations

import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from streams.config import Settings

__all__ = ["create_topics", "topic_specs"]

log = logging.getLogger(__name__)


def topic_specs(settings: Settings) -> list[NewTopic]:
    """Every topic the service reads or writes, with its partitions and configs."""
    partitions, replication = settings.topic_partitions, settings.topic_replication_factor
    specs = [
        NewTopic(
            name, partitions, replication, topic_configs={"retention.ms": str(settings.input_retention_ms)}
        )
        for name in settings.input_topic_names
    ]
    for name in (
        settings.scored_topic,
        settings.flagged_topic,
        settings.dlq_topic,
        settings.responses_topic,
        settings.claims_topic,
    ):
        specs.append(NewTopic(name, partitions, replication))
    return specs


async def create_topics(settings: Settings) -> list[str]:
    """Create the missing topics; return the names created (existing ones are left as they are)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
    await admin.start()
    created: list[str] = []
    try:
        existing = set(await admin.list_topics())
        missing = [spec for spec in topic_specs(settings) if spec.name not in existing]
        for spec in missing:
            try:
                await admin.create_topics([spec])
                created.append(spec.name)
            except TopicAlreadyExistsError:
                pass
    finally:
        await admin.close()
    log.info("topics created: %s", ", ".join(created) or "none (all existed)")
    return created
