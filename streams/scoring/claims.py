"""Seed 002's claim confidence interval: provenance, diversity, staleness, support, contradiction.

DESIGN 4/4b: one clamp (the seed's complete formula), then instance trust; the contradiction penalty is
clamped at 0; diversity follows the formula (one source type -> 0.667); derived claims replace steps
1-4 with the constituents' effective intervals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "ClaimFactors",
    "ClaimInterval",
    "ClaimsConfig",
    "Provenance",
    "Tier",
    "aggregate",
    "derived_interval",
    "effective_interval",
    "staleness_factor",
]

Tier = Literal["ephemeral", "task", "project", "persistent"]


def _half_lives() -> Mapping[str, timedelta]:
    return MappingProxyType(
        {
            "ephemeral": timedelta(hours=4),
            "task": timedelta(days=3),
            "project": timedelta(weeks=4),
            "persistent": timedelta(days=182.5),
        }
    )


@dataclass(frozen=True)
class ClaimsConfig:
    """Seed 002's tunables."""

    boost_factor: float = 0.1
    penalty_factor: float = 0.2
    diversity_max_types: int = 3
    half_lives: Mapping[str, timedelta] = field(default_factory=_half_lives)
    max_remembered_events: int = 64


class Provenance(BaseModel):
    """One source of a claim."""

    model_config = ConfigDict(frozen=True)
    source_type: str
    confidence: float
    source_id: str | None = None


class ClaimFactors(BaseModel):
    """Everything that shaped an interval."""

    model_config = ConfigDict(frozen=True)
    aggregate_lower: float
    aggregate_upper: float
    diversity: float
    staleness: float
    support_boost: float
    contradiction_penalty: float
    instance_trust: float
    derived: bool


class ClaimInterval(BaseModel):
    """Base (step 1) and effective interval with seed 002's projections."""

    model_config = ConfigDict(frozen=True)
    base_lower: float
    base_upper: float
    lower: float
    upper: float
    midpoint: float
    conservative: float
    optimistic: float
    width: float
    factors: ClaimFactors


def aggregate(provenance: Sequence[Provenance], cfg: ClaimsConfig) -> tuple[float, float, float]:
    """Step 1: (lower, upper, diversity). Empty provenance -> [0, 0]."""
    types = len({p.source_type for p in provenance})
    diversity = 0.5 + 0.5 * min(types / cfg.diversity_max_types, 1.0)
    if not provenance:
        return 0.0, 0.0, diversity
    miss = 1.0
    for p in provenance:
        miss *= 1.0 - p.confidence
    return max(p.confidence for p in provenance) * diversity, 1.0 - miss, diversity


def staleness_factor(staleness_at: datetime | None, as_of: datetime, tier: str, cfg: ClaimsConfig) -> float:
    """Step 2: 0.5 ** (time past staleness_at / the tier's half-life)."""
    if staleness_at is None or as_of <= staleness_at:
        return 1.0
    return float(0.5 ** ((as_of - staleness_at) / cfg.half_lives[tier]))


def _clamp(value: float) -> float:
    return max(0.0, min(1.0, value))


def _interval(base: tuple[float, float], lower: float, upper: float, factors: ClaimFactors) -> ClaimInterval:
    return ClaimInterval(
        base_lower=base[0],
        base_upper=base[1],
        lower=lower,
        upper=upper,
        midpoint=(lower + upper) / 2,
        conservative=lower,
        optimistic=upper,
        width=upper - lower,
        factors=factors,
    )


def effective_interval(
    aggregate_lower: float,
    aggregate_upper: float,
    diversity: float,
    staleness: float,
    supports: Sequence[tuple[float, float]],
    contradictions: Sequence[tuple[float, float]],
    instance_trust: float,
    cfg: ClaimsConfig,
) -> ClaimInterval:
    """Steps 2-4; `supports` / `contradictions` are (neighbour stale upper, strength) pairs."""
    boost = 1.0 + sum(u * s for u, s in supports) * cfg.boost_factor
    penalty = max(0.0, 1.0 - sum(u * s for u, s in contradictions) * cfg.penalty_factor)
    lower = _clamp(aggregate_lower * staleness * penalty)
    upper = _clamp(aggregate_upper * staleness * boost * penalty)
    lower = min(lower, upper)
    factors = ClaimFactors(
        aggregate_lower=aggregate_lower,
        aggregate_upper=aggregate_upper,
        diversity=diversity,
        staleness=staleness,
        support_boost=boost,
        contradiction_penalty=penalty,
        instance_trust=instance_trust,
        derived=False,
    )
    return _interval(
        (aggregate_lower, aggregate_upper), lower * instance_trust, upper * instance_trust, factors
    )


def derived_interval(
    constituents: Sequence[tuple[float, float]],
    assessed_upper: float | None,
    base: tuple[float, float, float],
) -> ClaimInterval:
    """DESIGN's derived rule (replaces steps 1-4, so no instance trust): min of lowers;
    min(assessed, max of uppers); then the lower bound drops so the width is at least the widest
    constituent's."""
    lower = min(lo for lo, _ in constituents)
    upper = max(up for _, up in constituents)
    if assessed_upper is not None:
        upper = min(upper, assessed_upper)
    widest = max(up - lo for lo, up in constituents)
    lower = max(0.0, min(lower, upper - widest))
    lower = min(lower, upper)
    factors = ClaimFactors(
        aggregate_lower=base[0],
        aggregate_upper=base[1],
        diversity=base[2],
        staleness=1.0,
        support_boost=1.0,
        contradiction_penalty=1.0,
        instance_trust=1.0,
        derived=True,
    )
    return _interval((base[0], base[1]), lower, upper, factors)
