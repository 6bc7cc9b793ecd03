"""The consumer-lag monitor against a fake consumer: definition, topics, rebalance, failures."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest
from faust.types import TP
from prometheus_client import CollectorRegistry

from streams import metrics
from streams.lag import LagMonitor, partition_lag

IN, RESP, CHANGELOG = "agent-events", "cs-responses-by-agent", "cs-traces-changelog"


class FakeConsumer:
    """Assignment, end offsets, Faust's committed offsets and positions, as plain dicts."""

    def __init__(
        self,
        ends: dict[TP, int],
        committed: dict[TP, int],
        positions: dict[TP, int] | None = None,
        fail: Exception | None = None,
    ) -> None:
        self.ends = ends
        self._committed_offset = committed
        self.positions = positions or {}
        self.fail = fail
        self.asked_ends: list[TP] = []

    def assignment(self) -> set[TP]:
        return set(self.ends)

    async def highwaters(self, *partitions: TP) -> Mapping[TP, int]:
        if self.fail is not None:
            raise self.fail
        self.asked_ends = list(partitions)
        return {tp: self.ends[tp] for tp in partitions}

    async def position(self, tp: TP) -> int | None:
        return self.positions.get(tp)


def _monitor() -> tuple[LagMonitor, CollectorRegistry]:
    registry = CollectorRegistry()
    return LagMonitor(metrics.create(registry), (IN, RESP)), registry


def _gauge(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {
        (s.labels["topic"], s.labels["partition"]): s.value
        for family in registry.collect()
        if family.name == "confidence_consumer_lag"
        for s in family.samples
    }


@pytest.mark.parametrize(
    ("end", "committed", "position", "expected"),
    [
        (100, 40, None, 60),  # end - committed (committed = next offset to read)
        (100, 40, 90, 60),  # the committed offset wins over a prefetching position
        (100, None, 75, 25),  # nothing committed yet: the position stands in
        (100, 100, None, 0),
        (97, 100, None, 0),  # Tansu's end can trail the real end: never negative
        (None, 40, None, None),  # end unknown
        (100, None, None, None),  # start unknown
    ],
)
def test_partition_lag(
    end: int | None, committed: int | None, position: int | None, expected: int | None
) -> None:
    assert partition_lag(end, committed, position) == expected


async def test_sample_reads_only_stage_topics_and_exports_each_partition() -> None:
    monitor, registry = _monitor()
    consumer = FakeConsumer(
        ends={TP(IN, 0): 50, TP(IN, 1): 10, TP(RESP, 0): 7, TP(CHANGELOG, 0): 999},
        committed={TP(IN, 0): 20, TP(RESP, 0): 7},
        positions={TP(IN, 1): 4},
    )
    await monitor.tick(consumer)
    assert TP(CHANGELOG, 0) not in consumer.asked_ends  # changelogs are read only during recovery
    assert _gauge(registry) == {(IN, "0"): 30.0, (IN, "1"): 6.0, (RESP, "0"): 0.0}


async def test_revoked_partitions_leave_the_gauge() -> None:
    monitor, registry = _monitor()
    await monitor.tick(
        FakeConsumer(ends={TP(IN, 0): 5, TP(IN, 1): 5}, committed={TP(IN, 0): 1, TP(IN, 1): 2})
    )
    assert _gauge(registry) == {(IN, "0"): 4.0, (IN, "1"): 3.0}
    # After a rebalance this worker owns partition 1 only; another worker reports partition 0.
    await monitor.tick(FakeConsumer(ends={TP(IN, 1): 9}, committed={TP(IN, 1): 9}))
    assert _gauge(registry) == {(IN, "1"): 0.0}


async def test_a_failed_sample_keeps_the_last_values_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    monitor, registry = _monitor()
    await monitor.tick(FakeConsumer(ends={TP(IN, 0): 5}, committed={TP(IN, 0): 1}))
    broken = FakeConsumer(ends={TP(IN, 0): 5}, committed={}, fail=ConnectionError("broker gone"))
    with caplog.at_level(logging.WARNING, logger="streams.lag"):
        await monitor.tick(broken)
        await monitor.tick(broken)
    assert [r.getMessage() for r in caplog.records] == [
        "consumer lag not sampled: ConnectionError('broker gone')"
    ]
    assert _gauge(registry) == {(IN, "0"): 4.0}


async def test_a_revoked_partition_leaves_the_gauge_also_when_the_sample_fails() -> None:
    """Metrics review: a failed sample kept every last value, also of partitions another worker owns
    now, so `sum by (topic)` counted them twice until a sample succeeded (often slow right then)."""
    monitor, registry = _monitor()
    await monitor.tick(FakeConsumer({TP(IN, 0): 10, TP(IN, 1): 20}, {TP(IN, 0): 5, TP(IN, 1): 5}))
    assert _gauge(registry) == {(IN, "0"): 5, (IN, "1"): 15}
    await monitor.tick(FakeConsumer({TP(IN, 0): 10}, {TP(IN, 0): 5}, fail=TimeoutError()))
    assert _gauge(registry) == {(IN, "0"): 5}  # partition 1 moved away; partition 0 keeps its value


class NotStarted(FakeConsumer):
    """Faust's consumer before its thread made the aiokafka consumer: even `assignment()` raises."""

    def assignment(self) -> set[TP]:
        raise RuntimeError("Consumer thread not yet started")


async def test_a_sample_that_cannot_read_the_assignment_either_never_raises() -> None:
    """The diff review: the pruning after a failed sample read the assignment again, outside the
    error net, and a timer that raises stops the worker."""
    monitor, registry = _monitor()
    await monitor.tick(NotStarted({}, {}))
    assert _gauge(registry) == {}


class SlowPosition(FakeConsumer):
    """One partition's position cannot be read (it times out, as during a restore)."""

    async def position(self, tp: TP) -> int | None:
        if tp == TP(IN, 1):
            raise TimeoutError
        return await super().position(tp)


async def test_a_partition_whose_position_cannot_be_read_freezes_only_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One slow position failed the whole sample: every partition's lag stayed where it was."""
    monitor, registry = _monitor()
    await monitor.tick(
        FakeConsumer(ends={TP(IN, 0): 5, TP(IN, 1): 3}, committed={TP(IN, 0): 5, TP(IN, 1): 3})
    )
    assert _gauge(registry) == {(IN, "0"): 0.0, (IN, "1"): 0.0}
    # Partition 0 falls 5,000 behind; partition 1's committed offset is gone and its position is slow.
    slow = SlowPosition(ends={TP(IN, 0): 5_005, TP(IN, 1): 9}, committed={TP(IN, 0): 5})
    with caplog.at_level(logging.WARNING, logger="streams.lag"):
        await monitor.tick(slow)
    assert _gauge(registry) == {(IN, "0"): 5_000.0, (IN, "1"): 0.0}  # 1 keeps its last value
    assert [r.getMessage() for r in caplog.records] == [
        "consumer lag not sampled: position of agent-events[1] not read: TimeoutError()"
    ]


async def test_a_committed_offset_needs_no_position(caplog: pytest.LogCaptureFixture) -> None:
    """Mutant: the position read even when Faust knows the committed offset. The committed offset is
    the lag's start (README: as Kafka tools count it); a position that cannot be read then (a partition
    being restored) must neither freeze that partition's lag nor log a warning."""
    monitor, registry = _monitor()
    slow = SlowPosition(ends={TP(IN, 0): 5, TP(IN, 1): 30}, committed={TP(IN, 0): 5, TP(IN, 1): 10})
    with caplog.at_level(logging.WARNING, logger="streams.lag"):
        await monitor.tick(slow)
    assert _gauge(registry) == {(IN, "0"): 0.0, (IN, "1"): 20.0}
    assert caplog.records == []


class UnknownEnd(FakeConsumer):
    """The broker answers no end offset for partition 1 (ListOffsets left it out)."""

    async def highwaters(self, *partitions: TP) -> Mapping[TP, int]:
        ends = await super().highwaters(*partitions)
        return {tp: end for tp, end in ends.items() if tp != TP(IN, 1)}


async def test_a_partition_whose_end_is_unknown_is_left_out_not_reported_caught_up() -> None:
    """Mutant: a partition of unknown end exported as lag 0. A lag of 0 says "caught up"; not knowing
    must not look like that (an alert on the lag would never fire)."""
    monitor, registry = _monitor()
    await monitor.tick(
        UnknownEnd(ends={TP(IN, 0): 9, TP(IN, 1): 500}, committed={TP(IN, 0): 4, TP(IN, 1): 0})
    )
    assert _gauge(registry) == {(IN, "0"): 5.0}


async def test_a_partition_kept_through_a_failed_read_still_leaves_the_gauge_once_revoked() -> None:
    """Mutant: the partitions kept after a failed position read dropped from what the monitor exported.
    Their series keeps its last value meanwhile, so once revoked it must still be removed: otherwise
    it stays for ever and `sum by (topic)` counts it with its new owner's."""
    monitor, registry = _monitor()
    await monitor.tick(FakeConsumer({TP(IN, 0): 5, TP(IN, 1): 3}, {TP(IN, 0): 5, TP(IN, 1): 1}))
    await monitor.tick(SlowPosition({TP(IN, 0): 6, TP(IN, 1): 9}, {TP(IN, 0): 5}))
    assert _gauge(registry) == {(IN, "0"): 1.0, (IN, "1"): 2.0}  # partition 1 keeps its last value
    await monitor.tick(FakeConsumer({TP(IN, 0): 7}, {TP(IN, 0): 5}))  # partition 1 moved away
    assert _gauge(registry) == {(IN, "0"): 2.0}


async def test_a_partition_that_stays_unreadable_is_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Mutant: the last warning forgotten after every sample, also one that left partitions unread. The
    timer runs every LAG_INTERVAL_SECONDS: a partition whose position stays unreadable (a long restore)
    would log the same warning every 5 s; once, and again only after it was read."""
    monitor, _ = _monitor()
    slow = SlowPosition({TP(IN, 0): 5, TP(IN, 1): 9}, {TP(IN, 0): 5})
    readable = FakeConsumer({TP(IN, 0): 5, TP(IN, 1): 9}, {TP(IN, 0): 5, TP(IN, 1): 9})
    with caplog.at_level(logging.WARNING, logger="streams.lag"):
        for consumer in (slow, slow, slow, readable, slow):
            await monitor.tick(consumer)
    assert [r.getMessage() for r in caplog.records] == [
        "consumer lag not sampled: position of agent-events[1] not read: TimeoutError()"
    ] * 2


async def test_a_partition_dropped_after_a_failed_sample_is_not_removed_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Mutant: `keep_only_assigned` removes the revoked partitions' series but still counts them as
    exported. prometheus-client before 0.22 (pyproject allows 0.20) raises KeyError when a series that
    is not there is removed: the next sample would fail at that removal, and every one after it, with
    the gauge frozen. Checked with that `remove`."""
    monitor, registry = _monitor()
    gauge = monitor.metrics.consumer_lag
    lenient = gauge.remove

    def strict(*labels: str) -> None:
        if tuple(labels) not in gauge._metrics:
            raise KeyError(labels)
        lenient(*labels)

    monkeypatch.setattr(gauge, "remove", strict)
    await monitor.tick(FakeConsumer({TP(IN, 0): 10, TP(IN, 1): 20}, {TP(IN, 0): 5, TP(IN, 1): 5}))
    with caplog.at_level(logging.WARNING, logger="streams.lag"):
        await monitor.tick(FakeConsumer({TP(IN, 0): 10}, {TP(IN, 0): 5}, fail=TimeoutError()))
        await monitor.tick(FakeConsumer({TP(IN, 0): 30}, {TP(IN, 0): 5}))
    assert _gauge(registry) == {(IN, "0"): 25.0}
    assert [r.getMessage() for r in caplog.records] == ["consumer lag not sampled: TimeoutError()"]
