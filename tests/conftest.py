"""The test harness: one broker per session from `streams.harness` (DESIGN section 7), never skipped."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from streams.harness import RunningBroker, broker


@pytest.fixture(scope="session")
def kafka() -> Iterator[RunningBroker]:
    """A real Kafka-protocol broker: configured, Docker Apache Kafka, or embedded Tansu."""
    with broker() as running:
        logging.getLogger("tests").warning("integration tests run against %s (%s)", running.kind, running.bootstrap_servers)
        yield running
