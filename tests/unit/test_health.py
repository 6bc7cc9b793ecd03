"""/readyz's reason for each phase Faust goes through (through the broker: test_reliability.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from streams.health import Health


def _app(
    *,
    rebalancing: bool = False,
    in_recovery: bool = False,
    completed: bool = True,
    should_stop: bool = False,
    crash_reason: BaseException | None = None,
) -> SimpleNamespace:
    done = asyncio.Event()
    if completed:
        done.set()
    recovery = SimpleNamespace(in_recovery=in_recovery, completed=done)
    return SimpleNamespace(
        rebalancing=rebalancing,
        tables=SimpleNamespace(recovery=recovery),
        should_stop=should_stop,
        crash_reason=crash_reason,
    )


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        # Faust's flags in each phase, as a worker goes through them (rebalancing stays set while it restores).
        (
            {"rebalancing": False, "in_recovery": False, "completed": False},
            (False, "joining the consumer group"),
        ),
        ({"rebalancing": True, "in_recovery": False, "completed": False}, (False, "rebalancing")),
        ({"rebalancing": True, "in_recovery": True, "completed": False}, (False, "restoring tables")),
        ({"rebalancing": False, "in_recovery": False, "completed": True}, (True, "ready")),
        ({"rebalancing": True, "in_recovery": True, "completed": True}, (False, "restoring tables")),
    ],
)
def test_readiness_names_the_phase(phase: dict[str, bool], expected: tuple[bool, str]) -> None:
    ready, reason = Health().readiness(_app(**phase))
    assert ready is expected[0]
    assert reason.startswith(expected[1])


def test_a_failed_batch_is_not_ready_whatever_faust_says() -> None:
    health = Health(fatal="score-events failed a batch")
    ready, reason = health.readiness(_app(rebalancing=False, in_recovery=False, completed=True))
    assert not ready and reason.startswith("stopping: score-events")


@pytest.mark.parametrize(
    ("crash_reason", "expected"),
    [(None, "stopping: shutting down"), (KeyError("x"), "stopping: crashed (KeyError)")],
)
def test_a_stopping_or_crashed_app_is_neither_alive_nor_ready(
    crash_reason: BaseException | None, expected: str
) -> None:
    """Faust stops agents, tables and consumer before the web server: /healthz said 200 "ok" and
    /readyz "ready" meanwhile, with nothing processed (found by review)."""
    app = _app(should_stop=True, crash_reason=crash_reason)
    assert Health().liveness(app) == (False, expected)
    assert Health().readiness(app) == (False, expected)
    assert Health().liveness(_app()) == (True, "ok")
