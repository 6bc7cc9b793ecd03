"""`confidence-streams report --from <topic>` after a worker scored traffic: every output, then a page."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from streams.harness import RunningBroker
from streams.report import read_topic, summarize
from tests.integration.fixtures import EventFactory, deploy

ODD_AGENT_TYPE = "clerk$\\notacommand$"


def test_report_from_the_scored_topic(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=2)
    d.start_worker()
    f = EventFactory(tenant="report")
    events = [
        # gpt-4o allowed (confidence 0.905), claude flagged (0.223), one response without logprobs
        f.response("rp-1", token_logprobs=[-0.1, -0.1]),
        f.response("rp-2", token_logprobs=[-1.5, -1.5], model="claude"),
        # an agent type matplotlib would read as math ("$...$" around an unknown TeX word): drawn as text
        f.response("rp-3", agent="clerk-1", agent_type=ODD_AGENT_TYPE),
        # a trace that ends strong (find + grep + read on one target) and a failed one
        f.tool("rp-t1", "find", "Parser", result_count=2),
        f.tool("rp-t1", "grep", "Parser", result_count=5, minutes=1),
        f.tool("rp-t1", "read", "src/Parser.py", minutes=2),
        f.tool("rp-t2", "grep", "Nothing", status="empty"),
    ]
    try:
        d.produce(events)
        records = d.collect(lambda rs: len(d.outputs(rs)) >= len(events))
        expected = d.outputs(records)
        # In process: the topic read from its beginning to its end offsets gives exactly those outputs.
        read = asyncio.run(read_topic(kafka.bootstrap_servers, d.settings.scored_topic))
        out = tempfile.mkdtemp(prefix="confidence-report-")
        done = subprocess.run(
            [sys.executable, "-m", "streams.cli", "report", "--from", d.settings.scored_topic, "--out", out],
            env={**os.environ, **d.env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        missing = subprocess.run(
            [sys.executable, "-m", "streams.cli", "report", "--from", "no-such-topic-or-file", "--out", out],
            env={**os.environ, **d.env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        d.stop()
    assert len(expected) == len(events)
    outputs = [o for o in read if isinstance(o, dict)]
    assert len(outputs) == len(read)
    assert sorted(outputs, key=lambda o: o["event_id"]) == sorted(expected, key=lambda o: o["event_id"])

    s = summarize(read, "topic")
    assert s.outputs == 7 and s.skipped == 0
    assert s.by_type == {"RESPONSE_SCORED": 3, "TRACE_SCORED": 4}
    assert s.confidence_by_model == {"claude": [0.223], "gpt-4o": [0.905]}
    assert s.confidence_missing == 1
    assert s.band_per_trace == {"strong": 1, "adequate": 0, "weak": 0, "failed": 1}
    assert set(s.blocked_by_agent_type) == {"planner", ODD_AGENT_TYPE.lower()}

    assert done.returncode == 0, done.stderr
    assert f"7 records from topic {d.settings.scored_topic}" in done.stdout
    png = (Path(out) / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 30_000
    html = (Path(out) / "report.html").read_text()
    assert f"<tr><td>7</td><td>{s.flagged} (" in html
    assert "<tr><td>claude</td><td>1</td><td>0.223</td>" in html
    assert "<tr><td>strong</td><td>1</td></tr>" in html and "<tr><td>failed</td><td>1</td></tr>" in html
    assert missing.returncode == 1 and "topic no-such-topic-or-file does not exist" in missing.stderr
