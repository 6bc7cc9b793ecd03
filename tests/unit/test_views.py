"""The claim filters of the query view (pure part): inclusive bounds compared after rounding to 9 decimals."""

from __future__ import annotations

from streams.views import claim_matches


def test_width_computed_with_float_error_meets_its_threshold() -> None:
    lower, upper = 0.7, 0.9  # upper - lower = 0.20000000000000007; and 0.6 - 0.4 = 0.19999999999999996
    assert claim_matches(lower, upper, min_width=0.2)
    assert claim_matches(0.4, 0.6, min_width=0.2)
    assert not claim_matches(0.4, 0.6, min_width=0.200000002)


def test_seed_002_queries() -> None:
    assert claim_matches(0.7, 0.85, min_lower=0.7)  # "lower bound above 0.7", inclusive
    assert not claim_matches(0.69, 0.85, min_lower=0.7)
    assert claim_matches(0.3, 0.9, min_upper=0.8, max_lower=0.5)  # high upper, low lower
    assert not claim_matches(0.6, 0.9, min_upper=0.8, max_lower=0.5)
