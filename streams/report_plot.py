"""The report's four charts as one PNG, drawn with matplotlib's Agg canvas (the `report` extra)."""

from __future__ import annotations

import io

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from streams.report import BANDS, Summary

__all__ = ["render_png"]

BAND_COLOURS = {"strong": "#2e9d4f", "adequate": "#2a9db3", "weak": "#e0a526", "failed": "#d1453b"}
MODEL_COLOURS = ("#3b6fb6", "#e07b26", "#6a4fb3", "#2e9d4f", "#c2477a", "#7f7f7f")
TOTAL_COLOUR, BLOCKED_COLOUR, FLAG_COLOUR = "#b8c4d6", "#d1453b", "#d1453b"


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#777")
    ax.set_xticks([])
    ax.set_yticks([])


def _confidence(ax: Axes, s: Summary) -> None:
    ax.set_title("Logprob confidence per model (RESPONSE_SCORED)")
    if not s.confidence_by_model:
        _empty(ax, "no response with a logprob confidence")
        return
    bins = [i / 20 for i in range(21)]
    tallest = 0.0
    for i, (model, values) in enumerate(s.confidence_by_model.items()):
        colour = MODEL_COLOURS[i % len(MODEL_COLOURS)]
        heights, _, _ = ax.hist(values, bins=bins, histtype="stepfilled", alpha=0.35, color=colour)
        tallest = max(tallest, float(max(heights)))
        ax.hist(
            values,
            bins=bins,
            histtype="step",
            linewidth=1.8,
            color=colour,
            label=f"{model} (n={len(values)})",
        )
    ax.set_xlim(0, 1)
    ax.set_ylim(0, tallest * 1.35 + 0.5)  # headroom for the legend
    ax.set_xlabel("confidence")
    ax.set_ylabel("responses")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    note = f"; {s.confidence_missing} without confidence" if s.confidence_missing else ""
    ax.legend(title=f"model{note}", loc="upper left", fontsize="small")


def _flag_rate(ax: Axes, s: Summary) -> None:
    ax.set_title(f"Flag rate over processing time ({s.bucket_seconds:g} s buckets)")
    if not s.timeline or s.first is None:
        _empty(ax, "no output with scored_at")
        return
    starts = [start for start, _, _ in s.timeline]
    totals = [n for _, n, _ in s.timeline]
    rates = [100 * f / n if n else float("nan") for _, n, f in s.timeline]
    counts = ax.twinx()
    bars = counts.bar(
        starts,
        totals,
        width=s.bucket_seconds * 0.9,
        align="edge",
        color=TOTAL_COLOUR,
        label="outputs per bucket",
    )
    counts.set_ylabel("outputs per bucket", color="#56647a")
    counts.set_ylim(0, max(totals) * 1.3)  # headroom for the legend, as on the rate axis
    counts.yaxis.set_major_locator(MaxNLocator(integer=True))
    # The rate line is drawn over the bars: put its axes in front and make it see-through.
    ax.set_zorder(counts.get_zorder() + 1)
    ax.patch.set_visible(False)
    centres = [start + s.bucket_seconds / 2 for start in starts]
    (line,) = ax.plot(
        centres, rates, marker="o", color=FLAG_COLOUR, linewidth=1.8, label="flagged % per bucket"
    )
    overall = 100 * s.flagged / s.outputs if s.outputs else 0.0
    mean = ax.axhline(
        overall,
        color=FLAG_COLOUR,
        linestyle=":",
        linewidth=1.2,
        label=f"flagged % overall ({overall:.0f} % of {s.outputs})",
    )
    ax.set_ylim(0, 130)
    ax.set_yticks([0, 20, 40, 60, 80, 100])
    ax.set_ylabel("flagged %", color=FLAG_COLOUR)
    ax.set_xlabel(f"seconds after the first output ({s.first.strftime('%Y-%m-%d %H:%M:%S %Z')})")
    ax.set_xlim(0, max(s.bucket_seconds, starts[-1] + s.bucket_seconds))
    ax.legend(handles=[line, mean, bars], loc="upper left", fontsize="small", ncols=2)


def _bands(ax: Axes, s: Summary) -> None:
    ax.set_title("Evidence band per trace (latest TRACE_SCORED)")
    counts = [s.band_per_trace.get(band, 0) for band in BANDS]
    if not any(counts):
        _empty(ax, "no TRACE_SCORED")
        return
    bars = ax.bar(BANDS, counts, color=[BAND_COLOURS[b] for b in BANDS])
    ax.bar_label(bars, padding=2)
    ax.set_ylabel("traces")
    ax.set_ylim(0, max(counts) * 1.2 + 0.5)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _blocked(ax: Axes, s: Summary) -> None:
    ax.set_title("Blocked responses per agent type (composite)")
    if not s.blocked_by_agent_type:
        _empty(ax, "no RESPONSE_SCORED")
        return
    kinds = list(s.blocked_by_agent_type)
    x = list(range(len(kinds)))
    totals = [s.blocked_by_agent_type[k][1] for k in kinds]
    blocked = [s.blocked_by_agent_type[k][0] for k in kinds]
    ax.bar([i - 0.2 for i in x], totals, width=0.4, color=TOTAL_COLOUR, label="responses")
    bars = ax.bar([i + 0.2 for i in x], blocked, width=0.4, color=BLOCKED_COLOUR, label="blocked")
    ax.bar_label(bars, labels=[f"{b}/{t}" for b, t in zip(blocked, totals, strict=True)], padding=2)
    ax.set_xticks(x, kinds)
    ax.set_ylabel("responses")
    ax.set_ylim(0, max(totals) * 1.25 + 0.5)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="upper right", fontsize="small")


def render_png(summary: Summary, title: str) -> bytes:
    """The four charts on one 1200 x 800 image."""
    # Model names, agent types and the title are free text: "$" would be read as math and a backslash
    # word in it as a TeX command, which raised and lost the whole report.
    with rc_context({"text.parse_math": False}):
        return _render(summary, title)


def _render(summary: Summary, title: str) -> bytes:
    figure = Figure(figsize=(12, 8), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    (a, b), (c, d) = figure.subplots(2, 2)
    _confidence(a, summary)
    _flag_rate(b, summary)
    _bands(c, summary)
    _blocked(d, summary)
    figure.suptitle(
        f"{title}: {summary.outputs} outputs, {summary.flagged} flagged, {summary.blocked} blocked"
        f"  ({summary.source})",
        fontsize="large",
    )
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
