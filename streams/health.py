"""What /healthz and /readyz report: the worker's own view of whether it is alive and able to work."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CRASH_MEMORY_SECONDS", "Health"]

CRASH_MEMORY_SECONDS = 60.0  # an agent crash keeps the worker unhealthy this long (issue: "last minute")


@dataclass
class Health:
    """Fatal stop reason and recent agent crashes, written by the agents, read by the views."""

    fatal: str | None = None
    crashes: dict[str, float] = field(default_factory=dict)  # agent name -> monotonic time of last crash

    def agent_crashed(self, agent: str) -> None:
        self.crashes[agent] = time.monotonic()

    def recent_crashes(self) -> list[str]:
        now = time.monotonic()
        return sorted(a for a, t in self.crashes.items() if now - t < CRASH_MEMORY_SECONDS)

    def liveness(self, app: Any) -> tuple[bool, str]:
        """Alive unless stopping (a fatal error, a shutdown, a crash) or an agent crashed in the last minute."""
        if self.fatal is not None:
            return False, f"stopping: {self.fatal}"
        # Faust stops the agents, tables and consumer before the web server: while it shuts down or
        # after a crash nothing is processed, though these endpoints still answer.
        if app.should_stop:
            reason = app.crash_reason
            return (
                False,
                f"stopping: crashed ({type(reason).__name__})" if reason else "stopping: shutting down",
            )
        crashed = self.recent_crashes()
        if crashed:
            return False, f"agent crashed in the last {CRASH_MEMORY_SECONDS:.0f} s: {', '.join(crashed)}"
        return True, "ok"

    def readiness(self, app: Any) -> tuple[bool, str]:
        """Ready: alive, partitions assigned (no rebalance in progress) and tables recovered."""
        alive, reason = self.liveness(app)
        if not alive:
            return False, reason
        # Faust keeps `rebalancing` set while it restores, and sets `recovery.completed` only once: ask
        # the restore first, and a worker that never had partitions is joining, not restoring.
        recovery = app.tables.recovery
        if recovery.in_recovery:
            return False, "restoring tables from their changelogs"
        if app.rebalancing:
            return False, "rebalancing: partitions not assigned yet"
        if not recovery.completed.is_set():
            return False, "joining the consumer group: no partitions assigned yet"
        return True, "ready"
