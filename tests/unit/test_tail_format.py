"""`tail` line format: one line per output, colour by decision, no escape codes off a terminal (unit)."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from streams.events import CalibrationGroup, CalibrationUpdated
from streams.kafka_io import Consumed
from streams.scoring.calibration import ReliabilityBin
from streams.tail import (
    ColorMode,
    dead_letter_json,
    format_dead_letter,
    format_output,
    make_console,
    output_json,
)

ANSI = re.compile(r"\x1b\[[0-9;]*m")
GREEN, YELLOW, RED, CYAN, MAGENTA = "32", "33", "31", "36", "35"


def response(action: str = "allow", blocked: bool = False, **overrides: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "event_type": "RESPONSE_SCORED",
        "event_id": "e1",
        "source_event_id": "in-1",
        "trace_id": "trace-1",
        "tenant_id": "acme",
        "scored_at": "2026-11-22T17:05:05.641692+00:00",
        "confidence": 0.2031,
        "action": action,
        "flags": ["LOW_CONFIDENCE"] if action != "allow" else [],
        "composite": {"score": 0.812, "level": "MODERATE", "should_block": blocked},
        "metadata": {"model": "gpt-4o", "agent_name": "planner-1", "agent_type": "planner"},
    }
    event.update(overrides)
    return event


def trace(band: str, score: float) -> dict[str, Any]:
    return {
        "event_type": "TRACE_SCORED",
        "trace_id": "trace-2",
        "tenant_id": "acme",
        "score": score,
        "band": band,
        "recovery_recommended": score < 0.5,
        "should_stop": score < 0.2,
    }


def claim(lower: float, upper: float, penalty: float = 1.0) -> dict[str, Any]:
    return {
        "event_type": "CLAIM_SCORED",
        "trace_id": "trace-3",
        "tenant_id": "acme",
        "claim_id": "c-1",
        "cause": "self",
        "interval": {"lower": lower, "upper": upper, "factors": {"contradiction_penalty": penalty}},
    }


def synthesis(level: str, conflicts: int = 0) -> dict[str, Any]:
    return {
        "event_type": "SYNTHESIS_SCORED",
        "trace_id": "trace-4",
        "tenant_id": "acme",
        "overall_confidence": 0.6721,
        "level": level,
        "sources": [{}, {}, {}],
        "conflicts": [{}] * conflicts,
        "warnings": ["w"] * conflicts,
    }


def calibration(alert: bool, previous: float | None = 0.151, dimension: str = "model") -> dict[str, Any]:
    """A real CALIBRATION_UPDATED as the calibration stage serialises it."""
    return CalibrationUpdated(
        event_id="cal-1",
        source_event_id="outcome-1",
        trace_id="trace-5",
        tenant_id="acme",
        scored_at=datetime(2026, 11, 22, 17, 5, 6, 2000, tzinfo=UTC),
        group=CalibrationGroup.model_validate(
            {
                "dimension": dimension,
                "value": "gpt-4o" if dimension == "model" else "planner",
                "kind": "response",
            }
        ),
        ece=0.18426 if alert else 0.0412,
        previous_ece=previous,
        brier=0.21208,
        samples=240,
        window_hours=168.0,
        alert=alert,
        bins=[ReliabilityBin(lower=0.9, upper=1.0, count=240, mean_predicted=0.95, observed_rate=0.77)],
    ).model_dump(mode="json")


def render(event: dict[str, Any], color: ColorMode) -> str:
    out = io.StringIO()
    make_console(color, file=out).print(format_output(event))
    return out.getvalue()


def plain(event: dict[str, Any]) -> str:
    return render(event, "never").rstrip("\n")


def codes_of(rendered: str, fragment: str) -> set[str]:
    """The SGR parameters in effect where `fragment` starts (e.g. {"1", "32"} for bold green)."""
    position = ANSI.sub("", rendered).index(fragment)
    active: set[str] = set()
    plain_index = 0
    for piece in re.split(f"({ANSI.pattern})", rendered):
        if ANSI.fullmatch(piece):
            params = piece[2:-1].split(";")
            active = set() if params in (["0"], [""]) else active | set(params)
        else:
            if plain_index + len(piece) > position:
                return active
            plain_index += len(piece)
    raise AssertionError(f"{fragment!r} not in {rendered!r}")


def test_response_line_names_the_decision_and_its_inputs() -> None:
    line = plain(response("flag"))
    assert line == (
        "17:05:05.641 RESPONSE_SCORED trace=trace-1 tenant=acme confidence=0.203 action=flag "
        "composite=0.812 MODERATE model=gpt-4o agent=planner-1 flags=LOW_CONFIDENCE [flagged]"
    )


@pytest.mark.parametrize(("action", "code"), [("allow", GREEN), ("flag", YELLOW), ("reject", RED)])
def test_response_coloured_by_action(action: str, code: str) -> None:
    rendered = render(response(action), "always")
    assert code in codes_of(rendered, f"action={action}")
    assert code in codes_of(rendered, "RESPONSE_SCORED")
    assert codes_of(rendered, "model=") == set()  # the rest of the line stays plain


def test_blocked_composite_is_coloured_and_flagged_even_when_allowed() -> None:
    blocked = response("allow", blocked=True, flags=["COMPOSITE_BLOCKED"])
    assert YELLOW in codes_of(render(blocked, "always"), "composite=0.812 MODERATE")
    assert plain(blocked).endswith("flags=COMPOSITE_BLOCKED [flagged]")
    assert codes_of(render(response("allow"), "always"), "composite=") == set()
    assert "[flagged]" not in plain(response("allow"))


@pytest.mark.parametrize(
    ("band", "score", "code", "flagged", "tag"),
    [
        ("strong", 0.83, GREEN, False, ""),
        ("adequate", 0.65, CYAN, False, ""),
        ("weak", 0.4, YELLOW, True, "recovery"),
        ("failed", 0.1, RED, True, "stop"),
    ],
)
def test_trace_coloured_by_band(band: str, score: float, code: str, flagged: bool, tag: str) -> None:
    event = trace(band, score)
    line = plain(event)
    assert f"TRACE_SCORED trace=trace-2 tenant=acme score={score:.3f} band={band}" in line
    assert code in codes_of(render(event, "always"), f"band={band}")
    assert ("[flagged]" in line) is flagged
    assert line.endswith(f"band={band}" + (f" {tag}" if tag else "") + (" [flagged]" if flagged else ""))


@pytest.mark.parametrize(
    ("lower", "code"), [(0.7, GREEN), (0.69, YELLOW), (0.5, YELLOW), (0.49, RED), (0.0, RED)]
)
def test_claim_coloured_by_lower_bound(lower: float, code: str) -> None:
    event = claim(lower, 0.95)
    interval = f"interval=[{lower:.3f}, 0.950]"
    assert f"claim=c-1 {interval} cause=self" in plain(event)
    assert code in codes_of(render(event, "always"), interval)


def test_contradicted_claim_is_marked_and_flagged() -> None:
    line = plain(claim(0.49, 0.736, penalty=0.92))
    assert line.endswith("cause=self contradicted [flagged]")
    assert RED in codes_of(render(claim(0.49, 0.736, penalty=0.92), "always"), "contradicted")


@pytest.mark.parametrize(
    ("level", "code"), [("high", GREEN), ("medium", CYAN), ("low", YELLOW), ("very_low", RED)]
)
def test_synthesis_coloured_by_level(level: str, code: str) -> None:
    event = synthesis(level)
    assert f"overall=0.672 level={level} sources=3 conflicts=0 warnings=0" in plain(event)
    assert code in codes_of(render(event, "always"), f"level={level}")


def test_synthesis_with_conflicts_is_flagged() -> None:
    assert plain(synthesis("low", conflicts=1)).endswith("conflicts=1 warnings=1 [flagged]")


def test_calibration_line_names_the_group_and_both_errors() -> None:
    assert plain(calibration(alert=True)) == (
        "17:05:06.002 CALIBRATION_UPDATED trace=trace-5 tenant=acme model=gpt-4o kind=response "
        "ece=0.184 (was 0.151) brier=0.212 samples=240 [flagged]"
    )
    # The group's first update has no previous ECE; below the alert threshold it is not copied to flagged.
    assert plain(calibration(alert=False, previous=None, dimension="agent_type")) == (
        "17:05:06.002 CALIBRATION_UPDATED trace=trace-5 tenant=acme agent_type=planner kind=response "
        "ece=0.041 (was -) brier=0.212 samples=240"
    )


@pytest.mark.parametrize(("alert", "code", "ece"), [(True, RED, "0.184"), (False, CYAN, "0.041")])
def test_calibration_coloured_by_alert(alert: bool, code: str, ece: str) -> None:
    rendered = render(calibration(alert), "always")
    assert code in codes_of(rendered, "CALIBRATION_UPDATED")
    assert code in codes_of(rendered, f"ece={ece} (was 0.151)")
    assert codes_of(rendered, "model=gpt-4o") == set()
    assert codes_of(rendered, "brier=") == set()


def test_calibration_with_missing_fields_still_makes_one_line() -> None:
    line = plain({"event_type": "CALIBRATION_UPDATED", "trace_id": "t", "tenant_id": "x"})
    assert (
        line == "CALIBRATION_UPDATED trace=t tenant=x None=None kind=None ece=- (was -) brier=- samples=None"
    )


def test_unknown_event_type_and_missing_fields_still_make_one_line() -> None:
    assert plain({"event_type": "SOMETHING", "trace_id": "t"}) == "SOMETHING trace=t tenant=None"
    line = plain({"event_type": "RESPONSE_SCORED", "trace_id": "t", "tenant_id": "x"})
    assert line.startswith("RESPONSE_SCORED trace=t tenant=x confidence=- action=None")


def test_a_long_line_is_never_wrapped() -> None:
    event = response("flag", flags=[f"FLAG_{i}" for i in range(40)])
    out = io.StringIO()
    make_console("never", file=out).print(format_output(event))
    assert out.getvalue().count("\n") == 1


@pytest.mark.parametrize("color", ["auto", "never"])
def test_no_escape_codes_when_not_a_terminal(color: ColorMode, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    out = io.StringIO()  # not a TTY
    console = make_console(color, file=out)
    events = (
        response("reject"),
        trace("failed", 0.1),
        claim(0.2, 0.3, 0.9),
        synthesis("very_low", 2),
        calibration(alert=True),
    )
    for event in events:
        console.print(format_output(event))
    assert "\x1b" not in out.getvalue()
    assert out.getvalue().count("\n") == 5


def test_always_colours_even_when_not_a_terminal() -> None:
    assert ANSI.search(render(response("allow"), "always"))


def test_output_json_is_one_line_equal_to_the_value() -> None:
    value = orjson.dumps(response("reject", response=None, note="line\nbreak"))
    line = output_json(value)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert orjson.loads(line) == orjson.loads(value)


def dead_letter() -> Consumed:
    headers = (
        ("__connect.errors.topic", b"agent-events"),
        ("__connect.errors.partition", b"2"),
        ("__connect.errors.offset", b"17"),
        ("__connect.errors.exception.class.name", b"JSONDecodeError"),
        ("__connect.errors.exception.message", b"unexpected end of data"),
        ("__connect.errors.reason", b"invalid_json"),
    )
    return Consumed("agent-events-dlq", 0, 3, b"trace-bad", b'{"event_type": "LLM', headers, 0)


def test_dead_letter_line_and_json() -> None:
    out = io.StringIO()
    make_console("always", file=out).print(format_dead_letter(dead_letter()))
    rendered = out.getvalue()
    assert ANSI.sub("", rendered).rstrip("\n") == (
        "DLQ reason=invalid_json from=agent-events[2]@17 error=unexpected end of data"
    )
    assert RED in codes_of(rendered, "reason=invalid_json")
    record = orjson.loads(dead_letter_json(dead_letter()))
    assert record["headers"]["__connect.errors.reason"] == "invalid_json"
    assert record["value"] == '{"event_type": "LLM'
    assert (record["topic"], record["partition"], record["offset"]) == ("agent-events-dlq", 0, 3)


def test_records_of_another_writer_still_make_one_line() -> None:
    """A claim below 0 (no edge matched: StopIteration ended `tail`) and a DLQ header with a null value
    (AttributeError) come from other writers on a shared topic; each still makes its line."""
    assert "interval=[-0.200, 0.950]" in plain(claim(-0.2, 0.95))
    assert MAGENTA in codes_of(render(claim(-0.2, 0.95), "always"), "interval=")
    letter = dead_letter()
    headers = (*letter.headers, ("__connect.errors.stage", None))
    nulled = Consumed(letter.topic, letter.partition, letter.offset, letter.key, letter.value, headers, 0)  # type: ignore[arg-type]
    out = io.StringIO()
    make_console("never", file=out).print(format_dead_letter(nulled))
    assert out.getvalue().startswith("DLQ reason=invalid_json")
