"""A claim's edges live in the nodes it points at (the reverse index): those nodes live as long as it.

X "supports T" is kept in T's node, which the sweep deletes `CLAIM_TTL_DAYS` after its last update.
That node was refreshed only when X's edge changed, so X re-sent with the same relationships outlived
it: the edge was lost with it, a T that arrived later took no support from X, and a contradiction
became one-sided (found by review). Each test runs the claim stage over an in-memory table and sweeps
it as the worker's sweep does.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from streams.stages.common import ExpiryClock
from tests.unit import stage_records
from tests.unit.test_claim_node_bound import _claim, _supports, _Worker

T0 = datetime(2026, 9, 1, tzinfo=UTC)  # CLAIM_TTL_DAYS is 30


def _at(event: dict[str, Any], day: float) -> dict[str, Any]:
    return {**event, "timestamp": (T0 + timedelta(days=day)).isoformat()}


def _sweep(w: _Worker) -> set[str]:
    """Delete the expired nodes no live claim points at, as the worker's sweep does (first taking their
    entries out of the nodes they pointed at); their claim ids."""
    loaded = [(key, w.nodes.load(key)) for key in list(w.table)]
    past_ttl = [(key, node) for key, node in loaded if node is not None and w.stage.expired(key, node)]
    gone, rewrites = w.stage.sweep(past_ttl, w.table.__contains__, w.nodes.load)
    for key, write in rewrites.items():
        w.table[key] = w.nodes.encode(key, write.node)
    for key in gone:
        del w.table[key]
        w.nodes.forget(key)
    return {orjson.loads(key)[1] for key in gone}


def _factors(records: list[Any], claim_id: str) -> dict[str, float]:
    (score,) = [o for o in stage_records.scored(records) if o["claim_id"] == claim_id]
    return score["interval"]["factors"]  # type: ignore[no-any-return]


def _aged(claim: dict[str, Any], versions: tuple[int, ...], until: int) -> _Worker:
    """A claim stage that applied `claim` on day 0, the same claim again (a new statement and event id,
    the same relationships) on each day of `versions`, and another claim of the tenant on day `until`,
    which moves the tenant's event time there."""
    w = _Worker(limit=1_040_000)
    w.stage.clock = ExpiryClock(timedelta(hours=1))  # a plain watermark: no idle-source grace
    w.run([_at(claim, 0)], [])
    for n, day in enumerate(versions, start=1):
        w.run([_at({**claim, "event_id": f"{claim['claim_id']}-{n}", "statement": f"version {n}"}, day)], [])
    w.run([_at(_claim(50, "other"), until)], [])
    return w


def test_a_supporter_re_sent_with_the_same_edges_keeps_its_targets_node_alive() -> None:
    def target_arrives(sweep: bool) -> dict[str, float]:
        x = _claim(0, "x", relationships=[{"type": "supports", "target": "t", "strength": 1.0}])
        w = _aged(x, versions=(10, 20, 30), until=31)
        if sweep:
            assert _sweep(w) == set()  # x was updated on day 30: neither it nor its target's stub goes
        return _factors(w.run([_at(_claim(60, "t"), 32)], []), "t")

    assert target_arrives(sweep=False)["support_boost"] > 1.0  # the premise: x supports t
    assert target_arrives(sweep=True) == target_arrives(sweep=False)


def test_a_contradiction_stays_symmetric_across_a_sweep() -> None:
    x = _claim(0, "x", relationships=[{"type": "contradicts", "target": "t", "strength": 1.0}])
    w = _aged(x, versions=(25,), until=31)
    assert _sweep(w) == set()
    arrived = w.run([_at(_claim(60, "t"), 32)], [])
    assert _factors(arrived, "t")["contradiction_penalty"] < 1.0
    again = w.run([_at({**x, "event_id": "x-2", "statement": "x v2"}, 33)], [])
    assert (
        _factors(again, "x")["contradiction_penalty"] == _factors(again, "t")["contradiction_penalty"] < 1.0
    )


def test_a_derived_claim_re_sent_keeps_its_constituents_index_alive() -> None:
    """`derived_by` lives in the constituent's node: a derived claim re-sent keeps it, so a constituent
    that arrives after 30 days still re-scores the claim derived from it."""
    w = _aged(_claim(0, "d", derived_from=["part"]), versions=(20,), until=31)
    assert _sweep(w) == set()
    arrived = w.run([_at(_claim(60, "part"), 32)], [])
    assert {o["claim_id"] for o in stage_records.scored(arrived)} == {"part", "d"}


def test_everything_expires_once_nothing_points_at_it_any_more() -> None:
    x = _claim(0, "x", relationships=[{"type": "supports", "target": "t", "strength": 1.0}])
    assert _sweep(_aged(x, versions=(10,), until=41)) == {"x", "t"}


@pytest.mark.parametrize("kind", ["supports", "contradicts"])
def test_a_claim_id_used_again_after_it_expired_takes_no_edge_of_its_old_version(kind: str) -> None:
    """x (kind t) expires while t, re-sent, lives on; a new x with no relationships arrives. t's node
    kept x's old edge, so t took x's support (or a one-sided penalty) again (found by review)."""
    w = _Worker(limit=1_040_000)
    w.stage.clock = ExpiryClock(timedelta(hours=1))
    x = _claim(0, "x", relationships=[{"type": kind, "target": "t", "strength": 1.0}])
    w.run([_at(x, 0), _at(_claim(1, "t"), 0)], [])
    premise = _factors(w.run([_at({**_claim(2, "t"), "statement": "t v2"}, 20)], []), "t")
    assert (premise["support_boost"], premise["contradiction_penalty"]) != (1.0, 1.0)  # x's edge counts
    w.run([_at(_claim(5, "other"), 31)], [])
    assert _sweep(w) == {"x"}
    w.run([_at({**_claim(6, "x"), "statement": "unrelated"}, 35)], [])
    factors = _factors(w.run([_at({**_claim(7, "t"), "statement": "t v3"}, 36)], []), "t")
    assert (factors["support_boost"], factors["contradiction_penalty"]) == (1.0, 1.0)


def test_the_sweep_leaves_no_entry_of_an_expired_claim_in_the_nodes_it_pointed_at() -> None:
    """Expired supporters and derived claims counted against the live claim's CLAIM_NODE_MAX_BYTES: a
    long-lived claim with short-lived supporters came to refuse every new one (`claim_node_full`)."""
    w = _Worker()  # the smallest bound
    w.stage.clock = ExpiryClock(timedelta(hours=1))
    refused = 0
    for round_ in range(3):  # every 31 days 200 new supporters and a derived claim; the old ones expire
        day = 31 * round_
        w.run([_at(_claim(1000 * round_ + 998, "clock"), day)], [])  # the tenant's event time moves on
        _sweep(w)
        events = [_at({**_claim(0, "hub"), "event_id": f"hub-{round_}"}, day)]
        events += [
            _at(_claim(1000 * round_ + i, f"s{round_}-{i:03d}", relationships=[_supports("hub")]), day)
            for i in range(200)
        ]
        events.append(_at(_claim(1000 * round_ + 999, f"d{round_}", derived_from=["hub"]), day))
        events.append(_at({**_claim(0, "hub"), "event_id": f"hub-{round_}-again"}, day + 16))  # it lives on
        refused += len(stage_records.dead(w.run(events, [1] * len(events))))
    assert refused == 0
    hub = w.node("hub")
    assert sorted(hub["incoming"]) == [f"s2-{i:03d}" for i in range(200)]
    assert hub["derived_by"] == ["d2"]


def test_a_claim_alive_by_being_pointed_at_keeps_the_claims_it_points_at() -> None:
    """y contradicts t (a stub); z's versions touch y, never t. The sweep deleted t with y's edge in it,
    and when t arrived the contradiction was one-sided: y penalised, t not (found by review)."""
    w = _Worker(limit=1_040_000)
    w.stage.clock = ExpiryClock(timedelta(hours=1))
    w.run(
        [_at(_claim(0, "y", relationships=[{"type": "contradicts", "target": "t", "strength": 1.0}]), 0)], []
    )
    w.run([_at(_claim(1, "z", relationships=[_supports("y")]), 20)], [])  # y touched on day 20, t not
    w.run([_at(_claim(5, "other"), 31)], [])  # the tenant's event time: day 31, t past its TTL
    assert _sweep(w) == set()  # t is pointed at by y, which z keeps alive
    arrived = w.run([_at(_claim(6, "t"), 32)], [])
    assert _factors(arrived, "t")["contradiction_penalty"] < 1.0
    # Once nothing live points at the chain any more, it goes as a whole.
    w.run([_at(_claim(7, "later"), 80)], [])
    assert _sweep(w) >= {"y", "z", "t"}


def test_a_cycle_nobody_live_points_at_expires() -> None:
    """Two claims that contradict each other point at each other: neither may keep the other alive."""
    w = _Worker(limit=1_040_000)
    w.stage.clock = ExpiryClock(timedelta(hours=1))
    a = _claim(0, "a", relationships=[{"type": "contradicts", "target": "b", "strength": 1.0}])
    b = _claim(1, "b", relationships=[{"type": "contradicts", "target": "a", "strength": 1.0}])
    w.run([_at(a, 0), _at(b, 0)], [])
    w.run([_at(_claim(5, "other"), 31)], [])
    assert _sweep(w) == {"a", "b"}
