"""`confidence-streams tail` follows the scored, flagged and DLQ topics of a running worker."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson

from streams.harness import RunningBroker
from tests.integration.fixtures import EventFactory, deploy


def _start_tail(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", "tail", *args],
        # COLUMNS is narrow on purpose: a line must never wrap; no FORCE_COLOR, so auto means no colour.
        env={k: v for k, v in os.environ.items() if k != "FORCE_COLOR"} | env | {"COLUMNS": "60"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    for line in process.stderr:  # blocks until tail says it is positioned (or exits)
        if line.startswith("following "):
            return process
    process.kill()
    raise AssertionError(f"tail exited before following, rc={process.wait()}")


def test_tail_prints_scored_and_flagged_events(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=2)
    d.start_worker()
    tails: list[subprocess.Popen[str]] = []
    f = EventFactory(tenant="tail")
    try:
        tails.append(scored := _start_tail(d.env, "--limit", "1"))
        tails.append(flagged := _start_tail(d.env, "--flagged", "--limit", "1"))
        d.produce([f.response("tail-1", token_logprobs=[-1.5, -1.5])])  # 0.223 < 0.40: flagged
        scored_out, _ = scored.communicate(timeout=90)
        flagged_out, _ = flagged.communicate(timeout=90)
    finally:
        for process in tails:
            if process.poll() is None:
                process.kill()
        d.stop()
    for process, out in ((scored, scored_out), (flagged, flagged_out)):
        assert process.returncode == 0
        assert out.count("\n") == 1, out  # one line, however narrow the terminal
        assert "RESPONSE_SCORED trace=tail-1 tenant=tail confidence=0.223 action=flag" in out
        assert out.rstrip("\n").endswith("flags=LOW_CONFIDENCE,COMPOSITE_BLOCKED [flagged]")
        assert "\x1b" not in out  # stdout is a pipe: no colour codes
    assert "-1.5" not in scored_out + flagged_out


def test_tail_json_lines_are_the_values_on_the_topic(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=2)
    d.start_worker()
    f = EventFactory(tenant="tail-json")
    # One output each: a response, two tool invocations of one trace, a claim with no relationships.
    events = [
        f.response("tj-1", token_logprobs=[-0.05, -0.1, None]),
        f.tool("tj-2", "find", "Parser", result_count=2),
        f.tool("tj-2", "read", "src/Parser.py", minutes=1),
        f.claim("tj-3", "c-json"),
    ]
    tails: list[subprocess.Popen[str]] = []
    try:
        tails.append(tail := _start_tail(d.env, "--json", "--limit", str(len(events))))
        tails.append(dlq := _start_tail(d.env, "--dlq", "--json", "--limit", "1"))
        d.produce([*events, b'{"event_type": "LLM_RESPONSE", "token_logprobs": [-0.1'])
        out, _ = tail.communicate(timeout=90)
        dlq_out, _ = dlq.communicate(timeout=90)
        # Every output, whichever partition it is on (a fetch may answer one partition and not the other).
        sources = {e["event_id"] for e in events}
        records = d.collect(lambda rs: {o["source_event_id"] for o in d.outputs(rs)} >= sources)
    finally:
        for process in tails:
            if process.poll() is None:
                process.kill()
        d.stop()
    assert tail.returncode == 0 and dlq.returncode == 0
    lines = out.splitlines()
    assert len(lines) == len(events)
    printed = sorted((orjson.loads(line) for line in lines), key=lambda o: o["event_id"])
    on_topic = sorted(d.outputs(records), key=lambda o: o["event_id"])
    assert printed == on_topic
    assert {o["source_event_id"] for o in printed} == {e["event_id"] for e in events}
    dead = orjson.loads(dlq_out)
    assert dead["headers"]["__connect.errors.reason"] == "invalid_json"
    assert dead["topic"] == d.settings.dlq_topic
