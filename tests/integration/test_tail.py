"""`confidence-streams tail` follows the scored and flagged topics of a running worker."""

from __future__ import annotations

import os
import subprocess
import sys

from streams.harness import RunningBroker
from tests.integration.fixtures import EventFactory, deploy


def _start_tail(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", "tail", *args],
        env={**os.environ, **env, "COLUMNS": "200"},
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
    scored = _start_tail(d.env, "--limit", "1")
    flagged = _start_tail(d.env, "--flagged", "--limit", "1")
    f = EventFactory(tenant="tail")
    try:
        d.produce([f.response("tail-1", token_logprobs=[-1.5, -1.5])])  # 0.223 < 0.40: flagged
        scored_out, _ = scored.communicate(timeout=90)
        flagged_out, _ = flagged.communicate(timeout=90)
    finally:
        for process in (scored, flagged):
            if process.poll() is None:
                process.kill()
        d.stop()
    for process, out in ((scored, scored_out), (flagged, flagged_out)):
        assert process.returncode == 0
        assert "RESPONSE_SCORED trace=tail-1 tenant=tail confidence=0.223 action=flag" in out
    assert "-1.5" not in scored_out + flagged_out
