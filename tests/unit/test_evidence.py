"""Seed 001 evidence per trace: DESIGN's table, worked cases, convergence, bands and properties."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.scoring.evidence import EvidenceConfig, EvidenceState, Invocation, score, targets_match, update

CFG = EvidenceConfig()


def run(*calls: tuple[str, str] | tuple[str, str, dict[str, Any]], cfg: EvidenceConfig = CFG) -> Any:
    state = EvidenceState()
    for i, call in enumerate(calls):
        tool, target = call[0], call[1]
        extra = call[2] if len(call) == 3 else {}  # type: ignore[misc]
        fields = {"status": "ok", **extra}
        state = update(state, Invocation(event_id=f"e{i}", tool=tool, target=target, **fields), cfg)
    return score(state, cfg)


def test_seed_case_find_read_different_targets() -> None:
    result = run(("find", "MemoryManager"), ("read", "src/Allocator.cpp"))
    assert round(result.score, 3) == 0.732 and result.band == "adequate"
    assert result.categories == {"search": 0.65, "read": 0.80}
    assert result.convergence.bonus == 0.0 and result.convergence.categories == ()


def test_seed_case_find_read_same_target() -> None:
    result = run(("find", "MemoryManager"), ("read", "src/MemoryManager.h"))
    assert round(result.score, 3) == 0.772
    assert result.convergence.bonus == pytest.approx(0.15)
    assert result.convergence.target is not None


def test_seed_case_find_grep_read_read_same_symbol() -> None:
    result = run(
        ("find", "MemoryManager"),
        ("grep", "MemoryManager"),
        ("read", "src/MemoryManager.h"),
        ("read", "src/MemoryManager.cpp"),
    )
    assert round(result.score, 3) == 0.830 and result.band == "strong"
    assert result.categories == {"search": 0.80, "read": 0.80}
    assert result.convergence.categories == ("read", "search")


@pytest.mark.parametrize(
    ("calls", "category", "expected"),
    [
        ([("read", "a.py")], "read", 0.55),
        ([("find", "foo"), ("grep", "foo"), ("references", "foo")], "search", 0.92),
        ([("find", "foo"), ("grep", "bar")], "search", 0.65),
        (
            [("find", "foo"), ("read", "src/foo_a.py"), ("read", "src/foo_b.py"), ("read", "src/foo_c.py")],
            "read",
            0.88,
        ),
        ([("find", "foo"), ("read", "foo_a.py"), ("read", "foo_b.py"), ("read", "other.py")], "read", 0.80),
        ([("discovery", "p", {"factors_found": 1})], "discovery", 0.20),
        ([("discovery", "p", {"factors_found": 2})], "discovery", 0.50),
        (
            [("discovery", "p", {"factors_found": 3}), ("discovery", "p", {"factors_found": 1})],
            "discovery",
            0.70,
        ),
        ([("discovery", "p", {"factors_found": 4})], "discovery", 0.85),
        ([("cmake", "all", {"build_passed": True})], "verification", 0.80),
        (
            [("cmake", "all", {"build_passed": True}), ("ctest", "all", {"tests_passed": True})],
            "verification",
            0.93,
        ),
        ([("ctest", "all", {"tests_passed": False})], "verification", 0.30),
        (
            [("ctest", "all", {"tests_passed": True}), ("cmake", "all", {"build_passed": False})],
            "verification",
            0.15,
        ),
        (
            [("cmake", "all", {"build_passed": False}), ("cmake", "all", {"build_passed": True})],
            "verification",
            0.80,
        ),
        ([("git", "log")], "git", 0.75),
        ([("gh", "run", {"complete": True})], "ci", 0.80),
    ],
)
def test_category_table(calls: list[Any], category: str, expected: float) -> None:
    assert run(*calls).categories[category] == pytest.approx(expected)


MAPPED = EvidenceConfig(
    tool_categories={**CFG.tool_categories, "pytest": "verification", "make": "verification"}
)


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        ([("pytest", "all", {"tests_passed": False})], 0.30),  # scored 0.80 (a passed build) before
        ([("make", "all", {"build_passed": True}), ("pytest", "all", {"tests_passed": True})], 0.93),
        ([("make", "all", {"build_passed": False})], 0.15),
        ([("pytest", "all", {"tests_passed": True}), ("make", "all", {"build_passed": False})], 0.15),
        ([("make", "all")], 0.80),  # no outcome field: a build that passed, as cmake's
    ],
)
def test_a_tool_mapped_to_verification_is_a_test_run_when_it_reports_tests(
    calls: list[Any], expected: float
) -> None:
    """DESIGN lets the tool mapping change; only ctest's `tests_passed` was read, so a failed pytest run
    mapped to verification scored as a passed build."""
    assert run(*calls, cfg=MAPPED).categories["verification"] == pytest.approx(expected)


@pytest.mark.parametrize(
    "calls",
    [
        [("find", "x", {"status": "error"})],
        [("grep", "x", {"status": "empty"})],
        [("find", "x", {"result_count": 0})],
        [("git", "x", {"result_count": 0})],
        [("read", "x.py", {"result_count": 0})],
        [("gh", "x", {"complete": False})],
        [("unknown-tool", "x")],
    ],
)
def test_no_evidence(calls: list[Any]) -> None:
    result = run(*calls)
    assert result.categories == {} and result.score == 0.0 and result.band == "failed"
    assert result.recovery_recommended and result.should_stop


def test_a_read_with_no_results_is_no_read() -> None:
    """DESIGN 4b: `ok` with `result_count: 0` means no results. It counted as a read (0.55, and 0.80 with
    the convergence bonus beside a search on the same target)."""
    result = run(("find", "MemoryManager"), ("read", "src/MemoryManager.h", {"result_count": 0}))
    assert result.categories == {"search": 0.65}
    assert result.convergence.bonus == 0.0 and result.band == "adequate"
    assert result.score == pytest.approx(0.65)
    with_count = run(("find", "MemoryManager"), ("read", "src/MemoryManager.h", {"result_count": 2}))
    assert round(with_count.score, 3) == 0.772  # a count above 0 is a read, as one without a count


@pytest.mark.parametrize("tool", ["discovery", "cmake", "ctest"])
def test_ok_with_no_results_and_no_outcome_is_empty_for_every_tool(tool: str) -> None:
    """DESIGN 4b: `ok` with `result_count: 0` means no results, as `empty` does. Without an outcome
    field it still added discovery 0.20, a passed build 0.80 or passed tests 0.93 (review); with one,
    the outcome counts."""
    empty = run(("find", "foo"), (tool, "foo", {"status": "empty"}))
    zero = run(("find", "foo"), (tool, "foo", {"result_count": 0}))
    assert zero.categories == empty.categories == {"search": 0.65}
    assert zero.score == pytest.approx(empty.score)
    outcome = {
        "discovery": {"factors_found": 2},
        "cmake": {"build_passed": True},
        "ctest": {"tests_passed": True},
    }
    assert len(run(("find", "foo"), (tool, "foo", {"result_count": 0, **outcome[tool]})).categories) == 2


def test_a_pass_followed_by_a_failure_no_longer_converges_after_a_later_pass() -> None:
    """DESIGN 4b: "a pass followed by a failure no longer converges". A later pass on bar made the
    latest outcome a pass again and foo's superseded pass converged again (0.25, not 0.15; review)."""
    result = run(
        ("find", "foo"),
        ("read", "src/foo.py"),
        ("ctest", "foo", {"tests_passed": True}),
        ("ctest", "foo", {"tests_passed": False}),
        ("ctest", "bar", {"tests_passed": True}),
    )
    assert result.convergence.categories == ("read", "search")
    assert result.convergence.bonus == pytest.approx(0.15)
    again = run(
        ("find", "foo"), ("ctest", "foo", {"tests_passed": False}), ("ctest", "foo", {"tests_passed": True})
    )
    assert again.convergence.categories == ("search", "verification")  # a pass after the failure counts


def test_an_empty_target_converges_with_nothing() -> None:
    """An empty target names nothing to agree on (seed 001: no convergence data). git, discovery and gh
    with target "" got the three-category +0.20 (review)."""
    result = run(("git", ""), ("discovery", "", {"factors_found": 1}), ("gh", "", {"complete": True}))
    assert (result.convergence.bonus, result.convergence.target) == (0.0, None)


def test_equal_anchors_tie_by_category_then_first_search_tool_then_arrival() -> None:
    """The reported anchor when two give the same bonus (DECISIONS "Evidence outcomes"): within search,
    the tool that found results first, then arrival within that tool's hits."""
    result = run(("find", "aaa"), ("grep", "bbb"), ("find", "ccc"), ("git", "bbb"), ("git", "ccc"))
    assert (result.convergence.bonus, result.convergence.target) == (pytest.approx(0.10), "ccc")


def test_the_bonus_is_one_anchors_and_search_read_elsewhere_adds_nothing() -> None:
    """Three categories agree on "bar" (0.20); search and read agree on "foo" (0.10 + 0.05). The bonus is
    the best single anchor's, 0.20, not 0.25 (docs/DECISIONS.md, "Evidence outcomes")."""
    result = run(
        ("find", "foo"),
        ("read", "src/foo.py"),
        ("git", "bar"),
        ("discovery", "bar", {"factors_found": 1}),
        ("cmake", "bar", {"build_passed": True}),
    )
    assert result.convergence.bonus == pytest.approx(0.20)
    assert result.convergence.categories == ("discovery", "git", "verification")
    assert result.convergence.target == "bar"


def test_errors_are_neutral_and_recovery_counts_every_attempt() -> None:
    before = run(("find", "foo"), ("read", "foo.py"))
    after = run(
        ("find", "foo"),
        ("read", "foo.py"),
        ("grep", "foo", {"status": "error", "phase": "recovery"}),
        ("find", "bar", {"phase": "recovery"}),
    )
    assert after.score == before.score
    assert after.recovery_attempts == 2 and before.recovery_attempts == 0


@pytest.mark.parametrize(
    ("final", "band"),
    [(0.75, "strong"), (0.7499, "adequate"), (0.55, "adequate"), (0.25, "weak"), (0.2499, "failed")],
)
def test_band_edges(final: float, band: str) -> None:
    from streams.scoring.evidence import _band

    assert _band(final) == band


def test_gates() -> None:
    weak = run(("discovery", "p", {"factors_found": 1}))
    assert weak.score == pytest.approx(0.20) and weak.band == "failed"
    assert weak.recovery_recommended and not weak.should_stop  # 0.20 is not below 0.20
    adequate = run(("find", "x"))
    assert not adequate.recovery_recommended


def test_three_category_convergence_and_failed_verification_stops_converging() -> None:
    passing = run(("find", "foo"), ("read", "src/foo.py"), ("ctest", "foo", {"tests_passed": True}))
    assert passing.convergence.count == 3 and passing.convergence.bonus == pytest.approx(0.25)
    failing = run(
        ("find", "foo"),
        ("read", "src/foo.py"),
        ("ctest", "foo", {"tests_passed": True}),
        ("cmake", "foo", {"build_passed": False}),
    )
    assert failing.convergence.categories == ("read", "search")


@pytest.mark.parametrize(
    ("a", "b", "match"),
    [
        ("memorymanager", "src/memorymanager.h", True),
        ("src/x/foo.py", "foo", True),
        ("ab", "src/ab.py", False),
        ("ab", "ab", True),
        ("foo", "src/foo/bar.py", False),
        ("bar", "baz", False),
    ],
)
def test_target_matching(a: str, b: str, match: bool) -> None:
    assert targets_match(a, b) is match and targets_match(b, a) is match


def test_state_round_trips_and_redelivery_is_a_no_op() -> None:
    state = EvidenceState()
    inv = Invocation(event_id="e1", tool="find", target="Foo", status="ok", phase="recovery")
    state = update(state, inv, CFG)
    assert update(state, inv, CFG) == state
    assert EvidenceState.model_validate_json(state.model_dump_json()) == state


tool_call = st.tuples(
    st.sampled_from(["find", "grep", "references", "read", "discovery", "cmake", "ctest", "git", "gh"]),
    st.sampled_from(["foo", "src/foo.py", "bar", "src/bar/baz.h", "x"]),
    st.fixed_dictionaries(
        {
            "status": st.sampled_from(["ok", "empty", "error"]),
            "result_count": st.one_of(st.none(), st.integers(0, 3)),
            "factors_found": st.one_of(st.none(), st.integers(0, 4)),
            "build_passed": st.one_of(st.none(), st.booleans()),
            "tests_passed": st.one_of(st.none(), st.booleans()),
            "complete": st.one_of(st.none(), st.booleans()),
        }
    ),
)


@given(st.lists(tool_call, max_size=12))
def test_score_in_unit_interval(calls: list[Any]) -> None:
    result = run(*calls)
    assert 0.0 <= result.score <= 1.0 and 0.0 <= result.base <= result.score + 1e-12


@given(st.lists(tool_call, min_size=1, max_size=10), st.data())
def test_duplicate_invocation_never_changes_score(calls: list[Any], data: st.DataObject) -> None:
    duplicate = data.draw(st.sampled_from(calls))
    if duplicate[0] in ("cmake", "ctest"):
        return  # verification follows the latest outcome by design; a re-run can change it
    assert run(*calls, duplicate).score == run(*calls).score


@given(st.lists(tool_call, max_size=8))
def test_failed_build_after_passing_tests_lowers_verification(calls: list[Any]) -> None:
    calls = [c for c in calls if c[0] not in ("cmake", "ctest")]  # the latest outcome is what we add here
    passed = run(*calls, ("ctest", "t", {"tests_passed": True}))
    failed = run(*calls, ("ctest", "t", {"tests_passed": True}), ("cmake", "t", {"build_passed": False}))
    assert failed.categories["verification"] < passed.categories["verification"]


# --- the match index against the pairwise rules it replaced ------------------------------------------
# `update` keeps, per target, the lists holding a matching target, so that `score` does not compare
# every pair of targets on each input. These are the pairwise rules as DESIGN 4/4b state them (the
# implementation before the index), kept as the oracle.


def _pairwise_categories(state: EvidenceState) -> dict[str, float]:
    scores: dict[str, float] = {}
    search = None
    if state.search_hits:
        best = 0
        for targets in state.search_hits.values():
            for anchor in targets:
                agreeing = sum(
                    1 for other in state.search_hits.values() if any(targets_match(anchor, t) for t in other)
                )
                best = max(best, agreeing)
        search = 0.92 if best >= 3 else 0.80 if best == 2 else 0.65
    searched = {t for targets in state.search_hits.values() for t in targets}
    if state.reads:
        if search is None:
            scores["read"] = 0.55
        else:
            confirmed = [p for p in state.reads if any(targets_match(p, t) for t in searched)]
            scores["read"] = 0.88 if len(confirmed) >= 3 else 0.80
    if search is not None:
        scores["search"] = search
    return scores


def _pairwise_convergence(state: EvidenceState, verification: float | None) -> tuple[Any, ...]:
    order = ("read", "search", "verification", "discovery", "git", "ci")
    positive: dict[str, tuple[str, ...]] = {
        "read": state.reads,
        "search": tuple(t for targets in state.search_hits.values() for t in targets),
        "verification": state.verification_targets if (verification or 0.0) >= 0.80 else (),
        "discovery": state.discovery_targets,
        "git": state.git_targets,
        "ci": state.ci_targets,
    }
    best: tuple[Any, ...] = ((), 0, 0.0, None)
    for name in order:
        for anchor in positive[name]:
            agreeing = [c for c in order if any(targets_match(anchor, t) for t in positive[c])]
            if len(agreeing) < 2:
                continue
            bonus = 0.20 if len(agreeing) >= 3 else 0.10
            if "search" in agreeing and "read" in agreeing:
                bonus += 0.05
            if bonus > best[2]:
                best = (tuple(sorted(agreeing)), len(agreeing), bonus, anchor)
    return best


# Targets that match each other in every way the rules allow: equal, case, contained in a file name,
# shorter than 3 characters, and paths whose directory (not file name) holds another target.
matching_target = st.sampled_from(
    ["foo", "FOO", "src/foo.py", "src/Foo.py", "src/foo/bar.py", "bar", "baz/bar", "ab", "src/ab.py", "x",
     "foobar", "lib/foobar.h", "oba", "src/x"]
)  # fmt: skip
indexed_call = st.tuples(
    st.sampled_from(["find", "grep", "references", "read", "discovery", "cmake", "ctest", "git", "gh"]),
    matching_target,
    st.fixed_dictionaries(
        {
            "status": st.sampled_from(["ok", "ok", "empty", "error"]),
            "result_count": st.one_of(st.none(), st.integers(0, 2)),
            "factors_found": st.one_of(st.none(), st.integers(0, 4)),
            "build_passed": st.one_of(st.none(), st.booleans()),
            "tests_passed": st.one_of(st.none(), st.booleans()),
            "complete": st.one_of(st.none(), st.booleans()),
        }
    ),
)


@given(st.lists(indexed_call, max_size=25), st.integers(0, 25))
def test_indexed_scoring_equals_the_pairwise_rules(calls: list[Any], stored_at: int) -> None:
    from streams.scoring.evidence import _all_matches

    state = EvidenceState()
    for i, (tool, target, fields) in enumerate(calls):
        if i == stored_at:  # a value written before the index existed: no index in it
            state = state.model_copy(update={"matched": {}})
        state = update(state, Invocation(event_id=f"e{i}", tool=tool, target=target, **fields), CFG)
        assert state.matched == _all_matches(state)  # kept exactly, input by input
        result = score(state, CFG)
        assert {c: result.categories[c] for c in ("read", "search") if c in result.categories} == (
            _pairwise_categories(state)
        )
        convergence = result.convergence
        assert (convergence.categories, convergence.count, convergence.bonus, convergence.target) == (
            _pairwise_convergence(state, result.categories.get("verification"))
        )
    # A state that `update` did not make (no index) scores by the same rules.
    bare = state.model_copy(update={"matched": {}})
    assert score(bare, CFG) == score(state, CFG)


def test_a_long_trace_compares_each_new_target_once() -> None:
    # The reason for the index: 1,000 distinct targets cost one comparison each per new target, not
    # one per pair of targets (bench/trace_size.py measures the time).
    from streams.scoring import evidence

    calls = 0
    original = evidence.targets_match

    def counted(a: str, b: str) -> bool:
        nonlocal calls
        calls += 1
        return original(a, b)

    state = EvidenceState()
    for i in range(1_000):
        state = update(
            state, Invocation(event_id=f"e{i}", tool="read", target=f"src/m{i}/f{i}.py", status="ok"), CFG
        )
    evidence.targets_match = counted  # type: ignore[assignment]
    try:
        state = update(state, Invocation(event_id="new", tool="grep", target="f999", status="ok"), CFG)
        score(state, CFG)
    finally:
        evidence.targets_match = original  # type: ignore[assignment]
    assert calls == 1_000  # the new target against each of the 1,000 listed before it; score: none
    assert score(state, CFG).convergence.target == "src/m999/f999.py"


def test_the_gates_compare_the_score_rounded_to_nine_decimals() -> None:
    """DESIGN 4b: a float sum a hair below a threshold is the threshold. This trace sums to
    0.39999999999999997; with a recovery threshold of 0.40 it must not recommend recovery."""
    calls = (("discovery", "a", {"factors_found": 1}), ("ctest", "a", {"tests_passed": False}), ("git", "b"))
    result = run(*calls)
    assert result.score < 0.40 and round(result.score, 9) == 0.40
    at_bound = run(*calls, cfg=EvidenceConfig(recovery_threshold=0.40, stop_threshold=0.40))
    assert not at_bound.recovery_recommended and not at_bound.should_stop


# --- From a mutation review of the twenty-eighth round: evidence --------------------------------------


def test_ok_with_no_results_and_a_complete_gh_run_counts_as_ci() -> None:
    """`complete` is an outcome too: gh `ok` with `result_count: 0` and `complete: true` is a complete
    CI run (dropping `complete` from the outcome fields made it no result)."""
    result = run(("find", "foo"), ("gh", "foo", {"result_count": 0, "complete": True}))
    assert result.categories == {"search": 0.65, "ci": 0.80}
    assert result.convergence.categories == ("ci", "search")


def test_a_blank_target_converges_with_nothing() -> None:
    """A target of spaces names nothing either (`anchor.strip()`, not only the empty string)."""
    result = run(("git", " "), ("discovery", " ", {"factors_found": 1}), ("gh", " ", {"complete": True}))
    assert (result.convergence.bonus, result.convergence.target) == (0.0, None)
