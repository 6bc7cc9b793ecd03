"""Seed 001 evidence per trace: DESIGN's table, worked cases, convergence, bands and properties."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.scoring.evidence import EvidenceConfig, EvidenceState, Invocation, score, targets_match, update

CFG = EvidenceConfig()


def run(*calls: tuple[str, str] | tuple[str, str, dict[str, Any]]) -> Any:
    state = EvidenceState()
    for i, call in enumerate(calls):
        tool, target = call[0], call[1]
        extra = call[2] if len(call) == 3 else {}  # type: ignore[misc]
        fields = {"status": "ok", **extra}
        state = update(state, Invocation(event_id=f"e{i}", tool=tool, target=target, **fields), CFG)
    return score(state, CFG)


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


@pytest.mark.parametrize(
    "calls",
    [
        [("find", "x", {"status": "error"})],
        [("grep", "x", {"status": "empty"})],
        [("find", "x", {"result_count": 0})],
        [("git", "x", {"result_count": 0})],
        [("gh", "x", {"complete": False})],
        [("unknown-tool", "x")],
    ],
)
def test_no_evidence(calls: list[Any]) -> None:
    result = run(*calls)
    assert result.categories == {} and result.score == 0.0 and result.band == "failed"
    assert result.recovery_recommended and result.should_stop


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
