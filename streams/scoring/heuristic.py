"""Seed 000's heuristic scorer: length, hedging, certainty and structure components.

Hedging and structure are exactly the seed's. The seed omits length and certainty; ours:
- length (weight 0.15): 0.3 for an empty answer, rising linearly to 1.0 at 200 code points, 1.0 up to
  4,000, then 0.8 (very long answers ramble);
- certainty (weight 0.15): the seed's certainty words (definitely, certainly, always, never, must be,
  clearly, obviously, undoubtedly) signal over-claiming, so 1 - min(0.1 x count, 0.5), like hedging.
Markers are matched lower-cased on both sides, as substrings (DESIGN 4b).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["Component", "HeuristicResult", "Level", "level_for", "score_heuristic", "weighted"]

Level = Literal["high", "medium", "low", "very_low"]

HEDGE_WORDS = (
    "might", "maybe", "perhaps", "possibly", "could be", "i think", "i believe", "it seems", "probably",
    "not sure", "uncertain", "unclear",
)  # fmt: skip
CERTAINTY_WORDS = (
    "definitely", "certainly", "always", "never", "must be", "clearly", "obviously", "undoubtedly",
)  # fmt: skip


class Component(BaseModel):
    """One factor of a confidence score (seed 000's ConfidenceComponent)."""

    model_config = ConfigDict(frozen=True)
    factor: str
    score: float
    weight: float


class HeuristicResult(BaseModel):
    """The weighted score, its level and the components."""

    model_config = ConfigDict(frozen=True)
    score: float
    level: Level
    components: tuple[Component, ...]


def weighted(components: Sequence[Component], base: float = 0.0) -> float:
    """Seed 000's `Confidence.Weighted()`: weighted mean, or `base` with no components or zero weight."""
    total = sum(c.weight for c in components)
    if not components or total == 0:
        return base
    return sum(c.score * c.weight for c in components) / total


def level_for(score: float) -> Level:
    """>= 0.9 high, >= 0.7 medium, >= 0.5 low, else very_low (compared at 9 decimals)."""
    s = round(score, 9)
    if s >= 0.9:
        return "high"
    if s >= 0.7:
        return "medium"
    if s >= 0.5:
        return "low"
    return "very_low"


def _count(text: str, markers: Sequence[str]) -> int:
    return sum(text.count(m) for m in markers)


def _length(content: str) -> Component:
    n = len(content)
    if n <= 200:
        score = 0.3 + 0.7 * n / 200
    elif n <= 4000:
        score = 1.0
    else:
        score = 0.8
    return Component(factor="length", score=score, weight=0.15)


def _structure(content: str) -> Component:
    score = 0.5
    if "- " in content or "1." in content:
        score += 0.15
    if "##" in content or "**" in content:
        score += 0.15
    if "```" in content:
        score += 0.2
    return Component(factor="structure", score=min(score, 1.0), weight=0.15)


def score_heuristic(text: str) -> HeuristicResult:
    """Score a response's text without any model."""
    lowered = text.lower()
    components = (
        _length(text),
        Component(factor="hedging", score=1.0 - min(_count(lowered, HEDGE_WORDS) * 0.1, 0.5), weight=0.2),
        Component(
            factor="certainty", score=1.0 - min(_count(lowered, CERTAINTY_WORDS) * 0.1, 0.5), weight=0.15
        ),
        _structure(text),
    )
    score = weighted(components)
    return HeuristicResult(score=score, level=level_for(score), components=components)
