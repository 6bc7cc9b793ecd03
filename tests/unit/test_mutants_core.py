"""Hand mutation review of the reliability core (streams/agents.py, recovery.py, app.py, lag.py).

Each test here kills a mutant that the other unit tests let through; the docstrings name it. The agents'
timers are driven offline: `attach_agents` runs on a real app whose `timer` decorator is replaced by one
that keeps the function, and `stop_worker`'s delayed exit is recorded instead of taken.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from faust.tables.recovery import ServiceStopped
from faust.types import TP

import streams.batch_runner
from streams.agents import _writer, attach_agents
from streams.app import Service, SourcePartitionedTable, create_app
from streams.batch_runner import BatchRunner
from streams.config import Settings, load_settings
from streams.decoded_states import ClaimFacts, DecodedStates
from streams.events import ClaimEvent
from streams.recovery import SeekThenResumeRecovery
from streams.scoring.claim_graph import ClaimArrived, ClaimNode
from streams.stages import InputRecord
from streams.stages.calibration import subject_key, upstream
from streams.stages.claims import claim_message
from streams.stages.common import ExpiryClock
from streams.stages.history import HistoryWrite
from streams.stages.trace import claim_definition
from streams.state import (
    AgentHistory,
    CalibrationItem,
    CalibrationMessage,
    GroupCalibration,
    HistoryHour,
    HourBucket,
    SubjectEntry,
    TraceState,
    encode_history_hour,
    table_key,
)
from tests.unit.stage_records import keyed
from tests.unit.test_calibration_stage import DAY, TENANT, _outcome, _score
from tests.unit.test_claim_node_bound import _claim, _supports
from tests.unit.test_history_stage import EXAMPLE, _response

ROOT = Path(__file__).parents[2]

_Timer = Callable[[], Awaitable[None]]


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """stop_worker's delayed os._exit, recorded instead."""
    calls: list[str] = []
    monkeypatch.setattr(streams.batch_runner, "_exit_now", lambda: calls.append("exit"))
    return calls


def _attached(
    monkeypatch: pytest.MonkeyPatch, **settings: Any
) -> tuple[Service, dict[str, _Timer], list[BatchRunner]]:
    """A real app with the agents attached; its timers by name, and the runners the sweep sent through."""
    svc, timers, sent, _ = _attached_with_facts(monkeypatch, **settings)
    return svc, timers, sent


def _attached_with_facts(
    monkeypatch: pytest.MonkeyPatch, **settings: Any
) -> tuple[Service, dict[str, _Timer], list[BatchRunner], ClaimFacts]:
    """`_attached`, and the claim agent's neighbour facts cache (which `attach_agents` returns)."""
    svc = create_app(load_settings(**settings))
    timers: dict[str, _Timer] = {}

    def timer(interval: float, **_: Any) -> Callable[[_Timer], _Timer]:
        def keep(fun: _Timer) -> _Timer:
            timers[fun.__name__] = fun
            return fun

        return keep

    sent: list[BatchRunner] = []
    monkeypatch.setattr(svc.app, "timer", timer)
    monkeypatch.setattr(BatchRunner, "send_table_changes", lambda runner: sent.append(runner))
    facts = attach_agents(svc)
    return svc, timers, sent, facts


def _recovery(svc: Service) -> SeekThenResumeRecovery:
    recovery = svc.app.tables.recovery
    assert isinstance(recovery, SeekThenResumeRecovery)
    return recovery


# streams/agents.py: the offset-commit watchdog


@pytest.mark.parametrize(("over", "stops"), [(0.0, False), (0.5, True)])
async def test_the_commit_watchdog_stops_the_worker_only_past_the_send_timeout(
    monkeypatch: pytest.MonkeyPatch, exits: list[str], over: float, stops: bool
) -> None:
    """Mutants: the check removed, `>` turned into `<` or `>=`. A commit running longer than
    SEND_TIMEOUT_SECONDS must stop the worker (offsets would stay put with /healthz "ok"); one that has
    run exactly that long must not."""
    svc, timers, _ = _attached(monkeypatch, send_timeout_seconds=4.0, fatal_exit_delay_seconds=0.0)
    svc.app.consumer = SimpleNamespace(commit_running_for=lambda: 4.0 + over)
    await timers["watch_offset_commits"]()
    await asyncio.sleep(0.01)
    if stops:
        assert svc.health.fatal is not None and "offset commit has not finished in 4 s" in svc.health.fatal
        assert exits == ["exit"]
    else:
        assert svc.health.fatal is None and exits == []


async def test_the_commit_watchdog_leaves_an_idle_consumer_alone(
    monkeypatch: pytest.MonkeyPatch, exits: list[str]
) -> None:
    svc, timers, _ = _attached(monkeypatch, send_timeout_seconds=4.0)
    svc.app.consumer = SimpleNamespace(commit_running_for=lambda: 0.0)
    await timers["watch_offset_commits"]()
    assert svc.health.fatal is None


# streams/agents.py: the expiry sweep's guards and its failure


def _ready(svc: Service) -> SeekThenResumeRecovery:
    recovery = _recovery(svc)
    recovery.completed.set()
    svc.app.rebalancing = False
    return recovery


async def test_a_failing_sweep_stops_the_worker(monkeypatch: pytest.MonkeyPatch, exits: list[str]) -> None:
    """Mutant: the `except` that calls stop_worker removed (the timer's exception would crash the app
    through Faust's graceful shutdown, /healthz "ok" meanwhile)."""
    svc, timers, _ = _attached(monkeypatch, fault_injection="sweep:expiry:1", fatal_exit_delay_seconds=0.0)
    _ready(svc)
    await timers["sweep_expired_state"]()
    await asyncio.sleep(0.01)
    assert svc.health.fatal is not None and svc.health.fatal.startswith("the expiry sweep failed")
    assert exits == ["exit"]


@pytest.mark.parametrize("state", ["recovering", "rebalancing"])
async def test_no_sweep_while_partitions_move(
    monkeypatch: pytest.MonkeyPatch, exits: list[str], state: str
) -> None:
    """Mutants: each condition of the sweep's guard dropped or flipped. A sweep before the tables are
    restored (or while partitions move) would look at partitions this worker may not own."""
    svc, timers, _ = _attached(monkeypatch, fault_injection="sweep:expiry:1")
    _ready(svc)
    if state == "recovering":
        _recovery(svc).completed.clear()
    else:
        svc.app.rebalancing = True
    await timers["sweep_expired_state"]()
    assert svc.health.fatal is None  # the fault (raised by any sweep) was not reached


def _trace(partition: int, when: datetime) -> bytes:
    return (
        TraceState(tenant_id="t", trace_id=f"x{partition}", partition=partition, last_event_time=when)
        .model_dump_json()
        .encode()
    )


def _expired_traces(svc: Service) -> tuple[str, datetime]:
    """Two traces idle past their TTL, on partitions 0 and 1; this worker owns partition 0 only."""
    topic = svc.traces.changelog_topic.get_topic_name()
    old = datetime(2026, 11, 20, tzinfo=UTC)
    svc.traces.set_from(b"t/x0", _trace(0, old), 0)
    svc.traces.set_from(b"t/x1", _trace(1, old), 1)
    svc.traces.take_changelog()
    now = old + timedelta(hours=svc.settings.trace_ttl_hours + 1)
    for partition in (0, 1):
        svc.trace_stage.clock.saw(partition, now)
    _recovery(svc).actives_for_table[svc.traces] = {TP(topic, 0)}
    return topic, now


async def test_the_sweep_deletes_expired_owned_state_and_sends_it_through_every_runner(
    monkeypatch: pytest.MonkeyPatch, exits: list[str]
) -> None:
    """Mutants: the trace deletion, the ownership check or the sends to the runners removed. An expired
    trace of an owned partition leaves the table with a tombstone for its source partition, which the
    sweep hands to the runners (ordered with the batches); a standby partition's trace stays."""
    svc, timers, sent = _attached(monkeypatch, topic_partitions=2)
    topic, _ = _expired_traces(svc)
    _ready(svc)
    await timers["sweep_expired_state"]()
    assert svc.health.fatal is None
    assert dict(svc.traces.items()).keys() == {b"t/x1"}
    [tombstone] = svc.traces.take_changelog()
    assert (tombstone.topic, tombstone.key, tombstone.value, tombstone.partition) == (topic, b"t/x0", None, 0)
    assert [runner.agent for runner in sent] == [
        "score-events",
        "score-responses",
        "score-claims",
        "calibrate",
    ]
    assert svc.metrics.table_keys.labels("traces")._value.get() == 0  # owned partition 0: none left


async def test_no_sweep_once_the_worker_is_stopping(
    monkeypatch: pytest.MonkeyPatch, exits: list[str]
) -> None:
    """Mutant: `svc.health.fatal is not None` dropped from the guard. Once a batch failed nothing more
    may change: the sweep would delete state (in memory) whose deletion is never sent."""
    svc, timers, sent = _attached(monkeypatch, topic_partitions=2)
    _expired_traces(svc)
    _ready(svc)
    svc.health.fatal = "a batch failed"
    await timers["sweep_expired_state"]()
    assert dict(svc.traces.items()).keys() == {b"t/x0", b"t/x1"}
    assert sent == []


def _own_partition_0(svc: Service, *tables: SourcePartitionedTable) -> None:
    """This worker owns partition 0 (the only one, TOPIC_PARTITIONS=1) of each of `tables`."""
    for table in tables:
        _recovery(svc).actives_for_table[table] = {TP(table.changelog_topic.get_topic_name(), 0)}


CLAIM_T0 = datetime(2026, 9, 1, tzinfo=UTC)  # CLAIM_TTL_DAYS is 30 (README)


def _claim_on(day: int, n: int, claim_id: str, **fields: Any) -> dict[str, Any]:
    return {**_claim(n, claim_id, **fields), "timestamp": (CLAIM_T0 + timedelta(days=day)).isoformat()}


def _feed_claims(svc: Service, *events: dict[str, Any]) -> None:
    """Each CLAIM input through stage 3 as the claim agent runs it, its nodes stored with `set_from`."""
    nodes = DecodedStates(svc.claims, ClaimNode)
    for offset, event in enumerate(events):
        claim = ClaimEvent.model_validate(event)
        arrived = ClaimArrived(
            definition=claim_definition(claim), source_event_id=claim.event_id, event_time=claim.timestamp
        )
        source = InputRecord("agent-events", 0, offset, 1.0, orjson.dumps(event))
        made = claim_message(svc.settings, claim.tenant_id, arrived, source)
        record = InputRecord(made.topic, made.partition or 0, offset, 1.0, made.value)
        _, written = svc.claim_stage.process([record], nodes.load, nodes)
        for key, write in written.items():
            svc.claims.set_from(key, nodes.encode(key, write.node), write.partition)


async def test_the_sweep_deletes_an_expired_claim_and_its_entry_in_the_live_claim_it_supported(
    monkeypatch: pytest.MonkeyPatch, exits: list[str]
) -> None:
    """Mutants: the claim rewrites, the deletion of expired claims, or `write_claim`'s
    `claim_facts.forget` removed. x supports t; t is re-sent on day 20, x never again: on day 31 x is past
    CLAIM_TTL_DAYS and goes, and t (alive) is rewritten without x's edge, or a new x would take it over.
    The claim view's cached facts of t must not keep t's replaced bytes."""
    svc, timers, _, facts = _attached_with_facts(monkeypatch, topic_partitions=1)
    svc.claim_stage.clock = ExpiryClock(timedelta(hours=1))  # one source: no idle-source grace
    x, t, other = (orjson.dumps(["t", claim_id]) for claim_id in ("x", "t", "other"))
    _feed_claims(
        svc,
        _claim_on(0, 0, "x", relationships=[_supports("t", 1.0)]),
        _claim_on(0, 1, "t"),
        {**_claim_on(20, 2, "t"), "statement": "t v2"},
        _claim_on(31, 5, "other"),  # the tenant's event time: day 31
    )
    assert set(ClaimNode.model_validate_json(svc.claims[t]).incoming) == {"x"}  # the premise
    assert facts.get(t) is not None  # the claim view read t: its facts are cached
    svc.claims.take_changelog()
    _own_partition_0(svc, svc.claims)
    _ready(svc)
    await timers["sweep_expired_state"]()
    assert svc.health.fatal is None
    assert set(dict(svc.claims.items())) == {t, other}
    assert ClaimNode.model_validate_json(svc.claims[t]).incoming == {}
    assert [(r.key, r.value is None) for r in svc.claims.take_changelog()] == [(t, False), (x, True)]
    assert t not in facts._facts  # the old bytes of t are not held by the cache


HISTORY_T0 = datetime(2026, 11, 1, tzinfo=UTC)


def _feed_responses(svc: Service, *responses: dict[str, object]) -> None:
    """Each LLM_RESPONSE through stage 1 and stage 2 as the agents run them; the history tables written
    through the history agent's writer."""
    states: dict[str, DecodedStates[Any]] = {
        "summary": DecodedStates(svc.agents_history, AgentHistory),
        "hours": DecodedStates(svc.agent_history_hours, HistoryHour, encoder=encode_history_hour),
    }
    write = _writer(states)
    for offset, event in enumerate(responses):
        record = keyed(InputRecord(svc.settings.input_topic_names[0], 0, offset, 1.0, orjson.dumps(event)))
        out, _ = svc.trace_stage.process([record], lambda key: None)
        forwarded = next(r.value for r in out if r.topic == svc.settings.responses_topic)
        response = InputRecord(svc.settings.responses_topic, 0, offset, 1.0, forwarded)
        _, writes = svc.agent_stage.process([response], states["summary"].load, states["hours"].load)
        for key, history_write in writes.items():
            write(key, history_write)


async def test_the_sweep_deletes_a_silent_agents_summary_and_every_chunk_of_its_hours(
    monkeypatch: pytest.MonkeyPatch, exits: list[str]
) -> None:
    """Mutants: the deletion of the history's chunks, or of its summary, removed. An agent silent past
    HISTORY_RETENTION_HOURS leaves both tables whole (agent names need not be a fixed set); an agent
    heard within it keeps its history."""
    svc, timers, _ = _attached(
        monkeypatch,
        topic_partitions=1,
        history_retention_hours=2,
        history_window_hours=1,
        history_chunk_bytes=700,
    )
    svc.agent_stage.clock = ExpiryClock(timedelta(hours=1))
    old = [_response(f"old-{i}", HISTORY_T0 + timedelta(minutes=10 * i), True, "a") for i in range(12)]
    _feed_responses(svc, *old, _response("new", HISTORY_T0 + timedelta(hours=5), True, "b"))
    gone, kept = table_key(EXAMPLE["tenant_id"], "a"), table_key(EXAMPLE["tenant_id"], "b")
    summary = AgentHistory.model_validate_json(svc.agents_history[gone])
    chunks = set(svc.agent_stage.expired_keys(summary))
    assert len(chunks) > 2 and chunks < set(svc.agent_history_hours.keys())  # the premise
    _own_partition_0(svc, svc.agents_history, svc.agent_history_hours)
    _ready(svc)
    await timers["sweep_expired_state"]()
    assert svc.health.fatal is None
    assert set(svc.agents_history.keys()) == {kept}  # newest 01:50 + 2 h < 05:00
    kept_summary = AgentHistory.model_validate_json(svc.agents_history[kept])
    assert set(svc.agent_history_hours.keys()) == set(svc.agent_stage.expired_keys(kept_summary))


async def test_the_sweep_rewrites_a_kept_score_entry_then_deletes_it_with_its_expired_groups(
    monkeypatch: pytest.MonkeyPatch, exits: list[str]
) -> None:
    """Mutants: the rewrite of a kept subject entry, the deletion of a subject entry, or the
    `group_expired` check (flipped) removed. A score and its outcome, one-hour windows: past the score's
    join window the entry keeps only the counted outcome id (until that outcome's hour of waiting ends,
    so a re-delivered one stays a duplicate); past that it goes; once the newest outcome's hour left
    CALIBRATION_WINDOW_HOURS its groups and their hour buckets go too."""
    svc, timers, _ = _attached(
        monkeypatch, topic_partitions=1, calibration_window_hours=1, calibration_join_window_hours=1
    )
    stage = svc.calibration_stage
    stage.clock = ExpiryClock(timedelta(hours=1), None)  # one source: no idle wait before sweeping
    offsets = iter(range(100))

    def feed(*items: CalibrationItem) -> None:
        message = CalibrationMessage(tenant_id=TENANT, items=list(items), source=upstream("trace", 0))
        record = InputRecord("calibration", 0, next(offsets), 1.0, message.model_dump_json().encode())
        states: dict[str, DecodedStates[Any]] = {
            "subjects": DecodedStates(svc.calibration_subjects, SubjectEntry),
            "groups": DecodedStates(svc.calibration_groups, GroupCalibration),
            "hours": DecodedStates(svc.calibration_hours, HourBucket),
        }
        _, writes = stage.process([record], lambda table, key: states[table].load(key))
        write = _writer(states)
        for key, calibration_write in writes.items():
            write(key, calibration_write)

    base = -3 * DAY  # in the past: event times are bounded by the wall clock
    feed(_score("r1", base), _outcome("o1", "r1", base + 10))  # joined; o1's hour of waiting ends at +70
    key = subject_key(TENANT, "response", "r1")
    assert len(svc.calibration_groups) > 0 and len(svc.calibration_hours) > 0  # the premise
    _own_partition_0(svc, svc.calibration_subjects, svc.calibration_groups, svc.calibration_hours)
    _ready(svc)

    feed(_score("clock-1", base + 65))  # past the score's join window (+60), within o1's wait
    await timers["sweep_expired_state"]()
    kept = SubjectEntry.model_validate_json(svc.calibration_subjects[key])
    assert (kept.subject, kept.applied) == (None, ("o1",))
    assert len(svc.calibration_groups) > 0  # newest outcome +10: the window holds it until +130

    feed(_score("clock-2", base + 131))
    await timers["sweep_expired_state"]()
    assert svc.health.fatal is None
    assert key not in svc.calibration_subjects
    assert len(svc.calibration_groups) == 0 and len(svc.calibration_hours) == 0


class _Backlogged:
    """Stage 1's input partition and a later stage's, `unread` records behind on the latter."""

    def __init__(self, settings: Settings) -> None:
        self.input = TP(settings.input_topic_names[0], 0)
        self.internal = TP(settings.internal_topics[0], 0)
        self.unread = 0
        self.paused: set[TP] = set()
        self._read_offset: dict[TP, int] = {}
        self._committed_offset = {self.internal: 0}

    def assignment(self) -> set[TP]:
        return {self.input, self.internal}

    def highwater(self, tp: TP) -> int | None:
        return self.unread if tp == self.internal else None

    def pause_partitions(self, tps: set[TP]) -> None:
        self.paused |= tps

    def resume_partitions(self, tps: set[TP]) -> None:
        self.paused -= tps


@pytest.mark.parametrize("agent", ["score-responses", "score-claims", "calibrate"])
async def test_a_later_stage_batch_lets_held_input_flow_again_at_once(
    monkeypatch: pytest.MonkeyPatch, exits: list[str], agent: str
) -> None:
    """Mutant: `later_stage` no longer calls `alignment.check`. Input held back while the later stages
    lag (INTERNAL_BACKLOG_MAX_RECORDS) must flow again as soon as a later stage's batch leaves the
    backlog at most half the bound, not on the next tick: those stages would run out of work."""
    svc, timers, _ = _attached(monkeypatch, internal_backlog_max_records=100)
    processes: dict[str, Callable[[list[InputRecord]], object]] = {}

    async def run(
        runner: BatchRunner, stream: Any, process: Callable[[list[InputRecord]], object], *_: Any
    ) -> None:
        processes[runner.agent] = process

    monkeypatch.setattr(BatchRunner, "run", run)
    await svc.app.agents[agent].fun(None)
    consumer = _Backlogged(svc.settings)
    svc.app.consumer = consumer
    svc.app.rebalancing = False
    consumer.unread = 101
    await timers["check_input_alignment"]()  # the timer
    assert consumer.paused == {consumer.input}  # the premise: held back
    consumer.unread = 50
    processes[agent]([])
    assert consumer.paused == set()


# streams/recovery.py


async def test_a_recovery_step_cut_short_by_a_stop_is_not_reported_as_a_timeout() -> None:
    """Mutant: `should_stop or timeout is None` -> `and`. A worker stopped (SIGTERM) while a recovery step
    with a timeout waits would be reported as a failed recovery and exit 70 instead of stopping."""
    svc = create_app(load_settings())
    recovery = _recovery(svc)
    reasons: list[str] = []
    recovery.on_failure = reasons.append
    recovery._stopped.set()
    with pytest.raises(ServiceStopped):
        await recovery._wait(asyncio.sleep(5), timeout=5)
    assert reasons == []


class _Consumer:
    """One stream and one changelog partition, paused; records seeks, resumes and the flow."""

    def __init__(self, changelog_topic: str, app: Any = None, rebalance_during_seek: bool = False) -> None:
        self.calls: list[str] = []
        self.paused = {TP("agent-events", 0), TP(changelog_topic, 0)}
        self.app = app
        self.rebalance_during_seek = rebalance_during_seek
        self.hang_seek = False

    def assignment(self) -> set[TP]:
        return set(self.paused)

    async def perform_seek(self) -> None:
        if self.hang_seek:
            await asyncio.sleep(3600)
        self.calls.append("seek")

    async def seek_to_committed(self) -> dict[TP, int | None]:
        if self.rebalance_during_seek:
            self.app.rebalancing_count += 1
        return {TP("agent-events", 0): 5}

    def resume_partitions(self, partitions: set[TP]) -> None:
        self.calls.append("resume")
        self.paused -= partitions

    def resume_flow(self) -> None:
        self.calls.append("resume_flow")


async def _noop() -> None:
    return None


def _flowing(svc: Service, monkeypatch: pytest.MonkeyPatch, **consumer: Any) -> _Consumer:
    recording = _Consumer(svc.traces.changelog_topic.get_topic_name(), svc.app, **consumer)
    svc.app.consumer = recording
    monkeypatch.setattr(svc.app, "_fetcher", SimpleNamespace(maybe_start=_noop), raising=False)
    svc.app.consumer_generation_id = 3
    svc.app.rebalancing = True
    return recording


@pytest.mark.parametrize("path", ["restored", "nothing to restore"])
async def test_a_finished_recovery_resumes_the_flow_and_announces_the_worker_ready(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Mutants in `_start_flow` (no `completed.set()`, no `resume_flow()`, the standby flag flipped):
    /readyz reads `recovery.completed`, the sweep waits for it, and the consumer's flow must resume."""
    svc = create_app(load_settings())
    recovery = _recovery(svc)
    consumer = _flowing(svc, monkeypatch)
    if path == "restored":
        await recovery.on_recovery_completed(generation_id=3)
    else:
        await recovery._resume_streams(generation_id=3)
    assert consumer.calls == ["seek", "resume", "resume_flow"]
    assert recovery.completed.is_set()
    assert svc.app.tables.actives_ready and svc.app.tables.standbys_ready  # no standbys assigned
    assert svc.app.rebalancing is False


@pytest.mark.parametrize("path", ["restored", "nothing to restore"])
@pytest.mark.parametrize("why", ["older generation", "rebalance during the seek"])
async def test_a_recovery_overtaken_by_a_rebalance_neither_resumes_nor_announces_ready(
    monkeypatch: pytest.MonkeyPatch, path: str, why: str
) -> None:
    """Mutants: the generation check flipped, or the seek's False ("another rebalance began") ignored:
    the worker would report ready and let records flow into tables the next recovery still restores."""
    svc = create_app(load_settings())
    recovery = _recovery(svc)
    consumer = _flowing(svc, monkeypatch, rebalance_during_seek=why == "rebalance during the seek")
    generation = 2 if why == "older generation" else 3
    if path == "restored":
        await recovery.on_recovery_completed(generation_id=generation)
    else:
        await recovery._resume_streams(generation_id=generation)
    assert "resume_flow" not in consumer.calls and "resume" not in consumer.calls
    assert not recovery.completed.is_set()
    assert svc.app.rebalancing is True


async def test_a_seek_the_broker_never_answers_stops_the_worker_instead_of_hanging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mutant: `perform_seek` awaited without BROKER_REQUEST_TIMEOUT. The recovery would wait for ever
    with the streams paused; instead the step's timeout is reported (the worker stops, exit 70)."""
    svc = create_app(load_settings())
    svc.app.conf.broker_request_timeout = 0.05
    recovery = _recovery(svc)
    reasons: list[str] = []
    recovery.on_failure = reasons.append
    consumer = _flowing(svc, monkeypatch)
    consumer.hang_seek = True
    with pytest.raises(ServiceStopped):
        await asyncio.wait_for(recovery._seek_then_resume_streams(), 2.0)
    assert len(reasons) == 1 and "took longer than 0.05 s" in reasons[0]
    assert "resume" not in consumer.calls


async def test_a_recovery_that_cannot_finish_stops_the_worker_it_was_attached_to(
    monkeypatch: pytest.MonkeyPatch, exits: list[str]
) -> None:
    """Mutant: `attach_agents` no longer wires the recovery's `on_failure` to `stop_worker`: a recovery
    step that times out would only be logged, the streams paused and /healthz "ok"."""
    svc, _, _ = _attached(monkeypatch, fatal_exit_delay_seconds=0.0)
    _recovery(svc)._failed("a table recovery step took longer than 1 s")
    await asyncio.sleep(0.01)
    assert svc.health.fatal == "a table recovery step took longer than 1 s"
    assert exits == ["exit"]


def test_a_stage_write_stores_its_value_and_a_none_deletes_it_to_the_source_partition() -> None:
    """Mutant: `_writer`'s `value is None` check flipped: every write would become a delete (and every
    delete a write of None). The history and calibration agents write their tables through it."""
    svc = create_app(load_settings(topic_partitions=4))
    states: dict[str, DecodedStates[Any]] = {"summary": DecodedStates(svc.agents_history, AgentHistory)}
    write = _writer(states)
    topic = svc.agents_history.changelog_topic.get_topic_name()
    summary = AgentHistory(tenant_id="t", agent_name="a", agent_type="planner")
    write(b"t/a", HistoryWrite("summary", summary, 2))
    assert states["summary"].load(b"t/a") == summary
    write(b"t/a", HistoryWrite("summary", None, 2))
    assert b"t/a" not in svc.agents_history and states["summary"].load(b"t/a") is None
    assert [(r.topic, r.key, r.value is None, r.partition) for r in svc.agents_history.take_changelog()] == [
        (topic, b"t/a", False, 2),
        (topic, b"t/a", True, 2),
    ]


# streams/app.py


def test_the_app_reads_from_the_beginning_takes_no_environment_and_fills_the_internal_topics_gaps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mutants: `earliest` turned into `latest`, `env={}` dropped (Faust's own variables then override
    the validated settings), the gapless internal topics emptied, a table left off the app. A new group
    that started at the end would skip every input written before it."""
    monkeypatch.setenv("CONSUMER_AUTO_OFFSET_RESET", "latest")
    monkeypatch.setenv("BROKER_MAX_POLL_RECORDS", "100000")
    settings = load_settings()
    svc = create_app(settings)
    assert svc.app.conf.consumer_auto_offset_reset == "earliest"
    assert svc.app.conf.broker_max_poll_records == settings.batch_size
    assert svc.app.conf.stream_buffer_maxsize == 2 * settings.batch_size
    assert svc.app.gapless_topics == frozenset(settings.internal_topics) != frozenset()
    assert svc.app.tables["traces"] is svc.traces and svc.app.tables["claims"] is svc.claims


# The graceful stop's deadline exiting 70: tests/unit/test_shutdown_deadline.py.


def test_a_key_written_through_set_from_keeps_no_partition_for_a_later_write() -> None:
    """Mutant: the `finally` that forgets the key's source partition removed. A later write outside
    `set_from` would go silently to the old partition instead of being refused (and every key ever
    written would stay in the map)."""
    svc = create_app(load_settings(topic_partitions=4))
    svc.traces.set_from(b"acme/t1", b"{}", partition=3)
    with pytest.raises(TypeError, match="no changelog partition"):
        svc.traces[b"acme/t1"] = b"{}"
