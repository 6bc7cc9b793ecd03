"""Input alignment (streams/alignment.py) against a fake consumer: who is paused, resumed, left alone."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiokafka.errors import IllegalStateError
from faust.types import TP
from prometheus_client import CollectorRegistry

from streams import metrics
from streams.alignment import InputAlignment, InternalBacklog, partitions_ahead
from streams.config import load_settings
from streams.lag import unread_records

T0 = datetime(2026, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)
INTERNAL = "later-stage"


def test_only_partitions_past_the_slowest_delivering_one_plus_the_lead_are_ahead() -> None:
    times = {0: T0 + 5 * HOUR, 1: T0, 2: T0 + 2 * HOUR, 3: T0 + 9 * HOUR}
    assert partitions_ahead(times, [0, 1, 2, 3], 2 * HOUR) == {0, 3}
    assert partitions_ahead(times, [0, 2, 3], 2 * HOUR) == {0, 3}  # 2 (T0+2h) is the slowest now
    assert partitions_ahead(times, [0, 3], 2 * HOUR) == {3}
    assert partitions_ahead(times, [], 2 * HOUR) == set()  # nobody delivering: nobody held back
    assert partitions_ahead(times, [7], 2 * HOUR) == set()  # a partition of unknown time holds nobody


class FakeConsumer:
    def __init__(self, partitions: list[int], topics: tuple[str, ...] = ("in",)) -> None:
        self.assigned = {TP(topic, p) for topic in topics for p in partitions}
        self.assigned |= {TP(INTERNAL, p) for p in partitions}  # a later stage's partitions
        self.paused: set[TP] = set()
        # Faust's bookkeeping that the backlog gate reads: the last offset delivered, the committed one.
        self._read_offset: dict[TP, int] = {}
        self._committed_offset: dict[TP, int] = {}
        self.highwaters: dict[TP, int] = {}

    def assignment(self) -> set[TP]:
        return self.assigned

    def highwater(self, tp: TP) -> int | None:
        return self.highwaters.get(tp)

    def pause_partitions(self, tps: set[TP]) -> None:
        self.paused |= tps

    def resume_partitions(self, tps: set[TP]) -> None:
        self.paused -= tps


class FakeApp:
    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.rebalancing = False
        self.in_recovery = False


class Setup:
    def __init__(
        self,
        partitions: list[int],
        topics: tuple[str, ...] = ("in",),
        backlog_high: int | None = None,
        max_lead: timedelta | None = 2 * HOUR,
        max_hold_seconds: float = float("inf"),
    ) -> None:
        self.topics = topics
        self.times: dict[TP, datetime] = {}  # each input topic's partition's latest event time
        self.written: dict[tuple[str, int], int] = {}
        self.now = 100.0
        self.registry = CollectorRegistry()
        self.consumer = FakeConsumer(partitions, topics)
        self.app = FakeApp(self.consumer)
        registry = metrics.create(self.registry)
        self.alignment = InputAlignment(
            topics,
            lambda topic, partition: self.times.get(TP(topic, partition)),
            max_lead=max_lead,
            idle_seconds=2.0,
            metrics=registry,
            clock=lambda: self.now,
            backlog=None
            if backlog_high is None
            else InternalBacklog([INTERNAL], backlog_high, registry, self.written),
            max_hold_seconds=max_hold_seconds,
        )

    def unread(self, partition: int, records: int) -> None:
        """The later stage's partition holds `records` records past the last one handed to it."""
        tp = TP(INTERNAL, partition)
        self.consumer._read_offset[tp] = 999
        self.consumer.highwaters[tp] = 1_000 + records

    def batch(self, **times: datetime) -> None:
        """Stage 1 processed records of these partitions of the first input topic (p0=..., p1=...),
        reaching these event times."""
        self.batch_of({TP(self.topics[0], int(name[1:])): moment for name, moment in times.items()})

    def batch_of(self, times: dict[TP, datetime]) -> None:
        """Stage 1 processed records of these input topic partitions, reaching these event times."""
        self.times.update(times)
        self.alignment.after_batch(self.app, times)

    def paused(self) -> set[int]:
        return {tp.partition for tp in self.consumer.paused}

    def gauge(self) -> float | None:
        return self.registry.get_sample_value("confidence_input_partitions_paused")


def test_a_partition_ahead_waits_for_the_slowest_delivering_one_and_then_resumes() -> None:
    s = Setup([0, 1])
    s.batch(p0=T0 + 10 * HOUR, p1=T0)
    assert s.paused() == {0}
    assert s.gauge() == 1
    s.now += 1
    s.batch(p1=T0 + 7 * HOUR)  # within 3 h: still more than 2 h behind
    assert s.paused() == {0}
    s.batch(p1=T0 + 8 * HOUR)  # p0 is exactly 2 h ahead: allowed
    assert s.paused() == set()
    assert s.gauge() == 0


def test_each_input_topics_partition_is_aligned_on_its_own() -> None:
    """Several-input-topics review: alignment keyed by partition number paused the topics of a number
    together and read them by whichever record came last, so topic A's partition 0 read 25 h ahead of
    topic B's backlog on partition 0 was never held back (and the decision followed record order)."""
    a0, b0, a1, b1 = TP("in", 0), TP("in2", 0), TP("in", 1), TP("in2", 1)
    for order in ([b0, a0, a1, b1], [a0, b0, b1, a1]):
        s = Setup([0, 1], topics=("in", "in2"))
        times = {a0: T0 + 25 * HOUR, b0: T0, a1: T0 + 25 * HOUR, b1: T0 + HOUR}
        s.batch_of({tp: times[tp] for tp in order})
        assert s.consumer.paused == {a0, a1}, order  # B is behind on both partitions: A waits
        assert s.gauge() == 2
        s.now += 1
        s.batch_of({b0: T0 + 24 * HOUR, b1: T0 + 24 * HOUR})  # B catches up
        assert s.consumer.paused == set()


def test_a_slowest_partition_that_stops_delivering_holds_nobody_back() -> None:
    s = Setup([0, 1])
    s.batch(p0=T0 + 10 * HOUR, p1=T0)
    assert s.paused() == {0}
    s.now += 2.5  # p1 delivered nothing for longer than idle_seconds: caught up, or stuck
    s.alignment.check(s.app)  # the timer
    assert s.paused() == set()


def test_left_alone_while_faust_rebalances_or_recovers_then_paused_again() -> None:
    s = Setup([0, 1])
    s.batch(p0=T0 + 10 * HOUR, p1=T0)
    s.app.in_recovery = True
    s.consumer.resume_partitions(set(s.consumer.assigned))  # what Faust's recovery does at its end
    s.alignment.check(s.app)
    assert s.paused() == set()
    s.app.in_recovery = False
    s.alignment.check(s.app)
    assert s.paused() == {0}
    s.app.rebalancing = True
    s.consumer.assigned = {TP("in", 0)}  # p1 revoked
    s.alignment.check(s.app)
    assert s.paused() == {0}
    s.app.rebalancing = False
    s.alignment.check(s.app)  # p1 is not ours any more: nobody holds p0 back
    assert s.paused() == set()


def test_a_future_dated_partition_counts_where_reading_is_not_its_newest_event() -> None:
    # The partition's time is its latest event's (ExpiryClock.latest): one far-future event on p0 is
    # followed by ordinary ones and p0 is not held back by it.
    s = Setup([0, 1])
    s.batch(p0=T0 + 100 * HOUR, p1=T0)
    assert s.paused() == {0}
    s.now += 3  # p0 paused, p1 idle
    s.alignment.check(s.app)
    assert s.paused() == set()
    s.batch(p0=T0 + HOUR, p1=T0)
    assert s.paused() == set()


def test_a_failing_consumer_is_logged_not_raised() -> None:
    s = Setup([0, 1])

    def broken() -> set[TP]:
        raise RuntimeError("consumer stopped")

    s.consumer.assignment = broken  # type: ignore[method-assign]
    s.batch(p0=T0 + 10 * HOUR, p1=T0)  # does not raise
    assert s.paused() == set()


def test_unread_records_count_the_internal_partitions_from_the_last_offset_handed_over() -> None:
    consumer = FakeConsumer([0, 1, 2])
    consumer.highwaters = {TP(INTERNAL, 0): 50, TP(INTERNAL, 1): 80, TP(INTERNAL, 2): 10, TP("in", 0): 900}
    consumer._read_offset = {TP(INTERNAL, 0): 39}  # records 40-49 are not handed over yet
    consumer._committed_offset = {TP(INTERNAL, 1): 60}  # nothing handed over since the commit
    # Partition 2: neither known, so 0; the input topic is not counted; a read past a lagging end is 0.
    assert unread_records(consumer, [INTERNAL], {}) == 10 + 20
    consumer._read_offset[TP(INTERNAL, 2)] = 30
    assert unread_records(consumer, [INTERNAL], {}) == 30
    # What this worker wrote itself since the last fetch counts, a stale or lower one does not.
    written = {(INTERNAL, 0): 75, (INTERNAL, 1): 70, ("in", 0): 5_000}
    assert unread_records(consumer, [INTERNAL], written) == 35 + 20


def test_all_input_is_held_while_the_later_stages_lag_and_flows_once_half_is_left() -> None:
    s = Setup([0, 1], backlog_high=100)
    s.unread(0, 60)
    s.unread(1, 40)
    s.batch(p0=T0, p1=T0)
    assert s.paused() == set() and not s.alignment.holding  # exactly the bound: not past it
    s.unread(1, 41)
    s.batch(p0=T0, p1=T0)
    assert s.paused() == {0, 1} and s.alignment.holding
    assert s.gauge() == 2
    assert s.registry.get_sample_value("confidence_input_holds_total") == 1
    assert s.registry.get_sample_value("confidence_internal_backlog_records") == 101
    s.unread(0, 10)  # 51 left: still held (hysteresis)
    s.alignment.check(s.app)
    assert s.paused() == {0, 1}
    s.unread(0, 9)  # 50: half the bound
    s.alignment.check(s.app)
    assert s.paused() == set() and not s.alignment.holding
    assert s.gauge() == 0


def test_while_held_alignment_still_pauses_only_the_partition_ahead_afterwards() -> None:
    s = Setup([0, 1], backlog_high=100)
    s.batch(p0=T0 + 10 * HOUR, p1=T0)
    assert s.paused() == {0}
    s.unread(0, 500)
    s.now += 0.5
    s.alignment.check(s.app)
    assert s.paused() == {0, 1}
    s.now += 30  # held far longer than idle_seconds: p1 delivered nothing, but could not
    s.unread(0, 0)
    s.alignment.check(s.app)
    assert s.paused() == {0}  # p1 still counts as delivering: p0 waits for it, as before the hold
    s.now += 2.5  # now p1 really delivered nothing for longer than idle_seconds
    s.alignment.check(s.app)
    assert s.paused() == set()


def test_the_backlog_gate_works_with_alignment_off() -> None:
    s = Setup([0, 1], backlog_high=10, max_lead=None)
    s.batch(p0=T0 + 10 * HOUR, p1=T0)
    assert s.paused() == set()  # no alignment
    s.unread(1, 11)
    s.batch(p0=T0 + 10 * HOUR, p1=T0)
    assert s.paused() == {0, 1}


def test_a_partition_whose_event_time_stands_still_holds_nobody_back() -> None:
    """Records that do not move a partition's time on (dead letters, a producer whose clock is behind)
    counted as delivering: the partition ahead stayed paused for as long as they came."""
    s = Setup([0, 1])
    s.batch(p0=T0 + 10 * HOUR, p1=T0)
    assert s.paused() == {0}
    for _ in range(5):  # p1 gets a batch every second, all dead-lettered: its time stays
        s.now += 1
        s.alignment.after_batch(s.app, [TP("in", 1)])
    assert s.paused() == set()
    s.now += 1
    s.batch(p1=T0 - 5 * HOUR)  # an event from the past lowers its time but is no progress either
    assert s.paused() == set()
    s.batch(p1=T0 + HOUR)  # moving on again: p0 waits for it again
    assert s.paused() == {0}


def test_no_partition_is_held_back_longer_than_the_max_hold_in_a_row() -> None:
    """A lagging partition catching up slowly held the one ahead back while its records aged in the
    broker: past the input topic's retention they would be deleted unread."""
    s = Setup([0, 1], max_hold_seconds=60)
    s.batch(p0=T0 + 10 * HOUR, p1=T0)
    for second in range(1, 60):  # p1 moves on a minute of event time every second
        s.now += 1
        s.batch(p1=T0 + second * timedelta(minutes=1))
    assert s.paused() == {0}  # 59 s
    s.now += 1
    s.batch(p1=T0 + 60 * timedelta(minutes=1))
    assert s.paused() == set()  # 60 s: released, though still ahead
    s.now += 1
    s.batch(p1=T0 + 61 * timedelta(minutes=1))
    assert s.paused() == set()  # and left alone while it stays ahead
    s.batch(p1=T0 + 8 * HOUR)  # caught up
    assert s.paused() == set()
    s.now += 1
    s.batch(p0=T0 + 20 * HOUR, p1=T0 + 9 * HOUR)  # ahead again: held back again
    assert s.paused() == {0}


def test_the_max_hold_is_at_most_half_the_input_retention() -> None:
    assert load_settings().alignment_max_hold_seconds == 600
    assert load_settings(input_retention_ms=300_000).alignment_max_hold_seconds == 150


def test_a_partition_assigned_here_again_counts_as_delivering_from_where_it_resumes() -> None:
    """It may come back at an older offset (another worker had it and committed less): its time then
    moves on below the highest it reached here before, and that is progress all the same."""
    s = Setup([0, 1])
    s.batch(p0=T0 + 5 * HOUR, p1=T0 + 5 * HOUR)
    moved = {TP("in", 1), TP(INTERNAL, 1)}
    s.consumer.assigned -= moved
    s.now += 5  # past idle_seconds: what p1 delivered before no longer counts
    s.alignment.check(s.app)
    s.consumer.assigned |= moved
    s.now += 1
    s.batch(p1=T0 + HOUR)
    s.batch(p1=T0 + 2 * HOUR)
    assert s.paused() == {0}  # p0 is 3 h ahead of p1, which is delivering again


def test_a_partition_delivering_exactly_idle_seconds_ago_still_holds_the_others_back() -> None:
    """Review (thirtieth round, mutations): idle means no progress for longer than `idle_seconds`; the
    boundary itself had no test."""
    s = Setup([0, 1])
    s.batch(p0=T0 + 10 * HOUR, p1=T0)
    s.now += 2.0  # exactly idle_seconds since p1 moved on
    s.alignment.check(s.app)
    assert s.paused() == {0}
    s.now += 0.001
    s.alignment.check(s.app)
    assert s.paused() == set()


class AiokafkaLikeConsumer(FakeConsumer):
    """Resuming a partition no longer assigned raises, as aiokafka's subscription does."""

    def resume_partitions(self, tps: set[TP]) -> None:
        if tps - self.assigned:
            raise IllegalStateError(f"No current assignment for partition {sorted(tps - self.assigned)}")
        super().resume_partitions(tps)


def test_a_paused_partition_revoked_meanwhile_is_not_resumed_and_alignment_goes_on() -> None:
    """Review (thirtieth round, mutations): no test revoked a partition alignment had paused. Resuming
    it raised on every check, so alignment stopped pausing and resuming anything at all."""
    s = Setup([0, 1, 2])
    s.consumer = AiokafkaLikeConsumer([0, 1, 2])
    s.app.consumer = s.consumer
    s.batch(p0=T0 + 10 * HOUR, p1=T0, p2=T0)
    assert s.paused() == {0}
    s.consumer.assigned -= {TP("in", 0), TP(INTERNAL, 0)}  # another worker has it now
    s.consumer.paused -= {TP("in", 0)}
    s.batch(p1=T0 + 10 * HOUR, p2=T0)
    assert s.paused() == {1}  # alignment still decides
    s.batch(p2=T0 + 9 * HOUR)
    assert s.paused() == set()


def test_the_paused_partitions_are_logged_in_partition_order(caplog: pytest.LogCaptureFixture) -> None:
    """The log line listed them sorted as strings, in[10] before in[2]."""
    s = Setup(list(range(11)))
    with caplog.at_level(logging.INFO, logger="streams.alignment"):
        s.batch_of({TP("in", p): T0 + 10 * HOUR if p in (2, 10) else T0 for p in range(11)})
    assert s.paused() == {2, 10}
    assert "partitions paused now: ['in[2]', 'in[10]']" in caplog.text
