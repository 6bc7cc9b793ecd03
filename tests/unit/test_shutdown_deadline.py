"""The graceful stop's deadline (`streams/app.py` DeadlinedWorker), without a broker.

Through the broker: tests/integration/test_stuck_commit.py (a stop that cannot commit exits 70 at the
deadline). Here, a worker whose stop takes a given time against a given deadline, in a subprocess: a
stop that finishes just inside it is not reported as overrun (the diff review: the timer ran on through
mode's own teardown of the loop and exited 70 with a false CRITICAL line), and one that overruns it
exits 70 (mutation review: the timer not started, or the exit status 0).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _stop_taking(stop_seconds: float, deadline_seconds: float) -> str:
    """The log of a worker sent SIGTERM whose stop takes `stop_seconds` against SHUTDOWN_TIMEOUT_SECONDS
    = `deadline_seconds`; its exit status on the last line. After the stop, mode's Worker runs its own
    loop teardown (`_shutdown_loop`: gathering futures, a 1 s sentinel task), which must not count."""
    probe = textwrap.dedent(
        f"""
        import asyncio, logging, signal, sys
        import faust
        from streams.app import DeadlinedWorker

        logging.basicConfig(level=logging.INFO, format="%(relativeCreated)6.0f %(levelname)s %(message)s")

        class SlowStop(DeadlinedWorker):
            async def on_stop(self) -> None:
                await super().on_stop()
                await asyncio.sleep({stop_seconds})  # e.g. an offset commit the broker keeps refusing
                logging.info("graceful stop finished")

        app = faust.App("probe", broker="kafka://127.0.0.1:1", autodiscover=False)
        worker = SlowStop(app, loglevel="info", quiet=True, debug=False)
        worker.shutdown_timeout_seconds = {deadline_seconds}

        async def sigterm() -> None:
            worker._schedule_shutdown(signal.SIGTERM)  # what mode's SIGTERM handler calls

        worker.loop.run_until_complete(sigterm())
        worker.stop_and_shutdown()  # what execute_from_commandline's `finally` runs
        logging.info("worker returned")
        sys.exit(0)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    return f"{run.stdout}{run.stderr}\nexit {run.returncode}"


def test_a_graceful_stop_that_finished_before_the_deadline_is_not_reported_as_overrun() -> None:
    """The stop finishes (its offsets committed) at 2.5 s of a 3 s deadline: exit 0, no CRITICAL line.
    Before, the timer ran on through mode's teardown after the stop, and the process exited 70 with
    "did not finish ... inputs not committed are processed again"."""
    log = _stop_taking(2.5, 3.0)
    assert "graceful stop finished" in log
    assert "did not finish" not in log, log
    assert log.endswith("\nexit 0"), log


def test_a_graceful_stop_past_its_deadline_exits_70() -> None:
    """A stop that cannot finish (an offset commit the broker keeps refusing) ends at the deadline with
    70 and the line naming the setting as given."""
    log = _stop_taking(30, 0.5)
    assert log.endswith("\nexit 70"), log
    assert "did not finish in 0.5 s (SHUTDOWN_TIMEOUT_SECONDS)" in log, log
