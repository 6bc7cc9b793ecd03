"""The README's first command, `make demo` (= `confidence-streams demo`), runs end to end and exits 0."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import orjson

from streams.demo import demo_traffic
from streams.demo_runner import expected_outputs


def test_demo_runs_shows_progress_and_prints_summary() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS", "FORCE_COLOR")}
    env |= {"COLUMNS": "160"}
    report = tempfile.mkdtemp(prefix="confidence-demo-report-")
    if "KAFKA_BOOTSTRAP_SERVERS" in os.environ:
        env["KAFKA_BOOTSTRAP_SERVERS"] = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    done = subprocess.run(
        [sys.executable, "-m", "streams.cli", "demo", "--timeout", "150", "--report", report],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "confidence-streams demo" in out
    for column in ("scored", "flagged", "rejected", "dead-lettered"):
        assert column in out
    for kind in ("RESPONSE_SCORED", "TRACE_SCORED", "CLAIM_SCORED", "SYNTHESIS_SCORED"):
        assert kind in out
    assert "dead-letter reasons:" in out and "invalid_json=1" in out
    # Progress, as plain lines (stdout is not a terminal), in order, before the summary.
    traffic = demo_traffic()
    awaited = sum(expected_outputs(traffic).values())
    steps = [
        r"progress: broker up: \S+ at \S+ \(\d+\.\ds\)",
        r"progress: topics ready \(\d+ created\)",
        r"progress: worker ready \(\d+\.\ds\)",
        rf"progress: events sent {len(traffic.records)}/{len(traffic.records)} \(",
        rf"progress: outputs received {awaited}/{awaited} \(",
        r"progress: worker and broker stopped",
        r"confidence-streams demo \(",
    ]
    positions = []
    for step in steps:
        found = re.search(step, done.stdout)
        assert found, f"{step!r} not in output:\n{done.stdout[-4000:]}"
        positions.append(found.start())
    assert positions == sorted(positions)
    assert "\x1b[" not in done.stdout  # no escape codes off a terminal
    # --report: the page, the picture and the outputs it was drawn from.
    outputs = [orjson.loads(line) for line in Path(report, "outputs.jsonl").read_bytes().splitlines()]
    kinds = Counter(o["event_type"] for o in outputs)
    expected = expected_outputs(traffic)
    assert all(kinds[kind] >= n for kind, n in expected.items() if kind != "DLQ"), (kinds, expected)
    assert Path(report, "report.png").read_bytes().startswith(b"\x89PNG")
    assert f"<tr><td>{len(outputs)}</td>" in Path(report, "report.html").read_text()
    # The worker's data dir and log are removed after a run that succeeded (kept when it fails).
    worker_log = re.search(r"log (\S+worker\.log)\)", done.stdout)
    assert worker_log, done.stdout[-4000:]
    assert not Path(worker_log.group(1)).parent.exists()
