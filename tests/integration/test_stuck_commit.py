"""Through the broker: an offset commit that cannot finish ends in exit 70, not a worker that looks
well while its offsets stand still, nor a graceful stop that never ends (the topics review).

aiokafka retries a commit the broker refuses with a retriable error for ever. The topics review saw it
on the embedded broker with an internal topic deleted under the worker (its partitions' commits
answered UnknownTopicOrPartition every 100 ms for as long as it ran) and with the broker gone at a
SIGTERM. Each test has its own embedded broker: deleting or pausing the suite's would stall the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient

from streams import harness
from streams.batch_runner import EXIT_BATCH_FAILED
from tests.integration.fixtures import EventFactory, deploy, health, poll
from tests.integration.test_reliability import (
    _collect_all,
    _inputs_processed,
    _own_outputs,
    _traffic,
    _wait_exit,
)


def _claims(tenant: str, n: int, start: int = 0) -> list[dict[str, Any]]:
    f = EventFactory(tenant=tenant)
    return [f.claim(f"{tenant}-trace-{i % 3}", f"c{i}", minutes=i) for i in range(start, start + n)]


async def _delete_topic(bootstrap_servers: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers)
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()


def test_a_commit_the_broker_keeps_refusing_stops_the_worker_and_health_says_so() -> None:
    with harness._tansu() as private:
        d = deploy(private, partitions=1, SEND_TIMEOUT_SECONDS="6")
        worker = d.start_worker()
        try:
            first = _claims("stuck", 6)
            d.produce(first)
            _collect_all(d, {e["event_id"] for e in first})
            asyncio.run(_delete_topic(private.bootstrap_servers, d.settings.claims_topic))
            d.produce(_claims("stuck", 6, start=6))  # acks to commit on the deleted topic's partition

            def stopping() -> str:
                with contextlib.suppress(OSError):
                    status, body = health(d.web_ports[0], "/healthz")
                    return f"{status} {body}"
                return ""

            seen = poll(stopping, lambda answer: answer.startswith("503"), 90, 0.2)
            assert seen.startswith("503") and "offset commit" in seen, (seen, d.log_tails())
            assert _wait_exit(worker, 30) == EXIT_BATCH_FAILED, d.log_tails()
            assert "an offset commit has not finished" in d.log_text()
        finally:
            d.stop()


def test_a_graceful_stop_that_cannot_commit_ends_by_its_deadline_and_loses_nothing() -> None:
    """SIGTERM while the broker does not answer (paused): Faust's stop commits the streams' offsets,
    and that commit waits for the broker. Before, the worker waited until SIGKILL (here: the harness
    kills after 30 s); now it exits 70 at SHUTDOWN_TIMEOUT_SECONDS and a successor scores every input."""
    with harness._tansu() as private:
        assert private.process is not None
        d = deploy(private, partitions=1, SHUTDOWN_TIMEOUT_SECONDS="5", SEND_TIMEOUT_SECONDS="300")
        before, during = _traffic("stop-before", 30), _traffic("stop-during", 3_000)
        worker = d.start_worker()
        try:
            d.produce(before)
            _collect_all(d, {e["event_id"] for e in before})
            d.produce(during)
            port = d.web_ports[0]
            poll(lambda: _inputs_processed(port), lambda n: n > len(before), 60, 0.02)
            private.process.send_signal(signal.SIGSTOP)
            try:
                assert worker.process is not None
                worker.process.send_signal(signal.SIGTERM)
                stopped_at = time.monotonic()
                code = _wait_exit(worker, 60)
                took = time.monotonic() - stopped_at
            finally:
                private.process.send_signal(signal.SIGCONT)
            assert code == EXIT_BATCH_FAILED, (code, d.log_tails())
            assert 4 < took < 20, took
            assert "the graceful stop did not finish in 5 s" in d.log_text()
            d.start_worker()
            ids = {e["event_id"] for e in before + during}
            own = _own_outputs(d, _collect_all(d, ids, timeout=180))
        finally:
            d.stop()
    assert ids <= set(own), f"{len(ids - set(own))} inputs without output"
