"""Two workers in one group give the same outputs as one; re-delivered inputs change nothing."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from streams.harness import RunningBroker
from streams.kafka_io import Consumed
from tests.integration.fixtures import Deployment, EventFactory, deploy, get_json, http_get, poll


def _phases(tenant: str) -> list[tuple[list[dict[str, Any]], int]]:
    """Input phases with the number of distinct outputs each must add.

    Each phase depends only on earlier phases' state, so processing order inside a phase (which differs
    between one and two workers) cannot change any output.
    """
    f = EventFactory(tenant=tenant)
    f.run = "fixed"  # identical event ids in every deployment
    base: list[dict[str, Any]] = []
    for t in range(8):
        trace = f"tr-{t}"
        base += [
            f.tool(trace, "find", f"Sym{t}", minutes=t, result_count=1),
            f.tool(trace, "read", f"src/Sym{t}.h", minutes=t),
            f.response(
                trace,
                minutes=t,
                agent=f"agent-{t}",
                token_logprobs=[-0.1 * (t + 1)],
                role="sub_call",
                sub_call_id=f"sub-{t}",
                response=f"Result {t}: definitely works.",
            ),
            f.claim(trace, f"c-{t}", minutes=t),
        ]
    contradiction = [
        f.claim(
            "tr-0",
            "c-x",
            minutes=20,
            relationships=[
                {"type": "contradicts", "target": "c-1", "strength": 0.9},
                {"type": "supports", "target": "c-2", "strength": 0.5},
            ],
        )
    ]
    derived = [f.claim("tr-3", "c-d", minutes=21, derived_from=["c-4"])]
    tail = [
        f.response("tr-0", minutes=22, agent="agent-0", role="synthesis", response="All good."),
        f.tool("tr-5", "cmake", "all", minutes=22, build_passed=False),
    ]
    return [
        (base, len(base)),
        # Exactly one CLAIM_SCORED per affected claim: c-x itself, c-1 penalised, c-2 boosted.
        (contradiction, 3),
        # c-d itself (nothing depends on it).
        (derived, 1),
        # RESPONSE_SCORED + SYNTHESIS_SCORED, TRACE_SCORED.
        (tail, 3),
    ]


def _scored(d: Deployment, records: list[Consumed]) -> list[dict[str, Any]]:
    return [orjson.loads(r.value) for r in records if r.topic == d.settings.scored_topic]


def _key(o: dict[str, Any]) -> tuple[str, bytes]:
    return o["event_id"], orjson.dumps(
        {k: v for k, v in o.items() if k != "scored_at"}, option=orjson.OPT_SORT_KEYS
    )


def _run(d: Deployment, phases: list[tuple[list[dict[str, Any]], int]]) -> list[Consumed]:
    expected = 0
    records: list[Consumed] = []
    for events, adds in phases:
        d.produce(events)
        expected += adds
        records = d.collect(lambda rs, n=expected: len({o["event_id"] for o in _scored(d, rs)}) >= n)
    return records


def _wait_ready(d: Deployment) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if all("Ready" in Path(w.log_path).read_text(errors="replace") for w in d.workers):
            return
        time.sleep(0.2)
    raise TimeoutError("workers did not report Ready")


def test_two_workers_match_one_worker(kafka: RunningBroker) -> None:
    phases = _phases("scale")
    single = deploy(kafka, partitions=4)
    single.start_worker()
    try:
        _wait_ready(single)
        one = {_key(o) for o in _scored(single, _run(single, phases))}
    finally:
        single.stop()
    double = deploy(kafka, partitions=4)
    double.start_worker()
    double.start_worker()
    try:
        _wait_ready(double)
        two = {_key(o) for o in _scored(double, _run(double, phases))}
        # Both members did part of the work: each has emitted outputs of its own.
        for port in double.web_ports:
            assert b"confidence_outputs_emitted_total{" in http_get(port, "/metrics")[1]
    finally:
        double.stop()
    assert len(one) == sum(adds for _, adds in phases)
    assert one == two


def _views(d: Deployment) -> dict[str, Any]:
    """Table state as the query views show it (the claim's wall-clock `as_of` left out)."""
    port = d.web_ports[0]
    views = {}
    for path in (
        "/traces/redeliver/tr-0",
        "/traces/redeliver/tr-5",
        "/agents/redeliver/agent-0",
        "/claims/redeliver/c-1",
        "/claims/redeliver/c-d",
    ):
        status, body = get_json(port, path)
        assert status == 200, (path, body)
        body.pop("as_of", None)
        views[path] = body
    return views


def _tail_phase_stored(views: dict[str, Any]) -> bool:
    return (
        all(
            views[f"/traces/redeliver/{t}"]["last_event_time"].startswith("2026-11-22T12:22")
            for t in ("tr-0", "tr-5")
        )
        and views["/agents/redeliver/agent-0"]["total_executions"] == 2
    )


def _re_emitted(o: dict[str, Any], inputs: dict[str, dict[str, Any]]) -> bool:
    """Whether a re-delivery of the output's input re-emits it: every output but the re-scores of other
    claims (a CLAIM re-emits only its own score)."""
    return o["event_type"] != "CLAIM_SCORED" or bool(
        o["claim_id"] == inputs[o["source_event_id"]]["claim_id"]
    )


def _each_arrived(d: Deployment, wanted: Counter[str]) -> Callable[[list[Consumed]], bool]:
    """`collect`'s condition: each output id in `wanted` was read at least that many times."""

    def done(records: list[Consumed]) -> bool:
        seen = Counter(o["event_id"] for o in _scored(d, records))
        return all(seen[event_id] >= n for event_id, n in wanted.items())

    return done


def _through_markers(d: Deployment, f: EventFactory, markers: set[str]) -> list[dict[str, Any]]:
    """Every scored output read once a marker input has passed each stage that emits them; the markers'
    own outputs left out (`markers` collects their ids).

    Call it once each stage has processed what is checked (its outputs were read): each marker is then
    taken in a later batch of the same stage agent (stage 1 for TRACE_SCORED and SYNTHESIS_SCORED, the
    history stage for RESPONSE_SCORED, the claim stage for CLAIM_SCORED; one agent per stage for all
    partitions on the one worker), and a batch's outputs go out only once the previous batch's are
    acknowledged (streams/batch_runner.py). So an output the earlier inputs caused in those stages, on
    any partition, is on the topic before the marker's output. A tenant of their own: the views
    compared below are not touched.
    """
    trace = f"marker-{len(markers)}"
    events = [
        f.tool(trace, "find", "marker"),
        f.response(trace, agent="marker-agent"),
        f.claim(trace, f"marker-claim-{len(markers)}"),
    ]
    ids = {e["event_id"] for e in events}
    markers |= ids
    d.produce(events)
    records = d.collect(lambda rs: ids <= {o["source_event_id"] for o in _scored(d, rs)})
    return [o for o in _scored(d, records) if o["source_event_id"] not in markers]


def test_redelivery_adds_no_new_ids_and_keeps_state(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=2)
    d.start_worker()
    marker_factory = EventFactory(tenant="redeliver-marker")
    markers: set[str] = set()
    try:
        phases = _phases("redeliver")
        _run(d, phases)
        # Through the markers: `first` holds every output of the first pass, late copies included.
        first = _through_markers(d, marker_factory, markers)
        first_keys = {_key(o) for o in first}
        # Wait until the views show the tail phase (tr-0 and tr-5 at minute 22, agent-0's second
        # response) before taking the snapshot, so the snapshot does not depend on when it is read.
        state_before = poll(lambda: _views(d), _tail_phase_stored)
        assert _tail_phase_stored(state_before), state_before
        # The same inputs again: each re-emits its remembered outputs (a CLAIM only its own score).
        again = [e for events, _ in phases for e in events]
        inputs = {e["event_id"]: e for e in again}
        distinct = {o["event_id"]: o for o in first}.values()
        re_emitted = Counter(o["event_id"] for o in distinct if _re_emitted(o, inputs))
        assert sum(re_emitted.values()) == sum(2 if e.get("role") == "synthesis" else 1 for e in again)
        once_more = Counter(o["event_id"] for o in first) + re_emitted
        d.produce(again)
        # Every re-emitted output read (so each stage has processed the re-deliveries), then the markers:
        # no output the re-deliveries caused can still be on its way, so the count is exact.
        d.collect(_each_arrived(d, once_more))
        outputs = _through_markers(d, marker_factory, markers)
        assert Counter(o["event_id"] for o in outputs) == once_more  # no new id, no copy too many
        assert {_key(o) for o in outputs} == first_keys
        assert _views(d) == state_before
        # Once more, each re-stamped an hour later, as a producer that stamps its retries sends them:
        # the same event ids, so the same output ids and no state counted twice.
        restamped = [{**e, "timestamp": _an_hour_later(e["timestamp"])} for e in again]
        d.produce(restamped)
        twice_more = once_more + re_emitted
        d.collect(_each_arrived(d, twice_more))
        outputs = _through_markers(d, marker_factory, markers)
        assert Counter(o["event_id"] for o in outputs) == twice_more
        # ... and the same scores (DESIGN 4b): a re-stamped response was scored again over the history
        # at its new time, which held its own first delivery (twenty-ninth round).
        assert {_key(o) for o in outputs} == first_keys
        assert _views(d) == state_before
    finally:
        d.stop()


def _an_hour_later(timestamp: str) -> str:
    return (datetime.fromisoformat(timestamp) + timedelta(hours=1)).isoformat()
