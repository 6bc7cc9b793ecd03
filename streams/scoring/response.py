"""Seed 003: per-response confidence from token logprobs and the allow / flag / reject decision.

Validity (DESIGN 4): None, NaN, +inf and values > 1e-6 are invalid; values in (0, 1e-6] count as 0.0;
-inf is valid (its probability is 0). With `enabled=False` no confidence is computed (the caller skips
`calculate_confidence`) and every response is allowed (docs/DECISIONS.md "Scoring"):
`treat_null_as_low` judges a missing confidence only while confidence is enabled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "Action",
    "Aggregation",
    "ConfidenceDecision",
    "ResponseConfig",
    "calculate_confidence",
    "evaluate_confidence",
]

Aggregation = Literal["average", "min", "percentile_90"]
Action = Literal["allow", "flag", "reject"]
LOW_CONFIDENCE = "LOW_CONFIDENCE"
_TINY_POSITIVE = 1e-6


@dataclass(frozen=True)
class ResponseConfig:
    """Seed 003's ConfidenceConfig (enabled by default in this service)."""

    enabled: bool = True
    aggregation: Aggregation = "average"
    min_acceptance: float = 0.40
    on_low: Action = "flag"
    treat_null_as_low: bool = False
    precision: int = 3


class ConfidenceDecision(BaseModel):
    """Seed 003's ConfidenceResult."""

    model_config = ConfigDict(frozen=True)
    confidence: float | None
    action: Action
    flags: tuple[str, ...]


def _valid(logprobs: Sequence[float | None]) -> list[float]:
    """Drop None, NaN, +inf and positives above _TINY_POSITIVE; tiny positives count as 0.0.

    A single bound check does it (in a comprehension, a third less time than a loop calling
    `math.isnan`): NaN fails every comparison, and +inf is above the bound.
    """
    return [0.0 if lp > 0.0 else lp for lp in logprobs if lp is not None and lp <= _TINY_POSITIVE]


def calculate_confidence(
    logprobs: Sequence[float | None] | None, aggregation: Aggregation = "average", precision: int = 3
) -> float | None:
    """exp(aggregate of the valid logprobs), clamped to [0, 1] and rounded; None when none is valid."""
    if not logprobs:
        return None
    valid = _valid(logprobs)
    if not valid:
        return None
    if aggregation == "min":
        m = min(valid)
    elif aggregation == "percentile_90":
        ordered = sorted(valid)
        m = ordered[max(0, int(len(ordered) * 0.1))]
    else:
        # The seed's own arithmetic, bit for bit: a rounding edge decides allow or flag. A sum past
        # -DBL_MAX is -inf (floats do not raise), and exp of it 0.
        m = sum(valid) / len(valid)
    confidence = max(0.0, min(1.0, math.exp(m)))
    return round(confidence, precision)


def evaluate_confidence(confidence: float | None, cfg: ResponseConfig) -> ConfidenceDecision:
    """Seed 003's `evaluate_confidence`, branch for branch; a disabled feature decides nothing."""
    if confidence is None:
        # Disabled, every confidence is None by design: that is not a low one (DECISIONS "Scoring").
        if cfg.enabled and cfg.treat_null_as_low:
            flags = (LOW_CONFIDENCE,) if cfg.on_low == "flag" else ()
            return ConfidenceDecision(confidence=None, action=cfg.on_low, flags=flags)
        return ConfidenceDecision(confidence=None, action="allow", flags=())
    if confidence < cfg.min_acceptance:
        flags = (LOW_CONFIDENCE,) if cfg.on_low == "flag" else ()
        return ConfidenceDecision(confidence=confidence, action=cfg.on_low, flags=flags)
    return ConfidenceDecision(confidence=confidence, action="allow", flags=())
