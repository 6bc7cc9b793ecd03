"""The harness finds the broker where the worker would: `KAFKA_BOOTSTRAP_SERVERS` from the environment,
else from `.env` (the harness read the environment only, so a cluster named in `.env` was ignored)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.harness import RunningBroker, broker, configured_bootstrap_servers


def test_a_cluster_named_in_dotenv_is_the_one_the_harness_uses(
    kafka: RunningBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.chdir(tmp_path)
    assert configured_bootstrap_servers() == ""  # neither sets it: Docker Kafka or Tansu next
    (tmp_path / ".env").write_text(
        f"# the worker reads names in any case\nkafka_bootstrap_servers={kafka.bootstrap_servers}\n"
    )
    with broker() as running:  # probed over the network, used as it is
        assert running == RunningBroker("external", kafka.bootstrap_servers)
    monkeypatch.setenv("TOPIC_PARTITIONS", "many")  # not its business: the worker would refuse it
    assert configured_bootstrap_servers() == kafka.bootstrap_servers
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "elsewhere:9092")  # the environment wins, as for the worker
    assert configured_bootstrap_servers() == "elsewhere:9092"
