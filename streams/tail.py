"""`confidence-streams tail`: one line per output as it arrives, coloured by its decision, or raw JSON lines.

Colours follow the decision each output carries: RESPONSE_SCORED by `action` (allow green, flag yellow,
reject red), TRACE_SCORED by `band`, SYNTHESIS_SCORED by `level`, CLAIM_SCORED by its interval's lower
bound, CALIBRATION_UPDATED by `alert` (red, else cyan); dead letters are red, and an output that is copied
to flagged-events (DESIGN section 3; a calibration update when it alerts) says so. Colour
is used only when stdout is a terminal (`--color auto`), unless asked for. `--json` writes each record's
value as one JSON line, for `jq` and for `confidence-streams report --from FILE`.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from datetime import datetime
from typing import IO, Literal

import orjson
from aiokafka import AIOKafkaConsumer
from rich.console import Console
from rich.text import Text

from streams.config import load_settings
from streams.kafka_io import Consumed
from streams.stages.common import is_flagged

__all__ = [
    "ColorMode",
    "Source",
    "dead_letter_json",
    "format_dead_letter",
    "format_output",
    "make_console",
    "output_json",
    "run",
    "tail",
]

ColorMode = Literal["auto", "always", "never"]
Source = Literal["scored", "flagged", "dlq"]

ACTION_STYLES = {"allow": "green", "flag": "yellow", "reject": "red"}
BAND_STYLES = {"strong": "green", "adequate": "cyan", "weak": "yellow", "failed": "red"}
LEVEL_STYLES = {"high": "green", "medium": "cyan", "low": "yellow", "very_low": "red"}
# A claim is coloured by its conservative (lower) bound, on the heuristic level edges (DECISIONS.md).
CLAIM_EDGES = ((0.7, "green"), (0.5, "yellow"), (0.0, "red"))
CALIBRATION_STYLES = {True: "red", False: "cyan"}  # by `alert`: ECE at or above CALIBRATION_ECE_ALERT
UNKNOWN_STYLE = "magenta"
DLQ_STYLE = "red"
FLAGGED_STYLE = "bold yellow"
BLOCKED_STYLE = "yellow"


def make_console(color: ColorMode = "auto", file: IO[str] | None = None) -> Console:
    """A console that never wraps a line; colour only on a terminal unless `color` says otherwise."""
    if color == "always":
        return Console(
            file=file, force_terminal=True, color_system="standard", highlight=False, soft_wrap=True
        )
    if color == "never":
        return Console(file=file, color_system=None, highlight=False, soft_wrap=True)
    # "auto": rich colours only when the file is a terminal (and honours NO_COLOR / FORCE_COLOR).
    return Console(file=file, highlight=False, soft_wrap=True)


def _num(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-" if value is None else str(value)
    return f"{value:.3f}"


def _dict(value: object) -> Mapping[str, object]:
    return value if isinstance(value, dict) else {}


def _clock(scored_at: object) -> str:
    """HH:MM:SS.mmm of the processing time, or an empty string when it is missing or unreadable."""
    if not isinstance(scored_at, str):
        return ""
    try:
        return datetime.fromisoformat(scored_at).strftime("%H:%M:%S.%f")[:-3]
    except ValueError:
        return ""


def _claim_style(lower: object) -> str:
    if not isinstance(lower, int | float):
        return UNKNOWN_STYLE
    return next((style for edge, style in CLAIM_EDGES if lower >= edge), UNKNOWN_STYLE)  # below 0: not ours


def format_output(event: Mapping[str, object]) -> Text:
    """One line for one output event (never wrapped); the decision part carries the colour."""
    kind = str(event.get("event_type"))
    parts: list[tuple[str, str]] = []  # (text, style); joined with single spaces
    if kind == "RESPONSE_SCORED":
        comp = _dict(event.get("composite"))
        meta = _dict(event.get("metadata"))
        style = ACTION_STYLES.get(str(event.get("action")), UNKNOWN_STYLE)
        parts += [
            (f"confidence={_num(event.get('confidence'))}", ""),
            (f"action={event.get('action')}", style),
            # A blocked composite (flag COMPOSITE_BLOCKED) stands out even when the action is allow.
            (
                f"composite={_num(comp.get('score'))} {comp.get('level')}",
                BLOCKED_STYLE if comp.get("should_block") else "",
            ),
        ]
        parts.append((f"model={meta.get('model')} agent={meta.get('agent_name')}", ""))
        flags = event.get("flags")
        if isinstance(flags, list) and flags:
            parts.append((f"flags={','.join(str(f) for f in flags)}", ""))
    elif kind == "TRACE_SCORED":
        style = BAND_STYLES.get(str(event.get("band")), UNKNOWN_STYLE)
        parts += [(f"score={_num(event.get('score'))}", ""), (f"band={event.get('band')}", style)]
        if event.get("should_stop"):
            parts.append(("stop", "red"))
        elif event.get("recovery_recommended"):
            parts.append(("recovery", "yellow"))
    elif kind == "CLAIM_SCORED":
        interval = _dict(event.get("interval"))
        factors = _dict(interval.get("factors"))
        style = _claim_style(interval.get("lower"))
        parts += [
            (f"claim={event.get('claim_id')}", ""),
            (f"interval=[{_num(interval.get('lower'))}, {_num(interval.get('upper'))}]", style),
            (f"cause={event.get('cause')}", ""),
        ]
        penalty = factors.get("contradiction_penalty")
        if isinstance(penalty, int | float) and penalty < 1.0:
            parts.append(("contradicted", "red"))
    elif kind == "SYNTHESIS_SCORED":
        style = LEVEL_STYLES.get(str(event.get("level")), UNKNOWN_STYLE)
        sources = event.get("sources")
        conflicts = event.get("conflicts")
        warnings = event.get("warnings")
        parts += [
            (f"overall={_num(event.get('overall_confidence'))}", ""),
            (f"level={event.get('level')}", style),
            (f"sources={len(sources) if isinstance(sources, list) else '-'}", ""),
            (f"conflicts={len(conflicts) if isinstance(conflicts, list) else '-'}", ""),
            (f"warnings={len(warnings) if isinstance(warnings, list) else '-'}", ""),
        ]
    elif kind == "CALIBRATION_UPDATED":
        group = _dict(event.get("group"))
        style = CALIBRATION_STYLES[event.get("alert") is True]
        parts += [
            (f"{group.get('dimension')}={group.get('value')} kind={group.get('kind')}", ""),
            (f"ece={_num(event.get('ece'))} (was {_num(event.get('previous_ece'))})", style),
            (f"brier={_num(event.get('brier'))} samples={event.get('samples')}", ""),
        ]
    else:
        style = UNKNOWN_STYLE
    line = Text()
    clock = _clock(event.get("scored_at"))
    if clock:
        line.append(clock + " ", style="dim")
    line.append(kind, style=f"bold {style}")
    line.append(f" trace={event.get('trace_id')} tenant={event.get('tenant_id')}")
    for text, part_style in parts:
        line.append(" ")
        line.append(text, style=part_style)
    if _flagged(event):
        line.append(" ")
        line.append("[flagged]", style=FLAGGED_STYLE)
    return line


def _flagged(event: Mapping[str, object]) -> bool:
    if event.get("event_type") == "CALIBRATION_UPDATED":
        return event.get("alert") is True  # the calibration stage copies an alert (not is_flagged's rule)
    try:
        return is_flagged(dict(event))
    except (KeyError, AssertionError, TypeError, ValueError):  # an output missing a field the rule reads
        return False


def _headers(record: Consumed) -> dict[str, str]:
    return {k: (v or b"").decode(errors="replace") for k, v in record.headers}  # Kafka allows a null value


def format_dead_letter(record: Consumed) -> Text:
    """One line for one DLQ record: reason, where it came from, the sanitised message."""
    h = _headers(record)
    line = Text()
    line.append("DLQ", style=f"bold {DLQ_STYLE}")
    line.append(" ")
    line.append(f"reason={h.get('__connect.errors.reason', '?')}", style=DLQ_STYLE)
    source = (
        f"{h.get('__connect.errors.topic', '?')}[{h.get('__connect.errors.partition', '?')}]"
        f"@{h.get('__connect.errors.offset', '?')}"
    )
    line.append(f" from={source}")  # the DLQ record's key is the bad record's, often missing
    line.append(f" error={h.get('__connect.errors.exception.message', '')}")
    return line


def output_json(value: bytes) -> bytes:
    """An output value as one JSON line (re-serialised, so a value is never split over two lines)."""
    return orjson.dumps(orjson.loads(value)) + b"\n"


def dead_letter_json(record: Consumed) -> bytes:
    """A DLQ record as one JSON line: its Connect headers and the stored (logprob-free) value as text."""
    return (
        orjson.dumps(
            {
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "key": None if record.key is None else record.key.decode(errors="replace"),
                "headers": _headers(record),
                "value": record.value.decode(errors="replace"),
            }
        )
        + b"\n"
    )


async def tail(
    source: Source = "scored",
    limit: int | None = None,
    as_json: bool = False,
    color: ColorMode = "auto",
) -> int:
    """Follow the scored, flagged or DLQ topic from its end; one line per record."""
    settings = load_settings()
    topic = {"scored": settings.scored_topic, "flagged": settings.flagged_topic, "dlq": settings.dlq_topic}[
        source
    ]
    console = make_console(color)
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=settings.kafka_bootstrap_servers, auto_offset_reset="latest", group_id=None
    )
    seen = 0
    try:
        await consumer.start()  # inside: a start that fails (no broker) still closes the client
        for partition in consumer.assignment():
            await consumer.position(partition)  # resolve "latest" now: every later record is shown
        Console(stderr=True, highlight=False).print(f"following {topic} from its end (Ctrl-C to stop)")
        async for message in consumer:
            record = Consumed.of(message)
            if as_json:
                sys.stdout.buffer.write(dead_letter_json(record) if source == "dlq" else _json_or_raw(record))
                sys.stdout.buffer.flush()
            else:
                console.print(format_dead_letter(record) if source == "dlq" else _line(record))
            seen += 1
            if limit is not None and seen >= limit:
                break
    finally:
        await consumer.stop()
    return 0


def _json_or_raw(record: Consumed) -> bytes:
    try:
        return output_json(record.value)
    except orjson.JSONDecodeError:  # not ours: an output topic only ever holds JSON objects
        return dead_letter_json(record)


def _line(record: Consumed) -> Text:
    try:
        event = orjson.loads(record.value)
    except orjson.JSONDecodeError:
        event = None
    if not isinstance(event, dict):
        return Text(f"{record.topic}[{record.partition}]@{record.offset}: not a JSON object", style="magenta")
    return format_output(event)


def run(source: Source, limit: int | None, as_json: bool, color: ColorMode) -> int:
    """`tail` for the command line: Ctrl-C ends it quietly (130), a closed pipe (`| head`) too (0)."""
    try:
        return asyncio.run(tail(source, limit, as_json, color))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): point stdout at /dev/null so the flush at exit stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
