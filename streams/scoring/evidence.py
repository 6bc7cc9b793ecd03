"""Seed 001's per-trace evidence score: category maxima, weights, convergence bonus, recovery gate.

DESIGN 4/4b settle the rules. Choices where they are silent:
- a tool's outcome when its specific field is absent: `ok` cmake/ctest without `build_passed` /
  `tests_passed` is a pass, `ok` discovery without `factors_found` counts as 0 factors, `ok` gh without
  `complete` is not complete; `empty` adds no outcome to any category; a read, like search and git,
  counts only with results (`ok` with `result_count: 0` is no read);
- among equally good convergence anchors the first seen (category order read, search, verification,
  discovery, git, ci; then arrival) is reported;
- the state keeps at most `max_event_ids` applied ids (oldest dropped); targets are deduplicated.

Matching every target with every other on each input made a trace's cost quadratic in its distinct
targets (282 ms per input at 1,000: bench/trace_size.py). So `update` keeps, per target, the lists
holding a target it matches (`EvidenceState.matched`): adding a target compares it once with each
target already there, and `score` reads the index instead of comparing pairs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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
    # Target -> the lists ("read", "search:<tool>", "verification", "discovery", "git", "ci") holding a
    # target that matches it, itself included. Kept complete by `update`; empty in values stored
    # before it existed (the next `update` builds it).
    matched: dict[str, tuple[str, ...]] = {}


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
    added_to: str | None = None  # the list `target` joins, if it was not in it yet
    rebuild_index = not state.matched and bool(_targets(state))  # a value stored before the index
    if inv.phase == "recovery":
        changes["recovery_attempts"] = state.recovery_attempts + 1
    category = cfg.tool_categories.get(inv.tool.lower())
    target = inv.target.lower()
    tool = inv.tool.lower()
    outcome_given = any(
        v is not None for v in (inv.factors_found, inv.build_passed, inv.tests_passed, inv.complete)
    )
    no_results = inv.result_count == 0 and not outcome_given  # DESIGN 4b: as `empty`
    if inv.status == "ok" and category is not None and not no_results:
        if category == "search" and _has_results(inv):
            hits = state.search_hits.get(tool, ())
            if target not in hits:
                changes["search_hits"] = {**state.search_hits, tool: (*hits, target)}
                added_to = f"search:{tool}"
        elif category == "read" and _has_results(inv):  # DESIGN 4b: `result_count: 0` is no results
            added_to = _join(changes, "reads", state.reads, target, "read")
        elif category == "discovery":
            factors = max(0, min(4, inv.factors_found or 0))
            changes["discovery_best"] = max(factors, state.discovery_best or 0)
            if factors >= 1:
                added_to = _join(changes, "discovery_targets", state.discovery_targets, target, "discovery")
        elif category == "verification":
            # ctest runs tests and cmake builds; a tool mapped here by configuration (pytest, make) is a
            # test run when it reports `tests_passed`, else a build (its failed tests scored as a build).
            is_test = tool == "ctest" or (tool != "cmake" and inv.tests_passed is not None)
            passed = inv.tests_passed if is_test else inv.build_passed
            passed = True if passed is None else passed
            changes["tests_latest" if is_test else "build_latest"] = passed
            if not passed and state.verification_targets:
                # DESIGN 4b: a pass followed by a failure no longer converges; targets leave the index.
                changes["verification_targets"] = ()
                rebuild_index = True
            if passed:
                added_to = _join(
                    changes, "verification_targets", state.verification_targets, target, "verification"
                )
        elif category == "git" and _has_results(inv):
            added_to = _join(changes, "git_targets", state.git_targets, target, "git")
        elif category == "ci" and inv.complete:
            added_to = _join(changes, "ci_targets", state.ci_targets, target, "ci")
    if rebuild_index:  # built from scratch once, then kept up to date per target
        updated = state.model_copy(update=changes)
        return updated.model_copy(update={"matched": _all_matches(updated)})
    if added_to is not None:
        changes["matched"] = _with_target(state, added_to, target)
    return state.model_copy(update=changes)


def _join(
    changes: dict[str, object], field: str, values: tuple[str, ...], value: str, name: str
) -> str | None:
    """Add `value` to the `field` list in `changes` unless it is there; the list name if it was added."""
    if value in values:
        return None
    changes[field] = (*values, value)
    return name


def _lists(state: EvidenceState) -> Iterator[tuple[str, tuple[str, ...]]]:
    """Every list of positive targets, by the name `matched` uses for it."""
    yield "read", state.reads
    for tool, targets in state.search_hits.items():
        yield f"search:{tool}", targets
    yield "verification", state.verification_targets
    yield "discovery", state.discovery_targets
    yield "git", state.git_targets
    yield "ci", state.ci_targets


def _targets(state: EvidenceState) -> set[str]:
    return {target for _, targets in _lists(state) for target in targets}


def _with_target(state: EvidenceState, name: str, target: str) -> dict[str, tuple[str, ...]]:
    """`state.matched` once `target` joins list `name`: one comparison per target already listed."""
    index = dict(state.matched)
    found = {name, *index.get(target, ())}
    for list_name, targets in _lists(state):
        for other in targets:
            if targets_match(other, target):
                found.add(list_name)
                if name not in index[other]:
                    index[other] = tuple(sorted((*index[other], name)))
    index[target] = tuple(sorted(found))
    return index


def _all_matches(state: EvidenceState) -> dict[str, tuple[str, ...]]:
    """The index from scratch: every target against every other (for values stored without it)."""
    found: dict[str, set[str]] = {target: set() for target in _targets(state)}
    for list_name, targets in _lists(state):
        for other in targets:
            for target, lists in found.items():
                if targets_match(other, target):
                    lists.add(list_name)
    return {target: tuple(sorted(lists)) for target, lists in found.items()}


def _index(state: EvidenceState) -> dict[str, tuple[str, ...]]:
    """`state.matched` (complete, or empty before the index existed), or built here if it is empty."""
    return state.matched or _all_matches(state)


def _searched(lists: tuple[str, ...]) -> bool:
    return any(name.startswith("search:") for name in lists)


def _search_score(state: EvidenceState, matched: dict[str, tuple[str, ...]]) -> float | None:
    if not state.search_hits:
        return None
    best = 0
    for targets in state.search_hits.values():
        for anchor in targets:
            # How many search tools found a target that matches this one.
            agreeing = sum(1 for name in matched[anchor] if name.startswith("search:"))
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


def _categories(state: EvidenceState, matched: dict[str, tuple[str, ...]]) -> dict[str, float]:
    scores: dict[str, float] = {}
    search = _search_score(state, matched)
    if state.reads:
        if search is None:
            scores["read"] = 0.55
        else:
            confirmed = [p for p in state.reads if _searched(matched[p])]
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


def _convergence(
    state: EvidenceState, categories: dict[str, float], matched: dict[str, tuple[str, ...]]
) -> Convergence:
    verification_positive = categories.get("verification", 0.0) >= 0.80
    positive: dict[str, tuple[str, ...]] = {
        "read": state.reads,
        "search": tuple(t for targets in state.search_hits.values() for t in targets),
        "verification": state.verification_targets if verification_positive else (),
        "discovery": state.discovery_targets,
        "git": state.git_targets,
        "ci": state.ci_targets,
    }
    best = Convergence(categories=(), count=0, bonus=0.0, target=None)
    for name in CATEGORY_ORDER:
        for anchor in positive[name]:
            if not anchor.strip():  # no target: no convergence data (seed 001)
                continue
            lists = {list_name.partition(":")[0] for list_name in matched[anchor]}  # "search:find" -> search
            agreeing = [
                c for c in CATEGORY_ORDER if c in lists and (c != "verification" or verification_positive)
            ]
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
    matched = _index(state)
    categories = _categories(state, matched)
    total = sum(cfg.weights[c] for c in categories)
    weights = {c: cfg.weights[c] / total for c in categories} if total else {}
    base = sum(categories[c] * weights[c] for c in categories)
    convergence = _convergence(state, categories, matched)
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
