"""Seed 004's 4-factor composite with per-agent thresholds and the agent-history factor.

A factor whose input is absent (no `retrieval`, no `code_validation`) is not applicable: the weights are
renormalised over the present factors and the result names the missing ones (DESIGN 4). Block reason
wording: "Composite confidence 62.50% below <agent_type> threshold 80.00%", the score cut (not rounded)
to two decimals of a percent so that a blocked 0.79996 never reads as its 80.00% threshold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "I_DONT_KNOW_ANSWER",
    "CodeValidation",
    "CompositeConfig",
    "CompositeLevel",
    "CompositeResult",
    "code_validation_score",
    "history_score",
    "knowledge_base_score",
    "response_certainty_score",
    "score_composite",
]

CompositeLevel = Literal["HIGH", "MODERATE", "LOW", "VERY_LOW"]
I_DONT_KNOW_ANSWER = "I don't know - my confidence is too low to answer this accurately."

UNCERTAINTY_MARKERS = (
    "i think", "maybe", "possibly", "perhaps", "might", "i'm not sure", "uncertain", "unclear",
    "i don't know", "unsure", "probably", "likely",
)  # fmt: skip
CERTAINTY_MARKERS = (
    "definitely", "certainly", "absolutely", "confirmed", "verified", "tested", "proven", "documented",
)  # fmt: skip

KB, CODE, CERTAINTY, HISTORY = "knowledge_base", "code_validation", "response_certainty", "agent_history"


def _frozen(values: Mapping[str, float]) -> Mapping[str, float]:
    return MappingProxyType(dict(values))


@dataclass(frozen=True)
class CompositeConfig:
    """Weights, thresholds per agent type (case-insensitive) and the KB relevance threshold."""

    weights: Mapping[str, float] = field(
        default_factory=lambda: _frozen({KB: 0.30, CODE: 0.30, CERTAINTY: 0.20, HISTORY: 0.20})
    )
    thresholds: Mapping[str, float] = field(
        default_factory=lambda: _frozen(
            {"planner": 0.75, "patcher": 0.80, "validator": 0.85, "dgts_enforcer": 0.90, "clerk": 0.70}
        )
    )
    default_threshold: float = 0.75
    kb_relevance_threshold: float = 0.7

    def threshold_for(self, agent_type: str) -> float:
        """The agent type's threshold, or the default for other types."""
        return self.thresholds.get(agent_type.lower(), self.default_threshold)


class CodeValidation(BaseModel):
    """Seed 004's code checks (absent means false)."""

    model_config = ConfigDict(frozen=True)
    code_exists: bool = False
    syntax_valid: bool = False
    type_valid: bool = False
    tests_exist: bool = False
    tests_pass: bool = False


class CompositeResult(BaseModel):
    """The composite, its level, factors and weights used, threshold decision and missing factors."""

    model_config = ConfigDict(frozen=True)
    score: float
    level: CompositeLevel
    factors: dict[str, float]
    weights: dict[str, float]
    threshold: float
    threshold_met: bool
    should_block: bool
    block_reason: str | None
    missing_factors: tuple[str, ...]


def knowledge_base_score(similarities: Sequence[float], threshold: float = 0.7) -> float:
    """Highest relevant similarity plus 0.05 per relevant result (at most +0.2), capped at 1."""
    relevant = [s for s in similarities if round(s, 9) >= threshold]  # DESIGN 4b: rounded to 9 decimals
    if not relevant:
        return 0.0
    return min(max(relevant) + min(len(relevant) * 0.05, 0.2), 1.0)


def code_validation_score(cv: CodeValidation) -> float:
    """0.30 exists + 0.20 syntax + 0.20 types + 0.15 tests exist + 0.15 tests pass."""
    return (
        0.30 * cv.code_exists
        + 0.20 * cv.syntax_valid
        + 0.20 * cv.type_valid
        + 0.15 * cv.tests_exist
        + 0.15 * cv.tests_pass
    )


def response_certainty_score(text: str) -> float:
    """0.5 + min(0.1 x certainty, 0.5) - min(0.15 x uncertainty, 0.5), clamped (substring counts)."""
    lowered = text.lower()
    certain = sum(lowered.count(m) for m in CERTAINTY_MARKERS)
    uncertain = sum(lowered.count(m) for m in UNCERTAINTY_MARKERS)
    score = 0.5 + min(certain * 0.1, 0.5) - min(uncertain * 0.15, 0.5)
    return max(0.0, min(1.0, score))


def history_score(
    entries: Sequence[tuple[datetime, bool]], at: datetime, window: timedelta = timedelta(hours=24)
) -> float:
    """threshold_met / total over [at - window, at); 0.5 with no history."""
    start = at - window
    total = met = 0
    for when, threshold_met in entries:
        if start <= when < at:
            total += 1
            met += threshold_met
    return met / total if total else 0.5


def _level(score: float) -> CompositeLevel:
    s = round(score, 9)
    if s > 0.90:
        return "HIGH"
    if s >= 0.75:
        return "MODERATE"
    if s >= 0.50:
        return "LOW"
    return "VERY_LOW"


def _percent_cut(score: float) -> str:
    """`score` as a percent with two decimals, cut towards zero: 0.79996 is "79.99%", not "80.00%"."""
    # round() first so that 0.7 (70.00000000000001 % in binary) is not cut to 69.99 %.
    return f"{math.floor(round(score * 10_000, 6)) / 100:.2f}%"


def score_composite(
    agent_type: str,
    retrieval_similarities: Sequence[float] | None,
    code_validation: CodeValidation | None,
    response_text: str,
    history: float,
    cfg: CompositeConfig,
) -> CompositeResult:
    """Seed 004's `calculate_confidence` for one response."""
    factors: dict[str, float] = {}
    missing: list[str] = []
    if retrieval_similarities is None:
        missing.append(KB)
    else:
        factors[KB] = knowledge_base_score(retrieval_similarities, cfg.kb_relevance_threshold)
    if code_validation is None:
        missing.append(CODE)
    else:
        factors[CODE] = code_validation_score(code_validation)
    factors[CERTAINTY] = response_certainty_score(response_text)
    factors[HISTORY] = history
    total = sum(cfg.weights[name] for name in factors)
    weights = {name: cfg.weights[name] / total for name in factors}
    score = sum(factors[name] * weights[name] for name in factors)
    threshold = cfg.threshold_for(agent_type)
    met = round(score, 9) >= threshold
    reason = (
        None
        if met
        else f"Composite confidence {_percent_cut(score)} below {agent_type.lower()} threshold {threshold:.2%}"
    )
    return CompositeResult(
        score=score,
        level=_level(score),
        factors=factors,
        weights=weights,
        threshold=threshold,
        threshold_met=met,
        should_block=not met,
        block_reason=reason,
        missing_factors=tuple(missing),
    )
