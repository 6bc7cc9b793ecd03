"""Through a real broker: a synthesis over sub calls, with a filtered source and both kinds of conflict."""

from __future__ import annotations

from streams.harness import RunningBroker
from streams.scoring.heuristic import score_heuristic
from streams.scoring.response import calculate_confidence
from streams.scoring.synthesis import SubResult, SynthesisConfig, source_confidence
from tests.integration.fixtures import EventFactory, count_of, deploy

STRONG_TEXT = "## Findings\n- `load()` returns nil on error\n- callers check it\n```go\nif err != nil {}\n```"
WEAK_TEXT = "Maybe. Not sure."


def test_synthesis_filters_and_reports_conflicts(kafka: RunningBroker) -> None:
    # MinConfidence 0.5: with the seed's heuristic floors no source can score below the default 0.3.
    d = deploy(kafka, SYNTHESIS_MIN_CONFIDENCE="0.5")
    d.start_worker()
    f = EventFactory(tenant="synth")
    trace = "syn-1"
    events = [
        f.claim(trace, "k1", statement="The function returns nil on error", source_id="sub-a"),
        f.claim(trace, "k2", statement="The function never returns nil", source_id="sub-b"),
        f.claim(
            trace,
            "k3",
            statement="The cache is warm at start",
            source_id="sub-a",
            relationships=[{"type": "contradicts", "target": "k4", "strength": 0.9}],
        ),
        f.claim(trace, "k4", statement="Startup begins cold", source_id="sub-b"),
        f.response(trace, role="sub_call", sub_call_id="sub-a", response=STRONG_TEXT, token_logprobs=[-0.05]),
        f.response(trace, role="sub_call", sub_call_id="sub-b", response=WEAK_TEXT, token_logprobs=[-3.0]),
        f.response(trace, role="synthesis", response="Combined."),
    ]
    try:
        d.produce(events)
        synth_id = events[-1]["event_id"]
        records = d.collect(count_of("SYNTHESIS_SCORED", 1, d.settings.scored_topic, {synth_id}))
    finally:
        d.stop()
    out = next(o for o in d.outputs(records) if o["event_type"] == "SYNTHESIS_SCORED")
    cfg = SynthesisConfig(min_confidence=0.5)

    def expected_confidence(text: str, logprobs: list[float]) -> float:
        sub = SubResult(
            sub_call_id="x",
            content=text,
            heuristic_components=score_heuristic(text).components,
            logprob_confidence=calculate_confidence(logprobs),
        )
        return source_confidence(sub, cfg)

    strong = expected_confidence(STRONG_TEXT, [-0.05])
    weak = expected_confidence(WEAK_TEXT, [-3.0])
    assert weak < 0.5 <= strong
    sources = {s["sub_call_id"]: s for s in out["sources"]}
    assert sources["sub-a"]["included"] is True and sources["sub-b"]["included"] is False
    assert sources["sub-a"]["confidence"] == strong and sources["sub-b"]["confidence"] == weak
    assert out["overall_confidence"] == strong  # only the included source, weighted by its length
    assert out["filtered_count"] == 1
    conflicts = {(c["claim_a"], c["claim_b"]): c for c in out["conflicts"]}
    assert set(conflicts) == {("k1", "k2"), ("k3", "k4")}
    assert conflicts[("k1", "k2")]["detected_by"] == "heuristic"
    assert conflicts[("k1", "k2")]["type"] == "contradiction"
    assert conflicts[("k3", "k4")]["detected_by"] == "explicit" and conflicts[("k3", "k4")]["severity"] == 0.9
    assert out["warnings"] == [
        "2 conflicts detected between sources. Review carefully.",
        "1 low-confidence sources excluded from synthesis.",
    ]
    flagged = [
        o for o in d.outputs(records, d.settings.flagged_topic) if o["event_type"] == "SYNTHESIS_SCORED"
    ]
    assert [o["event_id"] for o in flagged] == [out["event_id"]]
