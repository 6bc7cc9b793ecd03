"""The one table `make bench` ends with: each micro-benchmark adds its headline rows here as it runs,
and the pipeline benchmark prints them above its own (`bench/pipeline.py`), so every figure of the run
stands in one place as a ratio against a baseline measured in the same run."""

from __future__ import annotations

__all__ = ["ROWS", "add"]

# (measurement, ratio, baseline, absolute figures), in the order the benchmarks ran.
ROWS: list[tuple[str, str, str, str]] = []


def add(measurement: str, ratio: float, baseline: str, figures: str) -> None:
    ROWS.append((measurement, f"{ratio:.2f}x", baseline, figures))
