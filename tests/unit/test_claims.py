"""Seed 002 intervals: aggregation, diversity, staleness, support / contradiction, trust, derived."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.scoring.claims import (
    ClaimsConfig,
    Provenance,
    aggregate,
    derived_interval,
    effective_interval,
    staleness_factor,
)

CFG = ClaimsConfig()
T = datetime(2026, 11, 22, tzinfo=UTC)


def prov(*pairs: tuple[str, float]) -> list[Provenance]:
    return [Provenance(source_type=t, confidence=c) for t, c in pairs]


@pytest.mark.parametrize(
    ("entries", "lower", "upper", "diversity"),
    [
        (prov(("agent", 0.8)), 0.8 * (0.5 + 0.5 / 3), 0.8, 0.6667),
        (prov(("a", 0.7), ("b", 0.7), ("c", 0.7)), 0.7, 1 - 0.3**3, 1.0),
        (prov(("a", 0.5), ("a", 0.5)), 0.5 * (0.5 + 0.5 / 3), 0.75, 0.6667),
        (prov(("a", 0.5), ("b", 0.9)), 0.9 * (0.5 + 1 / 3), 0.95, 0.8333),
        ([], 0.0, 0.0, 0.5),
    ],
)
def test_aggregate(entries: list[Provenance], lower: float, upper: float, diversity: float) -> None:
    got = aggregate(entries, CFG)
    assert got[0] == pytest.approx(lower) and got[1] == pytest.approx(upper)
    assert round(got[2], 4) == diversity


@pytest.mark.parametrize(
    ("tier", "elapsed", "factor"),
    [
        ("ephemeral", timedelta(hours=4), 0.5),
        ("ephemeral", timedelta(hours=8), 0.25),
        ("task", timedelta(days=3), 0.5),
        ("project", timedelta(weeks=4), 0.5),
        ("persistent", timedelta(days=365), 0.25),
        ("task", -timedelta(days=1), 1.0),
    ],
)
def test_staleness_half_lives(tier: str, elapsed: timedelta, factor: float) -> None:
    assert staleness_factor(T, T + elapsed, tier, CFG) == pytest.approx(factor)
    assert staleness_factor(None, T + elapsed, tier, CFG) == 1.0


def test_support_and_contradiction() -> None:
    lo, up, div = aggregate(prov(("agent", 0.8)), CFG)
    supported = effective_interval(lo, up, div, 1.0, [(0.8, 0.5)], [], 1.0, CFG)
    assert supported.upper == pytest.approx(0.8 * 1.04) and supported.lower == pytest.approx(lo)
    contradicted = effective_interval(lo, up, div, 1.0, [], [(0.8, 1.0)], 1.0, CFG)
    assert (contradicted.lower, contradicted.upper) == pytest.approx((lo * 0.84, 0.8 * 0.84))
    assert contradicted.factors.contradiction_penalty == pytest.approx(0.84)
    crushed = effective_interval(lo, up, div, 1.0, [], [(1.0, 1.0)] * 6, 1.0, CFG)
    assert crushed.factors.contradiction_penalty == 0.0 and crushed.upper == 0.0  # clamped at 0


def test_single_clamp_then_instance_trust_and_projections() -> None:
    result = effective_interval(0.9, 0.99, 1.0, 1.0, [(1.0, 1.0)] * 3, [], 0.5, CFG)
    assert result.upper == pytest.approx(0.5)  # clamped to 1.0 first, then x 0.5 trust
    assert result.midpoint == pytest.approx((result.lower + result.upper) / 2)
    assert result.width == pytest.approx(result.upper - result.lower)
    assert (result.conservative, result.optimistic) == (result.lower, result.upper)


def test_derived_rule() -> None:
    result = derived_interval([(0.7, 0.973), (0.448, 0.672)], 0.9, (0.1, 0.2, 0.5))
    assert (result.lower, result.upper) == pytest.approx((0.448, 0.9))
    narrow = derived_interval([(0.6, 0.9), (0.5, 0.6)], 0.65, (0.0, 0.0, 0.5))
    # upper = min(0.65, 0.9); widest width 0.3 -> lower pushed down to 0.35
    assert (narrow.lower, narrow.upper) == pytest.approx((0.35, 0.65))
    assert narrow.factors.derived is True


unit = st.floats(min_value=0, max_value=1)
pairs = st.lists(st.tuples(unit, unit), max_size=5)


@given(st.lists(st.tuples(st.sampled_from("abcd"), unit), max_size=6), unit, pairs, pairs, unit)
def test_bounds_ordered_in_unit_interval(
    entries: list[tuple[str, float]],
    stale: float,
    sup: list[tuple[float, float]],
    con: list[tuple[float, float]],
    trust: float,
) -> None:
    lo, up, div = aggregate(prov(*entries), CFG)
    result = effective_interval(lo, up, div, stale, sup, con, trust, CFG)
    assert 0.0 <= result.lower <= result.upper <= 1.0


@given(st.lists(st.tuples(st.sampled_from("abc"), unit), min_size=1, max_size=5), pairs, pairs, unit, unit)
def test_contradiction_never_raises_support_never_lowers(
    entries: list[tuple[str, float]],
    sup: list[tuple[float, float]],
    con: list[tuple[float, float]],
    extra_upper: float,
    strength: float,
) -> None:
    lo, up, div = aggregate(prov(*entries), CFG)
    base = effective_interval(lo, up, div, 1.0, sup, con, 1.0, CFG)
    more_con = effective_interval(lo, up, div, 1.0, sup, [*con, (extra_upper, strength)], 1.0, CFG)
    assert more_con.lower <= base.lower + 1e-12 and more_con.upper <= base.upper + 1e-12
    more_sup = effective_interval(lo, up, div, 1.0, [*sup, (extra_upper, strength)], con, 1.0, CFG)
    assert more_sup.upper >= base.upper - 1e-12


@given(
    st.sampled_from(["ephemeral", "task", "project", "persistent"]),
    st.integers(0, 10_000),
    st.integers(0, 10_000),
)
def test_more_staleness_never_raises_a_bound(tier: str, a: int, b: int) -> None:
    early, late = sorted((a, b))
    lo, up, div = aggregate(prov(("x", 0.9)), CFG)
    first = effective_interval(
        lo, up, div, staleness_factor(T, T + timedelta(hours=early), tier, CFG), [], [], 1, CFG
    )
    later = effective_interval(
        lo, up, div, staleness_factor(T, T + timedelta(hours=late), tier, CFG), [], [], 1, CFG
    )
    assert later.lower <= first.lower and later.upper <= first.upper
