"""No logprob leakage, audited (DESIGN section 1): every topic, the log, /metrics and every view.

Raw token logprobs may exist only in the input topic and in memory while one event is scored. The test
sends a mixed stream whose logprobs are distinctive values, waits for every output, then reads *every*
topic the broker holds from the beginning (outputs, DLQ, the internal repartition topics and all
`*-changelog` topics; only the input topic itself is exempt), the worker's log and data directory,
GET /metrics and every view, and looks for each value in several renderings. As a control, the same
search must find the values in the input topic, and the audit must have read non-empty repartition and
changelog topics that saw the logprob-bearing events.

The second test feeds the DLQ's textual stripping (records that are not strict JSON) its hard cases.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streams.harness import RunningBroker
from streams.kafka_io import Consumed
from tests.integration.fixtures import STRONG_COMPOSITE, Deployment, EventFactory, deploy, http_get, poll
from tests.unit.test_dlq import serialised_wrong

# Distinctive logprobs: ten decimals each, so no score, offset or timestamp can contain them by chance.
LEAKS = (-0.7318264951, -1.2345678901, -2.9182736455, -0.0461938257, -3.5072916483, -0.6193847526)
# Used only by the dead-letter edge cases below, so the main audit never meets them.
EDGE_LEAKS = (-0.8264019375, -1.9350718264, -0.3719402856)


def renderings(value: float) -> list[bytes]:
    """Ways a float can be written: repr/JSON (signed, unsigned), its decimals alone, its significant
    digits with and without the point (covers `%e`, `%.17g` and str), and the IEEE-754 double bytes."""
    text = repr(value)
    unsigned = text.lstrip("-")
    integer, _, decimals = unsigned.partition(".")
    significant = (integer + decimals).lstrip("0")
    forms = {
        text,
        unsigned,
        decimals,  # '7318264951': whatever the formatting, these digits appear
        significant,
        f"{significant[0]}.{significant[1:]}",  # scientific mantissa, '7.318264951' of '7.318264951e-01'
    }
    encoded = [f.encode() for f in forms]
    encoded += [struct.pack(">d", value), struct.pack("<d", value)]  # binary (pickle, msgpack, struct)
    return encoded


def find_leaks(blob: bytes, values: Iterable[float]) -> list[str]:
    """The renderings of `values` found in `blob` (also with its NUL bytes taken out: UTF-16 text), as
    readable strings."""
    blobs = (blob, blob.replace(b"\x00", b""))
    return [f"{v!r} as {form!r}" for v in values for form in renderings(v) if any(form in b for b in blobs)]


@dataclass(frozen=True)
class Audit:
    """Everything the broker held, per topic."""

    topics: list[str]
    records: dict[str, list[Consumed]]


async def _read_every_topic(bootstrap: str, idle_polls: int = 4) -> Audit:
    """List every topic on the broker and read each one from the beginning to its end.

    The end is the later of the reported end offsets and a run of empty polls: on Tansu the reported high
    watermark can lag the real end of a partition (DESIGN section 7), so the offsets alone could stop early.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        topics = sorted(await admin.list_topics())
    finally:
        await admin.close()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    records: dict[str, list[Consumed]] = {t: [] for t in topics}
    try:
        await consumer.topics()  # load cluster metadata for every topic
        partitions = [
            TopicPartition(t, p) for t in records for p in sorted(consumer.partitions_for_topic(t) or ())
        ]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        empty = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500, max_records=5000)
            got = 0
            for tp, batch in batches.items():
                for m in batch:
                    got += 1
                    records[tp.topic].append(Consumed.of(m))
            empty = 0 if got else empty + 1
            positions = {tp: await consumer.position(tp) for tp in partitions}
            at_end = all(positions[tp] >= ends[tp] for tp in partitions)
            if at_end and empty >= idle_polls:
                break
        else:
            raise TimeoutError("could not read every topic to its end within 60 s")
    finally:
        await consumer.stop()
    return Audit(topics, records)


def _record_bytes(record: Consumed) -> bytes:
    parts = [record.key or b"", record.value]
    for name, value in record.headers:
        parts += [name.encode(), value or b""]
    return b"\n".join(parts)


def _directory_bytes(root: str) -> dict[str, bytes]:
    """Every file under `root` (worker logs and Faust's data directories)."""
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as handle:
                found[path] = handle.read()
    return found


def _scored_ids(d: Deployment, records: list[Consumed]) -> set[tuple[str, str]]:
    return {
        (o["event_type"], o["source_event_id"])
        for o in (orjson.loads(r.value) for r in records if r.topic == d.settings.scored_topic)
    }


def test_no_logprob_reaches_any_topic_log_metric_or_view(kafka: RunningBroker) -> None:
    # Small limits so the oversized cases stay small; valid events are far below them.
    d = deploy(kafka, partitions=2, MAX_EVENT_BYTES="8192", MAX_ARRAY_ITEMS="40")
    f = EventFactory(tenant="leak")
    l0, l1, l2, l3, l4, l5 = LEAKS
    nan, inf = float("nan"), float("-inf")
    valid: list[dict[str, Any]] = [
        # Single responses from two agents over two traces, some with non-finite entries (DESIGN 4b).
        f.response("lk-1", 0, agent="planner-1", token_logprobs=[l0, l1, None], **STRONG_COMPOSITE),
        f.response("lk-1", 1, agent="planner-1", token_logprobs=[l2, nan, inf, l3]),
        f.response("lk-2", 2, agent="clerk-1", agent_type="clerk", token_logprobs=[l4]),
        f.response("lk-2", 3, agent="clerk-1", agent_type="clerk", token_logprobs=[l5, l0, l1, l2, l3, l4]),
        f.tool("lk-1", "find", "Widget", 4, result_count=3),
        f.tool("lk-1", "read", "src/Widget.h", 5),
        f.tool("lk-2", "cmake", "all", 6, build_passed=False),
        # A synthesis trace: claims, sub calls with logprobs, a synthesis that also carries logprobs.
        f.claim("lk-syn", "k1", 7, statement="The cache returns nil on error", source_id="sub-a"),
        f.claim(
            "lk-syn",
            "k2",
            8,
            statement="The cache never returns nil",
            source_id="sub-b",
            relationships=[{"type": "contradicts", "target": "k1", "strength": 0.9}],
        ),
        f.claim(
            "lk-syn",
            "k3",
            9,
            source_id="sub-a",
            relationships=[{"type": "supports", "target": "k1", "strength": 0.6}],
        ),
        f.claim("lk-syn", "k4", 10, derived_from=["k1", "k3"]),
        f.response(
            "lk-syn",
            11,
            role="sub_call",
            sub_call_id="sub-a",
            response="It returns nil.",
            token_logprobs=[l1, l2],
        ),
        f.response(
            "lk-syn",
            12,
            role="sub_call",
            sub_call_id="sub-b",
            response="Maybe never.",
            token_logprobs=[l3, l5],
        ),
        f.response("lk-syn", 13, role="synthesis", response="Combined.", token_logprobs=[l0, l4]),
    ]
    # An OUTCOME for a response: its score reaches the calibration topic and tables (audited below).
    judged = next(e for e in valid if e["event_type"] == "LLM_RESPONSE")
    valid.append(f.outcome(judged["trace_id"], 14, subject_event_id=judged["event_id"], correct=True))
    base = f.response("lk-bad", 14, token_logprobs=[l0])
    bad: list[bytes] = [
        # Not JSON: cut off inside the logprobs array.
        b'{"event_type": "LLM_RESPONSE", "token_logprobs": [' + repr(l0).encode() + b", " + repr(l1).encode(),
        # Valid JSON, bad event: unsupported schema version, unknown type, wrong type, missing field.
        orjson.dumps({**base, "schema_version": 7, "token_logprobs": [l2, l3]}),
        orjson.dumps({**base, "event_type": "MYSTERY", "token_logprobs": [l4]}),
        orjson.dumps({**base, "response": 42, "token_logprobs": [l5, l0]}),
        orjson.dumps({k: v for k, v in base.items() if k != "trace_id"} | {"token_logprobs": [l1]}),
        # token_logprobs of the wrong shape: a scalar, strings, an object.
        orjson.dumps({**base, "token_logprobs": l2}),
        orjson.dumps({**base, "token_logprobs": [repr(l3), repr(l4)]}),
        orjson.dumps({**base, "token_logprobs": {"first": l5}}),
        # NaN makes it invalid for a strict JSON parser, so the DLQ strips it textually.
        b'{"event_type": "LLM_RESPONSE", "response": 42, "token_logprobs": [NaN, '
        + repr(l0).encode()
        + b"]}",
        # Out of range elsewhere, with logprobs hidden in an unknown nested field as well.
        orjson.dumps(
            {**base, "retrieval": [{"similarity": 1.5, "token_logprobs": [l1]}], "token_logprobs": [l2]}
        ),
        # Over MAX_ARRAY_ITEMS (40) and over MAX_EVENT_BYTES (8192).
        orjson.dumps({**base, "token_logprobs": [l3, l4, l5] * 20}),
        orjson.dumps({**base, "response": "x" * 9000, "token_logprobs": [l0, l1, l2, l3, l4, l5]}),
    ]
    responses = [e for e in valid if e["event_type"] == "LLM_RESPONSE"]
    claims = [e for e in valid if e["event_type"] == "CLAIM"]
    expected = (
        {("RESPONSE_SCORED", e["event_id"]) for e in responses}
        | {("TRACE_SCORED", e["event_id"]) for e in valid if e["event_type"] == "TOOL_INVOCATION"}
        | {("CLAIM_SCORED", e["event_id"]) for e in claims}
        | {("SYNTHESIS_SCORED", responses[-1]["event_id"])}
    )
    worker = d.start_worker()
    views: dict[str, tuple[int, bytes]] = {}
    try:
        d.produce(valid[:7])
        d.produce(bad[:6], key=b"lk-1")  # bad records between valid ones on the same partition
        d.produce(valid[7:])
        d.produce(bad[6:], key=b"lk-syn")
        d.collect(
            lambda rs: (
                expected <= _scored_ids(d, rs)
                and sum(1 for r in rs if r.topic == d.settings.dlq_topic) >= len(bad)
            )
        )
        port = d.web_ports[0]
        # The outcome's join runs after the outputs above: wait until its calibration group exists (and
        # k1's claim is in its view).
        statuses = poll(
            lambda: (http_get(port, "/calibration/leak")[0], http_get(port, "/claims/leak/k1")[0]),
            lambda seen: seen == (200, 200),
            60,
            0.2,
        )
        assert statuses == (200, 200), "the outcome was never joined with its score, or k1 is missing"
        paths = ["/healthz", "/metrics"]
        paths += [f"/traces/leak/{t}" for t in ("lk-1", "lk-2", "lk-syn", "lk-bad", "no-such-trace")]
        paths += [f"/claims/leak/{c}" for c in ("k1", "k2", "k3", "k4", "no-such-claim")]
        paths += ["/claims/leak/k1?min_lower=0.1&min_width=0.05&min_upper=0.2&max_lower=0.99"]
        paths += [f"/agents/leak/{a}" for a in ("planner-1", "clerk-1", "no-such-agent")]
        paths += ["/agents/leak/planner-1?hours=24", "/calibration/leak", "/calibration/leak?kind=response"]
        views = {path: http_get(port, path) for path in paths}
    finally:
        # SIGTERM: Faust flushes the producer (changelogs included) before it exits.
        assert worker.stop() == 0
    audit = asyncio.run(_read_every_topic(kafka.bootstrap_servers))
    input_topic = d.settings.input_topic_names[0]
    # Control: the detector finds the values where they are allowed to be, in the input topic.
    assert find_leaks(b"".join(_record_bytes(r) for r in audit.records[input_topic]), LEAKS)
    audited = {t: rs for t, rs in audit.records.items() if t != input_topic}

    # The audit read what it had to read: outputs, DLQ, both repartition topics and the changelogs.
    app_id = d.settings.app_id
    ours = [t for t in audited if t.startswith(app_id)]
    changelogs = [t for t in ours if t.endswith("-changelog")]
    repartition = [t for t in ours if not t.endswith("-changelog") and "__assignor" not in t]
    assert {d.settings.scored_topic, d.settings.flagged_topic, d.settings.dlq_topic} <= set(audited)
    assert d.settings.responses_topic in repartition and len(repartition) >= 2, audit.topics
    assert len(changelogs) >= 3, audit.topics  # traces, agent history, claims
    for topic in [*repartition, *changelogs, d.settings.scored_topic, d.settings.dlq_topic]:
        assert audited[topic], f"{topic} is empty: the audit would prove nothing"
    dead = audited[d.settings.dlq_topic]
    assert len(dead) == len(bad)
    # Exception messages are audited where they are stored: every dead letter's Connect headers.
    assert all(dict(r.headers).get("__connect.errors.exception.message") for r in dead)
    # The logprob-bearing responses did pass through the repartition topic and the state.
    internal = b"".join(_record_bytes(r) for t in [*repartition, *changelogs] for r in audited[t])
    for event in responses:
        assert event["event_id"].encode() in internal
    # Every view of something this traffic made answers; unknown keys and lk-bad (each of its events
    # was dead-lettered, so it has no state) are 404.
    unknown = [path for path in paths if "no-such" in path or path.endswith("/lk-bad")]
    assert {path: status for path, (status, _) in views.items()} == {
        path: 404 if path in unknown else 200 for path in paths
    }
    assert views["/metrics"][0] == 200 and b"llm_confidence_histogram" in views["/metrics"][1]
    assert json.loads(views["/claims/leak/k1"][1])["claim_id"] == "k1"

    print(  # the audit's extent, for the record (pytest -s)
        f"audited {sum(map(len, audited.values()))} records in {len(audited)} of "
        f"{len(audit.topics)} topics (all but the input topic):",
        {t: len(rs) for t, rs in audited.items() if t.startswith(app_id) or t.endswith(d.suffix)},
    )
    leaks: dict[str, list[str]] = {}
    for topic, recs in audited.items():
        for r in recs:
            found = find_leaks(_record_bytes(r), LEAKS)
            if found:
                leaks[f"topic {topic}[{r.partition}]@{r.offset}"] = found
    for path, (_, body) in views.items():
        if found := find_leaks(body, LEAKS):
            leaks[f"GET {path}"] = found
    for path, content in _directory_bytes(d.workdir).items():  # worker log(s) and data directories
        if found := find_leaks(content, LEAKS):
            leaks[f"file {path}"] = found
    assert "Ready" in d.log_text()  # the log was there to read
    assert not leaks, f"raw logprobs found outside the input topic: {leaks}"


def test_dead_letters_of_non_json_records_hold_no_logprobs(kafka: RunningBroker) -> None:
    """Records that are not strict JSON are stripped textually (README, Bad input): arrays nested in the
    logprobs (a top-k shape), a string holding `]`, and an escaped key must not survive either."""
    d = deploy(kafka, partitions=1)
    e0, e1, e2 = (repr(v).encode() for v in EDGE_LEAKS)
    bad = [
        # NaN (allowed in token_logprobs) makes these invalid for a strict JSON parser.
        b'{"event_type": "LLM_RESPONSE", "response": 42, "token_logprobs": [NaN, [-0.1, ' + e0 + b"]]}",
        b'{"event_type": "LLM_RESPONSE", "token_logprobs": [[-0.2, -1.5], [' + e1 + b", -0.3",  # truncated
        b'{"event_type": "LLM_RESPONSE", "token_logprobs": ["]", ' + e2 + b"], NaN}",
        b'{"event_type": "LLM_RESPONSE", "token\\u005flogprobs": [' + e0 + b", NaN]",
        # Thirtieth round (leak review), each of which kept its values before:
        *serialised_wrong(EDGE_LEAKS),
    ]
    worker = d.start_worker()
    try:
        d.produce(bad, key=b"edge")
        records = d.collect(lambda rs: sum(1 for r in rs if r.topic == d.settings.dlq_topic) >= len(bad))
    finally:
        worker.stop()
    leaks = {
        f"DLQ offset {r.offset} ({dict(r.headers).get('__connect.errors.reason', b'').decode()})": found
        for r in records
        if r.topic == d.settings.dlq_topic and (found := find_leaks(_record_bytes(r), EDGE_LEAKS))
    }
    if found := find_leaks(d.log_text().encode(), EDGE_LEAKS):
        leaks["worker log"] = found
    assert not leaks, f"raw logprobs in dead letters: {leaks}"
