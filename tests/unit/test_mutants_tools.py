"""Mutation review of the terminal tools: tail, report, report_plot, cli, progress (unit, offline).

Each test kills a mutant the existing tests let through and asserts what README "In the terminal" (or
the module's documented contract) promises; expected values are worked out by hand.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import orjson
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from rich.console import Console

import streams.report as report_module
import streams.report_plot as report_plot
import streams.tail as tail_module
from streams.cli import main
from streams.kafka_io import Consumed
from streams.progress import StepProgress
from streams.tail import dead_letter_json, format_output
from tests.unit.conftest import Clock

# ---------------------------------------------------------------- tail: the line of one output


def test_a_claim_without_a_contradiction_is_not_marked_contradicted() -> None:
    """`contradicted` marks a claim lowered by a contradiction: a penalty of 1.0 lowers nothing."""
    event = {
        "event_type": "CLAIM_SCORED",
        "trace_id": "t",
        "tenant_id": "acme",
        "claim_id": "c-1",
        "cause": "self",
        "interval": {"lower": 0.8, "upper": 0.9, "factors": {"contradiction_penalty": 1.0}},
    }
    assert "contradicted" not in format_output(event).plain
    event["interval"]["factors"]["contradiction_penalty"] = 0.75  # type: ignore[index]
    assert format_output(event).plain.endswith(" contradicted [flagged]")


def test_synthesis_line_counts_conflicts_and_warnings_each_from_its_own_list() -> None:
    event = {
        "event_type": "SYNTHESIS_SCORED",
        "trace_id": "t",
        "tenant_id": "acme",
        "overall_confidence": 0.5,
        "level": "low",
        "sources": [{}, {}, {}, {}],
        "conflicts": [{}, {}],
        "warnings": ["w"],
    }
    assert "sources=4 conflicts=2 warnings=1" in format_output(event).plain


def test_a_dead_letter_without_a_key_has_a_null_key_in_json() -> None:
    """README Topics: a DLQ record keeps the bad record's own key, none if it had none."""
    record = Consumed("agent-events-dlq", 0, 7, None, b"{", (), 0)
    assert orjson.loads(dead_letter_json(record))["key"] is None
    keyed = Consumed("agent-events-dlq", 0, 8, b"trace-1", b"{", (), 0)
    assert orjson.loads(dead_letter_json(keyed))["key"] == "trace-1"


# ---------------------------------------------------------------- tail: following a topic (fake consumer)


@dataclass
class Message:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp: int = 0


class FakeConsumer:
    """Stands in for AIOKafkaConsumer: records how it was made, yields the messages it is given."""

    made: ClassVar[list[FakeConsumer]] = []
    messages: ClassVar[list[Message]] = []

    def __init__(self, *topics: str, **options: Any) -> None:
        self.topics = topics
        self.options = options
        self.stopped = False
        FakeConsumer.made.append(self)

    async def start(self) -> None:
        return None

    def assignment(self) -> set[object]:
        return set()

    async def position(self, partition: object) -> int:
        return 0

    async def stop(self) -> None:
        self.stopped = True

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        for message in FakeConsumer.messages:
            yield message


def response(trace: str) -> bytes:
    return orjson.dumps(
        {
            "event_type": "RESPONSE_SCORED",
            "trace_id": trace,
            "tenant_id": "acme",
            "confidence": 0.9,
            "action": "allow",
            "flags": [],
            "composite": {"score": 0.8, "level": "MODERATE", "should_block": False},
            "metadata": {"model": "m", "agent_name": "a", "agent_type": "planner"},
        }
    )


@pytest.fixture
def fake_kafka(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeConsumer]]:
    for name in ("SCORED_TOPIC", "FLAGGED_TOPIC", "DLQ_TOPIC", "KAFKA_BOOTSTRAP_SERVERS"):
        monkeypatch.delenv(name, raising=False)
    FakeConsumer.made = []
    FakeConsumer.messages = [Message("t", 0, i, b"k", response(f"trace-{i}")) for i in range(5)]
    monkeypatch.setattr(tail_module, "AIOKafkaConsumer", FakeConsumer)
    yield FakeConsumer


@pytest.mark.parametrize(
    ("source", "topic"),
    [("scored", "scored-events"), ("flagged", "flagged-events"), ("dlq", "agent-events-dlq")],
)
def test_tail_follows_the_topic_of_its_source_from_its_end(
    fake_kafka: type[FakeConsumer], source: tail_module.Source, topic: str
) -> None:
    """README: `tail` follows scored-events from its end; --flagged flagged-events; --dlq the DLQ."""
    assert tail_module.run(source, limit=1, as_json=False, color="never") == 0
    (consumer,) = fake_kafka.made
    assert consumer.topics == (topic,)
    assert consumer.options["auto_offset_reset"] == "latest"
    assert consumer.options["group_id"] is None  # never joins (or commits for) a group
    assert consumer.stopped


def test_tail_stops_after_exactly_limit_records(
    fake_kafka: type[FakeConsumer], capsys: pytest.CaptureFixture[str]
) -> None:
    assert tail_module.run("scored", limit=3, as_json=False, color="never") == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["trace=trace-0", "trace=trace-1", "trace=trace-2"]


def test_tail_dlq_json_writes_the_connect_headers_and_the_value_as_text(
    fake_kafka: type[FakeConsumer], capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """README: with --dlq, --json writes an object with the Connect error headers and the value as text."""
    headers = [("__connect.errors.reason", b"invalid_json"), ("__connect.errors.offset", b"30")]
    stored = b'{"event_type": "LLM_RESPONSE", "trace_id": 7}'  # JSON, but not a valid event
    fake_kafka.messages = [Message("agent-events-dlq", 1, 4, None, stored, headers)]
    assert tail_module.run("dlq", limit=1, as_json=True, color="never") == 0
    (line,) = capsysbinary.readouterr().out.splitlines()
    assert orjson.loads(line) == {
        "topic": "agent-events-dlq",
        "partition": 1,
        "offset": 4,
        "key": None,
        "headers": {"__connect.errors.reason": "invalid_json", "__connect.errors.offset": "30"},
        "value": '{"event_type": "LLM_RESPONSE", "trace_id": 7}',
    }


def test_tail_json_writes_each_value_as_one_line(
    fake_kafka: type[FakeConsumer], capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    assert tail_module.run("scored", limit=2, as_json=True, color="never") == 0
    lines = capsysbinary.readouterr().out.splitlines()
    assert [orjson.loads(line)["trace_id"] for line in lines] == ["trace-0", "trace-1"]


def test_ctrl_c_ends_tail_with_status_130_and_a_closed_pipe_with_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shell's convention for SIGINT is 128 + 2; `tail | head` closing the pipe is not an error."""

    async def interrupted(*_: object) -> int:
        raise KeyboardInterrupt

    async def pipe_closed(*_: object) -> int:
        raise BrokenPipeError

    redirected: list[int] = []
    monkeypatch.setattr(os, "dup2", lambda fd, fd2: redirected.append(fd2))
    monkeypatch.setattr(tail_module, "tail", interrupted)
    assert tail_module.run("scored", None, False, "never") == 130
    monkeypatch.setattr(tail_module, "tail", pipe_closed)
    assert tail_module.run("scored", None, False, "never") == 0
    assert len(redirected) == 1  # stdout pointed at /dev/null so the flush at exit stays quiet


# ---------------------------------------------------------------- progress


def test_plain_progress_by_default_prints_a_counted_step_at_most_once_a_second(clock: Clock) -> None:
    """The demo makes StepProgress(console): a log must not get a line per event."""
    out = io.StringIO()
    with StepProgress(Console(file=out, width=200)) as p:
        p.begin("sent", "events sent", total=5)
        for n in range(1, 6):
            clock.now += 0.3
            p.update("sent", n)
        p.finish("sent")
    # begin at 100.0; updates at 100.3 .. 101.5: only the one at 101.2 (>= 1 s after begin) prints
    assert out.getvalue().splitlines() == [
        "progress: events sent 0/5",
        "progress: events sent 4/5",
        "progress: events sent 5/5 (1.5s)",
    ]


def test_a_finished_uncounted_step_is_ticked_on_a_terminal() -> None:
    out = io.StringIO()
    with StepProgress(Console(file=out, force_terminal=True, width=100)) as p:
        p.begin("worker", "starting the worker")
        p.finish("worker", "worker ready")
        assert p.live is not None
        (task,) = p.live.tasks
        assert task.finished and task.completed == task.total == 1
    assert "✓" in out.getvalue()


def test_a_counted_step_moves_its_bar_while_running_and_stops_when_finished_short() -> None:
    out = io.StringIO()
    with StepProgress(Console(file=out, force_terminal=True, width=100)) as p:
        p.begin("received", "outputs received", total=33)
        p.update("received", 30)
        assert p.live is not None
        (task,) = p.live.tasks
        assert task.completed == 30  # before finish: the bar follows the count
        p.finish("received")  # timed out at 30/33: not finished, but no longer running
        assert not task.finished and task.stop_time is not None
    assert "30/33" in out.getvalue()


# ---------------------------------------------------------------- report: the summary and the page

T0 = "2026-11-22T10:00:{:02d}+00:00"


def calibration_update(second: int | None, ece: float) -> dict[str, Any]:
    return {
        "event_type": "CALIBRATION_UPDATED",
        "tenant_id": "acme",
        "group": {"dimension": "model", "value": "gpt-4o", "kind": "response"},
        "ece": ece,
        "previous_ece": None,
        "brier": 0.2,
        "samples": 10,
        "alert": False,
        **({} if second is None else {"scored_at": T0.format(second)}),
    }


def test_a_calibration_update_without_scored_at_then_one_with_it_keeps_the_later() -> None:
    """Without a readable scored_at the later record wins (it used to compare a time with None)."""
    s = report_module.summarize([calibration_update(None, 0.3), calibration_update(5, 0.1)], "t")
    (last,) = s.calibration_last
    assert last.ece == 0.1


def test_one_trace_id_in_two_tenants_is_two_traces_in_the_band_chart() -> None:
    """Traces are per (tenant, trace) (README, de-duplication): acme's t-1 and globex's t-1 differ."""
    outputs = [
        {"event_type": "TRACE_SCORED", "tenant_id": "acme", "trace_id": "t-1", "band": "strong"},
        {"event_type": "TRACE_SCORED", "tenant_id": "globex", "trace_id": "t-1", "band": "failed"},
    ]
    s = report_module.summarize(outputs, "t")
    assert s.band_per_trace == {"strong": 1, "adequate": 0, "weak": 0, "failed": 1}


def scored(action: str, second: int, blocked: bool = False) -> dict[str, Any]:
    return {
        "event_type": "RESPONSE_SCORED",
        "tenant_id": "acme",
        "trace_id": f"r-{second}",
        "scored_at": T0.format(second),
        "confidence": 0.5,
        "action": action,
        "composite": {"score": 0.5, "should_block": blocked},
        "metadata": {"model": "m", "agent_type": "planner"},
    }


def test_the_summary_table_gives_allow_flag_and_reject_in_their_columns() -> None:
    outputs = [scored("allow", 0), scored("flag", 1), scored("flag", 2), scored("reject", 3)]
    page = report_module.render_html(report_module.summarize(outputs, "t"), b"png", "t")
    header = "<th>allow</th><th>flag</th><th>reject</th>"
    assert header in page
    # 4 outputs, 3 flagged (75.0 %), allow 1, flag 2, reject 1
    assert "<tr><td>4</td><td>3 (75.0 %)</td><td>1</td><td>2</td><td>1</td>" in page


def test_from_dash_reads_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    """README: `--from` takes a file, `-` for stdin, or else a topic name."""

    def no_topic(*_: object) -> list[object]:
        raise AssertionError("`-` was read as a topic name")

    stdin = io.TextIOWrapper(io.BytesIO(b'{"event_type": "TRACE_SCORED"}\n\nnot json\n'))
    monkeypatch.setattr(sys, "stdin", stdin)
    monkeypatch.setattr(report_module, "read_topic", no_topic)
    assert report_module.read_source("-", "localhost:9092") == (
        [{"event_type": "TRACE_SCORED"}, None],
        "stdin",
    )


# ---------------------------------------------------------------- report_plot: what the charts show


def charts_of(outputs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> Figure:
    """Render the report's PNG and keep the figure it drew."""
    drawn: list[Figure] = []
    save = Figure.savefig

    def keep(self: Figure, *args: Any, **kwargs: Any) -> None:
        drawn.append(self)
        save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    report_plot.render_png(report_module.summarize(outputs, "src"), "run")
    (figure,) = drawn
    return figure


def axes_titled(figure: Figure, prefix: str) -> Axes:
    (ax,) = [ax for ax in figure.axes if ax.get_title().startswith(prefix)]
    return ax


def plot_run() -> list[dict[str, Any]]:
    """5 responses in 0-4 s: 2 of 3 planners blocked, 0 of 2 clerks; flagged: 2 blocked + 1 reject."""
    outputs = [
        scored("allow", 0, blocked=True),
        scored("allow", 1, blocked=True),
        scored("allow", 2),
        scored("reject", 3),
        scored("allow", 4),
    ]
    for o in outputs[3:]:
        o["metadata"] = {"model": "m", "agent_type": "clerk"}
    outputs[4]["confidence"] = None
    bands = [("t-1", "strong"), ("t-2", "weak"), ("t-3", "weak"), ("t-4", "failed"), ("t-5", "failed")]
    bands += [("t-6", "failed")]
    outputs += [
        {"event_type": "TRACE_SCORED", "tenant_id": "acme", "trace_id": t, "band": b} for t, b in bands
    ]
    return outputs


def test_the_image_title_counts_outputs_flagged_and_blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    figure = charts_of(plot_run(), monkeypatch)
    # flagged: 2 blocked responses, 1 reject and 5 weak or failed bands
    assert figure.get_suptitle() == "run: 11 outputs, 8 flagged, 2 blocked  (src)"
    titles = [ax.get_title() for ax in figure.axes]
    assert any(t.startswith("Blocked responses per agent type") for t in titles)  # the fourth chart


def test_the_blocked_chart_shows_blocked_of_responses_per_agent_type(monkeypatch: pytest.MonkeyPatch) -> None:
    ax = axes_titled(charts_of(plot_run(), monkeypatch), "Blocked responses")
    assert [t.get_text() for t in ax.texts] == ["0/2", "2/3"]  # clerk, planner (sorted)
    responses, blocked = ax.containers
    assert [bar.get_height() for bar in responses] == [2, 3]
    assert [bar.get_height() for bar in blocked] == [0, 2]


def test_the_band_chart_counts_each_band_under_its_own_name(monkeypatch: pytest.MonkeyPatch) -> None:
    ax = axes_titled(charts_of(plot_run(), monkeypatch), "Evidence band")
    (bars,) = ax.containers
    assert [bar.get_height() for bar in bars] == [1, 0, 2, 3]  # strong, adequate, weak, failed
    assert [t.get_text() for t in ax.get_xticklabels()] == ["strong", "adequate", "weak", "failed"]


def test_the_flag_rate_chart_draws_percentages(monkeypatch: pytest.MonkeyPatch) -> None:
    ax = axes_titled(charts_of(plot_run(), monkeypatch), "Flag rate")
    rate_line, overall = ax.lines
    # responses one a second from 0 s (0.2 s buckets): blocked, blocked, allowed, rejected, allowed;
    # the TRACE_SCORED outputs have no scored_at and are not on the timeline
    rates = [
        float(y) for y in np.asarray(rate_line.get_ydata()) if y == y
    ]  # NaN for the empty buckets in between
    assert rates == [100.0, 100.0, 0.0, 100.0, 0.0]
    flagged = 2 + 1 + 5  # blocked, reject, weak and failed bands
    assert [float(y) for y in np.asarray(overall.get_ydata())] == [100 * flagged / 11] * 2
    assert overall.get_label() == f"flagged % overall ({100 * flagged / 11:.0f} % of 11)"


def test_the_confidence_legend_names_each_model_count_and_the_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ax = axes_titled(charts_of(plot_run(), monkeypatch), "Logprob confidence")
    legend = ax.get_legend()
    assert legend is not None
    assert legend.get_title().get_text() == "model; 1 without confidence"
    assert [t.get_text() for t in legend.get_texts()] == ["m (n=4)"]


# ---------------------------------------------------------------- cli: arguments and exit statuses


@pytest.fixture
def tail_args(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What `confidence-streams tail ...` hands to streams.tail.run (no broker)."""
    calls: list[dict[str, Any]] = []

    def fake_run(source: str, limit: int | None, as_json: bool, color: str) -> int:
        calls.append({"source": source, "limit": limit, "as_json": as_json, "color": color})
        return 0

    monkeypatch.setattr(tail_module, "run", fake_run)
    return calls


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], {"source": "scored", "limit": None, "as_json": False, "color": "auto"}),
        (["--flagged"], {"source": "flagged", "limit": None, "as_json": False, "color": "auto"}),
        (
            ["--dlq", "--json", "--limit", "3"],
            {"source": "dlq", "limit": 3, "as_json": True, "color": "auto"},
        ),
        (["--color", "never"], {"source": "scored", "limit": None, "as_json": False, "color": "never"}),
    ],
)
def test_tail_arguments(argv: list[str], expected: dict[str, Any], tail_args: list[dict[str, Any]]) -> None:
    """README: scored-events by default, --flagged / --dlq, --limit N, --json; --color auto by default."""
    assert main(["tail", *argv]) == 0
    assert tail_args == [expected]


def test_tail_refuses_flagged_and_dlq_together(
    tail_args: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["tail", "--flagged", "--dlq"])
    assert exit_.value.code == 2 and tail_args == []
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.fixture
def written(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """`report` reads nothing and draws nothing: (out_dir, source, title) of each write."""
    calls: list[tuple[str, str, str]] = []

    def fake_write(records: object, out_dir: str, source: str = "", title: str = "") -> tuple[str, str]:
        calls.append((out_dir, source, title))
        return f"{out_dir}/report.png", f"{out_dir}/report.html"

    monkeypatch.setattr(report_module, "read_source", lambda value, bootstrap: ([{}, None], f"topic {value}"))
    monkeypatch.setattr(report_module, "write_report", fake_write)
    return calls


def test_report_defaults_and_what_it_prints(
    written: list[tuple[str, str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """README: default DIR is `confidence-report`."""
    assert main(["report", "--from", "scored-events"]) == 0
    assert written == [("confidence-report", "topic scored-events", "confidence report")]
    assert capsys.readouterr().out == (
        "report: confidence-report/report.html and confidence-report/report.png "
        "(2 records from topic scored-events)\n"
    )


@pytest.mark.parametrize("problem", [LookupError("topic nope does not exist"), TimeoutError("nope: slow")])
def test_report_of_a_missing_or_unfinished_topic_exits_1(
    problem: Exception, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(value: str, bootstrap: str) -> tuple[list[object], str]:
        raise problem

    monkeypatch.setattr(report_module, "read_source", fail)
    assert main(["report", "--from", "nope"]) == 1
    assert capsys.readouterr().err == f"confidence-streams report: {problem}\n"


def test_demo_refuses_report_without_the_extra_but_runs_without_report(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import streams.demo_runner
    import streams.harness

    ran: list[str | None] = []

    def fake_demo(timeout: float, report_dir: str | None) -> int:
        ran.append(report_dir)
        return 0

    monkeypatch.setattr(streams.demo_runner, "run_demo", fake_demo)
    monkeypatch.setattr(streams.harness, "stop_on_sigterm", lambda: None)
    monkeypatch.setitem(sys.modules, "streams.report_plot", None)  # as if matplotlib were not installed
    assert main(["demo", "--report", "out"]) == 2
    assert "pip install 'confidence-streams[report]'" in capsys.readouterr().err
    assert ran == []
    assert main(["demo"]) == 0
    assert ran == [None]


@pytest.mark.parametrize("command", [["worker"], ["topics", "create"]])
def test_a_topic_problem_exits_2_with_one_line(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """README Topics: the worker refuses to start, exit status 2 with one line; `topics create` the same."""
    import streams.app
    import streams.topics

    async def mismatch(*_: object) -> list[str]:
        raise streams.topics.TopicProblem("agent-events has 3 partitions, TOPIC_PARTITIONS is 4")

    monkeypatch.setattr(streams.topics, "ensure_topics", mismatch)
    monkeypatch.setattr(streams.app, "create_app", lambda settings: object())
    monkeypatch.setattr(streams.app, "changelog_topics", lambda app: [])
    monkeypatch.setattr(sys, "argv", ["confidence-streams"])
    assert main(command) == 2
    name = " ".join(command)
    assert capsys.readouterr().err == (
        f"confidence-streams {name}: agent-events has 3 partitions, TOPIC_PARTITIONS is 4\n"
    )


@pytest.mark.parametrize(("fatal", "status"), [(RuntimeError("batch failed"), 70), (None, 0)])
def test_the_worker_exits_70_after_a_failed_batch_and_as_faust_does_otherwise(
    fatal: Exception | None, status: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README Configuration: a failed batch ends in exit 70; a clean stop keeps Faust's own status."""
    import streams.agents
    import streams.app
    import streams.lag
    import streams.topics
    import streams.views

    class Health:
        def __init__(self) -> None:
            self.fatal = fatal

    class Service:
        app = object()
        health = Health()

    class Worker:
        def __init__(self, app: object, **options: object) -> None:
            self.shutdown_timeout_seconds = 0.0

        def execute_from_commandline(self) -> None:
            raise SystemExit(0)  # Faust's worker ends the process when it stops

    async def topics_fine(*_: object) -> list[str]:
        return []

    monkeypatch.setattr(streams.topics, "ensure_topics", topics_fine)
    monkeypatch.setattr(streams.app, "create_app", lambda settings: Service())
    monkeypatch.setattr(streams.app, "changelog_topics", lambda svc: [])
    monkeypatch.setattr(streams.app, "DeadlinedWorker", Worker)
    monkeypatch.setattr(streams.agents, "attach_agents", lambda svc: {})
    monkeypatch.setattr(streams.views, "attach_views", lambda svc, facts: None)
    monkeypatch.setattr(streams.lag, "attach_lag_monitor", lambda svc: None)
    monkeypatch.setattr(sys, "argv", ["confidence-streams"])
    if fatal is None:
        with pytest.raises(SystemExit) as exit_:
            main(["worker"])
        assert exit_.value.code == status
    else:
        assert main(["worker"]) == status


@pytest.mark.parametrize("as_json", [True, False])
def test_topics_describe_prints_json_only_with_json(
    as_json: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import streams.app
    import streams.describe

    async def no_states(*_: object) -> list[object]:
        return []

    monkeypatch.setattr(streams.describe, "describe_topics", no_states)
    monkeypatch.setattr(streams.describe, "to_json", lambda states, group, bootstrap: {"topics": []})
    monkeypatch.setattr(streams.describe, "table_of", lambda states, group: "the table")
    monkeypatch.setattr(streams.app, "create_app", lambda settings: object())
    monkeypatch.setattr(streams.app, "changelog_topics", lambda app: [])
    assert main(["topics", "describe", *(["--json"] if as_json else [])]) == 0
    out = capsys.readouterr().out
    assert out == ('{\n  "topics": []\n}\n' if as_json else "the table\n")
