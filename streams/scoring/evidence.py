"""Seed 001's per-trace evidence score: category maxima, weights, convergence bonus, recovery gate.

DESIGN 4/4b settle the rules. Choices where they are silent:
- a tool's outcome when its specific field is absent: `ok` cmake/ctest without `build_passed` /
  `tests_passed` is a pass, `ok` discovery without `factors_found` counts as 0 factors, `ok` gh without
  `complete` is not complete; `empty` adds no outcome to any category;
- among equally good convergence anchors the first seen (category order read, search, verification,
  discovery, git, ci; then arrival) is reported;
- the state keeps at most `max_event_ids` applied ids (oldest dropped); targets are deduplicated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "Band",
    "Convergence",
    "EvidenceConfig",
    "EvidenceResult",
    "EvidenceState",
    "Invocation",
    "score",
    "targets_match",
    "update",
]

Band = Literal["strong", "adequate", "weak", "failed"]
CATEGORY_ORDER = ("read", "search", "verification", "discovery", "git", "ci")
DISCOVERY_SCORES = (0.20, 0.20, 0.50, 0.70, 0.85)


def _categories_default() -> Mapping[str, str]:
    return MappingProxyType(
        {
            "find": "search",
            "grep": "search",
            "references": "search",
            "read": "read",
            "discovery": "discovery",
            "cmake": "verification",
            "ctest": "verification",
            "git": "git",
            "gh": "ci",
        }
    )


def _weights_default() -> Mapping[str, float]:
    return MappingProxyType(
        {"read": 3.0, "search": 2.5, "verification": 1.5, "discovery": 1.0, "git": 1.0, "ci": 1.0}
    )


@dataclass(frozen=True)
class EvidenceConfig:
    """Tool -> category mapping, raw category weights and the recovery / stop gates."""

    tool_categories: Mapping[str, str] = field(default_factory=_categories_default)
    weights: Mapping[str, float] = field(default_factory=_weights_default)
    recovery_threshold: float = 0.50
    stop_threshold: float = 0.20
    max_event_ids: int = 10_000


class Invocation(BaseModel):
    """The fields of a TOOL_INVOCATION that evidence needs."""

    model_config = ConfigDict(frozen=True)
    event_id: str
    tool: str
    target: str
    phase: Literal["primary", "recovery"] = "primary"
    status: Literal["ok", "empty", "error"]
    result_count: int | None = None
    factors_found: int | None = None
    build_passed: bool | None = None
    tests_passed: bool | None = None
    complete: bool | None = None


class EvidenceState(BaseModel):
    """What one trace's evidence needs, and nothing more."""

    model_config = ConfigDict(frozen=True)
    search_hits: dict[str, tuple[str, ...]] = {}  # search tool -> lower-cased targets with results
    reads: tuple[str, ...] = ()
    discovery_best: int | None = None
    discovery_targets: tuple[str, ...] = ()
    build_latest: bool | None = None
    tests_latest: bool | None = None
    verification_targets: tuple[str, ...] = ()  # targets of passing builds / tests
    git_targets: tuple[str, ...] = ()
    ci_targets: tuple[str, ...] = ()
    recovery_attempts: int = 0
    applied: tuple[str, ...] = ()


class Convergence(BaseModel):
    """Which categories agree on one anchor target, and the bonus that earns."""

    model_config = ConfigDict(frozen=True)
    categories: tuple[str, ...]
    count: int
    bonus: float
    target: str | None


class EvidenceResult(BaseModel):
    """TRACE_SCORED's evidence block."""

    model_config = ConfigDict(frozen=True)
    score: float
    base: float
    band: Band
    categories: dict[str, float]
    weights: dict[str, float]
    convergence: Convergence
    recovery_recommended: bool
    should_stop: bool
    recovery_attempts: int


def _add(values: tuple[str, ...], value: str) -> tuple[str, ...]:
    return values if value in values else (*values, value)


def targets_match(a: str, b: str) -> bool:
    """Equal (lower-cased), or one of at least 3 characters inside the other's file name."""
    if a == b:
        return True
    name_a, name_b = a.rsplit("/", 1)[-1], b.rsplit("/", 1)[-1]
    return (len(a) >= 3 and a in name_b) or (len(b) >= 3 and b in name_a)


def _has_results(inv: Invocation) -> bool:
    return inv.status == "ok" and (inv.result_count is None or inv.result_count > 0)


def update(state: EvidenceState, inv: Invocation, cfg: EvidenceConfig) -> EvidenceState:
    """Apply one invocation (a re-delivered event id changes nothing)."""
    if inv.event_id in state.applied:
        return state
    changes: dict[str, object] = {"applied": (*state.applied, inv.event_id)[-cfg.max_event_ids :]}
    if inv.phase == "recovery":
        changes["recovery_attempts"] = state.recovery_attempts + 1
    category = cfg.tool_categories.get(inv.tool.lower())
    target = inv.target.lower()
    tool = inv.tool.lower()
    if inv.status == "ok" and category is not None:
        if category == "search" and _has_results(inv):
            changes["search_hits"] = {
                **state.search_hits,
                tool: _add(state.search_hits.get(tool, ()), target),
            }
        elif category == "read":
            changes["reads"] = _add(state.reads, target)
        elif category == "discovery":
            factors = max(0, min(4, inv.factors_found or 0))
            changes["discovery_best"] = max(factors, state.discovery_best or 0)
            if factors >= 1:
                changes["discovery_targets"] = _add(state.discovery_targets, target)
        elif category == "verification":
            passed = inv.tests_passed if tool == "ctest" else inv.build_passed
            passed = True if passed is None else passed
            changes["tests_latest" if tool == "ctest" else "build_latest"] = passed
            if passed:
                changes["verification_targets"] = _add(state.verification_targets, target)
        elif category == "git" and _has_results(inv):
            changes["git_targets"] = _add(state.git_targets, target)
        elif category == "ci" and inv.complete:
            changes["ci_targets"] = _add(state.ci_targets, target)
    return state.model_copy(update=changes)


def _search_score(state: EvidenceState) -> float | None:
    if not state.search_hits:
        return None
    best = 0
    for targets in state.search_hits.values():
        for anchor in targets:
            agreeing = sum(
                1 for other in state.search_hits.values() if any(targets_match(anchor, t) for t in other)
            )
            best = max(best, agreeing)
    return 0.92 if best >= 3 else 0.80 if best == 2 else 0.65


def _verification_score(state: EvidenceState) -> float | None:
    if state.build_latest is False:
        return 0.15
    if state.tests_latest is False:
        return 0.30
    if state.tests_latest:
        return 0.93
    if state.build_latest:
        return 0.80
    return None


def _categories(state: EvidenceState) -> dict[str, float]:
    scores: dict[str, float] = {}
    search = _search_score(state)
    searched = {t for targets in state.search_hits.values() for t in targets}
    if state.reads:
        if search is None:
            scores["read"] = 0.55
        else:
            confirmed = [p for p in state.reads if any(targets_match(p, t) for t in searched)]
            scores["read"] = 0.88 if len(confirmed) >= 3 else 0.80
    if search is not None:
        scores["search"] = search
    verification = _verification_score(state)
    if verification is not None:
        scores["verification"] = verification
    if state.discovery_best is not None:
        scores["discovery"] = DISCOVERY_SCORES[state.discovery_best]
    if state.git_targets:
        scores["git"] = 0.75
    if state.ci_targets:
        scores["ci"] = 0.80
    return scores


def _convergence(state: EvidenceState, categories: dict[str, float]) -> Convergence:
    positive: dict[str, tuple[str, ...]] = {
        "read": state.reads,
        "search": tuple(t for targets in state.search_hits.values() for t in targets),
        "verification": state.verification_targets if categories.get("verification", 0.0) >= 0.80 else (),
        "discovery": state.discovery_targets,
        "git": state.git_targets,
        "ci": state.ci_targets,
    }
    best = Convergence(categories=(), count=0, bonus=0.0, target=None)
    for name in CATEGORY_ORDER:
        for anchor in positive[name]:
            agreeing = [c for c in CATEGORY_ORDER if any(targets_match(anchor, t) for t in positive[c])]
            if len(agreeing) < 2:
                continue
            bonus = 0.20 if len(agreeing) >= 3 else 0.10
            if "search" in agreeing and "read" in agreeing:
                bonus += 0.05
            if bonus > best.bonus:
                best = Convergence(
                    categories=tuple(sorted(agreeing)), count=len(agreeing), bonus=bonus, target=anchor
                )
    return best


def _band(final: float) -> Band:
    s = round(final, 9)
    if s >= 0.75:
        return "strong"
    if s >= 0.55:
        return "adequate"
    if s >= 0.25:
        return "weak"
    return "failed"


def score(state: EvidenceState, cfg: EvidenceConfig) -> EvidenceResult:
    """Category-weighted base plus the convergence bonus in headroom form."""
    categories = _categories(state)
    total = sum(cfg.weights[c] for c in categories)
    weights = {c: cfg.weights[c] / total for c in categories} if total else {}
    base = sum(categories[c] * weights[c] for c in categories)
    convergence = _convergence(state, categories)
    final = base + convergence.bonus * (1.0 - base)
    rounded = round(final, 9)
    return EvidenceResult(
        score=final,
        base=base,
        band=_band(final),
        categories=categories,
        weights=weights,
        convergence=convergence,
        recovery_recommended=rounded < cfg.recovery_threshold,
        should_stop=rounded < cfg.stop_threshold,
        recovery_attempts=state.recovery_attempts,
    )
