"""Mutation review (thirty-second round): what `test_alignment.py` left open in streams/alignment.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from faust.types import TP
from prometheus_client import CollectorRegistry

from streams import metrics
from streams.alignment import InputAlignment, attach_input_alignment
from streams.config import load_settings
from tests.unit.test_alignment import HOUR, T0, Setup


def _attach(lead: float, high: int) -> InputAlignment | None:
    timers: list[Any] = []

    def timer(**_: Any) -> Any:
        def register(fn: Any) -> Any:
            timers.append(fn)
            return fn

        return register

    svc = SimpleNamespace(
        settings=load_settings(input_alignment_max_lead_hours=lead, internal_backlog_max_records=high),
        trace_stage=SimpleNamespace(input_latest=lambda topic, partition: None),
        metrics=metrics.create(CollectorRegistry()),
        internal_ends={},
        app=SimpleNamespace(timer=timer),
    )
    return attach_input_alignment(svc)  # type: ignore[arg-type]


def test_alignment_and_the_backlog_gate_are_turned_off_each_on_its_own() -> None:
    """Mutation `lead <= 0 and high <= 0` -> `or`: turning one off turned both off."""
    assert _attach(0, 0) is None
    only_backlog = _attach(0, 1000)
    assert only_backlog is not None and only_backlog.backlog is not None
    # Mutation `if lead > 0` -> `if lead >= 0`: a lead of 0 is "off", not "pause everything ahead".
    assert only_backlog.max_lead is None
    only_alignment = _attach(2, 0)
    assert only_alignment is not None and only_alignment.backlog is None
    assert only_alignment.max_lead == 2 * HOUR


def test_a_long_hold_checked_many_times_is_one_hold_and_counts_as_nobodys_idle_time() -> None:
    """Mutation `if holding and self._held_since is None` -> `if holding`: each check while held
    restarted the hold, so it was counted once per check and only its last interval was given back to
    the partitions' idle time (p1 counted idle after the hold, and p0 ran ahead unaligned)."""
    s = Setup([0, 1], backlog_high=100)
    s.batch(p0=T0 + 10 * HOUR, p1=T0)
    assert s.paused() == {0}
    s.unread(0, 500)
    for _ in range(30):  # the timer checks every half second; here every second, for 30 s
        s.now += 1
        s.alignment.check(s.app)
        assert s.paused() == {0, 1}
    assert s.registry.get_sample_value("confidence_input_holds_total") == 1
    s.now += 0.5
    s.unread(0, 0)
    s.alignment.check(s.app)
    assert s.paused() == {0}  # p1 could not deliver while held: it still holds p0 back


def test_a_partition_resumed_once_is_not_resumed_again() -> None:
    """Mutation `self._paused = wanted` -> `wanted | self._paused`: resumed partitions stayed
    "paused by alignment", and every later check resumed them again, also after something else paused them."""
    s = Setup([0, 1])
    s.batch(p0=T0 + 10 * HOUR, p1=T0)
    assert s.paused() == {0}
    s.now += 1
    s.batch(p1=T0 + 9 * HOUR)
    assert s.paused() == set()
    s.consumer.pause_partitions({TP("in", 0)})  # paused by someone else (not alignment)
    s.alignment.check(s.app)
    assert s.paused() == {0}


def test_a_partition_that_delivered_during_a_hold_is_given_back_only_the_rest_of_it() -> None:
    """The mutation review: when the backlog hold ended, every partition's last delivery moved forward
    by the whole hold, also for p1, which delivered (a batch already in stage 1's stream) 1.5 s before
    the end of a 30 s hold. p1 then counted as delivering for 30 s more, and p0 stayed paused behind it
    until then; p1 is idle 2 s (`idle_seconds`) after the hold, as after any delivery."""
    s = Setup([0, 1], backlog_high=100)
    s.batch(p0=T0 + 10 * HOUR, p1=T0)
    assert s.paused() == {0}
    s.unread(0, 500)
    for _ in range(28):
        s.now += 1
        s.alignment.check(s.app)
    s.now += 0.5
    s.batch(p1=T0 + HOUR / 60)  # delivered while held (a later event time: a delivery)
    s.now += 1.5
    s.unread(0, 0)
    s.alignment.check(s.app)
    assert s.paused() == {0}  # p1 delivered 1.5 s ago: it still holds p0 back
    s.now += 1.0
    s.alignment.check(s.app)
    assert s.paused() == {0}  # 2.5 s since its delivery, 1 s of it after the hold
    s.now += 1.5
    s.alignment.check(s.app)
    assert s.paused() == set()  # p1 idle for 2.5 s after the hold: p0 goes on
