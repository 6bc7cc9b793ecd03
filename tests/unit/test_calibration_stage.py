"""Stage 4 without Kafka: each item of a message is applied whole or dead-lettered alone, a subject's entry stays bounded, a
mistyped far-future outcome does not pin its group, and a group survives a bucket it never counted.
(Through the broker: tests/integration/test_calibration.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from streams import metrics
from streams.config import load_settings, scoring_configs
from streams.events import OutcomeEvent
from streams.scoring import calibration
from streams.stages import CalibrationStage, InputRecord
from streams.stages.calibration import (
    CalibrationWrite,
    Dimension,
    Table,
    _entry_size_bound,
    group_key,
    hour_key,
    subject_key,
    upstream,
)
from streams.stages.common import ExpiryClock, tenant_partition
from streams.state import (
    CalibrationItem,
    CalibrationMessage,
    CalibrationSubject,
    GroupCalibration,
    HourBucket,
    SubjectEntry,
)
from tests.unit.stage_records import dead

# Recent: the stage bounds event times at the wall clock plus EVENT_TIME_MAX_AHEAD_HOURS.
START = (datetime.now(UTC) - timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
TENANT = "t"


class _Worker:
    """A calibration stage and its three tables (dicts of models), fed one message per batch."""

    def __init__(self, **settings: Any) -> None:
        self.settings = load_settings(**settings)
        self.registry = CollectorRegistry()
        self.stage = CalibrationStage(
            self.settings,
            scoring_configs(self.settings),
            metrics.create(self.registry, self.settings.metrics_label_cap),
        )
        self.tables: dict[bytes, BaseModel] = {}
        self.offset = 0

    def load(self, _table: Table, key: bytes) -> BaseModel | None:
        return self.tables.get(key)

    def feed(
        self, *items: CalibrationItem, source: int = upstream("trace", 0)
    ) -> tuple[list[Any], dict[bytes, CalibrationWrite]]:
        message = CalibrationMessage(tenant_id=TENANT, items=list(items), source=source)
        partition = tenant_partition(TENANT, self.settings.topic_partitions)  # as stage 1-3 send it
        record = InputRecord("calibration", partition, self.offset, 1.0, message.model_dump_json().encode())
        self.offset += 1
        records, writes = self.stage.process([record], self.load)
        for key, write in writes.items():
            if write.value is None:
                self.tables.pop(key, None)
            else:
                self.tables[key] = write.value
        return records, writes

    def outcomes(self, status: str) -> float:
        return self.registry.get_sample_value("confidence_outcomes_total", {"status": status}) or 0.0

    def group(self, model: str = "m", kind: str = "response") -> GroupCalibration:
        return self.group_of("model", model, kind)

    def group_of(self, dimension: Dimension, value: str, kind: str = "response") -> GroupCalibration:
        group = self.tables[group_key(TENANT, dimension, value, kind)]
        assert isinstance(group, GroupCalibration)
        return group


def _score(
    subject_id: str, minutes: float, score: float = 0.8, model: str = "m", agent_type: str = "a"
) -> CalibrationItem:
    subject = CalibrationSubject(
        subject_type="response",
        subject_id=subject_id,
        event_time=START + timedelta(minutes=minutes),
        scores={"response": score},
        action="allow",
        model=model,
        agent_type=agent_type,
    )
    return CalibrationItem(subject=subject, received_at=1.0)


def _outcome(event_id: str, subject_id: str, minutes: float, correct: bool = True) -> CalibrationItem:
    outcome = OutcomeEvent(
        event_id=event_id,
        timestamp=(START + timedelta(minutes=minutes)).isoformat(),  # type: ignore[arg-type]
        tenant_id=TENANT,
        trace_id="trace",
        schema_version=1,
        event_type="OUTCOME",
        subject_event_id=subject_id,
        correct=correct,
        source="human",
    )
    return CalibrationItem(outcome=outcome, received_at=1.0)


def test_an_item_that_fails_half_way_is_dead_lettered_alone_and_leaves_no_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = _Worker()
    worker.feed(_score("r1", 0), _score("r2", 0), _score("r3", 0))
    # The second outcome fails in the scorer half-way (after its first group): its counts must not
    # stay, and the first and third outcomes of the message count (the whole message was lost before).
    real_add = calibration.add
    calls: Iterator[int] = iter(range(1_000))

    def add_failing_the_second_outcome(*args: Any) -> dict[int, calibration.BinStats]:
        # Each outcome adds to two groups, bucket and totals: 4 calls; the second fails at its third.
        if next(calls) == 6:
            raise RuntimeError("scorer bug")
        return real_add(*args)

    monkeypatch.setattr(calibration, "add", add_failing_the_second_outcome)
    records, _ = worker.feed(_outcome("o1", "r1", 1), _outcome("o2", "r2", 1), _outcome("o3", "r3", 1))
    assert worker.outcomes("matched") == 2
    assert calibration.total(worker.group().bins) == 2
    assert calibration.total(worker.group_of("agent_type", "a").bins) == 2  # not 3: no half count left
    (letter,) = records
    assert letter.topic == worker.settings.dlq_topic
    assert dict(letter.headers)["__connect.errors.exception.class.name"] == b"RuntimeError"
    dead = CalibrationMessage.model_validate_json(letter.value)  # the failed item alone, replayable
    assert [item.outcome.event_id for item in dead.items if item.outcome] == ["o2"]
    assert (dead.tenant_id, dead.source) == (TENANT, upstream("trace", 0))
    entry = worker.tables[subject_key(TENANT, "response", "r2")]
    assert isinstance(entry, SubjectEntry) and entry.applied == ()
    monkeypatch.setattr(calibration, "add", real_add)
    worker.feed(dead.items[0])  # the dead letter's item again, scorer fixed
    assert worker.outcomes("matched") == 3
    assert calibration.total(worker.group().bins) == 3
    assert calibration.total(worker.group_of("agent_type", "a").bins) == 3


def test_an_item_that_fails_after_publishing_a_group_leaves_no_gauge_series(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ECE and Brier series of the group an item counted before failing were created at once (only
    their values waited for the batch): a dead-lettered item left a series at 0 that nothing removed."""
    worker = _Worker()
    worker.feed(_score("r1", 0, model="fresh"))
    real_add = calibration.add
    calls: Iterator[int] = iter(range(1_000))

    def add_failing_at_the_agent_type_group(*args: Any) -> dict[int, calibration.BinStats]:
        if next(calls) == 2:  # the model group's bucket and totals went through, then the agent type's
            raise RuntimeError("scorer bug")
        return real_add(*args)

    monkeypatch.setattr(calibration, "add", add_failing_at_the_agent_type_group)
    records, _ = worker.feed(_outcome("o1", "r1", 1))
    assert [r.topic for r in records] == [worker.settings.dlq_topic]
    series = [
        sample.labels
        for family in worker.registry.collect()
        if family.name in ("confidence_calibration_ece", "confidence_calibration_brier")
        for sample in family.samples
    ]
    assert series == []


def test_a_message_that_does_not_decode_is_dead_lettered_whole() -> None:
    worker = _Worker()
    record = InputRecord("calibration", 0, 0, 1.0, b'{"tenant_id": "t", "items": "not a list"}')
    records, writes = worker.stage.process([record], worker.load)
    assert writes == {}
    (letter,) = records
    assert orjson.loads(letter.value) == orjson.loads(record.value or b"")
    assert dict(letter.headers)["__connect.errors.exception.class.name"] == b"ValidationError"


def test_a_subject_takes_at_most_its_share_of_outcomes() -> None:
    worker = _Worker(calibration_max_outcomes_per_subject=5)
    worker.feed(*(_outcome(f"early-{i}", "r1", 1) for i in range(8)))  # before its score
    assert worker.outcomes("waiting") == 5
    assert worker.outcomes("over_limit") == 3
    worker.feed(_score("r1", 0))
    assert worker.outcomes("matched") == 5
    worker.feed(_outcome("early-0", "r1", 1), _outcome("late", "r1", 2))  # a re-delivery, one more
    assert worker.outcomes("duplicate") == 1
    assert worker.outcomes("over_limit") == 4
    entry = worker.tables[subject_key(TENANT, "response", "r1")]
    assert len(entry.applied) == 5  # type: ignore[attr-defined]
    assert calibration.total(worker.group().bins) == 5


def test_a_far_future_outcome_does_not_pin_its_group() -> None:
    worker = _Worker()
    worker.feed(_score("r1", 0), _score("r2", 0), _score("r3", 0))
    typo = START.replace(year=2062)
    minutes = (typo - START).total_seconds() / 60
    worker.feed(_outcome("o1", "r1", 1), _outcome("typo", "r2", minutes), _outcome("o3", "r3", 2))
    group = worker.group()
    assert group.newest <= datetime.now(UTC) + timedelta(hours=1)  # the clock's bound
    assert calibration.total(group.bins) == 3  # none of the honest ones fell out of the window


def test_a_bucket_the_group_never_counted_does_not_fail_the_group() -> None:
    """The group and its hour buckets are separate changelog records: a worker stopped between them
    can leave a bucket whose counts the restored group lacks. Its hour leaving the window must not
    raise (which dead-lettered every later outcome of the group)."""
    worker = _Worker(calibration_window_hours=1)
    worker.feed(_score("r1", 0), _score("r2", 0))
    worker.feed(_outcome("o1", "r1", 1))
    group = worker.group()
    first_hour = hour_key(group, group.hours[0])
    counted = worker.tables[first_hour]
    assert isinstance(counted, HourBucket)
    # The bucket also holds an outcome (bin 30) the restored group never counted.
    worker.tables[first_hour] = HourBucket(bins=calibration.add(counted.bins, 0.3, 0.0))
    records, _ = worker.feed(_outcome("o2", "r2", 125))  # two hours later: the first hour leaves
    assert all(r.topic != worker.settings.dlq_topic for r in records)
    assert calibration.total(worker.group().bins) == 1


def test_the_window_is_at_least_one_hour() -> None:
    with pytest.raises(ValueError, match="calibration_window_hours"):
        load_settings(calibration_window_hours=0.5)


def test_an_upstream_that_went_quiet_no_longer_holds_expiry_back() -> None:
    """One claim's score from the claims stage, then only responses for days: the claims source's old
    time was the partition's watermark for ever, and no subject was swept until a restart."""
    worker = _Worker(calibration_join_window_hours=24)
    wall = [0.0]
    worker.stage.clock = ExpiryClock(timedelta(hours=1), 60, monotonic=lambda: wall[0])
    day = 24 * 60
    worker.feed(_score("r0", -5 * day), source=upstream("claims", 0))
    for n in range(1, 5):
        wall[0] += 50  # the claims stage sends nothing more (the responses come every 50 s)
        worker.feed(_score(f"r{n}", (n - 5) * day))
    old, recent = subject_key(TENANT, "response", "r0"), subject_key(TENANT, "response", "r4")
    old_entry, recent_entry = worker.tables[old], worker.tables[recent]
    assert isinstance(old_entry, SubjectEntry) and isinstance(recent_entry, SubjectEntry)
    assert worker.stage.sweep_subject(old, old_entry)[0] is None  # past its 24 h join window
    assert worker.stage.sweep_subject(recent, recent_entry)[0] is recent_entry


def test_a_subject_keeps_the_score_that_arrived_last_even_with_an_older_event_time() -> None:
    """A trace re-scored by a tool call timestamped earlier than the one before (agents' clocks, or a
    call logged late): the service now holds the new score, and outcomes are judged against it."""
    worker = _Worker()
    worker.feed(_score("r1", 10, score=0.65))
    worker.feed(_score("r1", 5, score=0.77))
    entry = worker.tables[subject_key(TENANT, "response", "r1")]
    assert isinstance(entry, SubjectEntry) and entry.subject is not None
    assert entry.subject.scores == {"response": 0.77}


def test_a_group_whose_tenant_moved_to_another_worker_leaves_the_gauges() -> None:
    """After a rebalance the tenant's new owner exports its groups' ECE and Brier; the old owner's
    series stayed, frozen at their last value, beside the new ones on every dashboard."""
    worker = _Worker(topic_partitions=4)
    worker.feed(_score("r1", 0), _outcome("o1", "r1", 1))
    here = tenant_partition(TENANT, 4)

    def exported() -> set[tuple[str, str]]:
        return {
            (sample.labels["dimension"], sample.name)
            for family in worker.registry.collect()
            if family.name in ("confidence_calibration_ece", "confidence_calibration_brier")
            for sample in family.samples
            if sample.labels["tenant"] == TENANT
        }

    both = {"confidence_calibration_ece", "confidence_calibration_brier"}
    assert exported() == {(dimension, name) for dimension in ("model", "agent_type") for name in both}
    worker.stage.forget_groups_outside({here})  # still owned here: kept
    assert len(exported()) == 4
    worker.stage.forget_groups_outside({p for p in range(4) if p != here})
    assert exported() == set()
    worker.feed(_score("r2", 2), _outcome("o2", "r2", 3))  # owned here again: exported again
    assert len(exported()) == 4


def test_an_other_series_leaves_with_the_last_group_sharing_it() -> None:
    """Groups whose model label was capped share the `other` series: it stayed for good once they went."""
    worker = _Worker(metrics_label_cap=1)  # model "m" keeps its name; "m2" and "m3" are `other`
    for n, model in enumerate(("m", "m2", "m3")):
        worker.feed(_score(f"r{n}", 2 * n, model=model), _outcome(f"o{n}", f"r{n}", 2 * n + 1))

    def models() -> set[str]:
        family = next(f for f in worker.registry.collect() if f.name == "confidence_calibration_ece")
        return {s.labels["group"] for s in family.samples if s.labels["dimension"] == "model"}

    assert models() == {"m", "other"}
    worker.stage.forget_group(worker.group("m2"))  # expired; m3 still counts on `other`
    assert models() == {"m", "other"}
    worker.stage.forget_group(worker.group("m3"))
    assert models() == {"m"}
    worker.stage.forget_groups_outside(set())  # the tenant's partition moved away
    assert models() == set()


def test_the_same_items_give_the_same_tables_and_outputs_in_one_message_or_one_each() -> None:
    """Items are applied one by one now: how upstream bundled them must not change what they make."""
    items = [
        _score("r1", 0),
        _outcome("o1", "r1", 1),
        _outcome("o2", "r2", 2, correct=False),  # waits for its score
        _score("r2", 3, score=0.3, model="m2"),
        _outcome("o1", "r1", 4),  # a duplicate
        _score("r1", 5, score=0.6),  # a newer score for r1
        _outcome("o3", "r1", 6),
    ]

    def run(bundles: list[list[CalibrationItem]]) -> tuple[dict[bytes, BaseModel], list[Any]]:
        worker = _Worker(calibration_min_samples=1, calibration_update_min_interval_minutes=0)
        outputs = []
        for bundle in bundles:
            records, _ = worker.feed(*bundle)
            outputs += [{k: v for k, v in orjson.loads(r.value).items() if k != "scored_at"} for r in records]
        return worker.tables, outputs

    together = run([items])
    assert together == run([[item] for item in items])
    assert together == run([items[:3], items[3:]])
    tables, outputs = together
    assert {o["event_type"] for o in outputs} == {"CALIBRATION_UPDATED"}
    group = tables[group_key(TENANT, "model", "m", "response")]
    assert isinstance(group, GroupCalibration) and calibration.total(group.bins) == 2  # o1 once, and o3


def test_the_ece_alert_compares_the_ece_rounded_to_9_decimals() -> None:
    """One correct outcome of a 0.9 score: ECE |1 - 0.9| is 0.09999999999999998 in floats, which is the
    0.1 alert line once rounded (DESIGN 4b); compared raw it was no alert."""
    worker = _Worker(calibration_min_samples=1, calibration_update_min_interval_minutes=0)
    worker.feed(_score("r1", 0, score=0.9))
    records, _ = worker.feed(_outcome("o1", "r1", 1))
    updates = [orjson.loads(r.value) for r in records if r.topic == worker.settings.scored_topic]
    assert updates and all(u["ece"] != 0.1 and round(u["ece"], 9) == 0.1 for u in updates)
    assert all(u["alert"] is True for u in updates)
    assert [r.topic for r in records].count(worker.settings.flagged_topic) == len(updates)


def test_agent_types_that_differ_only_in_case_are_one_group() -> None:
    """The composite threshold a group advises on matches agent types case-insensitively (DESIGN
    section 4b): "Planner" and "planner" were two groups advising one threshold on half the data each."""
    w = _Worker()
    w.feed(_score("r1", 0, agent_type="Planner"), _score("r2", 1, agent_type="planner"))
    w.feed(_outcome("o1", "r1", 2), _outcome("o2", "r2", 3, correct=False))
    assert calibration.total(w.group_of("agent_type", "planner").bins) == 2
    assert group_key(TENANT, "agent_type", "Planner", "response") not in w.tables


def _swept(w: _Worker, minutes: float) -> None:
    """The sweep of every subject entry (as streams/agents.py runs it), the clock at `minutes`."""
    w.stage.clock = ExpiryClock(timedelta(hours=1), None)  # one source: no idle wait before sweeping
    w.feed(_score("clock", minutes))  # moves the partition's event time
    for key, entry in list(w.tables.items()):
        if isinstance(entry, SubjectEntry) and key != subject_key(TENANT, "response", "clock"):
            kept, unmatched = w.stage.sweep_subject(key, entry)
            w.stage.metrics.outcomes_unmatched.inc(unmatched)
            if kept is None:
                del w.tables[key]
            else:
                w.tables[key] = kept


@pytest.mark.parametrize("sweep_first", [False, True])
def test_an_outcome_after_its_scores_join_window_is_unmatched_whether_or_not_the_sweep_ran(
    sweep_first: bool,
) -> None:
    """The join window (7 days of event time) was applied by the sweep alone: an outcome 8 days after
    its score was matched if it arrived before the sweep and waited (then unmatched) after it."""
    w = _Worker()
    day = 24 * 60
    w.feed(_score("r1", -9 * day))  # in the past: event times are bounded by the wall clock
    if sweep_first:
        _swept(w, -day - 1)
    w.feed(_outcome("o1", "r1", -day))
    assert (w.outcomes("matched"), w.outcomes("waiting")) == (0, 1)
    _swept(w, -day + 61)  # its hour of waiting ended: unmatched
    assert w.registry.get_sample_value("confidence_outcomes_unmatched_total") == 1
    assert group_key(TENANT, "model", "m", "response") not in w.tables


@pytest.mark.parametrize("sweep_first", [False, True])
def test_a_score_after_its_outcomes_wait_ended_leaves_it_unmatched_whether_or_not_the_sweep_ran(
    sweep_first: bool,
) -> None:
    """An outcome waits an hour (event time) for its score; a score 2 hours later matched it unless the
    sweep had run in between."""
    w = _Worker()
    w.feed(_outcome("o1", "r1", 0))
    if sweep_first:
        _swept(w, 119)
    w.feed(_score("r1", 120))
    assert w.outcomes("matched") == 0
    assert w.registry.get_sample_value("confidence_outcomes_unmatched_total") == 1
    assert group_key(TENANT, "model", "m", "response") not in w.tables


def test_a_score_within_its_outcomes_wait_still_matches_it() -> None:
    w = _Worker()
    w.feed(_outcome("o1", "r1", 0))
    w.feed(_score("r1", 60))  # exactly at the end of the hour: still joined
    assert w.outcomes("matched") == 1
    assert calibration.total(w.group().bins) == 1


def _joined(first: CalibrationItem, second: CalibrationItem) -> tuple[float, float, int]:
    """(matched, unmatched, samples counted) once the sweep has run past every window."""
    w = _Worker()
    w.feed(first)
    w.feed(second)
    _swept(w, 0)  # the wall clock bounds event times: every pair below is dated before it
    key = group_key(TENANT, "model", "m", "response")
    counted = calibration.total(w.tables[key].bins) if key in w.tables else 0  # type: ignore[attr-defined]
    unmatched = w.registry.get_sample_value("confidence_outcomes_unmatched_total") or 0.0
    return w.outcomes("matched"), unmatched, counted


DAY = 24 * 60


@pytest.mark.parametrize(
    ("score_at", "outcome_at", "matched"),
    [
        (-9 * DAY, -DAY, False),  # outcome 8 days after its score: past the 7-day join window
        (-8 * DAY, -DAY, True),  # exactly 7 days after: joined
        (-DAY + 120, -DAY, False),  # score 2 h after its outcome: past the outcome's 1 h wait
        (-DAY + 60, -DAY, True),  # exactly 1 h after: joined
        (-DAY, -DAY + 30, True),
    ],
)
def test_a_score_and_its_outcome_join_whichever_arrives_first(
    score_at: float, outcome_at: float, matched: bool
) -> None:
    """Each window was checked on one arrival order only: an outcome 8 days after its score was counted
    when it arrived first (and not when second), a score 2 h after its outcome when it arrived first."""
    score, outcome = _score("r1", score_at), _outcome("o1", "r1", outcome_at)
    expected = (1.0, 0.0, 1) if matched else (0.0, 1.0, 0)
    assert _joined(score, outcome) == expected
    assert _joined(outcome, score) == expected


def test_an_outcome_past_one_scores_window_joins_the_newer_score_in_either_order() -> None:
    """An outcome dated past its score's join window waits for a newer score of the subject (a trace
    re-scored): it must do so also when it arrived before the old score."""
    old, new = _score("r1", -9 * DAY, score=0.2), _score("r1", -DAY + 30, score=0.9)
    outcome = _outcome("o1", "r1", -DAY)
    for order in ((old, outcome, new), (outcome, old, new)):
        w = _Worker()
        for item in order:
            w.feed(item)
        assert w.outcomes("matched") == 1
        assert list(w.group().bins) == [calibration.fine_bin(0.9)], "joined with the newer score, 0.9"


def test_a_one_hour_window_keeps_the_last_hour_of_outcomes() -> None:
    """The window dropped every hour partly outside it: with CALIBRATION_WINDOW_HOURS=1, outcomes at
    +30 and +59 minutes, then one at +60, counted 1, 2, then 1 (the one-minute-old outcome gone)."""
    w = _Worker(calibration_window_hours=1)
    counted = []
    for i, minute in enumerate((30, 59, 60, 125)):
        w.feed(_score(f"r{i}", minute - 1), _outcome(f"o{i}", f"r{i}", minute))
        counted.append(calibration.total(w.group().bins))
    assert counted == [1, 2, 3, 2]  # at +125: the hour from +60 (partly in the last hour) stays, +0 left


def test_a_late_outcome_in_the_windows_first_hour_is_counted() -> None:
    """The window's first hour is in it: with a one-hour window and the newest outcome at +120, an
    outcome at +61 (the hour from +60) arriving late is counted, not dropped as already left."""
    w = _Worker(calibration_window_hours=1)
    w.feed(_score("r1", 119), _outcome("o1", "r1", 120))
    w.feed(_score("r2", 60), _outcome("o2", "r2", 61))
    assert calibration.total(w.group().bins) == 2


def test_a_group_expires_once_its_newest_outcomes_hour_has_left_the_window() -> None:
    """The window holds W to W + 1 hours (`_count`): the group stays while its newest outcome's hour is
    in the window and expires once the clock is past newest + W + 1 h."""
    w = _Worker(calibration_window_hours=1)
    w.feed(_score("r1", 29), _outcome("o1", "r1", 30))
    key = group_key(TENANT, "model", "m", "response")
    w.stage.clock = ExpiryClock(timedelta(hours=1), None)  # one source: no idle wait
    w.feed(_score("clock", 100))  # the hour from +0 is still the window's first
    assert not w.stage.group_expired(key, w.group())
    w.feed(_score("clock", 151))
    assert w.stage.group_expired(key, w.group())


def test_a_score_counts_unmatched_only_the_waiting_outcomes_whose_wait_it_passed() -> None:
    """Of two outcomes waiting for a score, one whose wait ended before it is unmatched; one dated past
    its join window waits on for a newer score, and is not counted unmatched (yet) too."""
    w = _Worker()
    w.feed(_outcome("o1", "r1", -9 * DAY - 120))  # its 1 h wait ended before the score
    w.feed(_outcome("o2", "r1", -DAY))  # 8 days after the score: past its 7-day join window
    w.feed(_score("r1", -9 * DAY))
    assert w.outcomes("matched") == 0
    assert w.registry.get_sample_value("confidence_outcomes_unmatched_total") == 1
    _swept(w, 0)  # o2's wait ends with no newer score: unmatched now, once
    assert w.registry.get_sample_value("confidence_outcomes_unmatched_total") == 2


def model_updates_of_25_half_scores(w: _Worker) -> list[tuple[int, dict[str, Any]]]:
    """25 responses scored 0.5, each followed by its outcome, right for the first 6 and the 21st: the
    model group's CALIBRATION_UPDATED outputs, each with the outcomes fed when it was emitted."""
    emitted = []
    for i in range(25):
        w.feed(_score(f"r{i}", 2 * i, score=0.5))
        records, _ = w.feed(_outcome(f"o{i}", f"r{i}", 2 * i + 1, correct=i < 6 or i == 20))
        updates = [orjson.loads(r.value) for r in records if r.topic == w.settings.scored_topic]
        emitted += [(i + 1, u) for u in updates if u["group"]["dimension"] == "model"]
    return emitted


def test_an_ece_move_of_exactly_the_setting_is_emitted() -> None:
    """20 outcomes of 0.5-scores, 6 right: ECE 0.2, emitted. 5 more, 1 right: ECE 7/25 = 0.22, a move of
    exactly CALIBRATION_ECE_CHANGE (0.02), computed as 0.01999999999999996 and not emitted: compared
    unrounded, against DESIGN 4b."""
    w = _Worker()  # minimum 20 samples, change 0.02, at most every 10 minutes
    emitted = [(samples, u["ece"]) for samples, u in model_updates_of_25_half_scores(w)]
    assert [samples for samples, _ in emitted] == [20, 25]
    assert emitted[1][1] == pytest.approx(0.22)


def _trace_score(minutes: float, score: float) -> CalibrationItem:
    """The trace `tr`'s evidence score (agent type `a`), as stage 1 sends it."""
    subject = CalibrationSubject(
        subject_type="trace",
        subject_id="tr",
        event_time=START + timedelta(minutes=minutes),
        scores={"evidence": score},
        agent_type="a",
    )
    return CalibrationItem(subject=subject, received_at=1.0)


def _trace_outcome(event_id: str, minutes: float) -> CalibrationItem:
    outcome = _outcome(event_id, "x", minutes).outcome
    assert outcome is not None
    return CalibrationItem(
        outcome=outcome.model_copy(update={"subject_event_id": None, "trace_id": "tr"}), received_at=1.0
    )


@pytest.mark.parametrize("another_waits", [False, True])
def test_a_redelivered_outcome_counts_once_also_after_its_score_was_swept(another_waits: bool) -> None:
    """The sweep dropped a subject's counted outcome ids with its expired score (the whole entry, or,
    with another outcome still waiting, the ids): the counted outcome, re-delivered, then joined the
    trace's next score and was counted twice; without the sweep in between, once."""
    base = -9 * DAY  # in the past: event times are bounded by the wall clock
    counts = {}
    for sweep in (False, True):
        w = _Worker()
        w.feed(_trace_score(base, 0.2))
        w.feed(_trace_outcome("o1", base + 7 * DAY - 1))  # joins it, a minute before its window ends
        if another_waits:
            w.feed(_trace_outcome("o2", base + 7 * DAY + 1))  # past that window: waits for a newer score
        if sweep:
            _swept(w, base + 7 * DAY + 2)  # the score expired; o1's hour of waiting has not ended
        w.feed(_trace_outcome("o1", base + 7 * DAY - 1))  # re-delivered
        w.feed(_trace_score(base + 7 * DAY + 30, 0.9))  # the trace re-scored within o1's hour
        counts[sweep] = (
            w.outcomes("duplicate"),
            calibration.total(w.group_of("agent_type", "a", "evidence").bins),
        )
    assert counts[True] == counts[False] == (1, 2 if another_waits else 1)


def test_counted_outcome_ids_leave_once_no_newer_score_could_join_them() -> None:
    """Kept past their score until the outcomes' hour of waiting ends, then the entry is deleted."""
    w = _Worker(calibration_join_window_hours=1)
    w.feed(_score("r1", -3 * DAY), _outcome("o1", "r1", -3 * DAY + 10))  # o1's hour ends at +70
    key = subject_key(TENANT, "response", "r1")
    _swept(w, -3 * DAY + 65)  # the score's hour ended at +60
    kept = w.tables[key]
    assert isinstance(kept, SubjectEntry) and kept.subject is None and kept.applied == ("o1",)
    assert w.stage.subject_sweep_after(key, kept)[1] == START + timedelta(minutes=-3 * DAY + 70)
    _swept(w, -3 * DAY + 71)
    assert key not in w.tables


ESCAPED = "\x01"  # 6 bytes in JSON (\u0001): an id of them is the longest an id encodes to


def _long_outcome(i: int, char: str) -> CalibrationItem:
    """An outcome whose ids are 1,024 `char`s each."""
    item = _outcome(char * 1020 + f"{i:04d}", char * 1024, 1)
    assert item.outcome is not None
    return item.model_copy(update={"outcome": item.outcome.model_copy(update={"trace_id": char * 1024})})


# 6 bytes in JSON as an escape; 4 bytes in UTF-8 but one character of the JSON text.
@pytest.mark.parametrize("char", [ESCAPED, "\U0010ffff"], ids=["escaped", "four-byte"])
def test_a_subject_entry_never_grows_past_max_record_bytes(char: str) -> None:
    """Review (thirtieth round): only the count of outcomes bounded a subject's entry. Ids of escaped
    characters made 48 waiting outcomes (the setting's maximum) a 1.2 MB changelog record, which a
    broker refuses at every restart; a lower MAX_RECORD_BYTES was passed by far fewer. An outcome that
    would take the entry past it is dead-lettered now (oversized_output) and counted nowhere. The
    re-read of the change found the exact size taken in characters, not bytes: 48 outcomes with ids of
    4-byte characters passed a 200 KB bound at 590 KB."""
    worker = _Worker(
        calibration_max_outcomes_per_subject=48, max_record_bytes=200_000, producer_max_batch_bytes=200_000
    )
    reasons = []
    for i in range(48):
        records, _ = worker.feed(_long_outcome(i, char))
        reasons += [reason for _, reason in dead(records)]
    key = subject_key(TENANT, "response", char * 1024)
    entry = worker.tables[key]
    assert isinstance(entry, SubjectEntry)
    size = len(key) + len(entry.model_dump_json().encode())
    assert size <= 200_000
    assert len(entry.waiting) + len(reasons) == 48 and 8 <= len(entry.waiting) < 48
    assert set(reasons) == {b"oversized_output"}
    assert worker.outcomes("waiting") == len(entry.waiting)


def test_the_entry_size_estimate_is_never_below_the_encoded_size() -> None:
    """The exact size is computed only once the estimate passes a quarter of the bound: it must be an
    upper bound for every kind of id (escaped, 4-byte, plain) and every part of an entry."""
    for char in (ESCAPED, "\U0010ffff", "é", "a", '"'):
        long_id = char * 1024
        subject = CalibrationSubject(
            subject_type="claim",
            subject_id=long_id,
            event_time=START,
            scores={"response": 0.5, "composite": 0.25, "evidence": 1.0, "claim": 0.125},
            action="reject",
            model=long_id,
            agent_type=long_id,
        )
        outcomes = []
        for i in range(3):
            item = _outcome(char * 1020 + f"{i:04d}", long_id, 1)
            assert item.outcome is not None
            outcomes.append(
                item.outcome.model_copy(update={"trace_id": long_id, "tenant_id": long_id, "claim_id": None})
            )
        for entry in (
            SubjectEntry(),
            SubjectEntry(subject=subject),
            SubjectEntry(waiting=tuple(outcomes)),
            SubjectEntry(
                subject=subject, applied=(long_id, long_id), applied_until=START, waiting=tuple(outcomes)
            ),
        ):
            key = subject_key(long_id, "claim", long_id)
            assert _entry_size_bound(key, entry) >= len(key) + len(entry.model_dump_json().encode()), (
                char,
                entry,
            )
