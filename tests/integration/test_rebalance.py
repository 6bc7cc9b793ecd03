"""Workers leaving and joining the group while events flow: every input is still scored.

Faust 0.15.3 silently skipped fetched records of partitions paused for a rebalance, and then
committed over them once a later offset was acknowledged (streams/transport.py). Before the fix this
test lost 200-600 inputs of a partition in about one run in four on the embedded broker, always
around the worker leaving or joining.
"""

from __future__ import annotations

import threading
import time
import urllib.error
from collections.abc import Callable

import orjson
import pytest

from streams.harness import RunningBroker
from streams.kafka_io import Consumed
from tests.integration.fixtures import Deployment, EventFactory, assigned_partitions, deploy, health, poll
from tests.integration.workload import scrape

# Rate- and timing-based: `make test` runs these alone, after the parallel run of the rest.
pytestmark = pytest.mark.serial

TRAFFIC_AROUND_EACH_CHANGE_SECONDS = 4.0  # events keep flowing this long after each membership change
ENOUGH_EVENTS = 1000  # and at least this many in all


def _readyz(port: int) -> str:
    try:
        return str(health(port, "/readyz", timeout=5))
    except (urllib.error.URLError, OSError, ValueError) as error:
        return repr(error)


def _diagnosis(d: Deployment) -> str:
    """Each worker's /readyz answer and the last warnings and errors of its log."""
    parts = []
    for n, (worker, port) in enumerate(zip(d.workers, d.web_ports, strict=True)):
        with open(worker.log_path, errors="replace") as handle:
            notable = [line for line in handle if "WARN" in line or "ERROR" in line or "Traceback" in line]
        alive = "running" if worker.alive() else "exited"
        parts.append(f"worker {n} ({alive}) /readyz: {_readyz(port)}\n" + "".join(notable[-15:]))
    return "\n".join(parts)


def _input_partitions(d: Deployment, port: int) -> set[str] | None:
    """The input partitions the worker at `port` consumes, as its `confidence_consumer_lag` gauge names
    them (streams/lag.py: exactly the assigned input and internal partitions, resampled every 5 s);
    None while it does not answer."""
    try:
        s = scrape(port, timeout=5)
    except (urllib.error.URLError, OSError, AssertionError, ValueError):
        return None
    topic = d.settings.input_topic_names[0]
    series = [dict(labels) for labels in s.series("confidence_consumer_lag")]
    return {labels["partition"] for labels in series if labels.get("topic") == topic}


def _each_owns_a_share(d: Deployment, ports: list[int]) -> bool:
    """Every worker at `ports` is ready with partitions assigned and consumes at least one input
    partition, no input partition is consumed by two of them, and together they consume them all."""
    if not all(assigned_partitions(port) for port in ports):  # None (not ready) or 0
        return False
    owned = [_input_partitions(d, port) for port in ports]
    if not all(owned):  # None or empty
        return False
    shares = [share for share in owned if share]
    every = {str(p) for p in range(d.settings.topic_partitions)}
    return sum(map(len, shares)) == len(every) and set().union(*shares) == every


def _wait_until(condition: str, check: Callable[[], object], d: Deployment, timeout: float = 60.0) -> None:
    if not poll(check, bool, timeout, 0.2):
        raise AssertionError(f"timed out waiting until {condition}\n{_diagnosis(d)}")


class Trickle:
    """Produces small batches of tool events on one thread until stopped; remembers every event id."""

    def __init__(self, d: Deployment) -> None:
        self.d = d
        self.factory = EventFactory(tenant="rebalance")
        self.sent: list[str] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self.stopped.is_set():
            batch = [self.factory.tool(f"trace-{(i + k) % 200}", "find", "x", minutes=0) for k in range(4)]
            i += 4
            self.d.produce(batch)
            self.sent.extend(e["event_id"] for e in batch)
            time.sleep(0.02)

    def __enter__(self) -> Trickle:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=30)


def test_events_flowing_while_workers_leave_and_join_are_all_scored(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=2)
    d.start_worker()
    leaving = d.start_worker()
    port = d.web_ports[0]  # the worker that stays throughout

    def owned() -> int:
        return assigned_partitions(port) or 0

    try:
        _wait_until("both workers own a share", lambda: _each_owns_a_share(d, d.web_ports), d)
        shared = owned()
        with Trickle(d) as trickle:
            time.sleep(TRAFFIC_AROUND_EACH_CHANGE_SECONDS)
            leaving.stop()
            _wait_until("the staying worker took over every partition", lambda: owned() > shared, d)
            _wait_until(
                "the staying worker consumes every input partition", lambda: _each_owns_a_share(d, [port]), d
            )
            alone = owned()
            time.sleep(TRAFFIC_AROUND_EACH_CHANGE_SECONDS)
            joining = d.start_worker()
            _wait_until("the joining worker took a share", lambda: 0 < owned() < alone, d)
            both = [port, d.web_ports[-1]]  # the staying and the joining worker
            _wait_until(
                "the joining worker consumes an input partition", lambda: _each_owns_a_share(d, both), d
            )
            time.sleep(TRAFFIC_AROUND_EACH_CHANGE_SECONDS)
            joining.stop()
            _wait_until("the staying worker took over every partition", lambda: owned() == alone, d)
            time.sleep(TRAFFIC_AROUND_EACH_CHANGE_SECONDS)
            # Enough traffic for the test to mean something, however slow the machine produces it.
            _wait_until(f"{ENOUGH_EVENTS} events were produced", lambda: len(trickle.sent) > ENOUGH_EVENTS, d)
        sent = set(trickle.sent)
        missing = len(sent)

        def all_scored(records: list[Consumed]) -> bool:
            nonlocal missing
            scored = {
                orjson.loads(r.value).get("source_event_id")
                for r in records
                if r.topic == d.settings.scored_topic
            }
            missing = len(sent - scored)
            return missing == 0

        try:
            d.collect(all_scored, timeout=90)
        except TimeoutError:
            raise AssertionError(
                f"{missing} of {len(sent)} inputs were never scored ({kafka.kind} broker)"
            ) from None
    finally:
        d.stop()
