"""Fixtures shared by the unit test files."""

from __future__ import annotations

import time

import pytest


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """`time.monotonic` replaced by a `Clock` (what streams/progress.py reads)."""
    fake = Clock()
    monkeypatch.setattr(time, "monotonic", fake)
    return fake
