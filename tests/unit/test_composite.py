"""Seed 004's composite: factors, renormalisation, thresholds, levels and the history window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.scoring.composite import (
    I_DONT_KNOW_ANSWER,
    CodeValidation,
    CompositeConfig,
    code_validation_score,
    history_score,
    knowledge_base_score,
    response_certainty_score,
    score_composite,
)

CFG = CompositeConfig()
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("similarities", "expected"),
    [
        ([0.85, 0.8, 0.75], 1.0),  # seed: 0.85 + 3 x 0.05
        ([0.92, 0.85, 0.65], 1.0),  # seed helper example: 0.92 + 2 x 0.05, capped
        ([0.71], 0.76),
        ([0.69, 0.5], 0.0),
        ([], 0.0),  # present but empty
        ([0.7] * 10, 0.9),  # bonus capped at +0.2
        ([0.6999999999999], 0.7499999999999),  # 0.7 once rounded to 9 decimals (DESIGN 4b): relevant
        ([0.6999999994], 0.0),  # 0.699999999 rounded: not relevant
    ],
)
def test_knowledge_base(similarities: list[float], expected: float) -> None:
    assert knowledge_base_score(similarities) == pytest.approx(expected)


def test_code_validation_seed_example() -> None:
    cv = CodeValidation(
        code_exists=True, syntax_valid=True, type_valid=True, tests_exist=True, tests_pass=False
    )
    assert code_validation_score(cv) == pytest.approx(0.85)
    assert code_validation_score(CodeValidation()) == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I definitely tested this and it's confirmed working", 0.8),  # DESIGN's correction: 3 markers
        ("The result.", 0.5),
        ("I think maybe", 0.2),
        ("It is untested", 0.6),  # substring counting: "untested" counts "tested"
        ("maybe " * 10, 0.0),
        ("definitely verified tested confirmed documented proven", 1.0),
    ],
)
def test_response_certainty(text: str, expected: float) -> None:
    assert response_certainty_score(text) == pytest.approx(expected)


def test_composite_seed_example() -> None:
    """Seed 004's example: factors 1.0, 0.85, 0.7 and 0.9 give 0.875."""
    result = score_composite(
        "planner",
        [0.95, 0.9],  # 0.95 + 2 x 0.05, capped at 1.0
        CodeValidation(code_exists=True, syntax_valid=True, type_valid=True, tests_exist=True),  # 0.85
        "definitely confirmed",  # 0.5 + 2 x 0.1
        0.9,
        CFG,
    )
    assert result.factors == pytest.approx(
        {"knowledge_base": 1.0, "code_validation": 0.85, "response_certainty": 0.7, "agent_history": 0.9}
    )
    assert result.score == pytest.approx(0.875)


def test_history_window_and_default() -> None:
    entries = [(NOW - timedelta(hours=1), i < 18) for i in range(20)]
    assert history_score(entries, NOW) == pytest.approx(0.9)  # seed: 18/20
    assert history_score([], NOW) == 0.5
    assert history_score([(NOW - timedelta(hours=25), False)], NOW) == 0.5  # outside the 24 h window
    assert history_score([(NOW, False)], NOW) == 0.5  # the window is [t - 24h, t)
    assert history_score([(NOW - timedelta(hours=24), True)], NOW) == 1.0


def test_missing_factors_renormalise() -> None:
    result = score_composite("planner", None, None, "The result.", 1.0, CFG)
    assert result.missing_factors == ("knowledge_base", "code_validation")
    assert result.weights == {"response_certainty": 0.5, "agent_history": 0.5}
    assert result.score == pytest.approx(0.75)
    assert result.threshold_met and not result.should_block and result.block_reason is None


@pytest.mark.parametrize(
    ("agent_type", "threshold"),
    [
        ("planner", 0.75),
        ("Patcher", 0.80),
        ("VALIDATOR", 0.85),
        ("dgts_enforcer", 0.90),
        ("clerk", 0.70),
        ("researcher", 0.75),
    ],
)
def test_thresholds(agent_type: str, threshold: float) -> None:
    assert CFG.threshold_for(agent_type) == threshold


def test_threshold_compared_after_rounding() -> None:
    # KB 0.7 + 2 x 0.05 computes as 0.7999999999999999 and must meet a 0.80 threshold.
    only_kb = {"knowledge_base": 1.0, "code_validation": 0.0, "response_certainty": 0.0, "agent_history": 0.0}
    result = score_composite(
        "other", [0.7, 0.7], None, "", 0.5, CompositeConfig(weights=only_kb, default_threshold=0.8)
    )
    assert result.score < 0.8 and result.threshold_met and not result.should_block
    blocked = score_composite("x", [0.6], None, "The result.", 0.5, CompositeConfig(default_threshold=0.8))
    assert (
        blocked.should_block and blocked.block_reason and "below x threshold 80.00%" in blocked.block_reason
    )
    assert I_DONT_KNOW_ANSWER == "I don't know - my confidence is too low to answer this accurately."


@pytest.mark.parametrize(
    ("kb_similarity", "shown"),
    [
        (0.74996, "79.99%"),  # 0.79996 rounded would read "80.00% below ... 80.00%"
        (0.65, "70.00%"),  # 0.7000000000000001 is not cut to 69.99 %
        (0.6, "65.00%"),
        (0.12, "17.00%"),  # 0.16999999999999998: x 10,000 is 1699.9999999999998, not cut to 16.99 %
        (0.7499999, "79.99%"),  # 7999.999 hundredths of a percent: not rounded up to 80.00 % first
    ],
)
def test_block_reason_never_shows_a_blocked_score_at_its_threshold(kb_similarity: float, shown: str) -> None:
    only_kb = {"knowledge_base": 1.0, "code_validation": 0.0, "response_certainty": 0.0, "agent_history": 0.0}
    cfg = CompositeConfig(weights=only_kb, default_threshold=0.8, kb_relevance_threshold=0.0)
    result = score_composite("other", [kb_similarity], None, "", 0.5, cfg)  # one relevant result: +0.05
    assert result.should_block
    assert result.block_reason == f"Composite confidence {shown} below other threshold 80.00%"


def test_levels_and_block() -> None:
    strong = score_composite(
        "patcher",
        [0.95, 0.9, 0.85],
        CodeValidation(
            code_exists=True, syntax_valid=True, type_valid=True, tests_exist=True, tests_pass=True
        ),
        "definitely verified tested confirmed documented",
        0.5,
        CFG,
    )
    assert strong.score == pytest.approx(0.9) and strong.level == "MODERATE"  # HIGH needs > 0.90
    weak = score_composite("validator", [], CodeValidation(), "maybe", 0.0, CFG)
    assert weak.level == "VERY_LOW" and weak.should_block


unit = st.floats(min_value=0, max_value=1)


@given(st.one_of(st.none(), st.lists(unit, max_size=8)), st.booleans(), st.text(max_size=200), unit)
def test_composite_in_unit_interval(
    sims: list[float] | None, with_code: bool, text: str, history: float
) -> None:
    result = score_composite(
        "planner", sims, CodeValidation(code_exists=True) if with_code else None, text, history, CFG
    )
    assert 0.0 <= result.score <= 1.0 + 1e-12
    assert sum(result.weights.values()) == pytest.approx(1.0)


@given(st.lists(st.tuples(st.integers(min_value=0, max_value=48 * 60), st.booleans()), max_size=50))
def test_history_is_a_fraction(entries: list[tuple[int, bool]]) -> None:
    value = history_score([(NOW - timedelta(minutes=m), met) for m, met in entries], NOW)
    assert 0.0 <= value <= 1.0
