"""The test harness: one broker per session from `streams.harness` (DESIGN section 7), never skipped."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from streams.harness import RunningBroker, broker, stop_on_sigterm

# CI explores a fixed set of examples (no flakes from a new random draw), with no per-example deadline
# on a busy 2-core machine; locally hypothesis draws fresh examples each run.
settings.register_profile("ci", derandomize=True, deadline=None, max_examples=200)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_configure(config: pytest.Config) -> None:
    # A CI runner that sends SIGTERM to pytest alone: stop as on Ctrl-C, so the session's broker and the
    # workers the tests started are stopped by their fixtures instead of left running.
    stop_on_sigterm()


@pytest.fixture(scope="session")
def kafka() -> Iterator[RunningBroker]:
    """A real Kafka-protocol broker: configured, Docker Apache Kafka, or embedded Tansu."""
    with broker() as running:
        logging.getLogger("tests").warning(
            "integration tests run against %s (%s)", running.kind, running.bootstrap_servers
        )
        yield running
