"""Seed 003: logprob confidence and evaluate_confidence, exactly as DESIGN section 4 states."""

from __future__ import annotations

import math
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.scoring.response import ResponseConfig, calculate_confidence, evaluate_confidence

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("logprobs", "aggregation", "expected"),
    [
        (None, "average", None),
        ([], "average", None),
        ([None, NAN, INF, 0.5, 2.0], "average", None),  # every entry invalid
        ([-0.2], "average", round(math.exp(-0.2), 3)),
        ([-0.1, -0.2, -0.3], "average", 0.819),
        ([-0.1, -0.2, -0.3], "min", round(math.exp(-0.3), 3)),
        ([5e-7, 1e-6], "average", 1.0),  # (0, 1e-6] counts as 0
        ([1.1e-6, -0.5], "average", round(math.exp(-0.5), 3)),  # > 1e-6 is invalid
        ([-INF, -0.1], "average", 0.0),  # -inf is valid: probability 0
        ([-INF, -0.1], "min", 0.0),
        ([None, -0.5, NAN, INF, -1.5], "average", round(math.exp(-1.0), 3)),
        ([-INF], "percentile_90", 0.0),
    ],
)
def test_calculate_confidence(
    logprobs: list[float | None] | None, aggregation: str, expected: float | None
) -> None:
    assert calculate_confidence(logprobs, aggregation, 3) == expected  # type: ignore[arg-type]


def test_percentile_index_rule() -> None:
    # n = 10 -> index int(10 * 0.1) = 1: the second smallest; n = 9 -> index 0: the smallest.
    values = [-float(i) / 10 for i in range(10)]  # 0.0 .. -0.9
    assert calculate_confidence(values, "percentile_90", 6) == round(math.exp(-0.8), 6)
    assert calculate_confidence(values[:9], "percentile_90", 6) == round(math.exp(-0.8), 6)
    assert calculate_confidence(values[1:], "percentile_90", 6) == round(math.exp(-0.9), 6)
    assert calculate_confidence([-0.3, -0.1], "percentile_90", 6) == round(math.exp(-0.3), 6)


def test_rounding_precision() -> None:
    assert calculate_confidence([-0.123456], "average", 2) == 0.88
    assert calculate_confidence([-0.123456], "average", 5) == round(math.exp(-0.123456), 5)


def _cfg(**kw: object) -> ResponseConfig:
    return ResponseConfig(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("confidence", "cfg", "action", "flags"),
    [
        (None, _cfg(), "allow", ()),
        (None, _cfg(treat_null_as_low=True), "flag", ("LOW_CONFIDENCE",)),
        (None, _cfg(treat_null_as_low=True, on_low="reject"), "reject", ()),
        (None, _cfg(treat_null_as_low=True, on_low="allow"), "allow", ()),
        # Disabled: no confidence is computed, and that is not a low one (DECISIONS "Scoring").
        (None, _cfg(enabled=False, treat_null_as_low=True), "allow", ()),
        (None, _cfg(enabled=False, treat_null_as_low=True, on_low="reject"), "allow", ()),
        (0.39, _cfg(), "flag", ("LOW_CONFIDENCE",)),
        (0.39, _cfg(on_low="reject"), "reject", ()),
        (0.39, _cfg(on_low="allow"), "allow", ()),
        (0.40, _cfg(), "allow", ()),  # at the threshold: accepted
        (0.95, _cfg(on_low="reject"), "allow", ()),
    ],
)
def test_evaluate_confidence_branches(
    confidence: float | None, cfg: ResponseConfig, action: str, flags: tuple[str, ...]
) -> None:
    decision = evaluate_confidence(confidence, cfg)
    assert (decision.confidence, decision.action, decision.flags) == (confidence, action, flags)


logprob = st.one_of(st.none(), st.floats())
mode = st.sampled_from(["average", "min", "percentile_90"])


@given(st.lists(logprob, max_size=60), mode)
def test_range_and_idempotence(values: list[float | None], aggregation: str) -> None:
    first = calculate_confidence(values, aggregation, 3)  # type: ignore[arg-type]
    assert first is None or 0.0 <= first <= 1.0
    assert calculate_confidence(values, aggregation, 3) == first  # type: ignore[arg-type]


def test_an_average_below_the_smallest_float_is_confidence_zero() -> None:
    """Found by the property above (a valid response, not a bad one): three logprobs of -DBL_MAX,
    each divided by 3 and rounded up in magnitude, sum exactly to below -DBL_MAX, and math.fsum raised
    OverflowError, which dead-lettered the response. Seed 003's sum gives -inf, so confidence 0."""
    assert calculate_confidence([-sys.float_info.max] * 3, "average", 3) == 0.0
    assert calculate_confidence([-sys.float_info.max, -sys.float_info.max / 2], "average", 3) == 0.0


@given(st.lists(st.floats(min_value=-50, max_value=0), min_size=1, max_size=60))
def test_min_never_above_average(values: list[float]) -> None:
    low = calculate_confidence(values, "min", 9)
    avg = calculate_confidence(values, "average", 9)
    assert low is not None and avg is not None and low <= avg


def test_extreme_values_do_not_overflow() -> None:
    # Found by hypothesis: the plain sum of two -9e307 overflows.
    assert calculate_confidence([-8.988465674311579e307, -8.98846567431158e307], "average", 3) == 0.0


def _valid_as_the_seed_states(logprobs: list[float | None]) -> list[float]:
    """Seed 003's filter, entry by entry: skip None, NaN, > 1e-6 and +inf; (0, 1e-6] counts as 0."""
    kept: list[float] = []
    for lp in logprobs:
        if lp is None or math.isnan(lp) or lp > 1e-6 or lp == math.inf:
            continue
        kept.append(0.0 if lp > 0.0 else lp)
    return kept


@given(st.lists(st.one_of(st.none(), st.floats(), st.sampled_from([1e-6, 5e-7, 0.0, -0.0, -INF, INF, NAN]))))
def test_filter_is_the_seed_rule(values: list[float | None]) -> None:
    # The filter is one comparison per entry (a comprehension, for speed); it must keep exactly what
    # the seed's explicit checks keep, the sign of -0.0 included.
    from streams.scoring.response import _valid

    expected = _valid_as_the_seed_states(values)
    got = _valid(values)
    assert [(v, math.copysign(1.0, v)) for v in got] == [(v, math.copysign(1.0, v)) for v in expected]


def _seed_average(logprobs: list[float | None]) -> float:
    """Seed 003's average branch as written there: `sum(valid) / len(valid)`, exp, clamp, round."""
    valid = _valid_as_the_seed_states(logprobs)
    return round(max(0.0, min(1.0, math.exp(sum(valid) / len(valid)))), 3)


def test_the_average_is_the_seeds_arithmetic_at_a_rounding_edge() -> None:
    """Summing the quotients (math.fsum of v / n) gave 0.399 here, a flag, where the seed gives 0.4."""
    edge = [-0.7155662583192558, -0.02779552060207072, -1.4262901723124828]
    edge += [-0.292512124050512, -1.757086626039317, -1.2859983813312077]
    assert _seed_average(edge) == 0.4
    assert calculate_confidence(edge, "average", 3) == 0.4
    assert evaluate_confidence(0.4, _cfg()).action == "allow"


@given(st.lists(st.one_of(st.none(), st.floats(), st.sampled_from([-INF, 5e-7])), min_size=1, max_size=60))
def test_the_average_equals_the_seeds(values: list[float | None]) -> None:
    expected = _seed_average(values) if _valid_as_the_seed_states(values) else None
    assert calculate_confidence(values, "average", 3) == expected
