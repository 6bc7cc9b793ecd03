"""Tests from a hand-mutation review of stage 1 (trace), stage 2 (history), evidence and composite.

Each test pins a rule that a single mutation of the code could break without any other unit test
noticing; the docstring names the rule and the mutation it catches.
"""

from __future__ import annotations

from typing import Any

import pytest

from streams.scoring.evidence import EvidenceConfig, EvidenceState, Invocation, score, update

CFG = EvidenceConfig()


def _run(
    *calls: tuple[str, str] | tuple[str, str, dict[str, Any]], cfg: EvidenceConfig = CFG
) -> EvidenceState:
    state = EvidenceState()
    for i, call in enumerate(calls):
        extra = call[2] if len(call) == 3 else {}  # type: ignore[misc]
        fields = {"status": "ok", **extra}
        state = update(state, Invocation(event_id=f"e{i}", tool=call[0], target=call[1], **fields), cfg)
    return state


# --- evidence ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("tool", ["find", "git", "read"])
def test_zero_results_stay_no_results_even_beside_an_outcome_field(tool: str) -> None:
    """DESIGN 4b: `ok` with `result_count: 0` means no results. An unrelated outcome field (here
    `complete`) lets the invocation past the `empty` shortcut, and search, git and read must still
    see no results (`_has_results` `> 0` made `>= 0`, or git's `_has_results` dropped)."""
    state = _run((tool, "foo", {"result_count": 0, "complete": True}))
    assert score(state, CFG).categories == {}


def test_the_applied_ids_keep_the_newest() -> None:
    """The state keeps the last `max_event_ids` applied ids, oldest dropped: the newest id is still
    recognised as a re-delivery (keeping the first ids instead let it count again)."""
    cfg = EvidenceConfig(max_event_ids=2)
    state = _run(("find", "a"), ("find", "b"), ("find", "c", {"phase": "recovery"}), cfg=cfg)
    assert state.applied == ("e1", "e2")
    again = update(
        state, Invocation(event_id="e2", tool="find", target="c", phase="recovery", status="ok"), cfg
    )
    assert again is state and again.recovery_attempts == 1


def test_targets_match_lower_cased_across_categories() -> None:
    """DESIGN 4: targets are compared lower-cased. A search for "memorymanager" and a read of
    "src/MemoryManager.h" converge, and the anchor is reported lower-cased (a mutation that kept the
    target's case missed the match)."""
    result = score(_run(("find", "memorymanager"), ("read", "src/MemoryManager.h")), CFG)
    assert result.convergence.categories == ("read", "search")
    assert result.convergence.target in ("memorymanager", "src/memorymanager.h")


def test_a_repeated_search_keeps_its_target_once() -> None:
    """Targets are deduplicated: the same search repeated under new event ids leaves one entry."""
    state = _run(("grep", "Foo"), ("grep", "foo"), ("grep", "FOO"))
    assert state.search_hits == {"grep": ("foo",)}


def test_cmake_is_a_build_even_when_it_reports_tests_passed() -> None:
    """DESIGN 2: `build_passed` is cmake's outcome, `tests_passed` ctest's. A cmake invocation that
    carries only `tests_passed: false` is a build with no outcome field (a pass, 0.80), not a failed
    test run (treating every tool with `tests_passed` as a test run scored it 0.30)."""
    result = score(_run(("cmake", "all", {"tests_passed": False})), CFG)
    assert result.categories == {"verification": pytest.approx(0.80)}


def test_a_state_stored_before_the_match_index_is_indexed_on_its_next_update() -> None:
    """A value without `matched` (stored before the index) gets the whole index on its next update,
    not only the new target's entry (skipping the rebuild left earlier targets out of the index)."""
    from streams.scoring.evidence import _all_matches

    fresh = _run(("find", "foo"), ("read", "src/foo.py"))
    legacy = fresh.model_copy(update={"matched": {}})
    added = Invocation(event_id="new", tool="git", target="bar", status="ok")
    updated = update(legacy, added, CFG)
    assert updated.matched == _all_matches(updated)
    assert score(updated, CFG) == score(update(fresh, added, CFG), CFG)


def test_a_failed_build_wins_over_failed_tests() -> None:
    """DESIGN 4: latest build failed -> 0.15, *else* latest tests failed -> 0.30. With both failed the
    build decides (checking the tests first scored 0.30)."""
    for calls in (
        (("cmake", "all", {"build_passed": False}), ("ctest", "all", {"tests_passed": False})),
        (("ctest", "all", {"tests_passed": False}), ("cmake", "all", {"build_passed": False})),
    ):
        assert score(_run(*calls), CFG).categories == {"verification": pytest.approx(0.15)}


def test_the_band_compares_the_score_rounded_to_nine_decimals() -> None:
    """DESIGN 4b: band edges are compared after rounding to 9 decimals. This trace sums to
    0.5499999999999999, which is the 0.55 edge: adequate, not weak (an unrounded compare said weak)."""
    state = _run(
        ("cmake", "v", {"build_passed": False}),
        ("discovery", "d", {"factors_found": 3}),
        ("git", "g"),
        ("gh", "c", {"complete": True}),
    )
    result = score(state, CFG)
    assert result.score < 0.55 and round(result.score, 9) == 0.55
    assert result.band == "adequate"


def test_discovery_with_no_factors_scores_its_floor() -> None:
    """DESIGN 4: discovery 0-1 factors -> 0.20. An `ok` discovery with `factors_found: 0` (or none)
    is evidence at 0.20, not absent (a truthiness test on the best count dropped it)."""
    assert score(_run(("discovery", "p", {"factors_found": 0})), CFG).categories == {"discovery": 0.20}
    assert score(_run(("discovery", "p")), CFG).categories == {"discovery": 0.20}


# --- composite ---------------------------------------------------------------------------------------


def test_knowledge_base_starts_from_the_highest_relevant_similarity() -> None:
    """Seed 004: max relevant similarity + 0.05 per relevant result, whatever their order (taking the
    first relevant one gave 0.81 here)."""
    from streams.scoring.composite import knowledge_base_score

    assert knowledge_base_score([0.71, 0.8]) == pytest.approx(0.9)


# --- stage 1 -----------------------------------------------------------------------------------------


def test_the_forwarded_response_carries_no_raw_logprobs() -> None:
    """DESIGN 1: raw logprobs never reach a repartition topic. Stage 1 forwards an LLM_RESPONSE to the
    responses topic with its scalar confidence only (forwarding the event unstripped kept them)."""
    import orjson
    from prometheus_client import CollectorRegistry

    from streams import metrics
    from streams.config import load_settings, scoring_configs
    from streams.stages import InputRecord, TraceStage

    settings = load_settings()
    stage = TraceStage(settings, scoring_configs(settings), metrics.create(CollectorRegistry()))
    event = {
        "event_type": "LLM_RESPONSE", "event_id": "r1", "timestamp": "2026-11-22T10:00:00Z",
        "tenant_id": "t", "trace_id": "tr", "agent_name": "a", "agent_type": "planner",
        "schema_version": 1, "request_id": "q", "model": "m", "endpoint": "e", "response": "ok",
        "token_logprobs": [-0.123456789, -0.5],
    }  # fmt: skip
    records, _ = stage.process([InputRecord("agent-events", 0, 0, 1.0, orjson.dumps(event))], {}.get)
    (forwarded,) = [r for r in records if r.topic == settings.responses_topic]
    pending = orjson.loads(forwarded.value)
    assert pending["event"]["token_logprobs"] is None and pending["logprobs_present"] is True
    assert b"123456789" not in forwarded.value
