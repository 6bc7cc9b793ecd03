"""The Faust recovery fix: stream partitions are sought to committed offsets while still paused.

The end-to-end evidence is tests/integration/test_shutdown.py (no input lost across SIGTERM and
restart); this test pins the ordering itself, which that test can only catch some of the time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import IllegalStateError
from faust.tables.recovery import ServiceStopped
from faust.types import TP

from streams.app import Service, create_app
from streams.config import load_settings
from streams.demo_runner import worker_env
from streams.harness import RunningBroker
from streams.recovery import SeekThenResumeRecovery


def _reporting(svc: Service) -> tuple[SeekThenResumeRecovery, list[str]]:
    """`svc`'s recovery, with the reasons it reports a failure for (the worker's `stop_worker`)."""
    recovery = svc.app.tables.recovery
    assert isinstance(recovery, SeekThenResumeRecovery)
    reasons: list[str] = []
    recovery.on_failure = reasons.append
    return recovery, reasons


class RecordingConsumer:
    """Records the order of the calls recovery makes; the assignment has one stream and one changelog."""

    def __init__(self, changelog_topic: str) -> None:
        self.calls: list[Any] = []
        self.paused = {TP("agent-events", 0), TP(changelog_topic, 0)}

    def assignment(self) -> set[TP]:
        return set(self.paused)

    async def perform_seek(self) -> None:
        self.calls.append(("seek", frozenset(self.paused)))

    async def seek_to_committed(self) -> dict[TP, int | None]:
        return {TP("agent-events", 0): None}  # nothing committed yet on the stream partition

    async def earliest_offsets(self, *partitions: TP) -> dict[TP, int]:
        return dict.fromkeys(partitions, 0)

    async def seek(self, partition: TP, offset: int) -> None:
        self.calls.append(("seek_to", (partition, offset)))

    def resume_partitions(self, partitions: set[TP]) -> None:
        self.calls.append(("resume", frozenset(partitions)))
        self.paused -= partitions


async def test_streams_are_sought_before_they_resume() -> None:
    svc = create_app(load_settings())
    recovery = svc.app.tables.recovery
    assert isinstance(recovery, SeekThenResumeRecovery)
    changelog = svc.traces.changelog_topic.get_topic_name()
    consumer = RecordingConsumer(changelog)
    svc.app.consumer = consumer

    await recovery._seek_then_resume_streams()

    stream_tp = TP("agent-events", 0)
    assert [name for name, _ in consumer.calls] == ["seek", "seek_to", "resume"]
    assert stream_tp in consumer.calls[0][1]  # the seek happened while the stream partition was paused
    # No committed offset: sought to its beginning (the app's `earliest`), not left where the fetch was.
    assert consumer.calls[1][1] == (stream_tp, 0)
    assert consumer.calls[2][1] == {stream_tp}  # only stream partitions resume; changelogs stay with recovery


class DroppingConsumer(RecordingConsumer):
    """A fetch returns records of the paused stream partition during the first seek, none later."""

    def __init__(self, changelog_topic: str) -> None:
        super().__init__(changelog_topic)
        self.dropped_partitions: set[TP] = set()
        self.seeks = 0

    async def seek_to_committed(self) -> dict[TP, int | None]:
        self.seeks += 1
        if self.seeks == 1:
            self.dropped_partitions.add(TP("agent-events", 0))
        return {TP("agent-events", 0): 7}


async def test_a_partition_that_lost_fetched_records_during_the_seek_is_sought_again() -> None:
    svc = create_app(load_settings())
    recovery = svc.app.tables.recovery
    consumer = DroppingConsumer(svc.traces.changelog_topic.get_topic_name())
    svc.app.consumer = consumer

    await recovery._seek_then_resume_streams()

    assert [name for name, _ in consumer.calls] == ["seek", "seek", "resume"]
    assert consumer.seeks == 2


def test_the_consistency_check_is_on_unless_the_broker_reports_stale_end_offsets() -> None:
    assert create_app(load_settings()).app.conf.recovery_consistency_check is True
    tansu = RunningBroker("tansu", "127.0.0.1:1")
    kafka = RunningBroker("apache-kafka", "127.0.0.1:1")
    assert worker_env(kafka, "-x", "/tmp", 0).get("RECOVERY_CONSISTENCY_CHECK") is None
    env = worker_env(tansu, "-x", "/tmp", 6066)
    settings = load_settings(**{k.lower(): v for k, v in env.items()})
    assert create_app(settings).app.conf.recovery_consistency_check is False


class RebalancingConsumer(RecordingConsumer):
    """A consumer during whose seek another rebalance begins (Faust counts it on the app)."""

    def __init__(self, changelog_topic: str, app: Any) -> None:
        super().__init__(changelog_topic)
        self.app = app

    async def seek_to_committed(self) -> dict[TP, int | None]:
        self.app.rebalancing_count += 1  # e.g. a worker joined while this one restored
        return await super().seek_to_committed()


async def test_a_rebalance_that_begins_during_the_seek_leaves_the_streams_paused() -> None:
    """The next recovery restores the new assignment's tables before it resumes the streams; this
    one resuming them would let records reach half-restored state."""
    svc = create_app(load_settings())
    recovery = svc.app.tables.recovery
    consumer = RebalancingConsumer(svc.traces.changelog_topic.get_topic_name(), svc.app)
    svc.app.consumer = consumer
    assert await recovery._seek_then_resume_streams() is False
    assert "resume" not in [name for name, _ in consumer.calls]
    assert TP("agent-events", 0) in consumer.paused


class SignalledDuringSeekConsumer(RecordingConsumer):
    """The next assignment arrives while the seek waits on the broker: Faust's `on_rebalance` sets
    `signal_recovery_start`, so the seek's `_wait` raises `RebalanceAgain`."""

    def __init__(self, changelog_topic: str, recovery: SeekThenResumeRecovery) -> None:
        super().__init__(changelog_topic)
        self.recovery = recovery

    async def perform_seek(self) -> None:
        self.recovery.app.rebalancing_count += 1
        self.recovery.signal_recovery_start.set()
        await asyncio.sleep(0.05)  # the broker round trip


class RevokedDuringSeekConsumer(RebalancingConsumer):
    """The stream partition left the assignment before it is sought to its beginning."""

    async def seek(self, partition: TP, offset: int) -> None:
        raise IllegalStateError(f"No current assignment for partition {partition}")


class EmptiedDuringSeekConsumer(RecordingConsumer):
    """The new assignment is empty when the committed offsets are looked up (aiokafka asserts)."""

    def __init__(self, changelog_topic: str, app: Any) -> None:
        super().__init__(changelog_topic)
        self.app = app

    async def seek_to_committed(self) -> dict[TP, int | None]:
        self.app.rebalancing_count += 1
        raise AssertionError("No partitions are currently assigned")


@pytest.mark.parametrize("case", ["signalled", "revoked", "emptied"])
async def test_a_seek_that_fails_because_another_rebalance_began_does_not_stop_the_worker(case: str) -> None:
    """Review (thirtieth round): every exception of the seek but `ServiceStopped` stopped the worker
    (exit 70), also Faust's `RebalanceAgain` and aiokafka's `IllegalStateError`, which Faust's recovery
    loop reads as "another rebalance began" and moves on to its recovery. Workers joining a few
    seconds apart are enough. Now the streams stay paused for that recovery, as when the rebalance
    begins without making the seek fail."""
    svc = create_app(load_settings())
    recovery, reasons = _reporting(svc)
    changelog = svc.traces.changelog_topic.get_topic_name()
    consumer = {
        "signalled": lambda: SignalledDuringSeekConsumer(changelog, recovery),
        "revoked": lambda: RevokedDuringSeekConsumer(changelog, svc.app),
        "emptied": lambda: EmptiedDuringSeekConsumer(changelog, svc.app),
    }[case]()
    svc.app.consumer = consumer
    assert await recovery._seek_then_resume_streams() is False
    assert reasons == []
    assert "resume" not in [name for name, _ in consumer.calls]
    assert TP("agent-events", 0) in consumer.paused


async def test_a_recovery_step_that_times_out_stops_the_worker() -> None:
    """Faust's `_wait` took a timeout for "stopped" and its recovery loop ended for good: streams
    paused, the worker alive. The timeout is reported (the worker wires `stop_worker`: exit 70)."""
    svc = create_app(load_settings())
    recovery, reasons = _reporting(svc)
    with pytest.raises(ServiceStopped):
        await recovery._wait(asyncio.sleep(5), timeout=0.05)
    assert len(reasons) == 1 and "took longer than 0.05 s" in reasons[0]
    await recovery._wait(asyncio.sleep(0), timeout=5)  # in time: nothing reported
    assert len(reasons) == 1


class UnansweredSeekConsumer(RecordingConsumer):
    """The broker never answers the committed-offset lookup."""

    async def seek_to_committed(self) -> dict[TP, int | None]:
        await asyncio.sleep(3600)
        return {}


class AlwaysDroppingConsumer(DroppingConsumer):
    """Every seek loses fetched records of the stream partition."""

    async def seek_to_committed(self) -> dict[TP, int | None]:
        self.dropped_partitions.add(TP("agent-events", 0))
        return {TP("agent-events", 0): 7}


@pytest.mark.parametrize(
    ("consumer_class", "error", "cause"),
    [
        (UnansweredSeekConsumer, TimeoutError, "TimeoutError"),
        (AlwaysDroppingConsumer, RuntimeError, "kept losing fetched records after 10 seeks"),
    ],
)
async def test_a_seek_that_cannot_finish_stops_the_worker(
    consumer_class: type[RecordingConsumer], error: type[Exception], cause: str
) -> None:
    """Only Faust's `_wait` timeouts were reported: the seek's own timeout and the lost-records limit
    crashed the app through Faust's graceful shutdown, with /healthz "ok" while it ran and the
    streams paused. Both are reported now (the worker wires `stop_worker`: exit 70) and still raised."""
    svc = create_app(load_settings())
    svc.app.conf.broker_request_timeout = 0.05
    recovery, reasons = _reporting(svc)
    consumer = consumer_class(svc.traces.changelog_topic.get_topic_name())
    svc.app.consumer = consumer
    with pytest.raises(error):
        await recovery._seek_then_resume_streams()
    assert len(reasons) == 1 and cause in reasons[0], reasons
    assert "resume" not in [name for name, _ in consumer.calls]


class RevokedBeforeCountedConsumer(RecordingConsumer):
    """aiokafka's assignment changed under the seek before Faust's callbacks counted or signalled the
    rebalance: the seek to the partition's beginning raises, nothing else says a rebalance began."""

    async def seek(self, partition: TP, offset: int) -> None:
        raise IllegalStateError(f"No current assignment for partition {partition}")


async def test_a_partition_revoked_mid_seek_does_not_stop_the_worker_before_the_rebalance_is_counted() -> (
    None
):
    """Review (thirtieth round, mutations): every `IllegalStateError` case also counted a rebalance, so
    the check of its type could go unnoticed. The type alone says another rebalance began."""
    svc = create_app(load_settings())
    recovery, reasons = _reporting(svc)
    consumer = RevokedBeforeCountedConsumer(svc.traces.changelog_topic.get_topic_name())
    svc.app.consumer = consumer
    assert await recovery._seek_then_resume_streams() is False
    assert reasons == []
    assert "resume" not in [name for name, _ in consumer.calls]


class SignalledNotCountedConsumer(RecordingConsumer):
    """The next assignment's signal is set during the committed-offset lookup (not through `_wait`);
    the revocation was counted before this recovery read the count."""

    def __init__(self, changelog_topic: str, recovery: SeekThenResumeRecovery) -> None:
        super().__init__(changelog_topic)
        self.recovery = recovery

    async def seek_to_committed(self) -> dict[TP, int | None]:
        self.recovery.signal_recovery_start.set()
        return await super().seek_to_committed()


@pytest.mark.parametrize("when", ["during", "before"])
async def test_a_rebalance_signalled_but_not_counted_leaves_the_streams_paused(when: str) -> None:
    """Review (thirtieth round, mutations): every test that signalled the next recovery also counted a
    rebalance; the signal alone, set during the seek or already before it, must keep the streams
    paused for that recovery (and stay set for Faust's recovery loop)."""
    svc = create_app(load_settings())
    recovery = svc.app.tables.recovery
    assert isinstance(recovery, SeekThenResumeRecovery)
    changelog = svc.traces.changelog_topic.get_topic_name()
    if when == "before":
        recovery.signal_recovery_start.set()
        consumer = RecordingConsumer(changelog)
    else:
        consumer = SignalledNotCountedConsumer(changelog, recovery)
    svc.app.consumer = consumer
    assert await recovery._seek_then_resume_streams() is False
    assert "resume" not in [name for name, _ in consumer.calls]
    assert TP("agent-events", 0) in consumer.paused
    assert recovery.signal_recovery_start.is_set()


class StoppedDuringSeekConsumer(RecordingConsumer):
    """The worker is being stopped while the committed offsets are looked up."""

    async def seek_to_committed(self) -> dict[TP, int | None]:
        raise ServiceStopped()


async def test_a_worker_stopped_during_the_seek_is_not_reported_as_a_failed_recovery() -> None:
    """Review (thirtieth round, mutations): `ServiceStopped` from the seek had no test. Reported, a
    worker stopped mid-recovery (SIGTERM) would exit 70 instead of shutting down cleanly."""
    svc = create_app(load_settings())
    recovery, reasons = _reporting(svc)
    svc.app.consumer = StoppedDuringSeekConsumer(svc.traces.changelog_topic.get_topic_name())
    with pytest.raises(ServiceStopped):
        await recovery._seek_then_resume_streams()
    assert reasons == []


class UnassignedConsumer(RecordingConsumer):
    """A worker with no partition (more workers than partitions)."""

    def assignment(self) -> set[TP]:
        return set()


async def test_a_worker_with_no_partition_finishes_its_recovery() -> None:
    """Review (thirtieth round, mutations): nothing to seek or resume, and the recovery goes on to start
    the flow and announce the worker ready (False would leave it rebalancing for good)."""
    svc = create_app(load_settings())
    recovery = svc.app.tables.recovery
    assert isinstance(recovery, SeekThenResumeRecovery)
    consumer = UnassignedConsumer(svc.traces.changelog_topic.get_topic_name())
    svc.app.consumer = consumer
    assert await recovery._seek_then_resume_streams() is True
    assert consumer.calls == []
