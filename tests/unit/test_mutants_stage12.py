"""Tests from a hand-mutation review of stage 1 (trace), stage 2 (history), evidence and composite.

Each test pins a rule that a single mutation of the code could break without any other unit test
noticing; the docstring names the rule and the mutation it catches.
"""

from __future__ import annotations

from typing import Any

import pytest

from streams.scoring.evidence import EvidenceConfig, EvidenceState, Invocation, score, update
from tests.unit.stage_records import keyed

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
    records, _ = stage.process([keyed(InputRecord("agent-events", 0, 0, 1.0, orjson.dumps(event)))], {}.get)
    (forwarded,) = [r for r in records if r.topic == settings.responses_topic]
    pending = orjson.loads(forwarded.value)
    assert pending["event"]["token_logprobs"] is None and pending["logprobs_present"] is True
    assert b"123456789" not in forwarded.value


# --- the survivors the review left without a test (written after it) ----------------------------------


class _Stage1:
    """Stage 1 over an in-memory trace table, one input per batch, returning what it sent."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        from streams import metrics
        from streams.config import load_settings, scoring_configs
        from streams.stages import TraceStage

        self.settings = load_settings()
        self.stage = TraceStage(
            self.settings, scoring_configs(self.settings), metrics.create(CollectorRegistry())
        )
        self.traces: dict[bytes, Any] = {}
        self.offset = 0

    def run(self, **fields: Any) -> dict[str, list[dict[str, Any]]]:
        """Send one input; its records by topic, decoded."""
        import orjson

        from streams.stages import InputRecord

        event = {
            "event_type": "LLM_RESPONSE", "timestamp": "2026-11-22T10:00:00Z", "tenant_id": "t",
            "trace_id": "tr", "agent_name": "a", "agent_type": "planner", "schema_version": 1,
            "request_id": "q", "model": "m", "endpoint": "e", "response": "Done.", **fields,
        }  # fmt: skip
        self.offset += 1
        record = keyed(InputRecord("agent-events", 0, self.offset, 1.0, orjson.dumps(event)))
        records, states = self.stage.process([record], self.traces.get)
        self.traces.update(states)
        sent: dict[str, list[dict[str, Any]]] = {}
        for r in records:
            sent.setdefault(r.topic, []).append(orjson.loads(r.value))
        return sent

    def claim(self, event_id: str, claim_id: str, **fields: Any) -> dict[str, list[dict[str, Any]]]:
        claim = {
            "event_type": "CLAIM", "event_id": event_id, "claim_id": claim_id, "statement": f"s {claim_id}",
            "tier": "task", "provenance": [{"source_type": "agent", "confidence": 0.8}],
        }  # fmt: skip
        return self.run(**{**claim, **fields})


def _without_scored_at(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in o.items() if k != "scored_at"} for o in outputs]


def test_a_redelivered_response_and_claim_go_to_the_later_stages_again_marked_at_their_first_time() -> None:
    """DESIGN 4b: a re-delivered input re-emits its outputs, also the later stages' ones. Stage 1 sends
    the response and the claim on again (dropping that lost RESPONSE_SCORED and CLAIM_SCORED), marked
    `redelivered` (unmarked, the claim stage re-applied a claim it had forgotten), and a response
    re-stamped by its producer at its first time (at the new one, stage 2 looked in the wrong hour)."""
    s = _Stage1()
    s.run(event_id="r1")
    s.claim("c-ev", "C")
    again = s.run(event_id="r1", timestamp="2026-11-22T11:30:00Z")
    (pending,) = again[s.settings.responses_topic]
    assert pending["redelivered"] is True
    assert pending["event"]["timestamp"].startswith("2026-11-22T10:00:00")
    (claim,) = s.claim("c-ev", "C")[s.settings.claims_topic]
    assert claim["redelivered"] is True and claim["arrived"]["source_event_id"] == "c-ev"


def test_a_redelivered_synthesis_re_emits_its_synthesis_scored() -> None:
    """DESIGN 4b: the same SYNTHESIS_SCORED again (same id and content, fresh scored_at), not nothing."""
    s = _Stage1()
    s.run(event_id="sub-1", role="sub_call", sub_call_id="s1", response="It is 4.")
    first = s.run(event_id="syn", role="synthesis", response="Combined: 4.")[s.settings.scored_topic]
    again = s.run(event_id="syn", role="synthesis", response="Combined: 4.")[s.settings.scored_topic]
    assert [o["event_type"] for o in first] == ["SYNTHESIS_SCORED"]
    assert _without_scored_at(again) == _without_scored_at(first)


def test_sub_calls_are_told_apart_by_sub_call_id_not_request_id() -> None:
    """Two sub calls that share a request id but not a sub_call_id are two sources of the synthesis
    (keyed by request id, the second replaced the first)."""
    s = _Stage1()
    s.run(event_id="sub-1", role="sub_call", sub_call_id="s1", request_id="same", response="It is 4.")
    s.run(event_id="sub-2", role="sub_call", sub_call_id="s2", request_id="same", response="It is 5.")
    (synthesis,) = s.run(event_id="syn", role="synthesis", response="Combined.")[s.settings.scored_topic]
    assert sorted(source["sub_call_id"] for source in synthesis["sources"]) == ["s1", "s2"]


def test_a_trace_keeps_at_most_synthesis_max_claims_and_a_held_claim_is_still_replaced_at_the_cap() -> None:
    """SYNTHESIS_MAX_CLAIMS (50): the 51st claim is not kept for synthesis (`<=` kept 51), and a new
    version of a claim already held replaces it even at the cap (refusing it kept the old statement)."""
    s = _Stage1()
    cap = s.settings.synthesis_max_claims
    for i in range(cap + 1):
        s.claim(f"c{i}", f"C{i}")
    (state,) = s.traces.values()
    assert len(state.claims) == cap and f"C{cap}" not in state.claims
    s.claim("c0-v2", "C0", statement="replaced")
    (state,) = s.traces.values()
    assert len(state.claims) == cap and state.claims["C0"].statement == "replaced"


def test_a_response_without_retrieval_leaves_the_knowledge_factor_out_and_an_empty_one_scores_zero() -> None:
    """Seed 004: an absent input makes its factor not applicable (weights renormalised); an empty
    retrieval list is an input: knowledge base 0.0 (treating absent as empty scored 0.0 for both)."""
    import orjson
    from prometheus_client import CollectorRegistry

    from streams import metrics
    from streams.config import scoring_configs
    from streams.stages import AgentStage, InputRecord

    s = _Stage1()
    registry = metrics.create(CollectorRegistry())
    stage2 = AgentStage(s.settings, scoring_configs(s.settings), registry)

    def composite(event_id: str, **fields: Any) -> dict[str, Any]:
        (pending,) = s.run(event_id=event_id, **fields)[s.settings.responses_topic]
        record = InputRecord(s.settings.responses_topic, 0, s.offset, 1.0, orjson.dumps(pending))
        outputs, _ = stage2.process([record], lambda key: None, lambda key: None)
        (scored,) = [orjson.loads(r.value) for r in outputs if r.topic == s.settings.scored_topic]
        return scored["composite"]  # type: ignore[no-any-return]

    absent = composite("r-absent")
    empty = composite("r-empty", retrieval=[])
    assert "knowledge_base" not in absent["factors"] and "knowledge_base" in absent["missing_factors"]
    assert empty["factors"]["knowledge_base"] == 0.0
