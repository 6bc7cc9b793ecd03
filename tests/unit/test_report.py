"""`confidence-streams report` from a JSON-lines file: the summary, the PNG and the HTML (unit)."""

from __future__ import annotations

import base64
import re
import struct
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from streams.cli import main
from streams.report import bucket_width, load_lines, render_html, summarize, write_report

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def response(
    seconds: float,
    confidence: float | None,
    action: str = "allow",
    model: str = "gpt-4o",
    agent_type: str = "planner",
    blocked: bool = False,
) -> dict[str, Any]:
    return {
        "event_type": "RESPONSE_SCORED",
        "trace_id": f"r-{seconds}",
        "tenant_id": "acme",
        "scored_at": at(seconds),
        "confidence": confidence,
        "action": action,
        "composite": {"score": 0.5, "should_block": blocked},
        "metadata": {"model": model, "agent_type": agent_type},
    }


def trace(seconds: float, trace_id: str, band: str) -> dict[str, Any]:
    return {
        "event_type": "TRACE_SCORED",
        "trace_id": trace_id,
        "tenant_id": "acme",
        "scored_at": at(seconds),
        "band": band,
    }


def claim(seconds: float, penalty: float) -> dict[str, Any]:
    return {
        "event_type": "CLAIM_SCORED",
        "trace_id": "c",
        "tenant_id": "acme",
        "scored_at": at(seconds),
        "interval": {"lower": 0.5, "upper": 0.8, "factors": {"contradiction_penalty": penalty}},
    }


def synthesis(seconds: float, warnings: list[str]) -> dict[str, Any]:
    return {
        "event_type": "SYNTHESIS_SCORED",
        "trace_id": "s",
        "tenant_id": "acme",
        "scored_at": at(seconds),
        "overall_confidence": 0.6,
        "level": "low",
        "warnings": warnings,
        "conflicts": [],
    }


def calibration_updated(
    seconds: float,
    ece: float,
    previous: float | None,
    tenant: str = "acme",
    dimension: str = "model",
    value: str = "gpt-4o",
    kind: str = "response",
) -> dict[str, Any]:
    return {
        "event_type": "CALIBRATION_UPDATED",
        "event_id": f"cal-{seconds}",
        "source_event_id": f"outcome-{seconds}",
        "trace_id": f"o-{seconds}",
        "tenant_id": tenant,
        "scored_at": at(seconds),
        "group": {"dimension": dimension, "value": value, "kind": kind},
        "ece": ece,
        "previous_ece": previous,
        "brier": 0.19,
        "samples": 240,
        "window_hours": 168.0,
        "alert": ece >= 0.1,
        "bins": [],
    }


def run_outputs() -> list[dict[str, Any]]:
    """12 outputs over 50 s; flagged: 2 flag/reject, 1 blocked, 1 weak band, 1 contradicted, 1 warning."""
    return [
        response(0, 0.95, model="gpt-4o"),
        response(1, 0.91, model="gpt-4o", agent_type="patcher"),
        response(2, 0.30, action="flag", model="claude", agent_type="patcher"),
        response(12, 0.10, action="reject", model="claude", agent_type="clerk"),
        response(13, None, model="claude", agent_type="clerk", blocked=True),  # allowed but blocked
        trace(20, "t-1", "weak"),  # t-1 ends strong: only its latest band counts
        trace(21, "t-1", "strong"),
        trace(22, "t-2", "adequate"),
        trace(23, "t-3", "failed"),
        claim(40, 1.0),
        claim(41, 0.92),
        synthesis(50, ["1 conflicts detected between sources. Review carefully."]),
    ]


def test_summary_counts() -> None:
    later_type = {"event_type": "SOMETHING_NEWER", "scored_at": at(30)}  # counted, not charted
    s = summarize([*run_outputs(), later_type, {"not": "an output"}, {"event_type": 3}, None, [1, 2]], "test")
    assert s.outputs == 13 and s.skipped == 4
    assert s.by_type == {
        "CLAIM_SCORED": 2,
        "RESPONSE_SCORED": 5,
        "SOMETHING_NEWER": 1,
        "SYNTHESIS_SCORED": 1,
        "TRACE_SCORED": 4,
    }
    # flag, reject, blocked, weak (the t-1 output that said so), failed, contradicted claim, warning
    assert s.flagged == 7
    assert s.actions == {"allow": 3, "flag": 1, "reject": 1}
    assert s.blocked == 1
    assert s.confidence_by_model == {"claude": [0.30, 0.10], "gpt-4o": [0.95, 0.91]}
    assert s.confidence_missing == 1
    assert s.band_per_trace == {"strong": 1, "adequate": 1, "weak": 0, "failed": 1}
    assert s.blocked_by_agent_type == {"clerk": (1, 2), "patcher": (0, 2), "planner": (0, 1)}
    assert (s.first, s.last) == (T0, T0 + timedelta(seconds=50))


def test_outputs_of_another_shape_are_counted_not_fatal() -> None:
    """`metadata` as a string, `composite` as a list (AttributeError) and a `scored_at` without a zone
    beside zoned ones (TypeError comparing them) ended the report."""
    odd = [
        {"event_type": "RESPONSE_SCORED", "metadata": "m", "composite": [1], "scored_at": at(1)},
        {"event_type": "TRACE_SCORED", "scored_at": "2026-11-22T10:00:05"},  # no zone: not on the timeline
    ]
    s = summarize([*run_outputs(), *odd], "test")
    assert s.outputs == 14 and s.by_type["RESPONSE_SCORED"] == 6
    assert (s.first, s.last) == (T0, T0 + timedelta(seconds=50))


def test_timeline_buckets_cover_the_run() -> None:
    s = summarize(run_outputs(), "test")
    assert s.bucket_seconds == 2  # 50 s in at most 30 buckets
    assert len(s.timeline) == 26
    assert sum(n for _, n, _ in s.timeline) == 12 and sum(f for _, _, f in s.timeline) == s.flagged
    assert s.timeline[0] == (0, 2, 0)  # 0 s and 1 s: two allowed responses
    assert s.timeline[1] == (2, 1, 1)  # 2 s: the flagged one
    assert s.timeline[-1] == (50, 1, 1)  # the synthesis with a warning


@pytest.mark.parametrize(
    ("span", "width"),
    [
        (0.0, 0.01),
        (0.07, 0.01),
        (0.3, 0.02),
        (50, 2),
        (59, 2),
        (60, 5),
        (3600, 300),
        (86_400, 3600),
        (604_800 * 29.9, 604_800),
        (1e9, 1e9 / 29),  # past the widest nice width: an even cut, MAX_BUCKETS long
    ],
)
def test_bucket_width(span: float, width: float) -> None:
    assert bucket_width(span) == width


def test_outputs_dated_centuries_apart_still_give_a_short_timeline(tmp_path: Path) -> None:
    """Two outputs 8,000 years apart (another writer's, or a corrupt clock) made 418,986 buckets with
    the 7-day width, and drawing them ran for minutes."""
    outputs = [
        {"event_type": "TRACE_SCORED", "band": "weak", "scored_at": "1970-01-01T00:00:00+00:00"},
        {"event_type": "TRACE_SCORED", "band": "weak", "scored_at": "9999-12-31T23:59:59+00:00"},
    ]
    summary = summarize(outputs, "x")
    assert len(summary.timeline) <= 30  # MAX_BUCKETS
    assert sum(outputs for _, outputs, _ in summary.timeline) == 2


@pytest.mark.parametrize(
    ("model", "agent_type", "title"),
    [("price$\\notacommand$", "planner", "t"), ("gpt-4o", "$\\notacommand$", "t"), ("m", "planner", "$x^$")],
)
def test_free_text_with_dollar_signs_is_drawn_as_text(
    model: str, agent_type: str, title: str, tmp_path: Path
) -> None:
    """Model names, agent types and the title reached matplotlib as math text: a "$" pair around a
    backslash word raised "Unknown symbol" and no report was written."""
    outputs = [response(0, 0.9, model=model, agent_type=agent_type, blocked=True)]
    png, _ = write_report(outputs, str(tmp_path), source="x", title=title)
    assert Path(png).read_bytes().startswith(PNG_SIGNATURE)


def test_empty_input_still_renders(tmp_path: Path) -> None:
    png, html = write_report([], str(tmp_path), source="nothing")
    assert Path(png).read_bytes().startswith(PNG_SIGNATURE)
    assert "<td>0</td>" in Path(html).read_text()


def test_load_lines_skips_blank_and_keeps_bad_lines_as_none() -> None:
    assert load_lines([b'{"a": 1}\n', b"\n", b"   \n", b"not json\n", '{"b": 2}']) == [
        {"a": 1},
        None,
        {"b": 2},
    ]


def png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(PNG_SIGNATURE) and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_report_command_from_a_json_lines_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = tmp_path / "outputs.jsonl"
    lines.write_bytes(b"".join(orjson.dumps(o) + b"\n" for o in run_outputs()))
    out = tmp_path / "out"
    assert main(["report", "--from", str(lines), "--out", str(out), "--title", "unit run"]) == 0
    assert "12 records from file" in capsys.readouterr().out

    png = (out / "report.png").read_bytes()
    assert png_size(png) == (1200, 800)
    assert len(png) > 30_000  # four charts with text, not an empty canvas
    html = (out / "report.html").read_text()
    for section in ("summary", "charts", "confidence", "flag-rate", "evidence", "blocked"):
        assert f'<section id="{section}">' in html
    embedded = re.search(r'src="data:image/png;base64,([^"]+)"', html)
    assert embedded is not None and base64.b64decode(embedded.group(1)) == png
    assert "<title>unit run</title>" in html and f"file {lines}" in html
    # overview: outputs, flagged (share), allow, flag, reject, blocked, calibration updates, alerts, skipped
    assert (
        "<tr><td>12</td><td>7 (58.3 %)</td><td>3</td><td>1</td><td>1</td><td>1</td>"
        "<td>0</td><td>0</td><td>0</td></tr>" in html
    )
    assert '<section id="calibration">' not in html  # no CALIBRATION_UPDATED in this run
    assert (
        "<tr><td>claude</td><td>2</td><td>0.200</td><td>0.200</td><td>0.100</td><td>0.300</td></tr>" in html
    )
    assert "<tr><td>strong</td><td>1</td></tr>" in html and "<tr><td>weak</td><td>0</td></tr>" in html
    assert "<tr><td>clerk</td><td>2</td><td>1</td><td>50.0 %</td></tr>" in html
    assert "per 2 s of processing time" in html and "1 response(s) had none" in html


def calibration_run() -> list[dict[str, Any]]:
    """Three groups; acme's gpt-4o group updated twice, its later update (45 s, an alert) read first."""
    return [
        calibration_updated(45, 0.12, 0.05),
        calibration_updated(30, 0.05, None),
        calibration_updated(31, 0.031, None, dimension="agent_type", value="planner", kind="composite"),
        calibration_updated(40, 0.2, 0.17, tenant="globex"),
        {"event_type": "CALIBRATION_UPDATED", "tenant_id": "acme"},  # counted, no group to show
    ]


def test_calibration_updates_are_counted_and_the_last_ece_per_group_kept() -> None:
    s = summarize([*run_outputs(), *calibration_run()], "test")
    assert s.by_type["CALIBRATION_UPDATED"] == s.calibration_updates == 5
    assert s.calibration_alerts == 2
    assert s.flagged == 7 + 2  # an alert is copied to flagged-events
    assert [(c.tenant, c.dimension, c.value, c.kind) for c in s.calibration_last] == [
        ("acme", "agent_type", "planner", "composite"),
        ("acme", "model", "gpt-4o", "response"),
        ("globex", "model", "gpt-4o", "response"),
    ]
    acme = s.calibration_last[1]
    assert (acme.ece, acme.previous_ece, acme.alert, acme.scored_at) == (
        0.12,
        0.05,
        True,
        T0 + timedelta(seconds=45),
    )


def test_calibration_table_in_the_html(tmp_path: Path) -> None:
    _, html_path = write_report([*run_outputs(), *calibration_run()], str(tmp_path), source="test")
    html = Path(html_path).read_text()
    assert "<td>1</td><td>5</td><td>2</td><td>0</td></tr>" in html  # blocked, updates, alerts, skipped
    section = html[html.index('<section id="calibration">') :]
    assert "5 update(s), 2 with an alert" in section
    assert (
        "<tr><td>acme</td><td>model=gpt-4o</td><td>response</td><td>0.120</td><td>0.050</td><td>0.190</td>"
        f"<td>240</td><td>yes</td><td>{at(45)}</td></tr>"
    ) in section
    assert (
        "<tr><td>acme</td><td>agent_type=planner</td><td>composite</td><td>0.031</td><td>-</td><td>0.190</td>"
        f"<td>240</td><td>no</td><td>{at(31)}</td></tr>"
    ) in section
    assert "<td>globex</td><td>model=gpt-4o</td><td>response</td><td>0.200</td>" in section
    assert section.count("<tr><td>") == 3  # one row per group: acme's earlier update is not shown


def test_html_escapes_values() -> None:
    s = summarize([response(0, 0.5, model="<script>x</script>")], "a & b")
    page = render_html(s, b"png", "t<1>")
    assert "<script>x" not in page and "&lt;script&gt;x" in page
    assert "a &amp; b" in page and "<title>t&lt;1&gt;</title>" in page


def test_missing_file_is_read_as_a_topic_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import streams.report as report

    asked: list[tuple[str, str]] = []

    async def fake_read_topic(bootstrap: str, topic: str, timeout: float = 60.0) -> list[object]:
        asked.append((bootstrap, topic))
        return []

    monkeypatch.setattr(report, "read_topic", fake_read_topic)
    records, source = report.read_source(str(tmp_path / "scored-events"), "broker:9092")
    assert asked == [("broker:9092", str(tmp_path / "scored-events"))] and records == []
    assert source == f"topic {tmp_path / 'scored-events'} at broker:9092"


def test_without_the_report_extra_the_command_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "streams.report_plot", None)  # as if matplotlib were not installed
    lines = tmp_path / "outputs.jsonl"
    lines.write_bytes(orjson.dumps(response(0, 0.9)) + b"\n")
    assert main(["report", "--from", str(lines), "--out", str(tmp_path / "out")]) == 2
    assert "pip install 'confidence-streams[report]'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
