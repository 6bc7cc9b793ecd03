"""Through a real broker: an input whose output or message to a later stage would be one record larger
than MAX_RECORD_BYTES is dead-lettered (`oversized_output`) and changes nothing; the worker goes on.

A broker refuses a record over its `message.max.bytes`, and the worker would stop on that batch after
every restart. The input bounds cannot see every such record: a list's entries gain their defaults in
the internal message (a retrieval hit of 16 bytes takes 36 there). The embedded broker takes larger
records than Apache Kafka, so the limit is lowered here to make small inputs cross it.
"""

from __future__ import annotations

import orjson

from streams.harness import RunningBroker
from streams.kafka_io import Consumed
from tests.integration.fixtures import EventFactory, deploy

LIMIT = 16_384  # the smallest the setting accepts


def test_inputs_that_would_make_an_oversized_record_are_dead_lettered(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=1, MAX_RECORD_BYTES=str(LIMIT), PRODUCER_MAX_BATCH_BYTES=str(LIMIT))
    f = EventFactory()
    # About 13 KB each as input; about 25 KB and 20 KB as the messages to the history and claim stages.
    hits = f.response("tr-big", retrieval=[{"similarity": 0.9}] * 700)
    sources = f.claim("tr-big", "c-big", provenance=[{"source_type": "a", "confidence": 0.5}] * 350)
    # An OUTCOME with ids of escaped characters (6 bytes each in JSON): one calibration item of about
    # 18 KB, sent over the limit until the thirtieth round. Its dead letter is cut to fit, so it is told
    # by its message, not its (no longer JSON) value.
    escaped = "\x01" * 1000
    verdict = f.outcome(
        escaped, 1, event_id=f.outcome("x")["event_id"] + escaped, subject_event_id=escaped, correct=True
    )
    after = [f.response("tr-big", minutes=1), f.claim("tr-big", "c-after", minutes=1)]
    assert all(len(orjson.dumps(e)) < LIMIT for e in (hits, sources))
    refused = {hits["event_id"], sources["event_id"]}
    applied = {e["event_id"] for e in after}

    def settled(records: list[Consumed]) -> bool:
        scored = {
            orjson.loads(r.value)["source_event_id"] for r in records if r.topic == d.settings.scored_topic
        }
        dead = {orjson.loads(r.value)["event_id"] for r in _json_letters(records)}
        return refused <= dead and applied <= scored and len(_calibration_letters(records)) == 1

    try:
        worker = d.start_worker()
        d.produce([hits, sources, verdict, *after])
        records = d.collect(settled)
        assert worker.alive(), d.log_tails()
    finally:
        d.stop()

    letters = [r for r in records if r.topic == d.settings.dlq_topic]
    assert {orjson.loads(r.value)["event_id"] for r in _json_letters(records)} == refused
    assert len(letters) == len(refused) + 1
    assert {dict(r.headers)["__connect.errors.reason"] for r in letters} == {b"oversized_output"}
    assert all(b"MAX_RECORD_BYTES" in dict(r.headers)["__connect.errors.exception.message"] for r in letters)
    outputs = d.outputs(records)
    assert not refused & {o["source_event_id"] for o in outputs}
    # Only the applied response is scored: the refused one left nothing behind to be scored again.
    (scored,) = [o for o in outputs if o["event_type"] == "RESPONSE_SCORED"]
    assert scored["source_event_id"] == after[0]["event_id"]
    assert max(len(r.value) + len(r.key or b"") for r in records) <= LIMIT


def _calibration_letters(records: list[Consumed]) -> list[Consumed]:
    """The dead letter of the OUTCOME whose calibration item was over the limit, told by its message."""
    message = "__connect.errors.exception.message"
    return [r for r in records if b"calibration message" in dict(r.headers).get(message, b"")]


def _json_letters(records: list[Consumed]) -> list[Consumed]:
    """Dead letters (the only records with Connect headers) other than the calibration item's."""
    return [r for r in records if r.headers and r not in _calibration_letters(records)]
