"""Topic setup against a broker that refuses: aiokafka returns per-topic error codes and raises for none."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from aiokafka.admin import NewTopic

import streams.topics
from streams.config import load_settings
from streams.topics import TopicNotCreated, config_warnings, create_topics, ensure_topics, topic_specs

SETTINGS = load_settings()


class _Admin:
    """Answers CreateTopics with `codes[name]` (0 when absent), as a broker does."""

    codes: ClassVar[dict[str, int]] = {}
    existing: ClassVar[set[str]] = set()

    def __init__(self, **_: Any) -> None:
        pass

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def list_topics(self) -> list[str]:
        return sorted(self.existing)

    async def create_topics(self, specs: list[NewTopic]) -> Any:
        errors = [(s.name, self.codes.get(s.name, 0), "replication factor: 3 larger than 1") for s in specs]
        return SimpleNamespace(topic_errors=errors)

    async def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        return [{"topic": n, "partitions": [0] * SETTINGS.topic_partitions, "error_code": 0} for n in names]


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> type[_Admin]:
    monkeypatch.setattr(streams.topics, "AIOKafkaAdminClient", _Admin)
    _Admin.codes, _Admin.existing = {}, set()
    return _Admin


def test_a_refused_creation_is_an_error_naming_the_topic_and_the_brokers_reason(admin: type[_Admin]) -> None:
    admin.codes = {SETTINGS.scored_topic: 38}  # INVALID_REPLICATION_FACTOR
    with pytest.raises(TopicNotCreated, match=f"{SETTINGS.scored_topic}.*InvalidReplicationFactor.*larger"):
        asyncio.run(ensure_topics(SETTINGS))
    with pytest.raises(TopicNotCreated):
        asyncio.run(create_topics(SETTINGS))


def test_a_topic_created_meanwhile_by_someone_else_is_fine(admin: type[_Admin]) -> None:
    admin.codes = {SETTINGS.scored_topic: 36}  # TOPIC_ALREADY_EXISTS: another worker was faster
    created = asyncio.run(ensure_topics(SETTINGS))
    assert SETTINGS.scored_topic not in created
    assert SETTINGS.dlq_topic in created


def test_existing_topics_with_a_longer_input_retention_or_an_uncompacted_changelog_are_named() -> None:
    settings = load_settings(input_topics="in", input_retention_ms=3_600_000)
    configs = {
        "in": {"retention.ms": "604800000"},  # Apache Kafka reports its default (7 days) too
        "ok-changelog": {"cleanup.policy": "compact"},
        "deleting-changelog": {"cleanup.policy": "delete"},
    }
    warnings = config_warnings(settings, ["ok-changelog", "deleting-changelog", "missing-changelog"], configs)
    assert len(warnings) == 2
    assert warnings[0].startswith("input topic in keeps records for retention.ms=604800000")
    assert "raw token logprobs" in warnings[0]
    assert warnings[1].startswith("changelog topic deleting-changelog has cleanup.policy=delete")
    assert config_warnings(settings, [], {"in": {}})[0].startswith(
        "input topic in keeps records for the broker's"
    )
    assert config_warnings(settings, [], {"in": {"retention.ms": "3600000"}}) == []
    assert config_warnings(settings, [], {"in": {"retention.ms": "-1"}}) != []  # -1: for ever


def test_an_input_topic_that_compacts_or_keeps_records_less_long_and_a_changelog_that_deletes_are_named() -> (
    None
):
    """Found in review: a compacted input kept each key's latest record (raw logprobs) for good and
    passed, as did a changelog with cleanup.policy=compact,delete (state lost past 7 days); an input
    kept 2 minutes let input alignment hold a partition back for up to 30 minutes."""
    settings = load_settings(input_topics="in", input_retention_ms=3_600_000)
    (compacted,) = config_warnings(
        settings, [], {"in": {"retention.ms": "3600000", "cleanup.policy": "compact"}}
    )
    assert compacted.startswith("input topic in has cleanup.policy=compact") and "logprobs" in compacted
    (short,) = config_warnings(settings, [], {"in": {"retention.ms": "120000"}})
    assert short.startswith("input topic in keeps records for retention.ms=120000, shorter than")
    (deleting,) = config_warnings(
        settings, ["c"], {"c": {"cleanup.policy": "compact,delete", "retention.ms": "604800000"}}
    )
    assert deleting.startswith("changelog topic c has cleanup.policy=compact,delete, not compact alone")
    assert (
        config_warnings(settings, ["c"], {"c": {"cleanup.policy": "compact,delete", "retention.ms": "-1"}})
        == []
    )


def test_input_topics_are_created_with_the_delete_policy() -> None:
    """Named, not left to the broker's default (which may be compact)."""
    settings = load_settings(input_topics="in,other")
    specs = {spec.name: spec.topic_configs for spec in topic_specs(settings)}
    assert specs["in"]["cleanup.policy"] == specs["other"]["cleanup.policy"] == "delete"
