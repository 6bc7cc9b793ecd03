"""An OUTCOME reaches the calibration stage behind the score it judges, however stage 1's input is cut
into batches and however far the later stages lag behind the calibration stage.

Stages 1-4 without Kafka, over in-memory tables. Claim scores reach the calibration stage from the
claim stage and response scores from the agent stage; an outcome sent there straight from stage 1
overtook them: a claim's was counted against an older score (the batch-cut review: A's first score,
0.75, instead of its last, 0.6285), a response's waited while its score was on its way and the sweep
counted it unmatched once the clock had passed its wait (the cross-stage ordering review).
(Through the broker: tests/integration/test_calibration.py.)
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from streams import metrics
from streams.config import load_settings, scoring_configs
from streams.decoded_states import UndecodableState
from streams.scoring.claim_graph import ClaimNode
from streams.stages import AgentStage, CalibrationStage, InputRecord, Record, TraceStage
from streams.stages.calibration import Table, group_key, subject_key
from streams.stages.claims import ClaimStage
from streams.stages.common import ExpiryClock
from streams.stages.history import HistoryWrite
from streams.state import AgentHistory, GroupCalibration, HistoryHour, SubjectEntry, TraceState
from tests.unit.stage_records import keyed

COMMON = {"tenant_id": "t", "trace_id": "tr", "agent_name": "a", "agent_type": "planner", "schema_version": 1}


def _claim(event_id: str, second: int, claim_id: str, **fields: Any) -> dict[str, Any]:
    return {
        **COMMON,
        "event_id": event_id,
        "event_type": "CLAIM",
        "timestamp": f"2026-11-22T10:00:{second:02d}Z",
        "claim_id": claim_id,
        "statement": claim_id,
        "source_id": "s",
        "tier": "task",
        "provenance": [{"source_type": "agent", "confidence": 0.9, "source_id": "x"}],
        **fields,
    }


EVENTS = [
    _claim("e1", 1, "A"),
    _claim("e2", 2, "B", relationships=[{"type": "contradicts", "target": "A", "strength": 0.9}]),
    {
        **COMMON,
        "event_id": "o1",
        "event_type": "OUTCOME",
        "timestamp": "2026-11-22T10:00:03Z",
        "claim_id": "A",
        "correct": True,
        "source": "human",
    },
]


class _Worker:
    """Stages 1, 3 and 4 and their tables. Each stage's records for a later one wait in its inbox until
    that stage is run, so a test decides which stage runs first."""

    def __init__(self) -> None:
        settings = load_settings(calibration_min_samples=1, calibration_update_min_interval_minutes=0)
        configs, registry = scoring_configs(settings), metrics.create(CollectorRegistry())
        self.settings = settings
        self.trace = TraceStage(settings, configs, registry)
        self.agents = AgentStage(settings, configs, registry)
        self.claims = ClaimStage(settings, configs, registry)
        self.calibration = CalibrationStage(settings, configs, registry)
        # A plain watermark (no idle-source grace, a wall-clock span): the sweep decides by event time.
        self.calibration.clock = ExpiryClock(self.calibration.clock.max_ahead)
        self.traces: dict[bytes, TraceState] = {}
        self.summaries: dict[bytes, AgentHistory] = {}
        self.hours: dict[bytes, HistoryHour] = {}
        self.nodes: dict[bytes, ClaimNode] = {}
        self.calibration_tables: dict[bytes, BaseModel] = {}
        self.unmatched = 0
        self.inbox: dict[str, list[Record]] = {
            settings.responses_topic: [],
            settings.claims_topic: [],
            settings.calibration_topic: [],
        }
        self.scored: list[dict[str, Any]] = []
        self.offset = 0

    def stage_1(self, events: list[dict[str, Any]]) -> None:
        batch = []
        for event in events:
            batch.append(keyed(InputRecord("agent-events", 0, self.offset, 1.0, orjson.dumps(event))))
            self.offset += 1
        records, states = self.trace.process(batch, self.traces.get)
        self.traces.update(states)
        self._route(records)

    def stage_2(self) -> None:
        records, writes = self.agents.process(
            self._take(self.settings.responses_topic), self.summaries.get, self.hours.get
        )
        for key, write in writes.items():
            self._write(self.summaries if write.table == "summary" else self.hours, key, write)
        self._route(records)

    @staticmethod
    def _write(table: dict[bytes, Any], key: bytes, write: HistoryWrite) -> None:
        if write.value is None:
            table.pop(key, None)
        else:
            table[key] = write.value

    def sweep_subjects(self) -> None:
        """The calibration part of the expiry sweep (streams/agents.py `_sweep_calibration`)."""
        for key, entry in list(self.calibration_tables.items()):
            if isinstance(entry, SubjectEntry):
                kept, unmatched = self.calibration.sweep_subject(key, entry)
                self.unmatched += unmatched
                if kept is None:
                    del self.calibration_tables[key]
                else:
                    self.calibration_tables[key] = kept

    def stage_3(self) -> None:
        records, writes = self.claims.process(self._take(self.settings.claims_topic), self.nodes.get)
        self.nodes.update({key: write.node for key, write in writes.items()})
        self._route(records)

    def stage_4(self) -> None:
        def load(_table: Table, key: bytes) -> BaseModel | None:
            return self.calibration_tables.get(key)

        records, writes = self.calibration.process(self._take(self.settings.calibration_topic), load)
        for key, write in writes.items():
            if write.value is None:
                self.calibration_tables.pop(key, None)
            else:
                self.calibration_tables[key] = write.value
        self._route(records)

    def _route(self, records: list[Record]) -> None:
        for record in records:
            if record.topic in self.inbox:
                self.inbox[record.topic].append(record)
            elif record.topic == self.settings.scored_topic:
                self.scored.append(orjson.loads(record.value))
            assert record.topic != self.settings.dlq_topic, record

    def _take(self, topic: str) -> list[InputRecord]:
        taken, self.inbox[topic] = self.inbox[topic], []
        return [InputRecord(topic, r.partition or 0, i, 1.0, r.value, r.key) for i, r in enumerate(taken)]

    def counted_at(self) -> list[float]:
        """The score each counted outcome of the tenant's claim group was counted at (bins' mean score)."""
        group = self.calibration_tables[group_key("t", "agent_type", "planner", "claim")]
        assert isinstance(group, GroupCalibration)
        return sorted(stats.sum_predicted / stats.n for stats in group.bins.values())


def _one_at_a_time() -> _Worker:
    w = _Worker()
    for event in EVENTS:
        w.stage_1([event])
        w.stage_3()
        w.stage_4()
    return w


@pytest.mark.parametrize("calibration_first", [True, False])
def test_a_claim_outcome_is_counted_against_the_claims_last_score_whatever_the_batches(
    calibration_first: bool,
) -> None:
    expected = _one_at_a_time()
    a_scores = [o["interval"]["midpoint"] for o in expected.scored if o.get("claim_id") == "A"]
    assert len(a_scores) == 2 and a_scores[1] < a_scores[0]  # B's contradiction re-scored A lower
    assert expected.counted_at() == [pytest.approx(a_scores[1])]

    w = _Worker()
    w.stage_1(EVENTS)  # one batch
    if calibration_first:  # the calibration stage reads before the claim stage has caught up
        w.stage_4()
    w.stage_3()
    w.stage_4()
    assert w.counted_at() == expected.counted_at()
    assert w.calibration_tables == expected.calibration_tables


def test_a_claim_message_with_neither_or_both_a_claim_and_an_outcome_is_dead_lettered_alone() -> None:
    w = _Worker()
    w.stage_1(EVENTS[:1] + EVENTS[2:])  # claim A and an outcome for it: two claim-stage messages
    claim, outcome = (orjson.loads(r.value) for r in w.inbox[w.settings.claims_topic])
    assert "arrived" in claim and claim["outcome"] is None and outcome["arrived"] is None
    neither = {**claim, "arrived": None}
    both = {**claim, "outcome": outcome["outcome"]}
    batch = [
        InputRecord(w.settings.claims_topic, 0, offset, 1.0, orjson.dumps(value))
        for offset, value in enumerate([neither, both, claim])
    ]
    records, writes = w.claims.process(batch, w.nodes.get)
    letters = [dict(r.headers or []) for r in records if r.topic == w.settings.dlq_topic]
    assert [(h["__connect.errors.offset"], h["__connect.errors.reason"]) for h in letters] == [
        (b"0", b"processing_error"),
        (b"1", b"processing_error"),
    ]
    assert [o["claim_id"] for o in map(orjson.loads, (r.value for r in records)) if "claim_id" in o] == ["A"]
    assert len(writes) == 1


def _response(event_id: str, minute: int, agent: str, trace: str) -> dict[str, Any]:
    return {
        **COMMON,
        "event_id": event_id,
        "event_type": "LLM_RESPONSE",
        "timestamp": f"2026-11-22T10:{minute:02d}:00Z",
        "trace_id": trace,
        "agent_name": agent,
        "request_id": event_id,
        "model": "m",
        "endpoint": "/v1",
        "response": "The retry limit is read from config/retry.yaml.",
        "token_logprobs": [-0.1, -0.2],
    }


@pytest.mark.parametrize("sweep_while_stage_2_lags", [False, True])
def test_a_response_outcome_waits_for_its_score_behind_it_not_at_the_calibration_stage(
    sweep_while_stage_2_lags: bool,
) -> None:
    """R, its OUTCOME (5 min later) and a tool call at +70 min in one stage-1 batch: the calibration
    stage's clock passes the outcome's 1-hour wait before the agent stage has handed R's score on.
    The outcome goes behind the score now, so a sweep meanwhile finds nothing waiting (before: the
    sweep counted it unmatched, and R's score, arriving next, joined nothing: no sample)."""
    w = _Worker()
    outcome = {
        **COMMON,
        "event_id": "o-r",
        "event_type": "OUTCOME",
        "timestamp": "2026-11-22T10:05:00Z",
        "subject_event_id": "r",
        "correct": True,
        "source": "human",
    }
    del outcome["agent_name"], outcome["agent_type"]
    tool = {
        **COMMON,
        "event_id": "t-late",
        "event_type": "TOOL_INVOCATION",
        "timestamp": "2026-11-22T11:10:00Z",
        "trace_id": "tr-late",
        "tool": "grep",
        "target": "retry",
        "status": "ok",
        "result_count": 2,
    }
    w.stage_1([_response("r", 0, "a", "tr"), outcome, tool])
    w.stage_4()  # the calibration stage reads stage 1's scores first: its clock is at 11:10
    if sweep_while_stage_2_lags:
        w.sweep_subjects()
    w.stage_2()
    w.stage_4()
    w.sweep_subjects()
    assert w.unmatched == 0
    entry = w.calibration_tables[subject_key("t", "response", "r")]
    assert isinstance(entry, SubjectEntry) and entry.applied == ("o-r",)
    group = w.calibration_tables[group_key("t", "model", "m", "response")]
    assert isinstance(group, GroupCalibration) and sum(b.n for b in group.bins.values()) == 1


def test_an_outcome_for_a_response_its_trace_does_not_know_still_goes_straight_to_calibration() -> None:
    """No route is known (another trace id here): it goes to the calibration stage directly, as before,
    and waits there for its score."""
    w = _Worker()
    w.stage_1([_response("r", 0, "a", "tr")])
    outcome = {
        "event_id": "o-r",
        "event_type": "OUTCOME",
        "timestamp": "2026-11-22T10:05:00Z",
        "tenant_id": "t",
        "trace_id": "another-trace",
        "schema_version": 1,
        "subject_event_id": "r",
        "correct": True,
        "source": "human",
    }
    w.stage_1([outcome])
    assert len(w.inbox[w.settings.responses_topic]) == 1  # the response only
    w.stage_4()
    w.stage_2()
    w.stage_4()
    entry = w.calibration_tables[subject_key("t", "response", "r")]
    assert isinstance(entry, SubjectEntry) and entry.applied == ("o-r",)


def _response_outcome(trace: str = "tr") -> dict[str, Any]:
    return {
        "event_id": "o-r",
        "event_type": "OUTCOME",
        "timestamp": "2026-11-22T10:05:00Z",
        "tenant_id": "t",
        "trace_id": trace,
        "schema_version": 1,
        "subject_event_id": "r",
        "correct": True,
        "source": "human",
    }


def test_an_outcome_whose_trace_state_cannot_be_read_goes_straight_not_to_the_dead_letter_topic() -> None:
    """The outcome needs nothing of its trace's state but the route: a stored trace this version cannot
    read gives no route, as an unknown response does (the routes review: it was dead-lettered, lost)."""
    w = _Worker()
    w.stage_1([_response("r", 0, "a", "tr")])

    def unreadable(key: bytes) -> TraceState | None:
        raise UndecodableState("a stored value of table traces is not a valid TraceState")

    record = keyed(InputRecord("agent-events", 0, 99, 1.0, orjson.dumps(_response_outcome())))
    records, states = w.trace.process([record], unreadable)
    assert states == {}
    w._route(records)  # asserts that nothing went to the dead-letter topic
    w.stage_2()
    w.stage_4()
    entry = w.calibration_tables[subject_key("t", "response", "r")]
    assert isinstance(entry, SubjectEntry) and entry.applied == ("o-r",)


def test_with_calibration_off_a_trace_keeps_no_route_for_outcomes_it_drops() -> None:
    """`response_agents` exists for OUTCOMEs; with calibration off stage 1 drops every OUTCOME, so a
    response adds nothing to it (the routes review: 55 B per response with UUID ids and a short agent
    name, 298 B with a 256-character one, against TRACE_STATE_MAX_BYTES)."""
    off = load_settings(calibration_enabled=False)
    stage = TraceStage(off, scoring_configs(off), metrics.create(CollectorRegistry()))
    record = keyed(InputRecord("agent-events", 0, 0, 1.0, orjson.dumps(_response("r", 0, "a", "tr"))))
    _, states = stage.process([record], lambda key: None)
    (state,) = states.values()
    assert state.response_agents == {} and list(state.response_times) == ["r"]


@pytest.mark.parametrize("subject", ["claim", "response"])
def test_a_late_dated_outcome_handed_on_by_a_later_stage_does_not_expire_the_scores_it_travels_with(
    subject: str,
) -> None:
    """The diff review: an outcome handed on by the claim or agent stage moved the clock of the scores
    it travels with. A tenant with A and B scored at S and B's verdict dated S + 7 d 1 h: the clock
    read past A's 7-day join window, and a sweep deleted A's score before A's verdict (dated S + 1 d)
    came. The outcome moves its input partition's clock source, as when stage 1 sent it."""
    w = _Worker()

    def scored(event_id: str) -> dict[str, Any]:
        if subject == "claim":
            return {**_claim(event_id, 0, event_id.upper()), "timestamp": "2026-11-01T10:00:00Z"}
        return {**_response(event_id, 0, "a", "tr"), "timestamp": "2026-11-01T10:00:00Z"}

    def verdict(event_id: str, timestamp: str, judged: str) -> dict[str, Any]:
        target = {"claim_id": judged.upper()} if subject == "claim" else {"subject_event_id": judged}
        outcome = {**COMMON, **target, "event_id": event_id, "event_type": "OUTCOME", "timestamp": timestamp}
        del outcome["agent_name"], outcome["agent_type"]
        return {**outcome, "correct": True, "source": "human"}

    def run(events: list[dict[str, Any]]) -> None:
        w.stage_1(events)
        w.stage_2()
        w.stage_3()
        w.stage_4()

    run([scored("a"), scored("b")])
    run([verdict("o-b", "2026-11-08T11:00:00Z", "b")])
    w.sweep_subjects()
    run([verdict("o-a", "2026-11-02T10:00:00Z", "a")])
    subject_id = "A" if subject == "claim" else "a"
    entry = w.calibration_tables.get(subject_key("t", subject, subject_id))
    assert isinstance(entry, SubjectEntry) and entry.applied == ("o-a",), entry
    assert w.unmatched == 0


def test_an_outcome_forwarded_before_calibration_was_turned_off_is_counted_disabled() -> None:
    """Forwarded by a stage 1 with calibration on, handed on by a later stage with it off: counted
    `disabled`, as stage 1 counts the outcomes it drops, not lost from every count."""
    w = _Worker()
    w.stage_1([_response("r", 0, "a", "tr"), {**EVENTS[0]}])
    outcomes = [
        {**EVENTS[2]},
        {**EVENTS[2], "event_id": "o-r", "claim_id": None, "subject_event_id": "r"},
    ]
    w.stage_1([{k: v for k, v in o.items() if v is not None} for o in outcomes])
    off = load_settings(calibration_enabled=False)
    registry = CollectorRegistry()
    off_metrics = metrics.create(registry)
    w.agents = AgentStage(off, scoring_configs(off), off_metrics)
    w.claims = ClaimStage(off, scoring_configs(off), off_metrics)
    w.settings = off
    w.stage_2()
    w.stage_3()
    assert registry.get_sample_value("confidence_outcomes_total", {"status": "disabled"}) == 2
    assert w.inbox[off.calibration_topic] == []
