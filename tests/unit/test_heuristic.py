"""Seed 000's heuristic scorer: hedging and structure exactly as the seed, Weighted(), levels."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.scoring.heuristic import Component, level_for, score_heuristic, weighted


def _component(text: str, factor: str) -> Component:
    return next(c for c in score_heuristic(text).components if c.factor == factor)


def test_seed_weighted_example() -> None:
    components = [
        Component(factor="a", score=0.8, weight=0.5),
        Component(factor="b", score=0.6, weight=0.3),
        Component(factor="c", score=0.4, weight=0.2),
    ]
    assert weighted(components) == pytest.approx((0.8 * 0.5 + 0.6 * 0.3 + 0.4 * 0.2) / 1.0, abs=0.001)
    assert weighted([], base=0.42) == 0.42
    assert weighted([Component(factor="a", score=0.8, weight=0.0)], base=0.3) == 0.3


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("The answer is 42.", 1.0),
        ("It might be 42.", 0.9),
        ("I THINK it could be 42, maybe.", 0.7),  # markers match lower-cased: i think, could be, maybe
        ("Maybe, maybe, maybe, maybe, maybe, maybe.", 0.5),  # capped at -0.5
    ],
)
def test_hedging(text: str, score: float) -> None:
    component = _component(text, "hedging")
    assert component.score == pytest.approx(score) and component.weight == 0.2


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("plain", 0.5),
        ("- item", 0.65),
        ("1. step", 0.65),
        ("## Title", 0.65),
        ("**bold**", 0.65),
        ("```code```", 0.7),
        ("## T\n- a\n```x```", 1.0),
    ],
)
def test_structure(text: str, score: float) -> None:
    component = _component(text, "structure")
    assert component.score == pytest.approx(score) and component.weight == 0.15


@pytest.mark.parametrize(
    ("length", "score"),
    [
        (0, 0.3),
        (100, 0.65),
        (200, 1.0),  # the linear rise ends here, inclusive
        (201, 1.0),
        (4000, 1.0),  # the flat part ends here, inclusive
        (4001, 0.8),
    ],
)
def test_length_boundaries(length: int, score: float) -> None:
    component = _component("a" * length, "length")
    assert component.score == pytest.approx(score) and component.weight == 0.15


def test_length_counts_code_points_not_bytes() -> None:
    assert _component("é" * 4000, "length").score == 1.0  # 8,000 bytes of UTF-8


def test_score_is_weighted_mean_of_components() -> None:
    result = score_heuristic("## Plan\n- definitely do it")
    assert result.score == pytest.approx(weighted(result.components))
    assert result.level == level_for(result.score)


@pytest.mark.parametrize(
    ("score", "level"),
    [
        (0.95, "high"),
        (0.9, "high"),
        (0.8999999999999999, "high"),
        (0.7, "medium"),
        (0.5, "low"),
        (0.49, "very_low"),
    ],
)
def test_levels(score: float, level: str) -> None:
    assert level_for(score) == level


@given(st.text(max_size=5000))
def test_score_in_unit_interval(text: str) -> None:
    result = score_heuristic(text)
    assert 0.0 <= result.score <= 1.0
    assert all(0.0 <= c.score <= 1.0 for c in result.components)
