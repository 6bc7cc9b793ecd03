"""The stages without Kafka: batch processing over in-memory state, and the processing-error net."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from streams import metrics
from streams.config import load_settings, scoring_configs
from streams.scoring import evidence
from streams.scoring.claim_graph import ClaimNode
from streams.stages import InputRecord, TraceStage
from streams.stages.claims import ClaimStage
from streams.stages.common import ExpiryClock, Outputs
from streams.state import CalibrationItem, TraceState
from tests.unit.stage_records import keyed

BASE = {
    "event_type": "TOOL_INVOCATION",
    "timestamp": "2026-11-22T10:00:00Z",
    "tenant_id": "t",
    "trace_id": "tr",
    "agent_name": "a",
    "agent_type": "planner",
    "schema_version": 1,
    "tool": "find",
    "status": "ok",
}


def _stage() -> TraceStage:
    settings = load_settings()
    return TraceStage(settings, scoring_configs(settings), metrics.create(CollectorRegistry()))


def _record(offset: int, **fields: Any) -> InputRecord:
    return keyed(InputRecord("agent-events", 0, offset, 1.0, orjson.dumps({**BASE, **fields})))


def test_batch_writes_each_trace_once_and_emits_in_order() -> None:
    stage = _stage()
    store: dict[bytes, TraceState] = {}
    records, states = stage.process(
        [_record(0, event_id="e1", target="Foo"), _record(1, event_id="e2", tool="read", target="src/Foo.h")],
        store.get,
    )
    assert len(states) == 1
    scored = [orjson.loads(r.value) for r in records if r.topic == "scored-events"]
    assert [o["source_event_id"] for o in scored] == ["e1", "e2"]
    assert round(scored[-1]["score"], 3) == 0.772


@pytest.mark.parametrize("key", [b"another-trace", None, b"TR", "tr\u0301".encode()])
def test_an_event_keyed_otherwise_than_by_its_trace_id_is_dead_lettered(key: bytes | None) -> None:
    """The topics review: a trace's events keyed otherwise (or not at all) reached another partition,
    whose owner scored them against a trace state without the others' (score 0.0, band failed),
    with no dead letter and no log. The key must be the trace_id's UTF-8, byte for byte."""
    records, states = _stage().process(
        [
            _record(0, event_id="e1", target="Foo"),
            dataclasses.replace(_record(1, event_id="e2", tool="read", target="src/Foo.h"), key=key),
        ],
        {}.get,
    )
    (dead,) = [r for r in records if r.topic == "agent-events-dlq"]
    headers = dict(dead.headers or [])
    assert headers["__connect.errors.reason"] == b"wrong_key"
    assert headers["__connect.errors.offset"] == b"1" and dead.key == key
    assert orjson.loads(dead.value)["event_id"] == "e2"  # the record as sent
    scored = [orjson.loads(r.value) for r in records if r.topic == "scored-events"]
    assert [o["source_event_id"] for o in scored] == ["e1"]
    (state,) = states.values()
    assert list(state.remembered) == ["e1"]


def test_a_scorer_failure_dead_letters_that_event_only(monkeypatch: pytest.MonkeyPatch) -> None:
    real_update = evidence.update

    def flaky(state: evidence.EvidenceState, inv: evidence.Invocation, cfg: evidence.EvidenceConfig) -> Any:
        if inv.target == "boom":
            raise RuntimeError("secret -0.0123456789")
        return real_update(state, inv, cfg)

    monkeypatch.setattr(evidence, "update", flaky)
    stage = _stage()
    records, states = stage.process(
        [_record(0, event_id="e1", target="boom"), _record(1, event_id="e2", target="Foo")], {}.get
    )
    dead = [r for r in records if r.topic == "agent-events-dlq"]
    assert len(dead) == 1
    headers = dict(dead[0].headers or [])
    assert headers["__connect.errors.reason"] == b"processing_error"
    assert headers["__connect.errors.exception.class.name"] == b"RuntimeError"
    assert b"0123456789" not in headers["__connect.errors.exception.message"]
    scored = [orjson.loads(r.value) for r in records if r.topic == "scored-events"]
    assert [o["source_event_id"] for o in scored] == ["e2"]
    state = next(iter(states.values()))
    assert "e1" not in state.remembered and "e2" in state.remembered


def test_expiry_clock_is_per_partition_and_a_watermark_over_sources() -> None:
    from datetime import UTC, datetime, timedelta

    from streams.stages.common import ExpiryClock

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    hour = timedelta(hours=1)
    clock = ExpiryClock(max_ahead=hour)
    clock.saw(0, t0 + 10 * hour, source=0)
    clock.saw(0, t0 + 2 * hour, source=1)  # a lagging upstream partition holds the clock back
    clock.saw(1, t0 + 10 * hour)
    assert not clock.passed(0, t0 + 3 * hour)  # oldest source: 2 h, within 3 h
    assert clock.passed(1, t0 + 3 * hour)  # partition 1's own clock: 10 h
    assert not clock.passed(2, t0)  # a partition never seen expires nothing
    clock.saw(1, datetime(2999, 1, 1, tzinfo=UTC))  # far future: bounded by the wall clock + 1 h
    assert not clock.passed(1, datetime.now(UTC) - hour + 3 * hour)
    latest = clock.latest_of(1, 0)
    assert latest is not None and latest <= datetime.now(UTC) + hour
    clock.saw(1, t0 + 11 * hour)  # latest is the last event's time (input alignment), not the newest
    assert clock.latest_of(1, 0) == t0 + 11 * hour
    assert clock.latest_of(0, 1) == t0 + 2 * hour and clock.latest_of(0, 0) == t0 + 10 * hour
    assert clock.latest_of(2, 0) is None


def test_a_quiet_source_leaves_the_watermark_and_a_fresh_partition_waits_for_its_sources() -> None:
    from datetime import UTC, datetime, timedelta

    from streams.stages.common import ExpiryClock

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    hour = timedelta(hours=1)
    wall = [0.0]
    clock = ExpiryClock(max_ahead=hour, source_idle_seconds=60, monotonic=lambda: wall[0])
    clock.saw(0, t0, source=1)  # e.g. the claims stage: one claim, then no more for this partition
    clock.saw(0, t0 + 5 * hour, source=2)
    wall[0] = 30
    assert not clock.passed(0, t0 - hour)  # within the start-up grace: nothing has passed yet
    clock.saw(0, t0 + 5 * hour, source=2)
    wall[0] = 61
    clock.saw(0, t0 + 10 * hour, source=2)
    assert clock.passed(0, t0 + 9 * hour)  # source 1 sent nothing for 61 s: left out
    clock.saw(0, t0 + 6 * hour, source=1)  # it sends again: it holds the watermark again
    assert not clock.passed(0, t0 + 9 * hour) and clock.passed(0, t0 + 5 * hour)
    wall[0] = 500  # every source quiet: the oldest holds
    assert not clock.passed(0, t0 + 9 * hour) and clock.passed(0, t0 + 5 * hour)
    # Heard again after the silence (the partition assigned here again, say): the grace starts again,
    # since source 1, quiet until now, may still send older times than source 2's first.
    clock.saw(0, t0 + 12 * hour, source=2)
    wall[0] = 530
    clock.saw(0, t0 + 12 * hour, source=2)
    assert not clock.passed(0, t0 + 5 * hour)
    wall[0] = 561
    clock.saw(0, t0 + 12 * hour, source=2)
    assert clock.passed(0, t0 + 11 * hour)  # source 1 left out again, after the grace


def test_an_input_remembered_in_a_compressed_block_is_re_emitted_unchanged() -> None:
    from streams.state import REMEMBERED_BLOCK

    stage, store = _stage(), {}
    inputs = [
        _record(i, event_id=f"e{i}", tool="read", target=f"src/f{i}.h") for i in range(REMEMBERED_BLOCK + 5)
    ]
    first: list[dict[str, Any]] = []
    for record in inputs:  # one batch each, as a slow trace arrives
        records, states = stage.process([record], store.get)
        store.update(states)
        first += [orjson.loads(r.value) for r in records if r.topic == "scored-events"]
    state = next(iter(store.values()))
    assert (
        len(state.archived) == 1 and len(state.archived_in) == REMEMBERED_BLOCK and len(state.remembered) == 5
    )
    again, written = stage.process([inputs[3], inputs[-1]], store.get)  # one archived, one recent
    assert written == {}  # nothing changed: nothing written to the changelog again
    scored = [orjson.loads(r.value) for r in again if r.topic == "scored-events"]
    for before, now in zip([first[3], first[-1]], scored, strict=True):
        assert {k: v for k, v in now.items() if k != "scored_at"} == {
            k: v for k, v in before.items() if k != "scored_at"
        }
        # scored_at as a first emission writes it (pydantic: "Z"), only its value differs
        assert now["scored_at"].endswith("Z") and before["scored_at"].endswith("Z")


def test_a_handler_that_fails_leaves_nothing_it_queued_in_the_batch() -> None:
    """Outputs, calibration items and metric updates of a dead-lettered record all go: a scored
    response whose composite then failed must not reach calibration as a subject."""
    settings = load_settings()
    out = Outputs(settings, metrics.create(CollectorRegistry()))
    record = _record(0, event_id="e1")

    def fails_late(record: InputRecord) -> None:
        out.emit({"event_type": "TRACE_SCORED"}, b"k", flagged=True, received_at=1.0)
        out.calibrate("t", 0, CalibrationItem(received_at=1.0))
        out.meter(lambda: None)
        raise RuntimeError("after queueing")

    out.guarded(record, "test", fails_late)
    assert out.calibration == [] and out.metered == []
    assert [r.topic for r in out.records] == [settings.dlq_topic]


def test_a_late_event_never_moves_a_traces_last_event_time_back() -> None:
    """The trace TTL counts from the newest event time seen: an out-of-order event from before must
    not shorten it."""
    stage = _stage()
    store: dict[bytes, TraceState] = {}
    batches = (("e1", "2026-11-22T12:00:00Z"), ("e2", "2026-11-22T10:00:00Z"))
    for offset, (event_id, timestamp) in enumerate(batches):
        record = _record(offset, event_id=event_id, timestamp=timestamp, target="Foo")
        _, states = stage.process([record], store.get)
        store.update(states)
    (state,) = store.values()
    assert state.last_event_time == datetime(2026, 11, 22, 12, tzinfo=UTC)


def test_a_claim_redelivered_after_its_claim_forgot_it_changes_nothing() -> None:
    """Review (thirtieth round): a claim remembers its last 64 inputs' scores. X's first version,
    re-delivered after 64 later versions of X, was applied again: X went back to the first version
    (contradicting Y again) and X and Y were re-emitted with new scores; a later supporter of Y then
    read Y penalised (0.82). Stage 1 remembers every input of a live trace and now marks the
    re-delivery, and the claim stage never applies a marked input."""
    settings = load_settings()
    configs = scoring_configs(settings)
    trace = TraceStage(settings, configs, metrics.create(CollectorRegistry()))
    claims = ClaimStage(settings, configs, metrics.create(CollectorRegistry()))
    traces: dict[bytes, TraceState] = {}
    nodes: dict[bytes, ClaimNode] = {}

    def run(offset: int, event_id: str, minute: int, **fields: Any) -> list[dict[str, Any]]:
        body = {
            **BASE,
            "event_type": "CLAIM",
            "event_id": event_id,
            "timestamp": f"2026-11-22T{10 + minute // 60:02d}:{minute % 60:02d}:00Z",
            "statement": "s",
            "tier": "task",
            **fields,
        }
        body.pop("tool"), body.pop("status")
        sent, states = trace.process(
            [keyed(InputRecord("agent-events", 0, offset, 1.0, orjson.dumps(body)))], traces.get
        )
        traces.update(states)
        forwarded = [
            InputRecord(r.topic, r.partition or 0, 0, 1.0, r.value)
            for r in sent
            if r.topic == settings.claims_topic
        ]
        out, writes = claims.process(forwarded, nodes.get)
        nodes.update({key: write.node for key, write in writes.items()})
        return [orjson.loads(r.value) for r in [*sent, *out] if r.topic == settings.scored_topic]

    def provenance(confidence: float) -> list[dict[str, Any]]:
        return [{"source_type": "agent", "confidence": confidence}]

    contradicts_y = [{"type": "contradicts", "target": "Y", "strength": 1.0}]
    run(0, "y", 0, claim_id="Y", provenance=provenance(0.8))
    first = run(1, "x0", 1, claim_id="X", provenance=provenance(0.9), relationships=contradicts_y)
    assert [o["claim_id"] for o in first] == ["X", "Y"]
    for i in range(1, 65):
        run(1 + i, f"x{i}", 1 + i, claim_id="X", provenance=provenance(0.5))
    before = dict(nodes)

    assert run(1, "x0", 1, claim_id="X", provenance=provenance(0.9), relationships=contradicts_y) == []
    assert nodes == before
    supporter = run(
        66,
        "z",
        70,
        claim_id="Z",
        provenance=provenance(0.6),
        relationships=[{"type": "supports", "target": "Y", "strength": 1.0}],
    )
    y = next(o for o in supporter if o["claim_id"] == "Y")
    assert y["interval"]["factors"]["contradiction_penalty"] == 1.0


def test_a_claim_message_written_before_the_mark_existed_is_applied() -> None:
    """Review (thirtieth round, mutations): claim messages already in the claims topic when the worker
    is upgraded carry no `redelivered`; read as unmarked, they are applied as before, not dropped."""
    settings = load_settings()
    configs = scoring_configs(settings)
    body = {
        **BASE,
        "event_type": "CLAIM",
        "event_id": "c1",
        "claim_id": "X",
        "statement": "s",
        "tier": "task",
    }
    body.pop("tool"), body.pop("status")
    sent, _ = _stage().process([keyed(InputRecord("agent-events", 0, 0, 1.0, orjson.dumps(body)))], {}.get)
    (message,) = (r for r in sent if r.topic == settings.claims_topic)
    old = orjson.loads(message.value or b"")
    assert old.pop("redelivered") is False
    claims = ClaimStage(settings, configs, metrics.create(CollectorRegistry()))
    out, writes = claims.process([InputRecord(message.topic, 0, 0, 1.0, orjson.dumps(old))], {}.get)
    assert [orjson.loads(r.value)["claim_id"] for r in out if r.topic == settings.scored_topic] == ["X"]
    assert list(writes)  # X's node is kept


def test_with_two_input_topics_one_read_ahead_does_not_expire_the_traces_waiting_in_the_other() -> None:
    """Several-input-topics review: the topics sharing a partition number shared one expiry clock, so
    topic A read 24.5 h ahead expired trace T while T's next event waited unread in topic B (scored
    0.55 as a lone read instead of 0.772 with its find). Each topic is a source of the partition's
    clock now; a topic quiet past EXPIRY_SOURCE_IDLE_SECONDS no longer holds it back."""
    from datetime import timedelta

    from streams.stages.common import ExpiryClock

    settings = load_settings(input_topics="in-a,in-b")
    stage = TraceStage(settings, scoring_configs(settings), metrics.create(CollectorRegistry()))
    wall = [0.0]
    stage.clock = ExpiryClock(
        stage.clock.max_ahead, settings.expiry_source_idle_seconds, monotonic=lambda: wall[0]
    )
    store: dict[bytes, TraceState] = {}
    t0 = datetime(2026, 11, 1, 10, tzinfo=UTC)

    def run(topic: str, hours: float, **fields: Any) -> list[dict[str, Any]]:
        moment = (t0 + timedelta(hours=hours)).isoformat()
        record = keyed(InputRecord(topic, 0, 0, 1.0, orjson.dumps({**BASE, "timestamp": moment, **fields})))
        records, states = stage.process([record], store.get)
        store.update(states)
        return [orjson.loads(r.value) for r in records if r.topic == "scored-events"]

    idle = settings.expiry_source_idle_seconds
    run("in-a", 0, event_id="a1", trace_id="T", target="Foo")
    wall[0] = 0.6 * idle  # both topics deliver, each within the idle span of the last
    run("in-a", 0.5, event_id="a0", trace_id="other-a0", target="Baz")
    run("in-b", 0.5, event_id="b0", trace_id="other-b", target="Baz")
    wall[0] = 1.2 * idle  # past the clock's start-up grace; topic A reads on, 24.5 h ahead
    run("in-a", 24.5, event_id="a2", trace_id="other-a", target="Bar")
    trace = store[b'["t","T"]']
    assert not stage.expired(trace)  # topic B is at T0 + 0.5 h: T's next event may still be there
    (scored,) = run("in-b", 1, event_id="b1", trace_id="T", tool="read", target="src/Foo.h")
    assert round(scored["score"], 3) == 0.772
    # Topic B goes quiet for good, topic A goes on: A alone moves the clock once B has been quiet
    # longer than the idle span.
    quiet_since = wall[0]
    for step, hours in ((0.6, 30), (1.2, 50)):
        wall[0] = quiet_since + step * idle
        run("in-a", hours, event_id=f"a-{hours}", trace_id=f"other-{hours}", target="Qux")
    assert stage.expired(store[b'["t","T"]'])


def test_one_input_topic_named_twice_is_one_topic_with_the_plain_clock() -> None:
    """The diff review: `INPUT_TOPICS=a,a` counted as two topics and switched on the several-topics
    clock (nothing swept for EXPIRY_SOURCE_IDLE_SECONDS after a start)."""
    settings = load_settings(input_topics="agent-events, agent-events")
    assert settings.input_topic_names == ("agent-events",)
    stage = TraceStage(settings, scoring_configs(settings), metrics.create(CollectorRegistry()))
    assert stage.clock.source_idle_seconds is None


def test_with_two_input_topics_the_later_stages_count_each_topics_partition_as_a_source() -> None:
    """The later stages' clocks counted stage 1's partition number as one source, so topic A read
    ahead moved them past what topic B's backlog still sends (the calibration stage swept outcomes
    still waiting for B's scores; alignment lets A run up to 2 h ahead, an outcome waits 1 h)."""
    from datetime import timedelta

    from streams.stages import AgentStage
    from streams.stages.common import INPUT_SOURCE_STRIDE, key_partition
    from streams.state import table_key

    settings = load_settings(input_topics="in-a,in-b")
    configs, registry = scoring_configs(settings), metrics.create(CollectorRegistry())
    stage1, stage2 = TraceStage(settings, configs, registry), AgentStage(settings, configs, registry)
    stage2.clock = ExpiryClock(stage2.clock.max_ahead)  # no idle grace: the sources decide
    t0 = datetime(2026, 11, 1, 10, tzinfo=UTC)
    n = settings.topic_partitions
    agents = [f"agent-{i}" for i in range(50)]
    a_agent = agents[0]
    b_agent = next(
        a
        for a in agents[1:]
        if key_partition(table_key("t", a), n) == key_partition(table_key("t", a_agent), n)
    )
    response = {
        **BASE, "event_type": "LLM_RESPONSE", "request_id": "q", "model": "m", "endpoint": "e", "response": "ok",
    }  # fmt: skip
    sources = []
    for topic, agent, hours in (("in-a", a_agent, 30), ("in-b", b_agent, 0)):
        moment = (t0 + timedelta(hours=hours)).isoformat()
        event = {**response, "event_id": f"{topic}-r", "agent_name": agent, "timestamp": moment}
        records, _ = stage1.process([keyed(InputRecord(topic, 0, 0, 1.0, orjson.dumps(event)))], {}.get)
        (forwarded,) = [r for r in records if r.topic == settings.responses_topic]
        sources.append(orjson.loads(forwarded.value)["source_partition"])
        pending = InputRecord(settings.responses_topic, forwarded.partition or 0, 0, 1.0, forwarded.value)
        stage2.process([pending], lambda key: None, lambda key: None)
    assert sources == [0, INPUT_SOURCE_STRIDE]
    responses_partition = key_partition(table_key("t", a_agent), n)
    assert not stage2.clock.passed(responses_partition, t0 + timedelta(hours=1))  # topic B holds it
    assert stage2.clock.passed(responses_partition, t0 - timedelta(hours=1))
