"""Calibration math against scikit-learn (test-only oracle) and brute force."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sklearn.calibration import calibration_curve
from sklearn.metrics import brier_score_loss

from streams.scoring import calibration

predictions = st.floats(0.0, 1.0, allow_nan=False)
pairs = st.lists(st.tuples(predictions, st.booleans()), min_size=1, max_size=200)


def histogram_of(points: list[tuple[float, float]]) -> dict[int, calibration.BinStats]:
    histogram: dict[int, calibration.BinStats] = {}
    for predicted, observed in points:
        histogram = calibration.add(histogram, predicted, observed)
    return histogram


def off_edges(points: list[tuple[float, bool]]) -> bool:
    # sklearn's edges come from np.linspace (0.30000000000000004), ours are i / 10: a prediction within
    # rounding of an edge may land in the neighbouring bin. Everything else must agree exactly.
    return all(abs(p * 10 - round(p * 10)) > 1e-9 or p in (0.0, 1.0) for p, _ in points)


@settings(max_examples=300, deadline=None)
@given(pairs)
def test_reliability_bins_equal_sklearn_calibration_curve(points: list[tuple[float, bool]]) -> None:
    assume(off_edges(points))
    y_prob = np.array([p for p, _ in points])
    y_true = np.array([int(o) for _, o in points])
    prob_true, prob_pred = calibration_curve(y_true, y_prob, n_bins=10, strategy="uniform")
    bins = [b for b in calibration.reliability(histogram_of([(p, float(o)) for p, o in points])) if b.count]
    assert len(bins) == len(prob_true)
    for ours, observed, predicted in zip(bins, prob_true, prob_pred, strict=True):
        assert ours.observed_rate is not None and ours.mean_predicted is not None
        assert math.isclose(ours.observed_rate, observed, abs_tol=1e-12)
        assert math.isclose(ours.mean_predicted, predicted, abs_tol=1e-12)


@settings(max_examples=300, deadline=None)
@given(pairs)
def test_ece_is_the_count_weighted_gap_of_sklearns_bins(points: list[tuple[float, bool]]) -> None:
    assume(off_edges(points))
    y_prob = np.array([p for p, _ in points])
    y_true = np.array([int(o) for _, o in points])
    prob_true, prob_pred = calibration_curve(y_true, y_prob, n_bins=10, strategy="uniform")
    counts = np.bincount(np.searchsorted(np.linspace(0, 1, 11)[1:-1], y_prob, side="right"), minlength=10)
    expected = float(np.sum(counts[counts > 0] / len(points) * np.abs(prob_true - prob_pred)))
    ece = calibration.ece(histogram_of([(p, float(o)) for p, o in points]))
    assert ece is not None and math.isclose(ece, expected, abs_tol=1e-12)


@settings(max_examples=300, deadline=None)
@given(pairs)
def test_brier_equals_sklearn(points: list[tuple[float, bool]]) -> None:
    y_prob = [p for p, _ in points]
    y_true = [int(o) for _, o in points]
    brier = calibration.brier(histogram_of([(p, float(o)) for p, o in points]))
    assert brier is not None and math.isclose(brier, brier_score_loss(y_true, y_prob), abs_tol=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(predictions, st.floats(0.0, 1.0)), min_size=1, max_size=100))
def test_graded_outcomes_brier_is_the_mean_squared_error(points: list[tuple[float, float]]) -> None:
    brier = calibration.brier(histogram_of(points))
    expected = sum((p - o) ** 2 for p, o in points) / len(points)
    assert brier is not None and math.isclose(brier, expected, rel_tol=1e-9, abs_tol=1e-12)


def brute_force_advice(
    points: list[tuple[float, bool]], target: float
) -> tuple[float | None, int, float | None]:
    """Every grid threshold, lowest first: the first whose allowed (p >= t) precision meets the target."""
    for i in range(calibration.FINE_BINS):
        threshold = i / calibration.FINE_BINS
        allowed = [o for p, o in points if round(p, 9) >= threshold]  # the service's comparison
        if allowed and round(sum(allowed) / len(allowed), 9) >= target:
            return threshold, len(allowed), (len(points) - len(allowed)) / len(points)
    return None, 0, None


@settings(max_examples=300, deadline=None)
@given(pairs, st.sampled_from([0.5, 0.8, 0.9, 0.95, 1.0]))
def test_threshold_advice_equals_brute_force(points: list[tuple[float, bool]], target: float) -> None:
    advice = calibration.advise_threshold(histogram_of([(p, float(o)) for p, o in points]), target)
    threshold, allowed, held_back = brute_force_advice(points, target)
    assert advice.threshold == threshold
    assert advice.allowed == allowed
    assert advice.held_back_share == held_back


def test_perfectly_calibrated_bins_have_zero_ece_and_a_known_brier() -> None:
    # Four predictions of 0.75, three of them right: observed rate 0.75 = mean prediction.
    points = [(0.75, 1.0), (0.75, 1.0), (0.75, 1.0), (0.75, 0.0)]
    histogram = histogram_of(points)
    assert calibration.ece(histogram) == 0.0
    assert calibration.brier(histogram) == (3 * 0.25**2 + 0.75**2) / 4


def test_overconfident_by_a_fifth_has_ece_one_fifth() -> None:
    points = [(0.9, 1.0)] * 7 + [(0.9, 0.0)] * 3  # says 0.9, right 70 % of the time
    ece = calibration.ece(histogram_of(points))
    assert ece is not None and math.isclose(ece, 0.2)


def test_empty_histogram_has_no_scores_and_no_advice() -> None:
    assert calibration.ece({}) is None
    assert calibration.brier({}) is None
    advice = calibration.advise_threshold({}, 0.9)
    assert advice.threshold is None and advice.allowed == 0


def test_bin_edges_start_at_the_threshold_grid() -> None:
    assert calibration.fine_bin(0.0) == 0
    assert calibration.fine_bin(0.29) == 29  # int(0.29 * 100) would say 28
    assert calibration.fine_bin(0.3) == 30
    assert calibration.fine_bin(0.999) == 99
    assert calibration.fine_bin(1.0) == 99


def test_threshold_advice_compares_precision_after_rounding_to_9_decimals() -> None:
    # 0.95 and 0.85 average 0.9, computed as 0.8999999999999999 (DESIGN 4b: round, then compare): every
    # threshold allows both. Unrounded, only thresholds above 0.85 (allowing 0.95 alone) would meet it.
    advice = calibration.advise_threshold(histogram_of([(0.95, 0.95), (0.85, 0.85)]), 0.9)
    assert advice.threshold == 0.0
    assert advice.allowed == 2


def test_a_score_that_meets_a_threshold_after_rounding_is_in_that_thresholds_bin() -> None:
    """0.7 + 0.1 = 0.7999999999999999 meets a 0.80 threshold in the service (DESIGN 4b). It was counted
    below 0.80, so the advice said 0.80 allows the 0.85 alone (precision 1.0) where it allows both."""
    assert calibration.fine_bin(0.7 + 0.1) == 80
    assert calibration.fine_bin(1 - 0.9) == 10  # 0.09999999999999998: reliability bin [0.1, 0.2)
    advice = calibration.advise_threshold(histogram_of([(0.7 + 0.1, 0.0), (0.85, 1.0)]), 0.9)
    assert (advice.threshold, advice.allowed, advice.precision) == (0.81, 1, 1.0)
    assert calibration.reliability(histogram_of([(1 - 0.9, 1.0)]))[1].count == 1


@pytest.mark.parametrize("seed", range(20))
def test_rates_and_means_stay_in_range_after_hours_leave_the_window(seed: int) -> None:
    """Window totals add each outcome and subtract each hour that leaves; with graded outcomes the float
    sums drift: an observed rate of -4.4e-16 or 1.0000000000000004, a mean under its bin's lower edge."""
    rng = random.Random(seed)
    hours: dict[int, dict[int, calibration.BinStats]] = {}
    totals: dict[int, calibration.BinStats] = {}
    for hour in range(40):
        bucket: dict[int, calibration.BinStats] = {}
        for _ in range(rng.randint(0, 20)):
            p = rng.choice([rng.random(), 0.999, 0.3, 1.0, 0.05])
            o = rng.choice([0.0, 1.0, rng.random(), p])
            bucket, totals = calibration.add(bucket, p, o), calibration.add(totals, p, o)
        hours[hour] = bucket
        if hour >= 5:
            totals = calibration.subtract(totals, hours.pop(hour - 5))
        for b in calibration.reliability(totals):
            assert b.observed_rate is None or 0.0 <= b.observed_rate <= 1.0
            assert b.mean_predicted is None or b.lower <= b.mean_predicted <= b.upper
        n, ece, brier = calibration.summary(totals)
        assert n == 0 or (0.0 <= ece <= 1.0 and 0.0 <= brier <= 1.0)  # type: ignore[operator]
