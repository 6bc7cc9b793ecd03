"""`confidence-streams report`: a run's outputs as one PNG (four charts) and an HTML page around it.

Reads the outputs from a topic (from the beginning to the end offsets it finds at start, then stops) or
from a JSON-lines file such as `confidence-streams tail --json` writes, and summarises them: logprob
confidence per model, the flag rate over processing time, each trace's latest evidence band, and blocked
responses per agent type; the HTML adds, when the run has CALIBRATION_UPDATED outputs, each calibration
group's last ECE. The summary is pure (`summarize`); the charts need the `report` extra (matplotlib, drawn
with its Agg backend, no display needed).
"""

from __future__ import annotations

import base64
import html
import math
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.stages.common import is_flagged

__all__ = [
    "BANDS",
    "CalibrationLast",
    "Summary",
    "bucket_width",
    "load_lines",
    "read_topic",
    "render_html",
    "summarize",
    "write_report",
]

BANDS = ("strong", "adequate", "weak", "failed")
ACTIONS = ("allow", "flag", "reject")
# Candidate widths of one flag-rate bucket, in seconds: the smallest giving at most MAX_BUCKETS is used.
NICE_WIDTHS = (
    *(0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30),
    *(60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400, 7 * 86400),
)
MAX_BUCKETS = 30


@dataclass(frozen=True)
class CalibrationLast:
    """A calibration group's latest CALIBRATION_UPDATED (by scored_at) in the run."""

    tenant: str
    dimension: str
    value: str
    kind: str
    ece: float | None
    previous_ece: float | None
    brier: float | None
    samples: int | None
    alert: bool
    scored_at: datetime | None


@dataclass(frozen=True)
class Summary:
    """What the report shows, computed from the outputs alone."""

    source: str
    outputs: int = 0
    skipped: int = 0  # records that are not outputs (not a JSON object with a string event_type)
    by_type: dict[str, int] = field(default_factory=dict)
    flagged: int = 0  # outputs DESIGN section 3 copies to flagged-events
    actions: dict[str, int] = field(default_factory=dict)
    blocked: int = 0
    confidence_by_model: dict[str, list[float]] = field(default_factory=dict)
    confidence_missing: int = 0  # RESPONSE_SCORED without a logprob confidence
    band_per_trace: dict[str, int] = field(default_factory=dict)  # each trace's latest band
    blocked_by_agent_type: dict[str, tuple[int, int]] = field(default_factory=dict)  # (blocked, responses)
    first: datetime | None = None  # earliest scored_at
    last: datetime | None = None
    bucket_seconds: float = 1.0
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (start s, outputs, flagged)
    calibration_alerts: int = 0  # CALIBRATION_UPDATED with alert true (copied to flagged-events)
    calibration_last: list[CalibrationLast] = field(default_factory=list)  # one per group, sorted

    @property
    def responses(self) -> int:
        return self.by_type.get("RESPONSE_SCORED", 0)

    @property
    def calibration_updates(self) -> int:
        return self.by_type.get("CALIBRATION_UPDATED", 0)


def _scored_at(output: dict[str, Any]) -> datetime | None:
    value = output.get("scored_at")
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None  # naive and aware times cannot be compared


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _flagged(output: dict[str, Any]) -> bool:
    if output["event_type"] == "CALIBRATION_UPDATED":
        return output.get("alert") is True  # the calibration stage copies an alert (not is_flagged's rule)
    try:
        return is_flagged(output)
    except (KeyError, AssertionError, TypeError, ValueError):  # an output missing a field the rule reads
        return False


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _calibration_last(outputs: Iterable[dict[str, Any]]) -> list[CalibrationLast]:
    """Each (tenant, dimension, value, kind) group's latest CALIBRATION_UPDATED, sorted by group.

    Latest by scored_at (records of one group may sit on several partitions: they are keyed by the
    outcome's trace); without a readable scored_at, the later record wins.
    """
    last: dict[tuple[str, str, str, str], CalibrationLast] = {}
    for o in outputs:
        group = o.get("group")
        if o["event_type"] != "CALIBRATION_UPDATED" or not isinstance(group, dict):
            continue
        key = (
            str(o.get("tenant_id")),
            str(group.get("dimension")),
            str(group.get("value")),
            str(group.get("kind")),
        )
        samples = o.get("samples")
        row = CalibrationLast(
            *key,
            ece=_number(o.get("ece")),
            previous_ece=_number(o.get("previous_ece")),
            brier=_number(o.get("brier")),
            samples=samples if isinstance(samples, int) and not isinstance(samples, bool) else None,
            alert=o.get("alert") is True,
            scored_at=_scored_at(o),
        )
        seen = last.get(key)
        if seen is None or seen.scored_at is None or row.scored_at is None or row.scored_at >= seen.scored_at:
            last[key] = row
    return [last[key] for key in sorted(last)]


def bucket_width(span_seconds: float) -> float:
    """The smallest nice bucket width that cuts `span_seconds` into at most MAX_BUCKETS buckets; past
    the widest nice one (outputs dated years apart: another writer's, or a corrupt clock), an even cut
    into MAX_BUCKETS - 1 widths, so the timeline stays at most MAX_BUCKETS long whatever the span."""
    for width in NICE_WIDTHS:
        if span_seconds / width < MAX_BUCKETS:
            return float(width)
    return span_seconds / (MAX_BUCKETS - 1)


def summarize(records: Iterable[object], source: str) -> Summary:
    """Summarise output values (parsed JSON); anything that is not an output is counted as skipped.

    Every event type is counted (a type this version does not chart, too); the charts read the four
    DESIGN section 3 types.
    """
    outputs: list[dict[str, Any]] = []
    skipped = 0
    for record in records:
        if isinstance(record, dict) and isinstance(record.get("event_type"), str):
            outputs.append(record)
        else:
            skipped += 1
    by_type = Counter(str(o["event_type"]) for o in outputs)
    actions: Counter[str] = Counter()
    confidence: dict[str, list[float]] = {}
    missing = 0
    blocked = 0
    agent_types: dict[str, tuple[int, int]] = {}
    latest_band: dict[tuple[str, str], str] = {}  # (tenant, trace) -> band; later outputs replace earlier
    for o in outputs:
        if o["event_type"] == "RESPONSE_SCORED":
            meta, composite = _dict(o.get("metadata")), _dict(o.get("composite"))  # another writer's shape
            actions[str(o.get("action"))] += 1
            value = o.get("confidence")
            if isinstance(value, int | float) and math.isfinite(value):
                confidence.setdefault(str(meta.get("model", "?")), []).append(float(value))
            else:
                missing += 1
            is_blocked = bool(composite.get("should_block"))
            blocked += is_blocked
            kind = str(meta.get("agent_type", "?"))
            was_blocked, total = agent_types.get(kind, (0, 0))
            agent_types[kind] = (was_blocked + is_blocked, total + 1)
        elif o["event_type"] == "TRACE_SCORED" and o.get("band") in BANDS:
            latest_band[(str(o.get("tenant_id")), str(o.get("trace_id")))] = str(o["band"])
    times = [(t, _flagged(o)) for o in outputs if (t := _scored_at(o)) is not None]
    first = min((t for t, _ in times), default=None)
    last = max((t for t, _ in times), default=None)
    width = bucket_width((last - first).total_seconds()) if first and last else 1.0
    timeline: list[tuple[float, int, int]] = []
    if first is not None and last is not None:
        count = int((last - first).total_seconds() // width) + 1
        totals, flags = [0] * count, [0] * count
        for t, flagged in times:
            index = min(count - 1, int((t - first).total_seconds() // width))
            totals[index] += 1
            flags[index] += flagged
        timeline = [(i * width, totals[i], flags[i]) for i in range(count)]
    return Summary(
        source=source,
        outputs=len(outputs),
        skipped=skipped,
        by_type=dict(sorted(by_type.items())),
        flagged=sum(_flagged(o) for o in outputs),
        actions={a: actions[a] for a in ACTIONS},
        blocked=blocked,
        confidence_by_model=dict(sorted(confidence.items())),
        confidence_missing=missing,
        band_per_trace={b: sum(1 for v in latest_band.values() if v == b) for b in BANDS},
        blocked_by_agent_type=dict(sorted(agent_types.items())),
        first=first,
        last=last,
        bucket_seconds=width,
        timeline=timeline,
        calibration_alerts=sum(
            1 for o in outputs if o["event_type"] == "CALIBRATION_UPDATED" and o.get("alert") is True
        ),
        calibration_last=_calibration_last(outputs),
    )


def load_lines(lines: Iterable[bytes | str]) -> list[object]:
    """JSON lines (blank lines ignored); a line that is not JSON is kept as None (counted as skipped)."""
    values: list[object] = []
    for line in lines:
        if not line.strip():
            continue
        try:
            values.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            values.append(None)
    return values


async def read_topic(bootstrap: str, topic: str, timeout: float = 60.0) -> list[object]:
    """Every value of `topic` from the beginning up to the end offsets found at start (values parsed).

    A fetch may return records past those end offsets (written meanwhile, or in the same batch): they
    are kept. TimeoutError when the end is not reached in `timeout` seconds; LookupError for a missing
    topic.
    """
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    values: list[object] = []
    try:
        await consumer.start()  # inside: a start that fails (no broker) still closes the client
        partitions = consumer.partitions_for_topic(topic)
        if partitions is None:
            await consumer.topics()  # refresh the metadata once: the cache may predate the topic
            partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise LookupError(f"topic {topic} does not exist")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout
        pending = {tp for tp in tps if await consumer.position(tp) < ends[tp]}
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: end offsets not reached after {timeout:.0f}s")
            batches = await consumer.getmany(*pending, timeout_ms=500)
            for batch in batches.values():
                for message in batch:
                    try:
                        values.append(orjson.loads(message.value or b""))
                    except orjson.JSONDecodeError:
                        values.append(None)
            pending = {tp for tp in pending if await consumer.position(tp) < ends[tp]}
    finally:
        await consumer.stop()
    return values


def _table(headers: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "-"


def _fixed(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _calibration_section(s: Summary) -> str:
    """The last ECE per calibration group, or nothing when the run has no CALIBRATION_UPDATED."""
    if not s.calibration_last:
        return ""
    table = _table(
        ("tenant", "group", "kind", "ECE", "previous ECE", "Brier", "samples", "alert", "scored_at"),
        [
            (
                c.tenant,
                f"{c.dimension}={c.value}",
                c.kind,
                _fixed(c.ece),
                _fixed(c.previous_ece),
                _fixed(c.brier),
                "-" if c.samples is None else c.samples,
                "yes" if c.alert else "no",
                "-" if c.scored_at is None else c.scored_at.isoformat(),
            )
            for c in s.calibration_last
        ],
    )
    note = (
        f"Each group's last CALIBRATION_UPDATED (latest scored_at): {s.calibration_updates} update(s), "
        f"{s.calibration_alerts} with an alert (ECE at or above CALIBRATION_ECE_ALERT, copied to "
        "flagged-events)."
    )
    return f'<section id="calibration"><h2>Calibration</h2>\n<p>{note}</p>{table}</section>\n'


def render_html(summary: Summary, png: bytes, title: str) -> str:
    """A self-contained page: the PNG inline (base64) and a table per chart."""
    s = summary
    span = f"{s.first.isoformat()} to {s.last.isoformat()}" if s.first and s.last else "-"
    overview = _table(
        (
            "outputs",
            "flagged",
            "allow",
            "flag",
            "reject",
            "blocked",
            "calibration updates",
            "calibration alerts",
            "not outputs (skipped)",
        ),
        [
            (
                s.outputs,
                f"{s.flagged} ({_pct(s.flagged, s.outputs)})",
                s.actions.get("allow", 0),
                s.actions.get("flag", 0),
                s.actions.get("reject", 0),
                s.blocked,
                s.calibration_updates,
                s.calibration_alerts,
                s.skipped,
            )
        ],
    )
    by_type = _table(("event_type", "count"), s.by_type.items())
    models = _table(
        ("model", "responses with confidence", "mean", "median", "min", "max"),
        [
            (
                m,
                len(v),
                f"{statistics.fmean(v):.3f}",
                f"{statistics.median(v):.3f}",
                f"{min(v):.3f}",
                f"{max(v):.3f}",
            )
            for m, v in s.confidence_by_model.items()
        ],
    )
    timeline = _table(
        ("from (s after first output)", "outputs", "flagged", "flag rate"),
        [(f"{start:g}", n, f, _pct(f, n)) for start, n, f in s.timeline if n],
    )
    bands = _table(("band", "traces"), s.band_per_trace.items())
    agents = _table(
        ("agent_type", "responses", "blocked", "blocked share"),
        [(k, total, b, _pct(b, total)) for k, (b, total) in s.blocked_by_agent_type.items()],
    )
    image = base64.b64encode(png).decode()
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.7em; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
img {{ max-width: 100%; border: 1px solid #ddd; }}
.meta {{ color: #666; }}
</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p class="meta">source: {html.escape(s.source)}; scored {html.escape(span)}</p>
<section id="summary"><h2>Summary</h2>{overview}{by_type}</section>
<section id="charts"><h2>Charts</h2><img alt="confidence report charts" src="data:image/png;base64,{image}"></section>
<section id="confidence"><h2>Confidence per model</h2>
<p>Logprob confidence of RESPONSE_SCORED; {s.confidence_missing} response(s) had none.</p>{models}</section>
<section id="flag-rate"><h2>Flag rate over time</h2>
<p>Outputs copied to flagged-events per {s.bucket_seconds:g} s of processing time (scored_at).</p>{timeline}</section>
<section id="evidence"><h2>Evidence bands</h2><p>Each trace's latest TRACE_SCORED band.</p>{bands}</section>
<section id="blocked"><h2>Blocked per agent type</h2>
<p>RESPONSE_SCORED whose composite blocked the answer (seed 004 threshold per agent type).</p>{agents}</section>
{_calibration_section(s)}</body></html>
"""


def write_report(
    records: Iterable[object], out_dir: str, source: str = "", title: str = "confidence report"
) -> tuple[str, str]:
    """Summarise, draw and write `report.png` and `report.html` into `out_dir`; return both paths."""
    from streams.report_plot import render_png

    summary = summarize(records, source)
    os.makedirs(out_dir, exist_ok=True)
    png = render_png(summary, title)
    png_path = os.path.join(out_dir, "report.png")
    html_path = os.path.join(out_dir, "report.html")
    with open(png_path, "wb") as handle:
        handle.write(png)
    with open(html_path, "w", encoding="utf-8") as handle:
        handle.write(render_html(summary, png, title))
    return png_path, html_path


def read_source(value: str, bootstrap: str) -> tuple[list[object], str]:
    """`--from`: `-` is stdin, an existing path is a JSON-lines file, anything else a topic name."""
    import asyncio

    if value == "-":
        return load_lines(sys.stdin.buffer), "stdin"
    if os.path.isfile(value):
        with open(value, "rb") as handle:
            return load_lines(handle), f"file {value}"
    return asyncio.run(read_topic(bootstrap, value)), f"topic {value} at {bootstrap}"
