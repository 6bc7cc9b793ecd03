"""Through a real broker: a long trace keeps seed 001's pairwise results across a worker restart.

The evidence state keeps a match index so that a trace's cost does not grow with the square of its
targets (docs/DECISIONS.md, eleventh round). Here 300 tool invocations of one trace, with targets that
match each other in every way the rules allow, go through a worker that is stopped (SIGTERM) half-way
and replaced, so the second half runs on the index restored from the changelog. Every TRACE_SCORED is
compared with the pairwise rules (the unit tests' oracle) applied to the same inputs offline.
"""

from __future__ import annotations

from typing import Any

from streams.harness import RunningBroker
from streams.scoring.evidence import EvidenceConfig, EvidenceState, Invocation, update
from tests.integration.fixtures import EventFactory, count_of, deploy
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
        assert first.stop() == 0  # SIGTERM: the batch finishes, offsets and changelog are committed
        d.start_worker()
        d.produce(events[half:])
        later_ids = {e["event_id"] for e in events[half:]}
        records += d.collect(count_of("TRACE_SCORED", EVENTS - half, scored, later_ids))
    finally:
        d.stop()
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
