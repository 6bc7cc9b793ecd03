"""Progress of a multi-step command (the demo): live rich bars on a terminal, plain lines otherwise.

A step is begun, optionally counted (`n/N`), and finished. On a terminal each step is one line of a
rich `Progress` display (a spinner while it runs, a bar for counted steps). Elsewhere (CI logs, a pipe)
each step prints `progress: ...` lines: when it begins, when it ends, and a counted step at most once
per `interval` seconds in between, so a log shows how far a run got without a line per event.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

__all__ = ["StepProgress"]


@dataclass
class _Step:
    description: str
    total: int | None
    started: float
    completed: int = 0
    printed_at: float = 0.0
    printed: int = -1
    task: TaskID | None = None


class StepProgress:
    """Steps with optional counts; `with StepProgress(console) as p: p.begin(...); p.finish(...)`."""

    def __init__(self, console: Console, interval: float = 1.0) -> None:
        self.console = console
        self.interval = interval
        self.steps: dict[str, _Step] = {}
        self.live: Progress | None = None
        if console.is_terminal:
            self.live = Progress(
                SpinnerColumn(finished_text="[green]✓[/]"),
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[count]}"),  # n/N for counted steps only
                TimeElapsedColumn(),
                console=console,
            )

    def __enter__(self) -> StepProgress:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.live is not None:
            self.live.stop()

    def begin(self, key: str, description: str, total: int | None = None) -> None:
        """Start a step (counted when `total` is given)."""
        step = _Step(description, total, time.monotonic())
        self.steps[key] = step
        if self.live is not None:
            step.task = self.live.add_task(description, total=total, count=_count(step))
        else:
            self._line(step, force=True)

    def update(self, key: str, completed: int) -> None:
        """A counted step's progress (`completed` of its total)."""
        step = self.steps[key]
        step.completed = completed
        if self.live is not None and step.task is not None:
            self.live.update(step.task, completed=completed, count=_count(step))
        elif completed != step.printed and time.monotonic() - step.printed_at >= self.interval:
            self._line(step)

    def finish(self, key: str, description: str | None = None) -> None:
        """End a step; `description` replaces its text (e.g. with what it found)."""
        step = self.steps[key]
        step.description = description or step.description
        seconds = time.monotonic() - step.started
        if self.live is not None and step.task is not None:
            total = step.total if step.total is not None else 1
            completed = step.completed if step.total is not None else 1
            self.live.update(
                step.task, description=step.description, total=total, completed=completed, count=_count(step)
            )
            self.live.stop_task(step.task)
        else:
            self._line(step, force=True, suffix=f" ({seconds:.1f}s)")

    def _line(self, step: _Step, force: bool = False, suffix: str = "") -> None:
        if not force and step.completed == step.printed:
            return
        count = f" {_count(step)}" if step.total is not None else ""
        self.console.print(
            f"progress: {step.description}{count}{suffix}", markup=False, highlight=False, soft_wrap=True
        )
        step.printed_at = time.monotonic()
        step.printed = step.completed


def _count(step: _Step) -> str:
    return f"{step.completed}/{step.total}" if step.total is not None else ""
