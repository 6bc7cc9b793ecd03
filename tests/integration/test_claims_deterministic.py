"""Through the broker: one claim graph per tenant, exact and deterministic (issue: claims per tenant).

A tenant's claims are produced in one trace, so their order at the claim stage is fixed; then the set of
(source_event_id, claim_id, interval) must be the same on every run, with 1 or 4 partitions and 1 or 2
workers, and equal to the pure graph function applied in that order.
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import timedelta
from typing import Any

import orjson

from streams.events import ClaimEvent
from streams.harness import RunningBroker
from streams.scoring import calibration
from streams.scoring.calibration import Histogram
from streams.scoring.claim_graph import ClaimArrived, ClaimNode, apply_claim
from streams.scoring.claims import ClaimsConfig
from streams.stages.trace import claim_definition
from tests.integration.fixtures import T0, Deployment, EventFactory, count_of, deploy, get_json, poll

Triple = tuple[str, str, float, float]  # (source_event_id, claim_id, lower, upper)


OUTCOME_EVERY = 6  # an OUTCOME for a claim already scored after every sixth claim
OUTCOME_MINUTES = 601  # after every claim's event time: each pair joins (wait 1 h, window 7 days)


def _claim_stream(tenant: str, n: int = 60, seed: int = 11) -> list[dict[str, Any]]:
    """A mixed stream in one trace: forward references, contradictions both ways, supports, derived
    claims, replacements and out-of-order event times; and OUTCOMEs judging claims seen before them."""
    rng = random.Random(seed)
    f = EventFactory(tenant=tenant)
    f.run = f"fixed-{tenant}"
    ids = [f"k{i}" for i in range(20)]
    events: list[dict[str, Any]] = []
    for i in range(n):
        if i and i % OUTCOME_EVERY == 0:
            judged = rng.choice(sorted({e["claim_id"] for e in events if e["event_type"] == "CLAIM"}))
            events.append(
                f.outcome(f"claims-{tenant}", OUTCOME_MINUTES, claim_id=judged, correct=rng.random() < 0.6)
            )
        claim_id = rng.choice(ids)
        relationships = [
            {
                "type": rng.choice(["supports", "contradicts"]),
                "target": rng.choice(ids),
                "strength": rng.choice([0.3, 0.6, 0.9]),
            }
            for _ in range(rng.randint(0, 3))
        ]
        derived = rng.sample(ids, rng.randint(1, 2)) if rng.random() < 0.2 else []
        events.append(
            f.claim(
                f"claims-{tenant}",
                claim_id,
                minutes=rng.uniform(0, 600),  # event times out of order
                relationships=relationships,
                derived_from=derived,
                provenance=[
                    {"source_type": t, "confidence": rng.choice([0.5, 0.7, 0.9])}
                    for t in rng.sample(["agent", "user", "extraction"], rng.randint(1, 3))
                ],
                staleness_at=(T0 + timedelta(minutes=rng.uniform(0, 300))).isoformat()
                if rng.random() < 0.3
                else None,
                tier=rng.choice(["ephemeral", "task"]),
            )
        )
    return events


def _sequential(events: list[dict[str, Any]]) -> tuple[list[Triple], Histogram]:
    """The pure graph function applied in topic order: what every deployment must emit; and the
    calibration of the tenant's claims, each OUTCOME counted at its claim's last score before it."""
    nodes: dict[str, ClaimNode] = {}
    triples = []
    last_midpoint: dict[str, float] = {}
    histogram: Histogram = {}
    for raw in events:
        if raw["event_type"] == "OUTCOME":
            observed = 1.0 if raw["correct"] else 0.0
            histogram = calibration.add(histogram, last_midpoint[raw["claim_id"]], observed)
            continue
        event = ClaimEvent.model_validate_json(orjson.dumps(raw))
        update = apply_claim(
            nodes.get,
            ClaimArrived(
                definition=claim_definition(event), source_event_id=event.event_id, event_time=event.timestamp
            ),
            ClaimsConfig(),
        )
        nodes.update(update.nodes)
        triples += [
            (s.source_event_id, s.claim_id, s.interval.lower, s.interval.upper) for s in update.scores
        ]
        last_midpoint.update((s.claim_id, s.interval.midpoint) for s in update.scores)
    return triples, histogram


def _claim_outputs(d: Deployment, expected: int, tenants: set[str]) -> list[dict[str, Any]]:
    def done(records: list[Any]) -> bool:
        return sum(1 for o in d.outputs(records) if o["event_type"] == "CLAIM_SCORED") >= expected

    records = d.collect(done, timeout=120)
    return [o for o in d.outputs(records) if o["event_type"] == "CLAIM_SCORED" and o["tenant_id"] in tenants]


def _triples(outputs: list[dict[str, Any]]) -> list[Triple]:
    return [
        (o["source_event_id"], o["claim_id"], o["interval"]["lower"], o["interval"]["upper"]) for o in outputs
    ]


def _claim_calibration(d: Deployment, tenant: str, outcomes: int) -> list[dict[str, Any]]:
    """The reliability bins of the tenant's claim group, once it counted all its outcomes."""

    def fetch() -> dict[str, Any]:
        status, body = get_json(d.web_ports[0], f"/calibration/{tenant}?agent_type=planner&kind=claim")
        return body if status == 200 else {"status": status, "body": body}

    def counted(body: dict[str, Any]) -> bool:
        return [g["samples"] for g in body.get("groups", [])] == [outcomes]

    body = poll(fetch, counted, timeout=60, interval=0.3)
    assert counted(body), f"the claim group of {tenant} did not count {outcomes} outcomes: {body}"
    return list(body["groups"][0]["bins"])


def _rounded(bins: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Means to 9 decimals: a sum of the same terms in the same order, through JSON."""
    return {
        tenant: [{k: round(v, 9) if isinstance(v, float) else v for k, v in b.items()} for b in group]
        for tenant, group in bins.items()
    }


def _run(
    kafka: RunningBroker,
    partitions: int,
    workers: int,
    streams: dict[str, list[dict[str, Any]]],
    expected: int,
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    d = deploy(kafka, partitions=partitions)
    for _ in range(workers):
        d.start_worker()
    try:
        # Interleave the tenants' streams; each tenant's own order is kept (one trace, one partition).
        merged = [e for group in zip(*streams.values(), strict=True) for e in group]
        d.produce(merged)
        outputs = _claim_outputs(d, expected, set(streams))
        outcomes = {t: sum(e["event_type"] == "OUTCOME" for e in events) for t, events in streams.items()}
        return outputs, {tenant: _claim_calibration(d, tenant, n) for tenant, n in outcomes.items()}
    finally:
        d.stop()


def test_same_outputs_whatever_the_partitions_and_workers(kafka: RunningBroker) -> None:
    """Also the calibration of each tenant's claims: every OUTCOME is counted at its claim's score made
    last before it (thirty-first round: outcomes went to the calibration stage straight from stage 1
    and could overtake the re-scores of the claims before them)."""
    streams = {tenant: _claim_stream(tenant, seed=i) for i, tenant in enumerate(["ta", "tb", "tc"])}
    sequential = {tenant: _sequential(events) for tenant, events in streams.items()}
    expected = {tenant: triples for tenant, (triples, _) in sequential.items()}
    want_bins = {
        tenant: [b.model_dump(mode="json") for b in calibration.reliability(histogram)]
        for tenant, (_, histogram) in sequential.items()
    }
    total = sum(len(t) for t in expected.values())
    want = sorted(t for triples in expected.values() for t in triples)
    runs = {
        (1, 1): _run(kafka, 1, 1, streams, total),
        (4, 1): _run(kafka, 4, 1, streams, total),
        (4, 2): _run(kafka, 4, 2, streams, total),
    }
    for setup, (_, bins) in runs.items():
        assert _rounded(bins) == _rounded(want_bins), (
            f"{setup}: claim calibration differs from the sequential"
        )
    for setup, (outputs, _) in runs.items():
        got = _triples(outputs)
        # Exactly one CLAIM_SCORED per (input, affected claim): no transient copies.
        duplicates = [k for k, n in Counter((s, c) for s, c, _, _ in got).items() if n > 1]
        assert duplicates == [], f"{setup}: several outputs for {duplicates[:5]}"
        assert sorted(got) == want, f"{setup}: outputs differ from the sequential graph"
        # Event ids are deterministic too.
        assert len({o["event_id"] for o in outputs}) == total
    assert {o["event_id"] for o in runs[(1, 1)][0]} == {o["event_id"] for o in runs[(4, 2)][0]}


def _produce_and_wait(d: Deployment, events: list[dict[str, Any]], expected: int) -> list[dict[str, Any]]:
    d.produce(events)
    return _claim_outputs(d, expected, {events[0]["tenant_id"]})


def _forward_reference(kafka: RunningBroker, b_first: bool) -> list[dict[str, Any]]:
    f = EventFactory(tenant="fwd")
    f.run = "fwd-fixed"
    a = f.claim("fwd-trace", "A", minutes=0)
    b = f.claim(
        "fwd-trace", "B", minutes=1, relationships=[{"type": "contradicts", "target": "A", "strength": 0.5}]
    )
    a_at_end = f.claim("fwd-trace", "A", minutes=2)  # the same A again (a new input): the final value
    d = deploy(kafka, partitions=2)
    d.start_worker()
    try:
        first, second = (b, a) if b_first else (a, b)
        # B first: B alone (1), then A's input scores A and re-scores B (2). A first: 1, then 2.
        _produce_and_wait(d, [first], 1)
        _produce_and_wait(d, [second], 3)
        return _produce_and_wait(d, [a_at_end], 5)
    finally:
        d.stop()


def test_forward_reference_both_ways(kafka: RunningBroker) -> None:
    b_first = _forward_reference(kafka, b_first=True)
    a_first = _forward_reference(kafka, b_first=False)
    penalised = (round(0.8 * (2 / 3) * 0.92, 9), round(0.8 * 0.92, 9))  # 0.8 upper x 0.5 x 0.2 -> 0.92
    alone = (round(0.8 * (2 / 3), 9), 0.8)

    def view(outputs: list[dict[str, Any]]) -> list[tuple[str, str, tuple[float, float]]]:
        return [
            (o["claim_id"], o["cause"], (round(o["interval"]["lower"], 9), round(o["interval"]["upper"], 9)))
            for o in outputs
        ]

    # B before A: B is scored alone; at A's input A is already penalised and B is re-scored (cause A).
    by_source = Counter(o["source_event_id"] for o in b_first)
    assert sorted(by_source.values()) == [1, 2, 2]
    assert view(b_first)[:3] == [("B", "self", alone), ("A", "self", penalised), ("B", "A", penalised)]
    # A before B: A alone; B's input scores B penalised and re-scores A.
    assert view(a_first)[:3] == [("A", "self", alone), ("B", "self", penalised), ("A", "B", penalised)]
    # Same final intervals either way.
    assert view(b_first)[3:] == view(a_first)[3:] == [("A", "self", penalised), ("B", "A", penalised)]
    assert all(o["as_of"].startswith("2026-11-22T12:02") for o in b_first[3:])


def test_redelivered_claim_re_emits_its_own_output_only(kafka: RunningBroker) -> None:
    f = EventFactory(tenant="redeliver-claims")
    a = f.claim("rd-trace", "A")
    b = f.claim(
        "rd-trace", "B", minutes=1, relationships=[{"type": "contradicts", "target": "A", "strength": 0.5}]
    )
    d = deploy(kafka, partitions=1)
    d.start_worker()
    try:
        first = _produce_and_wait(d, [a, b], 3)
        d.produce([b])

        def b_re_emitted(records: list[Any]) -> bool:
            own = [o for o in d.outputs(records) if o["source_event_id"] == b["event_id"]]
            return sum(1 for o in own if o.get("claim_id") == "B") >= 2

        # B's own score again: the claim stage has processed the re-delivery.
        d.collect(b_re_emitted, timeout=120)
        # A marker claim after it (same tenant and trace; nothing points at it, so it scores only
        # itself). One partition, one worker: the claim stage takes the marker in a later batch than
        # the re-delivery, and a batch's outputs go out only once the previous batch's are
        # acknowledged (streams/batch_runner.py), so every output the re-delivery caused is on the
        # topic before the marker's score, whatever arrives late.
        marker = f.claim("rd-trace", "M", minutes=2)
        d.produce([marker])
        records = d.collect(count_of("CLAIM_SCORED", 1, d.settings.scored_topic, {marker["event_id"]}), 120)
    finally:
        d.stop()
    again = [
        o
        for o in d.outputs(records)
        if o["event_type"] == "CLAIM_SCORED" and o["source_event_id"] in {a["event_id"], b["event_id"]}
    ]
    assert len(first) == 3
    b_outputs = [o for o in again if o["source_event_id"] == b["event_id"]]
    # B's input produced B and A; its re-delivery re-emitted B's own output only (same id, same scores).
    assert Counter(o["claim_id"] for o in b_outputs) == {"B": 2, "A": 1}
    own = [o for o in b_outputs if o["claim_id"] == "B"]
    assert own[0]["event_id"] == own[1]["event_id"] and own[0]["interval"] == own[1]["interval"]
    assert len(again) == 4 and len({o["event_id"] for o in again}) == 3


def test_a_claim_redelivered_after_its_claim_forgot_it_changes_nothing(kafka: RunningBroker) -> None:
    """A claim remembers its last 64 inputs' scores (`max_remembered_events`). Before the thirtieth
    round, X's first version re-delivered after 64 later versions of X was applied again: X and Y
    re-emitted, and X contradicting Y again, so a later supporter of Y read Y penalised."""
    f = EventFactory(tenant="forgotten")
    y = f.claim("fg-trace", "Y")
    contradicts_y = [{"type": "contradicts", "target": "Y", "strength": 1.0}]
    x0 = f.claim("fg-trace", "X", minutes=1, relationships=contradicts_y)
    later = [
        f.claim("fg-trace", "X", minutes=1 + i, provenance=[{"source_type": "agent", "confidence": 0.5}])
        for i in range(1, 65)
    ]
    d = deploy(kafka, partitions=1)
    d.start_worker()
    try:
        _produce_and_wait(d, [y, x0, *later], 1 + 2 + 64)
        d.produce([x0])  # its producer retries, after X moved on
        # A marker after it (one partition, one worker: its outputs follow every output the
        # re-delivery caused, see the test above): Z supports Y, so it re-scores Y as of now.
        z = f.claim(
            "fg-trace", "Z", minutes=70, relationships=[{"type": "supports", "target": "Y", "strength": 1.0}]
        )
        d.produce([z])
        records = d.collect(count_of("CLAIM_SCORED", 2, d.settings.scored_topic, {z["event_id"]}), 120)
    finally:
        d.stop()
    outputs = [o for o in d.outputs(records) if o["event_type"] == "CLAIM_SCORED"]
    assert Counter(o["claim_id"] for o in outputs if o["source_event_id"] == x0["event_id"]) == {
        "X": 1,
        "Y": 1,
    }
    y_now = next(o for o in outputs if o["source_event_id"] == z["event_id"] and o["claim_id"] == "Y")
    assert y_now["interval"]["factors"]["contradiction_penalty"] == 1.0, y_now["interval"]
