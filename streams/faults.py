"""Test-only fault injection (`FAULT_INJECTION=<send|table>:<agent>:<batch>`): one batch fails on purpose.

The reliability tests use it to prove that a failed send or table write never loses input: the batch is
not acknowledged and the worker stops (streams/batch_runner.py). `sweep:expiry:<n>` fails the n-th
expiry sweep instead (streams/agents.py), which must stop the worker the same way. Empty (the default)
injects nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["FaultInjector", "InjectedFault"]

FaultPoint = Literal["send", "table", "sweep"]
AGENTS = ("score-events", "score-responses", "score-claims", "calibrate")  # streams/agents.py names


class InjectedFault(RuntimeError):
    """Raised where FAULT_INJECTION asked for a failure."""


@dataclass
class FaultInjector:
    """Fails batch number `batch` (1-based) of `agent` at `point`; counts batches per agent."""

    point: FaultPoint | None = None
    agent: str | None = None
    batch: int = 0
    _batches: dict[str, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str) -> FaultInjector:
        if not spec:
            return cls()
        parts = spec.split(":")
        if len(parts) != 3 or not parts[1] or not parts[2].isdigit() or int(parts[2]) < 1:
            raise ValueError(
                f"FAULT_INJECTION {spec!r} is not <send|table>:<agent>:<batch number from 1> "
                "or sweep:expiry:<sweep number from 1>"
            )
        point, agent, batch = parts
        if point not in ("send", "table", "sweep"):
            raise ValueError(f"FAULT_INJECTION point must be send, table or sweep, not {point!r}")
        # A spec that can never fire is refused: a mistyped one injected nothing, silently.
        if point == "sweep" and agent != "expiry":
            raise ValueError(f"FAULT_INJECTION sweep faults name the sweep `expiry`, not {agent!r}")
        if point != "sweep" and agent not in AGENTS:
            raise ValueError(f"FAULT_INJECTION agent must be one of {', '.join(AGENTS)}, not {agent!r}")
        return cls(point, agent, int(batch))  # type: ignore[arg-type]

    def next_batch(self, agent: str) -> int:
        self._batches[agent] = self._batches.get(agent, 0) + 1
        return self._batches[agent]

    def check(self, agent: str, point: FaultPoint, batch: int) -> None:
        if self.point == point and self.agent == agent and self.batch == batch:
            raise InjectedFault(f"injected {point} failure in {agent} batch {batch}")

    def check_sweep(self) -> None:
        """Counts the expiry sweeps; raises in the one FAULT_INJECTION=sweep:expiry:<n> names."""
        if self.point == "sweep":
            self.check("expiry", "sweep", self.next_batch("expiry"))
