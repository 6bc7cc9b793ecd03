"""The README's first command, `make demo` (= `confidence-streams demo`), runs end to end and exits 0."""

from __future__ import annotations

import os
import subprocess
import sys


def test_demo_runs_and_prints_summary() -> None:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"} | {"COLUMNS": "160"}
    if "KAFKA_BOOTSTRAP_SERVERS" in os.environ:
        env["KAFKA_BOOTSTRAP_SERVERS"] = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    done = subprocess.run(
        [sys.executable, "-m", "streams.cli", "demo", "--timeout", "150"],
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
