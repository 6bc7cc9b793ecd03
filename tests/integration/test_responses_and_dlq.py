"""Through a real broker: RESPONSE_SCORED values, flagged copies, dead letters, and no logprob leaks."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

from streams.harness import RunningBroker
from streams.stages.common import key_partition
from tests.integration.fixtures import STRONG_COMPOSITE as STRONG
from tests.integration.fixtures import Deployment, EventFactory, count_of, deploy
from tests.integration.workload import scrape

# Distinctive values: if any of these digits show up in an output, a header or a log line, logprobs leaked.
LEAK_A = -0.0123456789
LEAK_B = -0.0987654321
LEAK_MARKERS = (b"0123456789", b"0987654321", b'token_logprobs":[')


@pytest.fixture(scope="module")
def deployment(kafka: RunningBroker) -> Iterator[Deployment]:
    d = deploy(kafka)
    d.start_worker()
    yield d
    d.stop()


def test_scores_flags_and_dead_letters(deployment: Deployment) -> None:
    f = EventFactory()
    good = [
        f.response("tr-1", token_logprobs=[-0.1, -0.2, -0.3], **STRONG),  # exp(-0.2) = 0.8187 -> 0.819 allow
        f.response("tr-2", token_logprobs=[-1.5, -1.5], **STRONG),  # 0.223 < 0.40 -> flag
        f.response("tr-3", token_logprobs=None, **STRONG),  # no logprobs: allow, confidence null
        f.response(
            "tr-4", token_logprobs=[LEAK_A, LEAK_B, None, float("nan"), float("inf"), 0.5, 5e-7], **STRONG
        ),
        # Valid but extreme: the mean is below the smallest float (it raised in the scorer once).
        f.response("tr-5", token_logprobs=[-1.7976931348623157e308] * 3, **STRONG),
    ]
    bad_event = f.response("tr-bad")
    bad = [
        b'{"event_type": "LLM_RESPONSE", "token_logprobs": [-0.0123456789, -0.0987654321',  # invalid JSON
        orjson.dumps({**bad_event, "event_type": "MYSTERY"}),
        orjson.dumps({k: v for k, v in bad_event.items() if k != "trace_id"}),
        orjson.dumps({**bad_event, "schema_version": 7, "token_logprobs": [LEAK_A]}),
        orjson.dumps({**bad_event, "retrieval": [{"similarity": 1.5}], "token_logprobs": [LEAK_B]}),
        orjson.dumps({**bad_event, "response": 42, "token_logprobs": [LEAK_A]}),
    ]
    after = f.response("tr-after", token_logprobs=[-0.05], **STRONG)  # exp(-0.05) = 0.951
    # Bad records interleaved with valid ones on the same partition: the valid ones must all be scored.
    deployment.produce([good[0], good[1]])
    deployment.produce(bad[:3], key=b"tr-1")
    deployment.produce([good[2], good[3], good[4]])
    deployment.produce(bad[3:], key=b"tr-1")
    deployment.produce([after])
    ids = {e["event_id"] for e in [*good, after]}
    s = deployment.settings

    # The flagged copy is its own record on its own topic: it may be read after the scored ones.
    flag_copied = count_of("RESPONSE_SCORED", 1, s.flagged_topic, {good[1]["event_id"]})

    def done(records: list) -> bool:  # type: ignore[type-arg]
        return (
            count_of("RESPONSE_SCORED", len(ids), s.scored_topic, ids)(records)
            and flag_copied(records)
            and sum(1 for r in records if r.topic == s.dlq_topic) >= len(bad)
        )

    records = deployment.collect(done)
    scored = {o["source_event_id"]: o for o in deployment.outputs(records) if o["source_event_id"] in ids}
    assert set(scored) == ids

    first = scored[good[0]["event_id"]]
    assert first["confidence"] == 0.819
    assert first["action"] == "allow" and first["flags"] == []
    assert first["response"] == STRONG["response"]
    assert first["composite"]["should_block"] is False
    assert first["metadata"]["request_id"] == good[0]["request_id"]
    assert first["metadata"]["model"] == "gpt-4o" and first["metadata"]["tenant_id"] == "t1"

    low = scored[good[1]["event_id"]]
    assert low["confidence"] == 0.223
    assert low["action"] == "flag" and low["flags"][0] == "LOW_CONFIDENCE"

    missing = scored[good[2]["event_id"]]
    assert missing["confidence"] is None and missing["action"] == "allow"

    mixed = scored[good[3]["event_id"]]
    # Valid entries: LEAK_A, LEAK_B and 5e-7 (counted as 0.0); mean = (-0.0123..-0.0987..+0)/3.
    import math

    assert mixed["confidence"] == round(math.exp((LEAK_A + LEAK_B + 0.0) / 3), 3)

    assert scored[after["event_id"]]["confidence"] == 0.951
    extreme = scored[good[4]["event_id"]]
    assert extreme["confidence"] == 0.0 and extreme["action"] == "flag"

    flagged = [o for o in deployment.outputs(records, s.flagged_topic) if o["source_event_id"] in ids]
    assert {o["source_event_id"] for o in flagged} >= {good[1]["event_id"]}
    assert good[0]["event_id"] not in {o["source_event_id"] for o in flagged}

    dead = [r for r in records if r.topic == s.dlq_topic]
    reasons = sorted(dict(r.headers)["__connect.errors.reason"].decode() for r in dead)
    assert reasons == sorted(
        [
            "invalid_json",
            "unknown_event_type",
            "missing_field",
            "unsupported_schema_version",
            "out_of_range",
            "wrong_type",
        ]
    )
    offsets = set()
    for r in dead:
        assert r.key == b"tr-1"  # the bad record's own key, as Kafka Connect's DLQ keeps it
        headers = dict(r.headers)
        assert headers["__connect.errors.topic"].decode() == s.input_topic_names[0]
        assert int(headers["__connect.errors.partition"]) == key_partition(b"tr-1", s.topic_partitions)
        offsets.add(int(headers["__connect.errors.offset"]))
        assert headers["__connect.errors.exception.class.name"]
        assert headers["__connect.errors.exception.message"]
    assert len(offsets) == len(dead) == 6  # six records, each named by its own input offset

    # No logprob anywhere: outputs, flagged copies, DLQ values and headers, and the worker's log.
    for r in records:
        blob = r.value + b"".join(v for _, v in r.headers)
        for marker in LEAK_MARKERS:
            assert marker not in blob, (r.topic, marker)
    log = deployment.log_text().encode()
    for marker in LEAK_MARKERS[:2]:
        assert marker not in log


def test_reject_mode_returns_error_object(kafka: RunningBroker) -> None:
    d = deploy(kafka, CONFIDENCE_ON_LOW="reject", CONFIDENCE_MIN_ACCEPTANCE="0.5")
    d.start_worker()
    try:
        f = EventFactory()
        event = f.response("tr-rej", token_logprobs=[-2.0])  # exp(-2) = 0.135
        d.produce([event])
        scored = count_of("RESPONSE_SCORED", 1, d.settings.scored_topic, {event["event_id"]})
        copied = count_of("RESPONSE_SCORED", 1, d.settings.flagged_topic, {event["event_id"]})
        records = d.collect(lambda rs: scored(rs) and copied(rs))
        metrics = scrape(d.web_ports[0])
    finally:
        d.stop()
    labels = {"tenant": event["tenant_id"], "model": "gpt-4o", "endpoint": "/v1/chat"}
    assert metrics.value("llm_confidence_rejected_total", **labels) == 1
    assert metrics.value("llm_confidence_histogram_count", **labels) == 1
    out = next(o for o in d.outputs(records) if o["source_event_id"] == event["event_id"])
    assert out["action"] == "reject"
    assert out["response"] is None
    assert out["error"] == {
        "code": "LOW_CONFIDENCE_REJECTED",
        "message": "Response rejected due to low confidence.",
        "details": {"confidence": 0.135, "min_acceptance": 0.5},
    }
    # "Done." from a planner with no other factors is also blocked by the composite (0.5 < 0.75): the
    # reject wins over the block's "I don't know" text, and the block still shows in the flags.
    assert out["composite"]["should_block"] is True
    assert out["flags"] == ["COMPOSITE_BLOCKED"]
    flagged_ids = {o["source_event_id"] for o in d.outputs(records, d.settings.flagged_topic)}
    assert event["event_id"] in flagged_ids


def test_disabled_confidence_allows_every_response(kafka: RunningBroker) -> None:
    """DECISIONS "Scoring": with CONFIDENCE_ENABLED=false every response is allowed. With
    TREAT_NULL_AS_LOW and ON_LOW=reject set too, the disabled feature's null confidence was judged low:
    every response came out rejected (null text, error object, a flagged copy)."""
    d = deploy(
        kafka,
        CONFIDENCE_ENABLED="false",
        CONFIDENCE_TREAT_NULL_AS_LOW="true",
        CONFIDENCE_ON_LOW="reject",
    )
    d.start_worker()
    try:
        f = EventFactory()
        quiet = [
            f.response("tr-off", token_logprobs=[-2.0, -3.0], **STRONG),  # 0.082: low, were it computed
            f.response("tr-off", token_logprobs=None, **STRONG),
        ]
        # Same trace and agent, so the same partitions: its composite block's copy on flagged-events
        # comes after any copy of the two above.
        blocked = f.response("tr-off")
        d.produce([*quiet, blocked])
        ids = {e["event_id"] for e in [*quiet, blocked]}
        scored = count_of("RESPONSE_SCORED", 3, d.settings.scored_topic, ids)
        copied = count_of("RESPONSE_SCORED", 1, d.settings.flagged_topic, {blocked["event_id"]})
        records = d.collect(lambda rs: scored(rs) and copied(rs))
        metrics = scrape(d.web_ports[0])
    finally:
        d.stop()
    outputs = {o["source_event_id"]: o for o in d.outputs(records) if o["event_type"] == "RESPONSE_SCORED"}
    for event in [*quiet, blocked]:
        out = outputs[event["event_id"]]
        assert (out["confidence"], out["action"], out["error"]) == (None, "allow", None), out
        assert "LOW_CONFIDENCE" not in out["flags"]
    assert outputs[quiet[0]["event_id"]]["response"] == STRONG["response"]
    assert outputs[blocked["event_id"]]["flags"] == ["COMPOSITE_BLOCKED"]
    flagged_ids = {o["source_event_id"] for o in d.outputs(records, d.settings.flagged_topic)}
    assert flagged_ids == {blocked["event_id"]}
    labels = {"tenant": blocked["tenant_id"], "model": "gpt-4o", "endpoint": "/v1/chat"}
    assert metrics.value("llm_confidence_rejected_total", **labels) in (None, 0.0)
    assert metrics.value("llm_confidence_missing_total", **labels) in (None, 0.0)
