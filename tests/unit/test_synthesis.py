"""Seed 000 synthesis: per-source confidence, filtering, length weighting, conflicts and warnings."""

from __future__ import annotations

import itertools
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.scoring.heuristic import Component, score_heuristic
from streams.scoring.synthesis import SubResult, SynthesisConfig, TraceClaim, source_confidence, synthesize

CFG = SynthesisConfig()


def sub(sub_id: str, score: float, content: str = "x" * 10, logprob: float | None = None) -> SubResult:
    return SubResult(
        sub_call_id=sub_id,
        content=content,
        heuristic_components=(Component(factor="h", score=score, weight=1.0),),
        logprob_confidence=logprob,
    )


def test_seed_filter_example() -> None:
    result = synthesize(
        [sub("a", 0.8), sub("b", 0.3), sub("c", 0.6)], [], SynthesisConfig(min_confidence=0.5)
    )
    assert [s.included for s in result.sources] == [True, False, True]
    assert result.filtered_count == 1


def test_token_logprobs_component_weight() -> None:
    assert source_confidence(sub("a", 0.8, logprob=0.2), CFG) == pytest.approx((0.8 * 1.0 + 0.2 * 0.3) / 1.3)
    assert source_confidence(sub("a", 0.8), CFG) == pytest.approx(0.8)


def test_overall_is_length_weighted_over_included_sources() -> None:
    result = synthesize(
        [sub("a", 0.9, "x" * 30), sub("b", 0.6, "é" * 10), sub("c", 0.1, "y" * 1000)], [], CFG
    )
    assert result.overall == pytest.approx((0.9 * 30 + 0.6 * 10) / 40)  # code points, c excluded
    assert result.level == "medium"
    assert result.warnings == ("1 low-confidence sources excluded from synthesis.",)


def test_the_low_confidence_warning_compares_after_rounding_as_the_level_does() -> None:
    # (0.35 * 3 + 0.95 * 1) / 4 is 0.5, computed as 0.49999999999999994: level "low", and no warning.
    result = synthesize(
        [sub("a", 0.35, "x" * 3), sub("b", 0.95, "y")], [], SynthesisConfig(min_confidence=0.0)
    )
    assert result.overall < 0.5 and result.level == "low"
    assert result.warnings == ()


def test_no_sources() -> None:
    result = synthesize([], [], CFG)
    assert result.overall == 0.0 and result.level == "very_low"
    assert result.warnings == ("Low overall confidence (0%). Results may be unreliable.",)


def test_negation_conflict_from_the_seed() -> None:
    claims = [
        TraceClaim(claim_id="1", statement="The function returns nil on error"),
        TraceClaim(claim_id="2", statement="The function never returns nil"),
    ]
    result = synthesize([sub("a", 0.9)], claims, CFG)
    assert len(result.conflicts) == 1
    conflict = result.conflicts[0]
    assert (conflict.claim_a, conflict.claim_b, conflict.type, conflict.detected_by) == (
        "1",
        "2",
        "contradiction",
        "heuristic",
    )
    assert result.warnings == ("1 conflicts detected between sources. Review carefully.",)


@pytest.mark.parametrize("apostrophe", ["'", "\u2019", "\u02bc"])
def test_a_typographic_apostrophe_negates_as_the_ascii_one(apostrophe: str) -> None:
    """Text from LLMs often carries "doesn’t" (U+2019): it was read as "doesn" and "t", no negation."""
    claims = [
        TraceClaim(claim_id="1", statement="The parser handles unicode input"),
        TraceClaim(claim_id="2", statement=f"The parser doesn{apostrophe}t handle unicode input"),
    ]
    result = synthesize([sub("a", 0.9)], claims, CFG)
    assert [(c.claim_a, c.claim_b, c.detected_by) for c in result.conflicts] == [("1", "2", "heuristic")]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("The cache is warm", "The build never fails"),
        ("It returns nil", "It returns nil on error"),
        ("No tests exist", "No tests exist"),
        # "no-op" is one word, not the negation "no" and "op" (review).
        ("The flush call is a no-op when idle", "The flush call returns at once when idle"),
    ],
)
def test_unrelated_or_agreeing_statements_do_not_conflict(a: str, b: str) -> None:
    claims = [TraceClaim(claim_id="1", statement=a), TraceClaim(claim_id="2", statement=b)]
    assert synthesize([], claims, CFG).conflicts == ()


def test_explicit_contradictions_threshold_pairs_and_max_claims() -> None:
    claims = [
        TraceClaim(claim_id="1", statement="alpha", contradicts=(("2", 0.9), ("1", 1.0), ("ghost", 1.0))),
        TraceClaim(claim_id="2", statement="beta", contradicts=(("1", 0.7),)),
        TraceClaim(claim_id="3", statement="gamma", contradicts=(("1", 0.4),)),  # below threshold 0.5
    ]
    result = synthesize([], claims, CFG)
    assert [(c.claim_a, c.claim_b, c.severity, c.detected_by) for c in result.conflicts] == [
        ("1", "2", 0.9, "explicit")
    ]
    capped = synthesize([], claims, SynthesisConfig(max_claims=1))
    assert capped.conflicts == ()


@given(
    st.lists(
        st.tuples(st.floats(0, 1), st.text(max_size=50), st.one_of(st.none(), st.floats(0, 1))), max_size=6
    )
)
def test_overall_in_unit_interval(parts: list[tuple[float, str, float | None]]) -> None:
    result = synthesize([sub(str(i), s, c, lp) for i, (s, c, lp) in enumerate(parts)], [], CFG)
    assert 0.0 <= result.overall <= 1.0
    assert result.filtered_count == sum(1 for s in result.sources if not s.included)


def test_a_source_exactly_at_min_confidence_is_included() -> None:
    """Seed 000 filters below MinConfidence: a source at the bound is kept (0.3 with the defaults)."""
    assert source_confidence(sub("b", 0.3), CFG) == pytest.approx(CFG.min_confidence)
    result = synthesize([sub("b", 0.3)], [], CFG)
    assert result.sources[0].included and result.filtered_count == 0


@pytest.mark.parametrize("explicit_on", ["1", "2"])
def test_an_explicit_contradiction_wins_a_tie_with_the_negation_heuristic(explicit_on: str) -> None:
    """The seed's negation pair, also declared contradicting at the heuristic's own severity (0.6):
    one conflict, credited to the declaration whichever claim carries it (either is offered first)."""
    other = "2" if explicit_on == "1" else "1"
    statements = {"1": "The function returns nil on error", "2": "The function never returns nil"}
    claims = [
        TraceClaim(
            claim_id=claim_id,
            statement=statement,
            contradicts=((other, CFG.heuristic_conflict_severity),) if claim_id == explicit_on else (),
        )
        for claim_id, statement in statements.items()
    ]
    conflicts = synthesize([sub("a", 0.9)], claims, CFG).conflicts
    assert [(c.claim_a, c.claim_b, c.severity, c.detected_by) for c in conflicts] == [
        ("1", "2", CFG.heuristic_conflict_severity, "explicit")
    ]


def _conflicting_pairs(a: str, b: str) -> list[tuple[str, str, str]]:
    claims = [TraceClaim(claim_id="1", statement=a), TraceClaim(claim_id="2", statement=b)]
    return [(c.claim_a, c.claim_b, c.detected_by) for c in synthesize([], claims, CFG).conflicts]


@pytest.mark.parametrize(
    "quoted",
    ["\u201cfsync\u201d is called", "\u2018fsync\u2019 is called", "'fsync' is called", "fsync is called"],
)
def test_quoting_a_word_does_not_hide_a_negation(quoted: str) -> None:
    """Since U+2019 reads as an apostrophe, a closing single quote stuck to the word ("fsync'"): the
    statements shared one content word instead of two, and no conflict was found (review)."""
    assert _conflicting_pairs(quoted, "fsync is never called") == [("1", "2", "heuristic")]


def test_the_seed_example_with_python_none() -> None:
    """DESIGN 4's "returns nil on error" vs "never returns nil", with Python's None: "None" mid-sentence
    is the value, not the negation "none", which made both sides negated (review)."""
    pair = _conflicting_pairs("The function returns None on error", "The function never returns None")
    assert pair == [("1", "2", "heuristic")]
    assert _conflicting_pairs("None of the tests pass", "All of the tests pass") == [("1", "2", "heuristic")]


def test_canonically_equivalent_text_reads_alike() -> None:
    """Words of any script, NFC or NFD: "Zoë" was "zo" in NFC and "zoe" in NFD (ASCII-only words)."""
    nfc = unicodedata.normalize("NFC", "Zo\u00eb is the owner")
    nfd = unicodedata.normalize("NFD", "Zo\u00eb is not the owner")
    assert _conflicting_pairs(nfc, nfd) == [("1", "2", "heuristic")]
    assert (
        _conflicting_pairs("Die Prüfung läuft grün", "Die Prüfung läuft nicht grün") == []
    )  # English negations only


def test_included_sources_without_content_are_averaged_not_zero() -> None:
    """Weighted by content length, an empty answer weighs 0: one included empty source gave overall 0.0,
    level very_low and a low-confidence warning beside that source listed at 0.72. With every weight 0
    the plain mean is used, as seed 000's Weighted() falls back to the plain score (review)."""
    empty = SubResult(
        sub_call_id="a",
        content="",
        heuristic_components=score_heuristic("").components,
        logprob_confidence=None,
    )
    result = synthesize([empty], [], CFG)
    assert result.sources[0].included and result.sources[0].confidence > 0.7
    assert result.overall == pytest.approx(result.sources[0].confidence, abs=1e-12)
    assert result.level == "medium" and result.warnings == ()
    # Once any included source has text, empty ones weigh nothing, as before.
    assert synthesize([sub("e", 0.9, content=""), sub("f", 0.6, content="xx")], [], CFG).overall == 0.6


# --- From a mutation review of the twenty-eighth round's synthesis change --------------------------------


def test_a_lone_dash_is_no_shared_content_word() -> None:
    """ "-" between words is punctuation: kept as a word (or as an empty one), it made two statements
    sharing one real content word look like two."""
    assert _conflicting_pairs("Retries - enabled", "Retries - not configured") == []
    assert _conflicting_pairs("Retries - enabled", "Retries are not - enabled") == [("1", "2", "heuristic")]


def test_python_none_as_the_second_word_is_the_value() -> None:
    """Only the first word "None" is the negation: "Returns None" (None at index 1) is the value."""
    assert _conflicting_pairs("Returns None on error", "Never returns None on error") == [
        ("1", "2", "heuristic")
    ]


def test_empty_included_sources_average_every_included_score_only() -> None:
    """With every included weight 0, the plain mean of the included sources: not the first one's or the
    best one's, and an excluded (low-confidence) source does not count."""
    result = synthesize(
        [sub("a", 0.9, content=""), sub("b", 0.6, content=""), sub("c", 0.1, content="")], [], CFG
    )
    assert [s.included for s in result.sources] == [True, True, False]
    assert result.overall == pytest.approx(0.75)


@pytest.mark.parametrize("bullet", ["- ", "-- ", "' "])
def test_a_bullet_before_none_keeps_it_the_negation(bullet: str) -> None:
    """The first word decides, not the first token: a markdown bullet "-" (no word) made a leading "None"
    the second token, read as Python's None, so "- None of the tests pass" was not negated (86bd311)."""
    assert _conflicting_pairs(bullet + "None of the tests pass", bullet + "All of the tests pass") == [
        ("1", "2", "heuristic")
    ]


def _scored(sub_id: str, text: str, logprob: float | None) -> SubResult:
    return SubResult(
        sub_call_id=sub_id,
        content=text,
        heuristic_components=score_heuristic(text).components,
        logprob_confidence=logprob,
    )


SPREAD = [
    _scored("s0", "The retry limit is 3.", 0.905),
    _scored("s2", "## Result\n- limit: 3\n- verified", None),
    _scored("s4", "Perhaps it could be 4", 0.135),
    _scored("s6", "x" * 333, 0.34),
]


def test_the_overall_score_does_not_depend_on_the_sub_calls_order() -> None:
    """Review (thirtieth round): the weighted sum was added in arrival order, so the same sub calls in
    another order gave another last bit (0.7207771338250791 against 0.720777133825079 for three)."""
    overalls = {synthesize(order, [], SynthesisConfig()).overall for order in itertools.permutations(SPREAD)}
    assert len(overalls) == 1, overalls


def test_conflicts_are_listed_by_pair_whatever_the_claims_order() -> None:
    """Review (thirtieth round): conflicts were listed in the order their claims arrived."""
    claims = [
        TraceClaim(claim_id="k3", statement="gamma", contradicts=(("k4", 0.9),)),
        TraceClaim(claim_id="k1", statement="alpha", contradicts=(("k2", 0.9),)),
        TraceClaim(claim_id="k4", statement="delta"),
        TraceClaim(claim_id="k2", statement="beta"),
    ]
    listings = {
        tuple((c.claim_a, c.claim_b) for c in synthesize([], order, SynthesisConfig()).conflicts)
        for order in itertools.permutations(claims)
    }
    assert listings == {(("k1", "k2"), ("k3", "k4"))}
