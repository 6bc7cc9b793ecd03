"""Seed 000's confidence-weighted synthesis of a trace's sub results: filtering, conflicts, warnings.

Choices where the contract is silent:
- the heuristic conflict detector flags a contradiction when two statements share at least two content
  words (stop and negation words ignored) and exactly one of them is negated (not, never, no, n't,
  cannot, none, without, nothing, neither, nor: `NEGATIONS`); its severity is `heuristic_conflict_severity` (0.6, above the 0.5 threshold);
- an explicit and a heuristic hit on one pair are one conflict at the higher severity (explicit wins ties);
- the excluded-sources warning counts the excluded sources (DESIGN 4: the seed's check never fires).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from streams.scoring.heuristic import Component, Level, level_for, weighted

__all__ = [
    "Conflict",
    "SourceScore",
    "SubResult",
    "SynthesisConfig",
    "SynthesisResult",
    "TraceClaim",
    "source_confidence",
    "synthesize",
]

NEGATIONS = frozenset({"not", "never", "no", "cannot", "none", "without", "nothing", "neither", "nor"})
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "on",
        "in",
        "at",
        "of",
        "to",
        "for",
        "and",
        "or",
        "but",
        "if",
        "then",
        "it",
        "its",
        "this",
        "that",
        "these",
        "those",
        "with",
        "by",
        "as",
        "from",
        "into",
        "when",
        "what",
        "which",
        "who",
        "do",
        "does",
        "did",
        "has",
        "have",
        "had",
        "will",
        "would",
        "can",
        "could",
        "should",
        "may",
    ]
)
# Words of any script, with inner apostrophes ("doesn't") and hyphens ("no-op" is one word, not "no").
# Apostrophes at either end are quotes ('fsync', ‘fsync’), not part of the word.
_WORD = re.compile(r"[\w'-]+")
# Typographic apostrophes (right single quotation mark, modifier letter apostrophe) read as ASCII, so
# "doesn’t" is the negation "doesn't" and not the words "doesn" and "t".
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u02bc": "'"})


@dataclass(frozen=True)
class SynthesisConfig:
    """Seed 000's SynthesisConfig plus the weight of the logprob component and heuristic severity."""

    min_confidence: float = 0.3
    conflict_threshold: float = 0.5
    max_claims: int = 50
    logprob_weight: float = 0.3
    heuristic_conflict_severity: float = 0.6


class TraceClaim(BaseModel):
    """A claim of the trace, as conflict detection needs it."""

    model_config = ConfigDict(frozen=True)
    claim_id: str
    statement: str
    source_id: str | None = None
    contradicts: tuple[tuple[str, float], ...] = ()


class SubResult(BaseModel):
    """A sub call's result: its text, heuristic components and (rounded) logprob confidence."""

    model_config = ConfigDict(frozen=True)
    sub_call_id: str
    content: str
    heuristic_components: tuple[Component, ...]
    logprob_confidence: float | None


class SourceScore(BaseModel):
    """One source's confidence and whether it was included."""

    model_config = ConfigDict(frozen=True)
    sub_call_id: str
    confidence: float
    included: bool
    content_length: int


class Conflict(BaseModel):
    """Two contradictory claims."""

    model_config = ConfigDict(frozen=True)
    claim_a: str
    claim_b: str
    type: Literal["contradiction", "inconsistency", "ambiguity"]
    severity: float
    detected_by: Literal["explicit", "heuristic"]


class SynthesisResult(BaseModel):
    """Overall confidence, level, per-source scores, conflicts, warnings and how many were filtered."""

    model_config = ConfigDict(frozen=True)
    overall: float
    level: Level
    sources: tuple[SourceScore, ...]
    conflicts: tuple[Conflict, ...]
    warnings: tuple[str, ...]
    filtered_count: int


def source_confidence(sub: SubResult, cfg: SynthesisConfig) -> float:
    """Heuristic components plus a `token_logprobs` component when the logprob confidence exists."""
    components = sub.heuristic_components
    if sub.logprob_confidence is not None:
        components = (
            *components,
            Component(factor="token_logprobs", score=sub.logprob_confidence, weight=cfg.logprob_weight),
        )
    return weighted(components)


def _words(statement: str) -> tuple[frozenset[str], bool]:
    text = unicodedata.normalize("NFC", statement).translate(_APOSTROPHES)
    tokens: list[str] = []
    for raw in _WORD.findall(text):
        word = raw.strip("'-")
        if not word:
            continue
        if word == "None" and tokens:  # Python's null value after the first word ("returns None"), not "none"
            word = "none_value"
        tokens.append(word.lower())
    negated = any(t in NEGATIONS or t.endswith("n't") for t in tokens)
    content = frozenset(
        t for t in tokens if t not in NEGATIONS and t not in STOPWORDS and not t.endswith("n't")
    )
    return content, negated


def _conflicts(claims: Sequence[TraceClaim], cfg: SynthesisConfig) -> tuple[Conflict, ...]:
    considered = list(claims)[: cfg.max_claims]
    known = {c.claim_id for c in considered}
    best: dict[tuple[str, str], Conflict] = {}

    def offer(a: str, b: str, severity: float, by: Literal["explicit", "heuristic"]) -> None:
        """Keep the pair's highest severity; explicit hits are offered first, so they win ties."""
        pair = (a, b) if a < b else (b, a)
        current = best.get(pair)
        if current is None or severity > current.severity:
            best[pair] = Conflict(
                claim_a=pair[0], claim_b=pair[1], type="contradiction", severity=severity, detected_by=by
            )

    for claim in considered:
        for target, strength in claim.contradicts:
            if target != claim.claim_id and target in known:
                offer(claim.claim_id, target, strength, "explicit")
    parsed = [(c.claim_id, *_words(c.statement)) for c in considered]
    for i, (id_a, words_a, neg_a) in enumerate(parsed):
        for id_b, words_b, neg_b in parsed[i + 1 :]:
            if id_a != id_b and neg_a != neg_b and len(words_a & words_b) >= 2:
                offer(id_a, id_b, cfg.heuristic_conflict_severity, "heuristic")
    # Sorted by pair: `best` keeps the order pairs were first offered, which follows claim arrival.
    kept = (c for c in best.values() if round(c.severity, 9) >= cfg.conflict_threshold)
    return tuple(sorted(kept, key=lambda c: (c.claim_a, c.claim_b)))


def synthesize(
    sub_results: Sequence[SubResult], claims: Sequence[TraceClaim], cfg: SynthesisConfig
) -> SynthesisResult:
    """Score each source, filter at MinConfidence, weight by content length, detect conflicts, warn."""
    sources = []
    weighted: list[float] = []  # confidence x length of each included source
    for sub in sub_results:
        confidence = source_confidence(sub, cfg)
        included = round(confidence, 9) >= cfg.min_confidence
        length = len(sub.content)
        sources.append(
            SourceScore(
                sub_call_id=sub.sub_call_id, confidence=confidence, included=included, content_length=length
            )
        )
        if included:
            weighted.append(confidence * length)
    included_scores = [s.confidence for s in sources if s.included]
    # fsum: exactly rounded, so the score does not depend on the order the sub calls arrived in.
    if total_length := sum(s.content_length for s in sources if s.included):
        overall = math.fsum(weighted) / total_length
    elif included_scores:  # every included source is empty: weights all 0, as Weighted() falls back
        overall = math.fsum(included_scores) / len(included_scores)
    else:
        overall = 0.0
    conflicts = _conflicts(claims, cfg)
    excluded = sum(1 for s in sources if not s.included)
    warnings = []
    if round(overall, 9) < 0.5:  # compared after rounding, as the level is (DESIGN 4b)
        warnings.append(f"Low overall confidence ({overall * 100:.0f}%). Results may be unreliable.")
    if conflicts:
        warnings.append(f"{len(conflicts)} conflicts detected between sources. Review carefully.")
    if excluded:
        warnings.append(f"{excluded} low-confidence sources excluded from synthesis.")
    return SynthesisResult(
        overall=overall,
        level=level_for(overall),
        sources=tuple(sources),
        conflicts=conflicts,
        warnings=tuple(warnings),
        filtered_count=excluded,
    )
