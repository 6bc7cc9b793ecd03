"""Stage 2's agent history (a summary of hour counts + one key per hour) against a brute-force reference.

Responses arrive in shuffled event-time order and some are re-delivered; after every input the history
factor and the success-rate gauge must equal seed 004's rule computed over every distinct response
applied before it and still retained, the stored hours must be sorted, hold each event id once, agree
with the summary's counts, and hours wholly past the retention horizon must be deleted. A history
stored in the old format (one list of entries, possibly unsorted) must be read and split by hour.
"""

from __future__ import annotations

import itertools
import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from streams import metrics
from streams.config import Settings, load_settings, scoring_configs
from streams.events import LlmResponse
from streams.scoring import composite, heuristic
from streams.stages import AgentStage, InputRecord, TraceStage
from streams.stages.common import ExpiryClock
from streams.stages.history import HistoryWrite, agent_entries, chunk_bytes_bound, chunked, hour_key, hour_of
from streams.state import (
    AgentHistory,
    HistoryEntry,
    HistoryHour,
    PendingResponse,
    TraceState,
    encode_history_hour,
    table_key,
)
from tests.unit.stage_records import keyed

T0 = datetime(2026, 11, 1, tzinfo=UTC)
EXAMPLE = orjson.loads((Path(__file__).parents[2] / "schemas/examples/LLM_RESPONSE.json").read_bytes())
EXAMPLE_TEXT = "The answer is definitely config/retry.yaml, verified in the code."


class Tables:
    """The two history tables as the worker keeps them (a write of None deletes the key)."""

    def __init__(self, batched: bool = False) -> None:
        self.summary: dict[bytes, AgentHistory] = {}
        self.hours: dict[bytes, HistoryHour] = {}
        # In a batch of several responses, a chunk written and dropped by later ones is deleted without
        # ever having been stored: the delete replaces the batch's own pending write of it.
        self.batched = batched

    def apply(self, writes: dict[bytes, HistoryWrite]) -> None:
        for key, write in writes.items():
            table: dict[bytes, object] = self.summary if write.table == "summary" else self.hours  # type: ignore[assignment]
            if write.value is None:
                assert self.batched or key in table, "a delete of a key that is not there"
                table.pop(key, None)
            else:
                table[key] = write.value


def _response(
    event_id: str, when: datetime, good: bool, agent_name: str, **fields: object
) -> dict[str, object]:
    """An LLM_RESPONSE well supported (meets the planner's threshold, whatever the history) or not."""
    return {
        **EXAMPLE,
        "event_id": event_id,
        "timestamp": when.isoformat(),
        "retrieval": [{"similarity": 0.99 if good else 0.2, "source": "s"}],
        "code_validation": dict.fromkeys(EXAMPLE["code_validation"], good),
        "response": EXAMPLE_TEXT,
        "agent_name": agent_name,
        **fields,
    }


class Responses:
    """Scored responses fed through stage 1 (as the worker does) and then stage 2."""

    def __init__(self, settings: Settings, rng: random.Random, keep_traces: bool = False) -> None:
        self.settings = settings
        # Stage 1's trace states, when kept, let it recognise a re-delivered event id as the worker does.
        self.traces: dict[bytes, TraceState] | None = {} if keep_traces else None
        self.rng = rng
        configs = scoring_configs(settings)
        self.trace_stage = TraceStage(settings, configs, metrics.create(CollectorRegistry()))
        self.registry = CollectorRegistry()
        self.stage = AgentStage(settings, configs, metrics.create(self.registry, settings.metrics_label_cap))
        self.tables = Tables()
        self.offset = 0

    def score(
        self,
        event_id: str,
        when: datetime,
        good: bool | None = None,
        agent_name: str = EXAMPLE["agent_name"],
        **fields: object,
    ) -> dict[str, object]:
        good = self.rng.random() < 0.5 if good is None else good
        event = _response(event_id, when, good, agent_name, **fields)
        self.offset += 1
        traces = self.traces
        out, written = self.trace_stage.process(
            [keyed(InputRecord("in", 0, self.offset, 1.0, orjson.dumps(event)))],
            (lambda k: None) if traces is None else traces.get,
        )
        if traces is not None:
            traces.update(written)
        forwarded = next(r.value for r in out if r.topic == self.settings.responses_topic)
        record = InputRecord(self.settings.responses_topic, 0, self.offset, 1.0, forwarded)
        outputs, writes = self.stage.process([record], self.tables.summary.get, self.tables.hours.get)
        self.tables.apply(writes)
        (scored,) = [orjson.loads(r.value) for r in outputs if r.topic == self.settings.scored_topic]
        return scored  # type: ignore[no-any-return]

    def success_rate(self) -> float | None:
        return self.registry.get_sample_value(
            "confidence_agent_success_rate",
            {"tenant": EXAMPLE["tenant_id"], "agent": EXAMPLE["agent_name"]},
        )


def _check_stored(
    tables: Tables, applied: dict[str, tuple[datetime, bool, float]], horizon: datetime, chunk_bytes: int
) -> None:
    (summary,) = tables.summary.values()
    assert summary.entries == ()
    for chunk in tables.hours.values():
        assert chunk.entries, "an empty chunk is stored"
        assert [e.event_time for e in chunk.entries] == sorted(e.event_time for e in chunk.entries)
        assert len(chunk.entries) == 1 or len(chunk.model_dump_json()) <= chunk_bytes
    stored = [e for chunk in tables.hours.values() for e in chunk.entries]
    assert len({e.event_id for e in stored}) == len(stored)
    retained = {i for i, (when, _, _) in applied.items() if when >= horizon}
    assert retained <= {e.event_id for e in stored}  # everything retained is stored...
    # ...and only hours the horizon does not lie wholly after are kept.
    assert all(hour_of(e.event_time) + 1 > hour_of(horizon) for e in stored)
    assert len(tables.hours) == sum(counts.chunks for counts in summary.hours)
    for counts in summary.hours:
        keys = [hour_key(summary.tenant_id, summary.agent_name, counts.hour, i) for i in range(counts.chunks)]
        hour = [e for key in keys for e in tables.hours[key].entries]
        assert {hour_of(e.event_time) for e in hour} == {counts.hour}
        assert (counts.total, counts.met) == (len(hour), sum(e.threshold_met for e in hour))
    viewed = list(agent_entries(summary, tables.hours.get, horizon))
    assert [e.event_time for e in viewed] == sorted(e.event_time for e in viewed)
    assert {e.event_id for e in viewed} == retained


@pytest.mark.parametrize(
    ("seed", "span_hours", "chunk_bytes"),
    [
        (1, 60, 65_536),
        (2, 60, 65_536),
        (3, 400, 65_536),  # 400 h: hours leave the 168 h retention while it runs
        (4, 400, 65_536),
        (6, 8, 700),  # about 20 responses an hour in chunks of 3: hours of many chunks
        (6, 400, 1),  # a chunk per entry
    ],
)
def test_history_factor_equals_brute_force_with_shuffled_times_and_redelivery(
    seed: int, span_hours: int, chunk_bytes: int
) -> None:
    rng = random.Random(seed)
    settings = load_settings(history_chunk_bytes=chunk_bytes)
    responses = Responses(settings, rng)
    window = timedelta(hours=settings.history_window_hours)
    retention = timedelta(hours=settings.history_retention_hours)

    # 150 responses, minute resolution (windows cut hours), equal times on purpose; mostly ascending.
    times = sorted(T0 + timedelta(minutes=rng.randrange(span_hours * 60)) for _ in range(150))
    times += [T0 + timedelta(minutes=30 * rng.randrange(span_hours * 2)) for _ in range(30)]
    inputs = [(str(uuid.uuid4()), when) for when in times]
    order = [*inputs, *rng.sample(inputs, 15)]  # 15 re-deliveries
    order = [item if rng.random() < 0.8 else rng.choice(order) for item in order]  # and some shuffling
    applied: dict[str, tuple[datetime, bool, float]] = {}  # event id -> (time, threshold_met, factor)
    newest: datetime | None = None
    for event_id, when in order:
        scored = responses.score(event_id, when)
        factor = scored["composite"]["factors"]["agent_history"]  # type: ignore[index]
        if event_id in applied:
            assert factor == applied[event_id][2]  # re-delivery: the factor it was scored with
            continue
        horizon = None if newest is None else newest - retention
        if horizon is not None and when < horizon:
            # Older than the retention: scored over what is retained, not kept, so a re-delivery is new.
            kept = [(t, met) for t, met, _ in applied.values() if t >= horizon]
            assert factor == pytest.approx(composite.history_score(kept, when, window), abs=1e-12)
            continue
        kept = [(t, met) for t, met, _ in applied.values() if horizon is None or t >= horizon]
        assert factor == pytest.approx(composite.history_score(kept, when, window), abs=1e-12)
        applied[event_id] = (when, bool(scored["composite"]["threshold_met"]), factor)  # type: ignore[index]
        newest = when if newest is None else max(newest, when)
        horizon = newest - retention
        applied = {i: v for i, v in applied.items() if v[0] >= horizon}
        # The gauge: the agent's last window, ending at its newest response (not at a late one).
        recent = [met for t, met, _ in applied.values() if t >= max(newest - window, horizon)]
        assert responses.success_rate() == pytest.approx(sum(recent) / len(recent), abs=1e-12)
    assert newest is not None
    assert {met for _, met, _ in applied.values()} == {True, False}  # factors between 0 and 1 were checked
    _check_stored(responses.tables, applied, newest - retention, chunk_bytes)
    if span_hours > 200:  # hours past the retention were deleted
        assert len({orjson.loads(key)[2] for key in responses.tables.hours}) < span_hours - 150
    if chunk_bytes < 1_000:
        (summary,) = responses.tables.summary.values()
        assert len(responses.tables.hours) > len(summary.hours)  # some hours did take several chunks


def test_entries_before_the_horizon_in_the_hour_it_cuts_count_as_gone() -> None:
    settings = load_settings(history_retention_hours=2, history_window_hours=2)
    responses = Responses(settings, random.Random(0))
    met = responses.score("c", T0 + timedelta(minutes=5), good=True)["composite"]["threshold_met"]  # type: ignore[index]
    first = responses.score("a", T0 + timedelta(minutes=10))["composite"]["factors"]  # type: ignore[index]
    assert first["agent_history"] == (1.0 if met else 0.0)
    # b moves the horizon to 00:30: c and a stay stored (their hour is cut) but are no longer history.
    b = responses.score("b", T0 + timedelta(hours=2, minutes=30), good=False)
    assert b["composite"]["factors"]["agent_history"] == 0.5  # type: ignore[index]
    assert responses.success_rate() == 0.0  # b alone, not c and a
    stored = [e.event_id for hour in responses.tables.hours.values() for e in hour.entries]
    assert sorted(stored) == ["a", "b", "c"]
    # A re-delivery of a is older than the retention: scored as new over what is retained (nothing).
    again = responses.score("a", T0 + timedelta(minutes=10))["composite"]["factors"]  # type: ignore[index]
    assert again["agent_history"] == 0.5
    # The next hour past the horizon deletes hour 0.
    responses.score("d", T0 + timedelta(hours=3, minutes=1))
    assert sorted(e.event_id for hour in responses.tables.hours.values() for e in hour.entries) == ["b", "d"]


def _legacy_entries(times: list[datetime]) -> list[HistoryEntry]:
    return [
        HistoryEntry(
            event_id=f"old-{i}",
            event_time=when,
            threshold_met=i % 3 != 0,
            composite=0.8,
            blocked=False,
            history_score=0.5,
        )
        for i, when in enumerate(times)
    ]


def test_a_history_stored_unsorted_decodes_sorted() -> None:
    entries = _legacy_entries([T0 + timedelta(hours=h) for h in [5, 1, 3, 2]])
    raw = orjson.dumps(
        {
            "tenant_id": "t",
            "agent_name": "a",
            "agent_type": "planner",
            "entries": [e.model_dump(mode="json") for e in entries],
        }
    )
    history = AgentHistory.model_validate_json(raw)
    assert [e.event_id for e in history.entries] == ["old-1", "old-3", "old-2", "old-0"]


@pytest.mark.parametrize("chunk_bytes", [65_536, 500])  # 500: two entries a chunk
def test_a_history_of_the_old_format_is_split_by_hour_on_the_next_response(chunk_bytes: int) -> None:
    rng = random.Random(7)
    settings = load_settings(history_chunk_bytes=chunk_bytes)
    responses = Responses(settings, rng)
    window = timedelta(hours=settings.history_window_hours)
    times = [T0 + timedelta(minutes=rng.randrange(48 * 60)) for _ in range(80)]
    entries = _legacy_entries(times)
    key = table_key(EXAMPLE["tenant_id"], EXAMPLE["agent_name"])
    legacy = AgentHistory.model_validate_json(
        orjson.dumps(
            {
                "tenant_id": EXAMPLE["tenant_id"],
                "agent_name": EXAMPLE["agent_name"],
                "agent_type": EXAMPLE["agent_type"],
                "entries": [e.model_dump(mode="json") for e in entries],
            }
        )
    )
    responses.tables.summary[key] = legacy
    since = T0 + timedelta(hours=30)
    assert [e.event_id for e in agent_entries(legacy, responses.tables.hours.get, since)] == [
        e.event_id for e in sorted(entries, key=lambda e: e.event_time) if e.event_time >= since
    ]
    # A re-delivery of an old entry re-emits its factor and splits the history.
    assert responses.score("old-5", times[5])["composite"]["factors"]["agent_history"] == 0.5  # type: ignore[index]
    when = T0 + timedelta(hours=49)
    scored = responses.score("new", when)
    expected = composite.history_score([(e.event_time, e.threshold_met) for e in entries], when, window)
    assert scored["composite"]["factors"]["agent_history"] == pytest.approx(expected, abs=1e-12)  # type: ignore[index]
    applied = {e.event_id: (e.event_time, e.threshold_met, 0.5) for e in entries}
    applied["new"] = (when, bool(scored["composite"]["threshold_met"]), 0.0)  # type: ignore[index]
    retention = timedelta(hours=settings.history_retention_hours)
    _check_stored(responses.tables, applied, when - retention, settings.history_chunk_bytes)
    (summary,) = responses.tables.summary.values()
    assert [c.hour for c in summary.hours] == sorted({hour_of(t) for t in [*times, when]})
    if chunk_bytes < 1_000:
        assert len(responses.tables.hours) > len(summary.hours)


_ENTRIES = st.lists(
    st.builds(
        HistoryEntry,
        event_id=st.text(
            st.characters(exclude_categories=("Cs",)), max_size=60
        ),  # quotes, controls, any script
        event_time=st.datetimes(timezones=st.timezones()),
        threshold_met=st.booleans(),
        composite=st.floats(allow_nan=False, allow_infinity=False),
        blocked=st.booleans(),
        history_score=st.floats(allow_nan=False, allow_infinity=False),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(entries=_ENTRIES, limit=st.integers(1, 3_000))
def test_chunks_are_bounded_in_order_and_full(entries: list[HistoryEntry], limit: int) -> None:
    chunks = chunked(entries, limit)
    assert [e for chunk in chunks for e in chunk] == entries
    for at, chunk in enumerate(chunks):
        encoded = len(HistoryHour(entries=chunk).model_dump_json().encode())
        bound = chunk_bytes_bound(chunk)
        assert encoded <= bound <= encoded + 60 * len(chunk)  # never below, and not far above
        assert len(chunk) == 1 or bound <= limit
        if at + 1 < len(chunks):  # a chunk is cut only where the next entry would not fit
            assert chunk_bytes_bound((*chunk, chunks[at + 1][0])) > limit


@settings(max_examples=200, deadline=None)
@given(entries=_ENTRIES, first=st.integers(0, 40))
def test_a_chunk_encoded_from_its_entries_is_what_pydantic_writes(
    entries: list[HistoryEntry], first: int
) -> None:
    """The stored bytes must not change with the encoder: the changelog, the views and an older worker
    read them. Part of the entries are encoded (and cached) before the chunk, as after a response."""
    for entry in entries[:first]:
        assert entry.encoded == entry.model_dump_json().encode()
    hour = HistoryHour(entries=tuple(entries))
    assert encode_history_hour(hour) == hour.model_dump_json().encode()


def test_a_far_future_response_does_not_drop_the_agents_history() -> None:
    """A response dated 2062 (a mistyped year) moved the agent's newest time there: every hour fell
    behind the retention horizon and was deleted, and later responses were scored on nothing."""
    responses = Responses(load_settings(), random.Random(7))
    start = datetime.now(UTC) - timedelta(hours=5)
    for i in range(10):
        responses.score(f"good-{i}", start + timedelta(minutes=i), good=True)
    responses.score("typo", start.replace(year=2062), good=True)
    later = responses.score("later", start + timedelta(hours=1), good=True)
    assert later["composite"]["factors"]["agent_history"] == 1.0  # type: ignore[index]  # the 10 still count
    (summary,) = responses.tables.summary.values()
    assert summary.newest is not None and summary.newest <= datetime.now(UTC) + timedelta(hours=1, minutes=1)


def test_far_future_responses_are_scored_not_kept() -> None:
    """Found in review: each response dated in a distinct far-future hour added an hour to the agent's
    summary that retention (counted back from the bounded newest time) never dropped, so one agent's
    summary, one changelog record, grew without bound. Such a response is scored, not kept."""
    responses = Responses(load_settings(), random.Random(3))
    now = datetime.now(UTC)
    responses.score("now", now, good=True)
    future = [
        responses.score(f"future-{i}", now.replace(year=2100) + timedelta(hours=i), good=False)
        for i in range(200)
    ]
    assert all(s["event_type"] == "RESPONSE_SCORED" for s in future)
    # Scored on the window before each one's own time, which holds no kept response: seed 004's 0.5
    # (had the failing ones been kept, the later ones would count them: 0.0).
    assert {s["composite"]["factors"]["agent_history"] for s in future} == {0.5}  # type: ignore[index]
    (summary,) = responses.tables.summary.values()
    assert sum(counts.total for counts in summary.hours) == 1
    assert len(responses.tables.hours) == 1
    later = responses.score("later", now + timedelta(minutes=1), good=True)
    assert later["composite"]["factors"]["agent_history"] == 1.0  # type: ignore[index]


def test_an_agent_silent_past_the_retention_expires_with_every_chunk() -> None:
    """Agent names need not be a fixed set (one per instance): a silent agent's summary and chunks
    stayed for ever, since only its own next response dropped old hours."""
    settings = load_settings(
        history_retention_hours=2, history_window_hours=1, history_chunk_bytes=700, topic_partitions=1
    )
    responses = Responses(settings, random.Random(3))
    wall = [0.0]
    responses.stage.clock = ExpiryClock(timedelta(hours=1), 60, monotonic=lambda: wall[0])
    for i in range(12):  # two hours, several chunks each
        responses.score(f"old-{i}", T0 + timedelta(minutes=10 * i))
    ((key, summary),) = responses.tables.summary.items()
    chunks = sorted(responses.tables.hours)
    assert len(chunks) > 2 and sorted(responses.stage.expired_keys(summary)) == chunks
    wall[0] = 50  # the same input partition goes on with another agent (heard again within 60 s)
    responses.score("new", T0 + timedelta(hours=3), agent_name="other-agent")
    assert not responses.stage.expired(key, summary)  # newest 01:50 + 2 h retention: not yet
    wall[0] = 100  # past the start-up grace
    responses.score("newer", T0 + timedelta(hours=4), agent_name="other-agent")
    assert responses.stage.expired(key, summary)
    other = responses.tables.summary[table_key(EXAMPLE["tenant_id"], "other-agent")]
    assert not responses.stage.expired(table_key(EXAMPLE["tenant_id"], "other-agent"), other)


def test_a_response_re_sent_with_another_timestamp_is_counted_once() -> None:
    """A producer that re-stamps its retries sends one event id at two times: stage 1 knows it by id,
    stage 2 looked it up at its new time only, kept it a second time and counted it twice."""
    responses = Responses(load_settings(), random.Random(5), keep_traces=True)
    first = responses.score("e-1", T0, good=True)
    again = responses.score("e-1", T0 + timedelta(hours=1, minutes=5), good=True)
    assert first["event_id"] == again["event_id"]  # scored again under the same output id
    (summary,) = responses.tables.summary.values()
    assert [(c.hour, c.total) for c in summary.hours] == [(hour_of(T0), 1)]
    stored = [e.event_id for chunk in responses.tables.hours.values() for e in chunk.entries]
    assert stored == ["e-1"]
    responses.score("e-2", T0 + timedelta(hours=2), good=True)  # counts the one response, not two
    (summary,) = responses.tables.summary.values()
    assert sum(c.total for c in summary.hours) == 2


def test_a_response_re_sent_with_another_timestamp_re_emits_its_first_scores() -> None:
    """DESIGN 4b: a re-delivery re-emits the same scores. Re-stamped an hour later, a well-supported
    response was scored over the history at its new time, which held its own first delivery: history
    0.5 -> 0.2, composite 0.84 -> 0.78, blocked with the "I don't know" text under the same output id."""
    responses = Responses(load_settings(), random.Random(5), keep_traces=True)
    first = responses.score("e-1", T0, good=True, agent_type="patcher")
    for i in range(2, 6):
        responses.score(f"e-{i}", T0 + timedelta(minutes=10 * i), good=False, agent_type="patcher")
    again = responses.score("e-1", T0 + timedelta(hours=1), good=True, agent_type="patcher")
    assert {k: v for k, v in again.items() if k != "scored_at"} == {
        k: v for k, v in first.items() if k != "scored_at"
    }


def test_the_rolling_confidence_average_counts_a_zero_confidence() -> None:
    """A confidence of 0.0 (any -inf logprob) was taken for "no value yet": the average restarted from
    the next response instead of moving 5 % towards it."""
    responses = Responses(load_settings(), random.Random(9))
    for i in range(20):
        scored = responses.score(f"zero-{i}", T0 + timedelta(minutes=i), token_logprobs=[-50.0])
        assert scored["confidence"] == 0.0
    scored = responses.score("sure", T0 + timedelta(minutes=30), token_logprobs=[-0.05])
    confidence = scored["confidence"]
    assert isinstance(confidence, float) and confidence > 0.9
    labels = {"tenant": EXAMPLE["tenant_id"], "model": EXAMPLE["model"], "endpoint": EXAMPLE["endpoint"]}
    average = responses.registry.get_sample_value("llm_confidence_average", labels)
    assert average == pytest.approx(0.05 * confidence)


def test_a_swept_agent_leaves_the_success_rate_and_frees_its_label() -> None:
    """Per-instance agent names took every label place for good: after METRICS_LABEL_CAP of them every
    new agent was `other`, and a dead instance's rate stayed exported."""
    responses = Responses(load_settings(), random.Random(4))
    for n in range(100):  # the default cap: 100 agent names
        responses.score(f"r-{n}", T0 + timedelta(minutes=n), agent_name=f"pod-{n}")
    responses.score("late", T0 + timedelta(hours=2), agent_name="pod-new")
    assert _success_rate(responses, "other") is not None and _success_rate(responses, "pod-new") is None
    responses.stage.forget_agent(EXAMPLE["tenant_id"], "pod-0")  # what the sweep does once it expired
    assert _success_rate(responses, "pod-0") is None
    responses.score("later", T0 + timedelta(hours=3), agent_name="pod-newer")
    assert _success_rate(responses, "pod-newer") is not None  # the freed place
    responses.stage.forget_agent(EXAMPLE["tenant_id"], "pod-new")  # one of the agents on `other`
    assert _success_rate(responses, "other") is None  # its only agent left


def _success_rate(responses: Responses, agent: str) -> float | None:
    labels = {"tenant": EXAMPLE["tenant_id"], "agent": agent}
    return responses.registry.get_sample_value("confidence_agent_success_rate", labels)


def test_agents_on_a_partition_this_worker_lost_leave_the_success_rate() -> None:
    """After a rebalance the agent's new owner exports its rate; the old owner's stayed, stale."""
    responses = Responses(load_settings(topic_partitions=4), random.Random(6))
    names = [f"agent-{n}" for n in range(8)]
    for n, name in enumerate(names):
        responses.score(f"r-{n}", T0 + timedelta(minutes=n), agent_name=name)
    stage = responses.stage
    where = {name: stage.partition_of(table_key(EXAMPLE["tenant_id"], name)) for name in names}
    kept = {where[names[0]]}
    assert set(where.values()) - kept, "every agent on one partition: the test would show nothing"
    stage.forget_agents_outside(kept)
    assert {name for name in names if _success_rate(responses, name) is not None} == {
        name for name in names if where[name] in kept
    }


@pytest.mark.parametrize(
    ("logprob", "good", "action", "text", "flags"),
    [
        (-0.05, True, "allow", "given", []),
        (-0.05, False, "allow", composite.I_DONT_KNOW_ANSWER, ["COMPOSITE_BLOCKED"]),
        (-2.0, True, "reject", None, []),
        # Reject wins over the block (DESIGN 4b): no text at all, not "I don't know"; the block is flagged.
        (-2.0, False, "reject", None, ["COMPOSITE_BLOCKED"]),
    ],
)
def test_reject_and_composite_block_each_and_together(
    logprob: float, good: bool, action: str, text: str | None, flags: list[str]
) -> None:
    responses = Responses(
        load_settings(confidence_on_low="reject", confidence_min_acceptance=0.5), random.Random(1)
    )
    scored = responses.score("e-1", T0, good=good, token_logprobs=[logprob])
    assert scored["action"] == action
    assert scored["response"] == (EXAMPLE_TEXT if text == "given" else text)
    assert scored["flags"] == flags
    assert scored["composite"]["should_block"] is (not good)  # type: ignore[index]
    assert (scored["error"] is None) is (action == "allow")
    labels = {"tenant": EXAMPLE["tenant_id"], "model": EXAMPLE["model"], "endpoint": EXAMPLE["endpoint"]}
    rejected = responses.registry.get_sample_value("llm_confidence_rejected_total", labels)
    assert rejected == (1.0 if action == "reject" else None)
    blocked = responses.registry.get_sample_value(
        "confidence_composite_blocked_total", {"agent_type": EXAMPLE["agent_type"]}
    )
    assert blocked == (None if good else 1.0)


def _pending(event_id: str, when: datetime, good: bool, agent: str, redelivered: bool) -> bytes:
    """Stage 1's message for stage 2 (built here, so one batch can mix agents and re-delivery flags)."""
    event = LlmResponse.model_validate(_response(event_id, when, good, agent, token_logprobs=None))
    pending = PendingResponse(
        event=event,
        confidence=None,
        logprobs_present=False,
        heuristic=heuristic.score_heuristic(event.response),
        received_at=1.0,
        redelivered=redelivered,
    )
    return pending.model_dump_json().encode()


@pytest.mark.parametrize("seed", range(40))
def test_history_factor_equals_brute_force_in_batches_of_two_agents(seed: int) -> None:
    """Batches of 1-8 responses of two agents (a batch sees its own earlier writes), re-deliveries with
    and without stage 1's flag (flagged ones also re-stamped), and windows, retentions and chunk sizes
    drawn per seed."""
    rng = random.Random(seed)
    window_hours = rng.choice([1, 3, 24])
    settings = load_settings(
        history_chunk_bytes=rng.choice([1, 400, 700, 65_536]),
        history_window_hours=window_hours,
        history_retention_hours=max(window_hours, rng.choice([3, 30, 168])),
    )
    window = timedelta(hours=settings.history_window_hours)
    retention = timedelta(hours=settings.history_retention_hours)
    stage = AgentStage(settings, scoring_configs(settings), metrics.create(CollectorRegistry()))
    tables = Tables(batched=True)
    # Per agent: event id -> (time, threshold_met, factor) of what is retained, and the newest time.
    applied: dict[str, dict[str, tuple[datetime, bool, float]]] = {"a1": {}, "a2": {}}
    newest: dict[str, datetime | None] = {"a1": None, "a2": None}
    sent: list[tuple[str, datetime, bool, str]] = []
    span_hours = rng.choice([5, 50, 400])
    offset = 0
    for _ in range(40):
        batch: list[tuple[str, datetime, bool, str, bool]] = []
        for _ in range(rng.randint(1, 8)):
            if sent and rng.random() < 0.2:
                event_id, when, good, agent = rng.choice(sent)
                if rng.random() < 0.5:  # re-delivered as it was: stage 2 finds it by (time, id)
                    batch.append((event_id, when, good, agent, rng.random() < 0.5))
                else:  # re-stamped by its producer: only stage 1's flag says it was counted
                    batch.append(
                        (event_id, when + timedelta(minutes=rng.randrange(1, 120)), good, agent, True)
                    )
                continue
            minutes = rng.randrange(span_hours * 60) if rng.random() < 0.8 else 60 * rng.randrange(span_hours)
            sent.append(
                (
                    f"e{len(sent)}",
                    T0 + timedelta(minutes=minutes),
                    rng.random() < 0.5,
                    rng.choice(["a1", "a2"]),
                )
            )
            batch.append((*sent[-1], False))
        records = []
        for event_id, when, good, agent, redelivered in batch:
            offset += 1
            records.append(
                InputRecord("r", 0, offset, 1.0, _pending(event_id, when, good, agent, redelivered))
            )
        out, writes = stage.process(records, tables.summary.get, tables.hours.get)
        tables.apply(writes)
        scored = [orjson.loads(r.value) for r in out if r.topic == settings.scored_topic]
        assert len(scored) == len(batch)
        for (event_id, when, _, agent, redelivered), output in zip(batch, scored, strict=True):
            factor = output["composite"]["factors"]["agent_history"]
            horizon = None if newest[agent] is None else newest[agent] - retention
            known = applied[agent].get(event_id)
            if known is not None and known[0] == when and (horizon is None or when >= horizon):
                assert factor == known[2], (seed, event_id, "a re-delivery keeps its factor")
                continue
            kept = [(t, met) for t, met, _ in applied[agent].values() if horizon is None or t >= horizon]
            assert factor == pytest.approx(composite.history_score(kept, when, window), abs=1e-12)
            if redelivered:  # stage 1 had applied it: scored, never counted twice
                continue
            latest = when if newest[agent] is None else max(newest[agent], when)
            if when >= latest - retention:
                applied[agent][event_id] = (when, bool(output["composite"]["threshold_met"]), factor)
            newest[agent] = latest
            applied[agent] = {i: v for i, v in applied[agent].items() if v[0] >= latest - retention}
        for summary in tables.summary.values():  # the summaries' counts are the stored chunks'
            for counts in summary.hours:
                keys = [
                    hour_key(summary.tenant_id, summary.agent_name, counts.hour, i)
                    for i in range(counts.chunks)
                ]
                hour = [e for key in keys for e in tables.hours[key].entries]
                assert (counts.total, counts.met) == (len(hour), sum(e.threshold_met for e in hour))
        assert len(tables.hours) == sum(c.chunks for s in tables.summary.values() for c in s.hours)


def test_response_label_sets_are_capped_not_only_each_label() -> None:
    """Review (thirtieth round): tenant, model and endpoint were capped one by one, so their sets could
    multiply to 101^3 series (about 4.4 KB each here and on every scrape). With a cap of 2 per label,
    3 x 3 x 3 sets were possible; at most 10 x 2 keep their own series, the rest share all-`other`."""
    responses = Responses(load_settings(metrics_label_cap=2), random.Random(7))
    for n, (tenant, model, endpoint) in enumerate(itertools.product("abc", "abc", "abc")):
        responses.score(
            f"r-{n}",
            T0 + timedelta(minutes=n),
            tenant_id=f"t-{tenant}",
            model=f"m-{model}",
            endpoint=f"/e-{endpoint}",
            token_logprobs=[-0.05],
        )
    series = {
        tuple(sorted(sample.labels.items()))
        for family in responses.registry.collect()
        if family.name == "llm_confidence_histogram"
        for sample in family.samples
        if sample.name.endswith("_count")
    }
    assert len(series) == 2 * 10 + 1
    everything_other = (("endpoint", "other"), ("model", "other"), ("tenant", "other"))
    assert everything_other in series
    assert len(responses.stage._averages) == 2 * 10 + 1


def test_the_confidence_average_leaves_with_the_last_agent_feeding_it() -> None:
    """Metrics review: `llm_confidence_average` was never removed, so after a rebalance moved its
    agents' partitions away (or the sweep removed them) a frozen copy stayed beside the new owner's."""
    settings = load_settings()
    responses = Responses(settings, random.Random(3))
    labels = {"tenant": EXAMPLE["tenant_id"], "model": EXAMPLE["model"], "endpoint": EXAMPLE["endpoint"]}

    def average() -> float | None:
        return responses.registry.get_sample_value("llm_confidence_average", labels)

    responses.score("e-1", T0, good=True)
    responses.score("e-2", T0 + timedelta(minutes=1), good=True, agent_name="other-agent")
    assert average() is not None
    responses.stage.forget_agent(EXAMPLE["tenant_id"], "other-agent")  # swept: the other still feeds it
    assert average() is not None
    responses.stage.forget_agents_outside(set())  # every responses partition moved away
    assert average() is None and responses.success_rate() is None
