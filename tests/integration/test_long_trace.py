"""Through a real broker: a long trace keeps seed 001's pairwise results across a worker restart, and a
trace that reaches TRACE_STATE_MAX_BYTES has what would grow it further dead-lettered, never written.

The evidence state keeps a match index so that a trace's cost does not grow with the square of its
targets (docs/DECISIONS.md, eleventh round). Here 300 tool invocations of one trace, with targets that
match each other in every way the rules allow, go through a worker that is stopped (SIGTERM) half-way
and replaced, so the second half runs on the index restored from the changelog. Every TRACE_SCORED is
compared with the pairwise rules (the unit tests' oracle) applied to the same inputs offline, and
early inputs sent again re-emit their outputs from the compressed blocks of the restored state.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from streams import metrics
from streams.config import scoring_configs
from streams.harness import RunningBroker
from streams.kafka_io import Consumed, collect
from streams.scoring.evidence import EvidenceConfig, EvidenceState, Invocation, update
from streams.stages import InputRecord, TraceStage
from tests.integration.fixtures import EventFactory, count_of, deploy, settled_as_offline
from tests.unit.test_evidence import _pairwise_categories, _pairwise_convergence

EVENTS = 300


def _long_trace(f: EventFactory) -> list[dict[str, Any]]:
    """Reads, searches, git and builds over 40 modules: equal targets, terms inside file names, misses."""
    events = []
    for i in range(EVENTS):
        module = i % 40
        tool, target = [
            ("read", f"src/mod{module}/handler{i}.py"),
            ("grep", f"handler{i - 1}"),  # inside the previous read's file name
            ("find", f"mod{module}"),  # a directory, never a file name: matches only itself
            ("git", f"src/mod{module}/handler{i - 3}.py"),  # the same path as an earlier read
            ("cmake", f"handler{i}"),
        ][i % 5]
        fields = {"result_count": 1} if tool in ("grep", "find", "git") else {}
        events.append(f.tool("long-trace", tool, target, minutes=i * 0.1, **fields))
    return events


def _expected(events: list[dict[str, Any]]) -> dict[str, tuple[Any, ...]]:
    """Per input event id: (read and search scores, convergence) by the pairwise rules."""
    cfg, state, expected = EvidenceConfig(), EvidenceState(), {}
    for e in events:
        fields = {k: e[k] for k in ("tool", "target", "status") if k in e}
        state = update(
            state, Invocation(event_id=e["event_id"], result_count=e.get("result_count"), **fields), cfg
        )
        # Every build of the trace passes: verification scores 0.80 once there is one (before, its list
        # is empty and the value does not matter).
        convergence = _pairwise_convergence(state, 0.80)
        expected[e["event_id"]] = (_pairwise_categories(state), convergence)
    return expected


def _observed(output: dict[str, Any]) -> tuple[Any, ...]:
    categories = {c: s for c, s in output["categories"].items() if c in ("read", "search")}
    c = output["convergence"]
    return categories, (tuple(c["categories"]), c["count"], c["bonus"], c["target"])


def test_long_trace_matches_the_pairwise_rules_across_a_restart(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=2)
    f = EventFactory()
    events = _long_trace(f)
    half = EVENTS // 2
    scored = d.settings.scored_topic
    try:
        first = d.start_worker()
        d.produce(events[:half])
        first_ids = {e["event_id"] for e in events[:half]}
        records = d.collect(count_of("TRACE_SCORED", half, scored, first_ids))
        d.replace_worker(first)  # SIGTERM; the successor restores the trace's index from the changelog
        d.produce(events[half:])
        later_ids = {e["event_id"] for e in events[half:]}
        records += d.collect(count_of("TRACE_SCORED", EVENTS - half, scored, later_ids))
        # Re-delivered: early inputs, whose outputs the restored state keeps in compressed blocks.
        again = {e["event_id"] for e in events[:3]}
        d.produce(events[:3])
        # Each input's output again (not a count of six, which one input emitting twice would reach).
        d.collect(lambda rs: all(count_of("TRACE_SCORED", 2, scored, {i})(rs) for i in again))
        # Then a marker input (another trace): stage 1 takes it in a later batch than the re-deliveries,
        # and a batch's outputs go out only once the previous batch's are acknowledged
        # (streams/batch_runner.py; one worker, one stage-1 agent for both partitions). Once its output
        # is read, every output the re-deliveries caused is on the topic: a third copy would be here.
        marker = f.tool("marker-trace", "find", "marker", minutes=EVENTS * 0.1)
        d.produce([marker])
        repeated = d.collect(count_of("TRACE_SCORED", 1, scored, {marker["event_id"]}))
    finally:
        d.stop()
    # Each collect reads from the beginning: `repeated` holds the first outputs and the re-emitted ones.
    first_time = {o["source_event_id"]: o for o in d.outputs(records) if o["source_event_id"] in again}
    both_times = [o for o in d.outputs(repeated) if o["source_event_id"] in again]
    assert len(first_time) == 3 and len(both_times) == 6
    assert Counter(o["source_event_id"] for o in both_times) == dict.fromkeys(again, 2)

    def scores(outputs: list[dict[str, Any]]) -> set[bytes]:
        return {orjson.dumps({k: v for k, v in o.items() if k != "scored_at"}) for o in outputs}

    assert scores(both_times) == scores(list(first_time.values()))
    outputs = {
        o["source_event_id"]: o
        for o in d.outputs(records)
        if o["event_type"] == "TRACE_SCORED" and o["source_event_id"] in first_ids | later_ids
    }
    assert len(outputs) == EVENTS
    expected = _expected(events)
    wrong = [e["event_id"] for e in events if _observed(outputs[e["event_id"]]) != expected[e["event_id"]]]
    assert not wrong, (
        f"{len(wrong)} of {EVENTS} TRACE_SCORED differ from the pairwise rules, first {wrong[:3]}"
    )
    # The inputs exercise convergence in both halves, so the second half tested the restored index.
    bonuses = [expected[e["event_id"]][1][2] for e in events]
    assert max(bonuses[:half]) > 0 and max(bonuses[half:]) > 0


STATE_LIMIT = 16_384


def _accepted_offline(d: Any, events: list[dict[str, Any]]) -> set[str]:
    """The input ids stage 1 applies under the deployment's settings, one per batch, without Kafka."""
    stage = TraceStage(d.settings, scoring_configs(d.settings), metrics.create(CollectorRegistry()))
    table: dict[Any, Any] = {}
    for offset, event in enumerate(events):
        record = InputRecord("in", 0, offset, 1.0, orjson.dumps(event), str(event["trace_id"]).encode())
        table.update(stage.process([record], table.get)[1])
    return {event_id for state in table.values() for event_id in [*state.remembered, *state.archived_in]}


def test_a_trace_at_its_state_bound_dead_letters_the_rest_across_a_restart(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=2, TRACE_STATE_MAX_BYTES=str(STATE_LIMIT))
    f = EventFactory()
    events = []
    for i in range(120):  # a new target each: every input grows its trace; 1 in 8 is another trace
        trace = "other-trace" if i % 8 == 7 else "full-trace"
        events.append(
            f.tool(trace, ("read", "grep", "git")[i % 3], f"src/module_{i}/handler_{i}.py", i * 0.1)
        )
    accepted = _accepted_offline(d, events)
    refused = {e["event_id"] for e in events} - accepted
    assert refused and all(e["trace_id"] == "full-trace" for e in events if e["event_id"] in refused)

    def settled(ids: set[str]) -> Callable[[list[Consumed]], bool]:
        return settled_as_offline(d, ids, accepted, refused, lambda dead: dead["event_id"])

    half = len(events) // 2
    try:
        first = d.start_worker()
        d.produce(events[:half])
        records = d.collect(settled({e["event_id"] for e in events[:half]}))
        d.replace_worker(first)  # SIGTERM; the successor restores the full trace from the changelog
        d.produce(events[half:])
        records += d.collect(settled({e["event_id"] for e in events}))
    finally:
        d.stop()

    scored = {o["source_event_id"] for o in d.outputs(records) if o["event_type"] == "TRACE_SCORED"}
    assert scored & {e["event_id"] for e in events} == accepted
    letters = [r for r in records if r.topic == d.settings.dlq_topic]
    assert {orjson.loads(r.value)["event_id"] for r in letters} == refused
    assert {dict(r.headers)["__connect.errors.reason"] for r in letters} == {b"trace_state_full"}

    # What reached the changelog: the long trace's last state was written, and no value over the bound.
    changelog = f"{d.settings.app_id}-traces-changelog"
    last_id = max(
        accepted & {e["event_id"] for e in events if e["trace_id"] == "full-trace"},
        key=lambda i: int(i.split("-")[-1]),
    )

    def last_state_written(records: list[Consumed]) -> bool:
        return any(r.value and f'"{last_id}"'.encode() in r.value for r in records)

    written = asyncio.run(collect(kafka.bootstrap_servers, [changelog], last_state_written, 60))
    sizes = [len(r.value) for r in written if r.value]
    assert max(sizes) <= STATE_LIMIT
    assert max(sizes) > STATE_LIMIT * 0.9, "the trace got close to the bound"
