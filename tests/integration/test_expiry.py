"""Bounded state: a trace idle past TRACE_TTL_HOURS of event time is swept from the table."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

import orjson

from streams.harness import RunningBroker
from streams.kafka_io import Consumed, produce
from streams.stages.common import key_partition
from streams.state import table_key
from tests.integration.fixtures import Deployment, EventFactory, count_of, deploy, health, http_get, poll
from tests.integration.workload import scrape


def _status(port: int, path: str) -> int:
    """The view's status; while partitions move, a routed request can get a non-JSON error answer."""
    status, body = http_get(port, path, timeout=5)
    if status == 200:
        json.loads(body)  # a view that answers, answers JSON
    return status


def _status_or_none(port: int, path: str) -> int | None:
    try:
        return _status(port, path)
    except urllib.error.URLError:  # a worker still starting refuses connections
        return None


SWEPT_TRACES = re.compile(r"swept [1-9][0-9]* expired traces")  # streams/agents.py, the sweep's INFO line


def _sweeps(port: int) -> float:
    """Expiry sweeps the worker has run: the count of `confidence_batch_seconds{agent="sweep"}`."""
    count = scrape(port, timeout=5).value("confidence_batch_seconds_count", agent="sweep", phase="process")
    return count or 0.0


def _deploy_one_day_claims(kafka: RunningBroker) -> Deployment:
    """Claims live one day of event time, swept every 0.5 s."""
    return deploy(
        kafka,
        partitions=2,
        CLAIM_TTL_DAYS="1",
        SWEEP_INTERVAL_SECONDS="0.5",
        EXPIRY_SOURCE_IDLE_SECONDS="2",  # the default 300 s start-up grace would outlast the test
        EVENT_TIME_MAX_AHEAD_HOURS="876600",
    )


def _supports(target: str) -> dict[str, object]:
    return {"type": "supports", "target": target, "strength": 0.5}


def _wait_for_status(port: int, path: str, status: int, what: str, timeout: float = 30) -> None:
    seen = poll(lambda: _status_or_none(port, path), lambda answer: answer == status, timeout, 0.2)
    assert seen == status, f"{what} (last status {seen})"


def test_idle_trace_expires_by_event_time(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=1, TRACE_TTL_HOURS="1", SWEEP_INTERVAL_SECONDS="0.5")
    d.start_worker()
    try:
        f = EventFactory(tenant="ttl")
        # A marker trace 40 minutes older than the old one: still within the TTL while the newest event
        # is the old trace's (minute 0), idle past it once the newest is minute 30.
        marker = f.tool("marker-trace", "find", "x", minutes=-40)
        old = f.tool("old-trace", "find", "x", minutes=0)
        d.produce([marker, old])
        d.collect(count_of("TRACE_SCORED", 1, d.settings.scored_topic, {old["event_id"]}))
        port = d.web_ports[0]
        # Wait until the views show both traces (a view answers as of the last batch the worker
        # processed, README "HTTP"), then watch them go.
        _wait_for_status(port, "/traces/ttl/old-trace", 200, "old-trace never stored")
        _wait_for_status(port, "/traces/ttl/marker-trace", 200, "marker-trace never stored")
        # Thirty minutes later in event time: the old trace (idle 30 min) is still within the TTL. The
        # marker (idle 70 min) disappearing proves a sweep ran after this event was seen, so the old
        # trace's survival below is that sweep's decision, not a sweep that has not happened yet.
        recent = f.tool("busy-trace", "find", "x", minutes=30)
        d.produce([recent])
        d.collect(count_of("TRACE_SCORED", 1, d.settings.scored_topic, {recent["event_id"]}))
        _wait_for_status(port, "/traces/ttl/marker-trace", 404, "the marker trace was never swept")
        assert "swept 1 expired traces" in d.log_text()
        assert _status(port, "/traces/ttl/old-trace") == 200
        _wait_for_status(port, "/traces/ttl/busy-trace", 200, "busy-trace never stored")
        # Two hours later in event time: the old trace is idle past the 1 h TTL and gets swept.
        later = f.tool("busy-trace", "read", "x.py", minutes=120)
        d.produce([later])
        d.collect(count_of("TRACE_SCORED", 1, d.settings.scored_topic, {later["event_id"]}))
        _wait_for_status(port, "/traces/ttl/old-trace", 404, "idle trace was never swept")
        _wait_for_status(port, "/traces/ttl/busy-trace", 200, "busy-trace was swept")
    finally:
        d.stop()


def test_state_expires_per_partition_and_a_future_dated_event_cannot_wipe_it(kafka: RunningBroker) -> None:
    """Expiry clocks are per input partition and bounded by the wall clock (EVENT_TIME_MAX_AHEAD_HOURS)."""
    d = deploy(kafka, partitions=1, TRACE_TTL_HOURS="2", SWEEP_INTERVAL_SECONDS="0.5")
    d.start_worker()
    try:
        f = EventFactory(tenant="future")
        kept = f.tool("kept-trace", "find", "x", minutes=0)  # T0: days before the wall clock
        d.produce([kept])
        d.collect(count_of("TRACE_SCORED", 1, d.settings.scored_topic, {kept["event_id"]}))
        port = d.web_ports[0]
        # An event dated 2999 moves the expiry clock only to the wall clock + 1 h (the default bound);
        # kept-trace (T0, in the past) is idle past its 2 h TTL against that and is swept.
        future = f.tool("future-trace", "find", "x", minutes=(2999 - 2026) * 365 * 24 * 60)
        d.produce([future])
        d.collect(count_of("TRACE_SCORED", 1, d.settings.scored_topic, {future["event_id"]}))
        _wait_for_status(port, "/traces/future/kept-trace", 404, "state behind the clock was never swept")
        # The future trace's own expiry counts from that bound too, not from 2999 (it would never go).
        status, body = http_get(port, "/traces/future/future-trace", timeout=5)
        assert status == 200
        kept_until = datetime.fromisoformat(json.loads(body)["last_event_time"])
        assert kept_until <= datetime.now(UTC) + timedelta(hours=1, minutes=1)
        # A trace at the wall clock's time is 1 h behind the bounded clock, within its 2 h TTL: it stays
        # (unbounded, the 2999 clock would have swept it, and every other trace, at the next sweep).
        # Behind it on the same partition, a trace 3 h behind the wall clock (4 h behind the bounded
        # clock, past its TTL): its leaving proves a sweep ran after both were stored, with the clock
        # at the bound, and decided to keep now-trace.
        now_trace = EventFactory(tenant="future").tool("now-trace", "find", "x")
        now_trace["timestamp"] = datetime.now(UTC).isoformat()
        doomed = EventFactory(tenant="future").tool("doomed-trace", "find", "x")
        doomed["timestamp"] = (datetime.now(UTC) - timedelta(hours=3)).isoformat()
        swept_before = len(SWEPT_TRACES.findall(d.log_text()))  # kept-trace's sweep
        d.produce([now_trace, doomed])  # one partition: doomed is applied after now-trace
        ids = {now_trace["event_id"], doomed["event_id"]}
        d.collect(count_of("TRACE_SCORED", 2, d.settings.scored_topic, ids))
        _wait_for_status(port, "/traces/future/doomed-trace", 404, "the trace past its TTL was never swept")
        # The 404 could also mean it was never stored: the sweep's log line says it was swept.
        assert len(SWEPT_TRACES.findall(d.log_text())) > swept_before
        assert _status(port, "/traces/future/now-trace") == 200
        # And it stays through three more sweeps, counted by the sweep's own timing histogram (a sweep
        # that found the worker rebalancing or stopping returns before it and is not counted).
        sweeps_from = _sweeps(port)

        def sweeps_with_now_trace_kept() -> float:
            assert _status(port, "/traces/future/now-trace") == 200  # at every poll
            return _sweeps(port)

        sweeps = poll(sweeps_with_now_trace_kept, lambda n: n >= sweeps_from + 3, 30, 0.2)
        assert sweeps >= sweeps_from + 3, f"the sweep stopped running ({sweeps_from} -> {sweeps} sweeps)"
        assert _status(port, "/traces/future/now-trace") == 200
    finally:
        d.stop()


def test_claims_and_stubs_expire_by_event_time(kafka: RunningBroker) -> None:
    """CLAIM_TTL_DAYS after its last update a claim leaves the table, as does a stub (a target that
    never arrives); a claim or stub that a live claim points at lives as long as that claim, since its
    node holds the live claim's edge (a claim re-sent with the same relationships outlived its target's
    node and lost the edge: a contradiction became one-sided, found by review)."""
    d = _deploy_one_day_claims(kafka)
    d.start_worker()
    try:
        f = EventFactory(tenant="claim-ttl")
        old = f.claim("ct-trace", "old", minutes=0)
        lonely = f.claim("ct-trace", "lonely", minutes=0)
        pointing = f.claim(
            "ct-trace",
            "pointing",
            minutes=1,
            relationships=[
                {"type": "contradicts", "target": "old", "strength": 0.5},
                {"type": "supports", "target": "never-arrives", "strength": 0.5},
            ],
        )
        first = {old["event_id"], lonely["event_id"], pointing["event_id"]}
        d.produce([old, lonely, pointing])
        d.collect(count_of("CLAIM_SCORED", 4, d.settings.scored_topic, first))
        port = d.web_ports[0]
        _wait_for_status(port, "/claims/claim-ttl/lonely", 200, "the lonely claim never stored")
        # Two days later in event time, "pointing" is updated (a new version, same relationships):
        # "lonely" (last updated at minute 0) is past its 1-day TTL and is swept; "old", which
        # "pointing" contradicts, stays with it, and both are scored with the contradiction.
        renewed = f.claim(
            "ct-trace", "pointing", minutes=2 * 24 * 60, relationships=pointing["relationships"]
        )
        d.produce([renewed])
        records = d.collect(count_of("CLAIM_SCORED", 2, d.settings.scored_topic, {renewed["event_id"]}))
        _wait_for_status(port, "/claims/claim-ttl/lonely", 404, "the expired claim was never swept")
        assert "expired claims" in d.log_text()
        _wait_for_status(port, "/claims/claim-ttl/pointing", 200, "the renewed claim is missing")
        _wait_for_status(port, "/claims/claim-ttl/old", 200, "the claim a live claim contradicts was swept")
        penalties = {
            o["claim_id"]: o["interval"]["factors"]["contradiction_penalty"]
            for o in d.outputs(records)
            if o["event_type"] == "CLAIM_SCORED" and o["source_event_id"] == renewed["event_id"]
        }
        assert set(penalties) == {"pointing", "old"} and max(penalties.values()) < 1.0
    finally:
        d.stop()


def test_a_claim_id_used_again_after_it_expired_carries_no_edge_of_its_old_version(
    kafka: RunningBroker,
) -> None:
    """The sweep deleted an expired claim's node but left its edge in the claim it supported: a new
    claim with the same id, declaring no relationship, boosted that claim again (found by review)."""
    d = _deploy_one_day_claims(kafka)
    d.start_worker()
    scored = d.settings.scored_topic

    def boost_of(event: dict[str, object]) -> float:
        records = d.collect(count_of("CLAIM_SCORED", 1, scored, {event["event_id"]}))
        (output,) = (o for o in d.outputs(records) if o["source_event_id"] == event["event_id"])
        return float(output["interval"]["factors"]["support_boost"])

    try:
        f = EventFactory(tenant="claim-reuse")
        supports = [{"type": "supports", "target": "t", "strength": 1.0}]
        d.produce([f.claim("cr-trace", "x", minutes=0, relationships=supports)])
        first_t = f.claim("cr-trace", "t", minutes=1)
        d.produce([first_t])
        assert boost_of(first_t) > 1.0  # the premise: x's edge counts for t
        # Two days later t is updated and x, untouched since minute 0, is past its 1-day TTL.
        d.produce([f.claim("cr-trace", "t", minutes=2 * 24 * 60)])
        _wait_for_status(d.web_ports[0], "/claims/claim-reuse/x", 404, "the expired claim was never swept")
        d.produce([f.claim("cr-trace", "x", minutes=2 * 24 * 60 + 1)])  # the id again, no relationship
        last_t = f.claim("cr-trace", "t", minutes=2 * 24 * 60 + 2)
        d.produce([last_t])
        assert boost_of(last_t) == 1.0
    finally:
        d.stop()


def test_a_claim_alive_by_being_pointed_at_keeps_the_claim_it_contradicts(kafka: RunningBroker) -> None:
    """y contradicts t (a stub) and lives on because z's versions touch it; t is never touched again.
    The sweep deleted t, y's edge with it, and t arrived without y's contradiction (found by review)."""
    d = _deploy_one_day_claims(kafka)
    d.start_worker()
    try:
        f = EventFactory(tenant="claim-chain")
        contradicts = [{"type": "contradicts", "target": "t", "strength": 1.0}]
        d.produce([f.claim("cc-trace", "y", minutes=0, relationships=contradicts)])
        d.produce([f.claim("cc-trace", "lonely", minutes=0)])  # swept by the same sweep as t would be
        hours = 60
        d.produce([f.claim("cc-trace", "z", minutes=20 * hours, relationships=[_supports("y")])])
        d.produce([f.claim("cc-trace", "clock", minutes=36 * hours)])  # t and lonely past their 1-day TTL
        _wait_for_status(
            d.web_ports[0], "/claims/claim-chain/lonely", 404, "the lonely claim was never swept"
        )
        arriving = f.claim("cc-trace", "t", minutes=37 * hours)
        d.produce([arriving])
        records = d.collect(count_of("CLAIM_SCORED", 1, d.settings.scored_topic, {arriving["event_id"]}))
        (t,) = (
            o
            for o in d.outputs(records)
            if o["source_event_id"] == arriving["event_id"] and o["claim_id"] == "t"
        )
        assert t["interval"]["factors"]["contradiction_penalty"] < 1.0
    finally:
        d.stop()


def test_state_a_worker_takes_over_still_expires(kafka: RunningBroker) -> None:
    """State a worker restores from the changelog when it takes over a stopped worker's partition was
    never written through its own code: the sweep must still find it (the sweep index scans the table
    after every recovery, not only at start)."""
    d = deploy(kafka, partitions=2, TRACE_TTL_HOURS="1", SWEEP_INTERVAL_SECONDS="0.5")
    d.start_worker()
    leaving = d.start_worker()
    try:
        f = EventFactory(tenant="ttl-takeover")
        # One old trace and one later trace on each partition (the input is keyed by trace id).
        names = {
            p: [t for t in (f"trace-{i}" for i in range(50)) if key_partition(t.encode(), 2) == p]
            for p in (0, 1)
        }
        old = [f.tool(names[p][0], "find", "x", minutes=0) for p in (0, 1)]
        d.produce(old)
        d.collect(count_of("TRACE_SCORED", 2, d.settings.scored_topic, {e["event_id"] for e in old}))
        leaving.stop()
        port = d.web_ports[0]  # the worker that stays now owns both partitions
        for event in old:  # a rebalance and a changelog restore: the suite allows 60-90 s for those
            _wait_for_status(port, f"/traces/ttl-takeover/{event['trace_id']}", 200, "not taken over", 90)
        # Two hours later in event time, on both partitions: both old traces are idle past the 1 h TTL.
        later = [f.tool(names[p][1], "read", "x.py", minutes=120) for p in (0, 1)]
        d.produce(later)
        d.collect(count_of("TRACE_SCORED", 2, d.settings.scored_topic, {e["event_id"] for e in later}))
        for event in old:
            path = f"/traces/ttl-takeover/{event['trace_id']}"
            _wait_for_status(port, path, 404, f"{path} was never swept")
        for event in later:
            path = f"/traces/ttl-takeover/{event['trace_id']}"
            _wait_for_status(port, path, 200, f"{path} never stored")
    finally:
        d.stop()


def test_a_stored_value_the_worker_cannot_read_is_skipped_not_fatal(kafka: RunningBroker) -> None:
    """A changelog value this version cannot decode (another version's, or another writer's) made every
    expiry sweep raise: the worker crashed after each restart, on restoring it. Now the sweep skips it
    (logged, counted) and goes on expiring the rest; only an input that needs it is dead-lettered."""
    d = deploy(
        kafka, partitions=1, TRACE_TTL_HOURS="1", SWEEP_INTERVAL_SECONDS="0.5", EXPIRY_SOURCE_IDLE_SECONDS="2"
    )
    first = d.start_worker()
    f = EventFactory(tenant="ttl-corrupt")
    try:
        old = f.tool("t-old", "find", "x", minutes=0)
        d.produce([old])
        d.collect(count_of("TRACE_SCORED", 1, d.settings.scored_topic, {old["event_id"]}))
        assert first.stop() == 0
        changelog = f"{d.settings.app_id}-traces-changelog"
        corrupt = [(table_key("ttl-corrupt", "t-bad"), b'{"trace": "from somewhere else"}')]
        asyncio.run(produce(kafka.bootstrap_servers, changelog, corrupt))
        d.close_changelog_gaps()
        second = d.start_worker()  # restores t-old and the value it cannot read
        port = d.web_ports[-1]
        _wait_for_status(port, "/traces/ttl-corrupt/t-old", 200, "t-old was never restored")
        # Two hours later in event time: the sweep must get past t-bad to expire t-old.
        later = f.tool("t-new", "read", "x.py", minutes=120)
        d.produce([later])
        d.collect(count_of("TRACE_SCORED", 1, d.settings.scored_topic, {later["event_id"]}))
        _wait_for_status(port, "/traces/ttl-corrupt/t-old", 404, "the sweep never expired t-old")
        assert second.alive() and health(port, "/healthz")[0] == 200
        assert scrape(port).value("confidence_state_undecodable_total", table="traces") == 1
        assert "the sweep skips key" in d.log_text()
        # Its view says why in JSON (aiohttp's bare 500 page did not), and the worker stays up.
        status, body = http_get(port, "/traces/ttl-corrupt/t-bad", timeout=5)
        assert status == 500
        assert "a stored value of table traces is not a valid TraceState" in orjson.loads(body)["error"]
        assert second.alive() and health(port, "/healthz")[0] == 200
        # An input for t-bad needs the value: dead-lettered, saying why; the next input is scored.
        needs_it, after = f.tool("t-bad", "find", "y", minutes=121), f.tool("t-new", "grep", "y", minutes=122)
        d.produce([needs_it, after])
        scored = count_of("TRACE_SCORED", 1, d.settings.scored_topic, {after["event_id"]})

        def dead(rs: list[Consumed]) -> list[Consumed]:
            return [r for r in rs if r.topic == d.settings.dlq_topic]

        records = d.collect(lambda rs: scored(rs) and bool(dead(rs)))
        (letter,) = dead(records)
        headers = dict(letter.headers)
        assert headers["__connect.errors.exception.class.name"] == b"UndecodableState"
        assert orjson.loads(letter.value)["event_id"] == needs_it["event_id"]
        assert second.alive()
    finally:
        d.stop()


def test_an_agent_silent_past_its_history_retention_leaves(kafka: RunningBroker) -> None:
    """Agent names need not be a fixed set: an agent that stopped answering loses its history once
    HISTORY_RETENTION_HOURS of event time passed its newest response (its next one would have dropped
    every hour anyway); before the eighteenth round it stayed for ever."""
    d = deploy(
        kafka,
        partitions=1,
        HISTORY_RETENTION_HOURS="1",
        HISTORY_WINDOW_HOURS="1",
        SWEEP_INTERVAL_SECONDS="0.5",
        EXPIRY_SOURCE_IDLE_SECONDS="2",
    )
    d.start_worker()
    try:
        f = EventFactory(tenant="agents-ttl")
        quiet = f.response("t-quiet", minutes=0, agent="quiet-agent")
        d.produce([quiet])
        d.collect(count_of("RESPONSE_SCORED", 1, d.settings.scored_topic, {quiet["event_id"]}))
        port = d.web_ports[0]
        _wait_for_status(port, "/agents/agents-ttl/quiet-agent", 200, "quiet-agent's history never stored")
        assert _success_rate_agents(port) == {"quiet-agent"}
        # Three hours later another agent answers: quiet-agent's newest (minute 0) + 1 h has passed.
        busy = f.response("t-busy", minutes=180, agent="busy-agent")
        d.produce([busy])
        d.collect(count_of("RESPONSE_SCORED", 1, d.settings.scored_topic, {busy["event_id"]}))
        _wait_for_status(port, "/agents/agents-ttl/quiet-agent", 404, "the silent agent was never swept")
        _wait_for_status(port, "/agents/agents-ttl/busy-agent", 200, "the answering agent was swept")
        # Its success rate left /metrics with it (a dead instance's rate stayed on every dashboard).
        assert _success_rate_agents(port) == {"busy-agent"}
        assert "agents' histories" in d.log_text()
    finally:
        d.stop()


def _success_rate_agents(port: int) -> set[str]:
    """The agents `confidence_agent_success_rate` has a series for."""
    status, body = http_get(port, "/metrics", timeout=5)
    assert status == 200
    lines = body.decode().splitlines()
    series = [line for line in lines if line.startswith("confidence_agent_success_rate{")]
    return {line.split('agent="', 1)[1].split('"', 1)[0] for line in series}
