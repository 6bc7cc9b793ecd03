"""The test harness: one broker per session from `streams.harness` (DESIGN section 7), never skipped."""

from __future__ import annotations

import logging
import os
import tempfile
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


@pytest.fixture(scope="session", autouse=True)
def scratch_under_pytest_basetemp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Deployments' data dirs and logs, reports and the like go under pytest's base temp dir, which pytest
    prunes (it keeps the last three runs'); in /tmp they piled up, hundreds per run of the suite."""
    before = tempfile.tempdir
    tempfile.tempdir = str(tmp_path_factory.getbasetemp())
    yield
    tempfile.tempdir = before
