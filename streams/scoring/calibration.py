"""Online calibration: how often scores of p turned out right, and which threshold would have worked.

Pure math, no Kafka. Predictions and outcomes are kept in `FINE_BINS` (100) bins of width 0.01, each
with count, sum of predictions, sum of outcomes and sum of squared errors. From those follow exactly:

- the reliability diagram in `RELIABILITY_BINS` (10) bins: count, mean predicted, observed rate;
- ECE = sum over bins of (count / total) * |observed rate - mean predicted| (10 bins);
- the Brier score = mean of (prediction - outcome)^2;
- the threshold advice on the 0.01 grid: the lowest threshold t whose "allowed" predictions (>= t)
  had a mean outcome (precision) at or above the target, and the share it would have held back.

An outcome is 1.0 (correct), 0.0 (wrong) or a graded score in [0, 1]. Bin i holds predictions in
[i/100, (i+1)/100); the last bin also holds 1.0. Histograms are plain dicts, so they can be summed
across hourly buckets (the sliding window) and stored as JSON.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping
from typing import NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict

__all__ = [
    "FINE_BINS",
    "RELIABILITY_BINS",
    "ActionStats",
    "BinStats",
    "Histogram",
    "ReliabilityBin",
    "ThresholdAdvice",
    "add",
    "advise_threshold",
    "brier",
    "ece",
    "fine_bin",
    "merge",
    "reliability",
    "subtract",
    "summary",
    "total",
]

FINE_BINS = 100
RELIABILITY_BINS = 10
# Inner edges 0.01 .. 0.99, written as i / 100 so that bin i starts exactly at the threshold i / 100.
_FINE_EDGES = tuple(i / FINE_BINS for i in range(1, FINE_BINS))


class BinStats(NamedTuple):
    """Sums over the predictions that fell in one bin (a tuple: stored as a JSON array, cheap to add)."""

    n: int = 0  # not `count`: that is a tuple method
    sum_predicted: float = 0.0
    sum_observed: float = 0.0
    sum_squared_error: float = 0.0

    def plus(self, other: BinStats) -> BinStats:
        return BinStats(
            self.n + other.n,
            self.sum_predicted + other.sum_predicted,
            self.sum_observed + other.sum_observed,
            self.sum_squared_error + other.sum_squared_error,
        )

    def minus(self, other: BinStats) -> BinStats:
        return BinStats(
            self.n - other.n,
            self.sum_predicted - other.sum_predicted,
            self.sum_observed - other.sum_observed,
            self.sum_squared_error - other.sum_squared_error,
        )


# Fine bin index (0..99) -> its sums; empty bins are absent.
Histogram = Mapping[int, BinStats]


class ActionStats(NamedTuple):
    """Outcomes of the responses that got one action (allow / flag / reject)."""

    n: int = 0  # not `count`: that is a tuple method
    sum_observed: float = 0.0

    def plus(self, other: ActionStats) -> ActionStats:
        return ActionStats(self.n + other.n, self.sum_observed + other.sum_observed)

    def minus(self, other: ActionStats) -> ActionStats:
        return ActionStats(self.n - other.n, self.sum_observed - other.sum_observed)

    @property
    def observed_accuracy(self) -> float | None:
        return _within(self.sum_observed / self.n, 0.0, 1.0) if self.n else None


def _within(value: float, low: float, high: float) -> float:
    """`value` kept in [low, high]. Window totals are kept by adding each outcome and subtracting each
    hour that leaves, and graded outcomes make those float sums drift by a few ulps: a mean of values in
    [0, 1] came out as -4.4e-16 or 1.0000000000000004, and a bin's mean just under its lower edge."""
    return min(high, max(low, value))


K = TypeVar("K")
S = TypeVar("S", BinStats, ActionStats)


class ReliabilityBin(BaseModel):
    """One bar of the reliability diagram."""

    model_config = ConfigDict(frozen=True)
    lower: float
    upper: float
    count: int
    mean_predicted: float | None
    observed_rate: float | None


class ThresholdAdvice(BaseModel):
    """The lowest threshold that met the target precision in the window (None when none did)."""

    model_config = ConfigDict(frozen=True)
    target_precision: float
    threshold: float | None
    precision: float | None
    allowed: int
    held_back_share: float | None


def fine_bin(predicted: float) -> int:
    """The fine bin of a prediction in [0, 1], after rounding to 9 decimals as every threshold
    comparison is (DESIGN 4b): 0.7 + 0.1 = 0.7999999999999999 meets a 0.80 threshold, so it belongs
    to the bin that starts at 0.80, where the threshold advice counts it as allowed."""
    return bisect_right(_FINE_EDGES, round(predicted, 9))


def add(histogram: Histogram, predicted: float, observed: float) -> dict[int, BinStats]:
    """`histogram` with one more (prediction, outcome)."""
    index = fine_bin(predicted)
    one = BinStats(1, predicted, observed, (predicted - observed) ** 2)
    current = histogram.get(index)
    return {**histogram, index: one if current is None else current.plus(one)}


def subtract(totals: Mapping[K, S], removed: Mapping[K, S]) -> dict[K, S]:
    """`totals` without `removed` (an hour leaving the window), for bins or actions; emptied entries are
    dropped, so rounding left by the subtraction never outlives the data it came from.

    An entry `totals` lacks or holds fewer of is left out rather than raising: the group and its hour
    buckets are separate changelog records, and a worker that stopped between writing them can leave a
    bucket the restored group never counted (it would otherwise fail every later outcome of the group).
    """
    result = dict(totals)
    for key, stats in removed.items():
        current = result.get(key)
        if current is None:
            continue
        left = current.minus(stats)
        if left.n > 0:
            result[key] = left
        else:
            del result[key]
    return result


def merge(histograms: Iterable[Histogram]) -> dict[int, BinStats]:
    """The sum of several histograms (e.g. the hourly buckets of a window)."""
    merged: dict[int, BinStats] = {}
    for histogram in histograms:
        for index, stats in histogram.items():
            current = merged.get(index)
            merged[index] = stats if current is None else current.plus(stats)
    return merged


def total(histogram: Histogram) -> int:
    return sum(stats.n for stats in histogram.values())


def _coarse(histogram: Histogram) -> list[tuple[int, float, float]]:
    """(count, sum predicted, sum observed) per reliability bin, summed in bin order."""
    width = FINE_BINS // RELIABILITY_BINS
    counts, predicted, observed = [0] * RELIABILITY_BINS, [0.0] * RELIABILITY_BINS, [0.0] * RELIABILITY_BINS
    for index in sorted(histogram):
        count, sum_predicted, sum_observed, _ = histogram[index]
        coarse = index // width
        counts[coarse] += count
        predicted[coarse] += sum_predicted
        observed[coarse] += sum_observed
    return list(zip(counts, predicted, observed, strict=True))


def summary(histogram: Histogram) -> tuple[int, float | None, float | None]:
    """(samples, ECE, Brier) in one pass over the bins (the per-outcome path)."""
    n = sum(stats.n for stats in histogram.values())
    if n == 0:
        return 0, None, None
    squared = sum(stats.sum_squared_error for stats in histogram.values())
    gaps = sum(abs(o / c - p / c) * c for c, p, o in _coarse(histogram) if c)
    return n, _within(gaps / n, 0.0, 1.0), _within(squared / n, 0.0, 1.0)


def reliability(histogram: Histogram) -> list[ReliabilityBin]:
    """The 10-bin reliability diagram (empty bins have count 0 and no means)."""
    bins = []
    for coarse, (count, predicted, observed) in enumerate(_coarse(histogram)):
        lower, upper = coarse / RELIABILITY_BINS, (coarse + 1) / RELIABILITY_BINS
        bins.append(
            ReliabilityBin(
                lower=lower,
                upper=upper,
                count=count,
                mean_predicted=_within(predicted / count, lower, upper) if count else None,
                observed_rate=_within(observed / count, 0.0, 1.0) if count else None,
            )
        )
    return bins


def ece(histogram: Histogram) -> float | None:
    """Expected calibration error over the 10 reliability bins (None without data)."""
    return summary(histogram)[1]


def brier(histogram: Histogram) -> float | None:
    """Mean squared error of the predictions (None without data)."""
    return summary(histogram)[2]


def advise_threshold(histogram: Histogram, target_precision: float) -> ThresholdAdvice:
    """The lowest t on the 0.01 grid whose predictions >= t had mean outcome >= `target_precision`.

    "Allowed" is seed 003's rule (confidence below `min_acceptance` is flagged or rejected) and seed
    004's (composite below the threshold blocks). Lower thresholds allow more, so the lowest one that
    meets the target is the least restrictive setting that would have been good enough.
    """
    n = total(histogram)
    allowed, observed = 0, 0.0
    best: tuple[int, int, float] | None = None
    # Walk from the top bin down, accumulating what a threshold at the bin's lower edge allows.
    for index in range(FINE_BINS - 1, -1, -1):
        stats = histogram.get(index)
        if stats is not None:
            allowed += stats.n
            observed += stats.sum_observed
        # Compared after rounding to 9 decimals (DESIGN 4b): 1.8 / 2 computed as 0.8999999999999999
        # meets a target of 0.9.
        if allowed and round(observed / allowed, 9) >= target_precision:
            best = (index, allowed, observed / allowed)
    if best is None:
        return ThresholdAdvice(
            target_precision=target_precision, threshold=None, precision=None, allowed=0, held_back_share=None
        )
    index, count, precision = best
    return ThresholdAdvice(
        target_precision=target_precision,
        threshold=index / FINE_BINS,
        precision=_within(precision, 0.0, 1.0),
        allowed=count,
        held_back_share=(n - count) / n,
    )
