"""Project-level checks: settings validation, schema drift, scoring purity, docker-compose vs the CLI."""

from __future__ import annotations

import ast
import os
import pathlib
import random
import shlex
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone

import pytest
import yaml
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ValidationError

from streams import metrics, schemas
from streams.cli import main
from streams.config import SPAN_MAX_HOURS, Settings, load_settings, scoring_configs
from streams.events import TIMESTAMP_YEARS
from streams.stages import TraceStage
from streams.state import AgentHistory, GroupCalibration, HourCounts, TraceState
from tests.unit.test_history_stage import Responses

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_seed_003_env_names_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONFIDENCE_AGGREGATION", "percentile_90")
    monkeypatch.setenv("CONFIDENCE_ON_LOW", "reject")
    monkeypatch.setenv("CONFIDENCE_MIN_ACCEPTANCE", "0.55")
    settings = Settings()
    assert settings.confidence_enabled is True  # enabled by default in this service
    assert settings.confidence_aggregation == "percentile_90"
    assert settings.confidence_on_low == "reject"
    assert settings.confidence_min_acceptance == 0.55
    assert settings.confidence_precision_decimals == 3


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CONFIDENCE_AGGREGATION", "median"),
        ("CONFIDENCE_ON_LOW", "explode"),
        ("CONFIDENCE_MIN_ACCEPTANCE", "1.5"),
        ("TOPIC_PARTITIONS", "0"),
        ("INPUT_TOPICS", " , "),
        ("LOG_LEVEL", "warning"),  # Faust's slow spinner mode
        ("EVIDENCE_TOOL_CATEGORIES", "find=serch"),  # a typo scored the tool 0, silently
        ("CALIBRATION_WINDOW_HOURS", "0.5"),  # hourly buckets: under 1 counted nothing
        ("HISTORY_RETENTION_HOURS", "12"),  # under the 24 h window: it would silently shorten it
        ("STALENESS_HALF_LIFE_TASK_HOURS", "1e-10"),  # a zero timedelta: stage 3 divided by it (review)
        # Under the default PRODUCER_MAX_BATCH_BYTES (262,144): bundles that large were sent (review).
        ("MAX_RECORD_BYTES", "100000"),
        ("PRODUCER_LINGER_MS", "60000"),  # a batch lingering to SEND_TIMEOUT_SECONDS stopped the worker
        ("KAFKA_BOOTSTRAP_SERVERS", "kafka:9092,"),  # Faust was handed an empty address
        ("KAFKA_BOOTSTRAP_SERVERS", "kafka:9092, ,kafka2:9092"),  # blank between commas: empty too
        ("TABLE_STANDBY_REPLICAS", "17"),
    ],
)
def test_invalid_settings_fail_at_start_up(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as err:
        load_settings()
    assert name.lower() in str(err.value).lower()


FLOAT_SETTINGS = sorted(name for name, field in Settings.model_fields.items() if field.annotation is float)
# Spans of event time: added to or subtracted from event times (years 1900-8999).
SPAN_SETTINGS = sorted(name for name in FLOAT_SETTINGS if name.endswith(("_hours", "_days", "_minutes")))


# Records large enough for a century of hours in an agent's history summary and a calibration group
# (`_summaries_fit_one_record`), so that the span bounds are tested alone.
HUGE_RECORDS = 60_000_000


def _longest(name: str) -> float:
    """SPAN_MAX_HOURS in the span setting's own unit."""
    return SPAN_MAX_HOURS / {"hours": 1, "days": 24, "minutes": 1 / 60}[name.rsplit("_", 1)[1]]


@pytest.mark.parametrize(
    ("name", "per_hour"), [("history_retention_hours", 63), ("calibration_window_hours", 9)]
)
def test_an_hourly_summary_at_its_longest_span_fits_one_record(name: str, per_hour: int) -> None:
    """An agent's history summary lists every hour of HISTORY_RETENTION_HOURS with responses, and a
    calibration group every hour of CALIBRATION_WINDOW_HOURS with outcomes, each in one changelog
    record. The settings review: a retention of 24,100 h made a 1,080,121-byte summary (nothing
    refused), over Kafka's record limit, so the worker would stop on it after every restart. The
    longest span accepted fills a record that still fits; one hour more is refused at start."""
    limit = 1_040_000
    fits = (limit - 4096) // per_hour - 1
    settings = load_settings(max_record_bytes=limit, **{name: fits})
    first = 61_000_000  # epoch hours in the year 8928: the widest hour numbers
    hours = range(first, first + fits + 1)
    if name == "history_retention_hours":
        summary: BaseModel = AgentHistory(
            tenant_id="t",
            agent_name="a",
            agent_type="planner",
            newest=datetime(8928, 1, 1, tzinfo=UTC),
            hours=tuple(HourCounts(hour=h, total=9_999_999, met=9_999_999, chunks=99_999) for h in hours),
        )
    else:
        summary = GroupCalibration(
            tenant_id="t",
            dimension="model",
            value="m",
            kind="response",
            newest=datetime(8928, 1, 1, tzinfo=UTC),
            hours=tuple(hours),
        )
    assert len(summary.model_dump_json()) <= settings.max_record_bytes
    with pytest.raises(ValidationError) as err:
        load_settings(max_record_bytes=limit, **{name: fits + 1})
    assert name.upper() in str(err.value)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "Infinity"])
@pytest.mark.parametrize("name", FLOAT_SETTINGS)
def test_no_float_setting_takes_inf_or_nan(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    """`TRACE_TTL_HOURS=inf` ("never expire") passed `gt=0` and overflowed a datetime on the first
    trace written, stopping the worker on every restart; every float setting refuses it at start."""
    monkeypatch.setenv(name.upper(), value)
    with pytest.raises(ValidationError) as err:
        load_settings()
    assert name in str(err.value)


@pytest.mark.parametrize("name", SPAN_SETTINGS)
def test_event_time_spans_are_bounded_to_a_century(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    longest = _longest(name)
    monkeypatch.setenv("HISTORY_RETENTION_HOURS", str(SPAN_MAX_HOURS))  # at least the history window
    monkeypatch.setenv("MAX_RECORD_BYTES", str(HUGE_RECORDS))  # a century of hours in one summary
    monkeypatch.setenv(name.upper(), str(longest))
    assert getattr(load_settings(), name) == longest
    monkeypatch.setenv(name.upper(), str(longest * 1.01))
    with pytest.raises(ValidationError):
        load_settings()


def test_the_longest_spans_work_on_the_extreme_event_times() -> None:
    """With every span at its longest, a trace's expiry and an agent's retention on events of the years
    1900 and 8999 compute (the worker stopped on `inf`: datetime overflow)."""
    settings = load_settings(
        max_record_bytes=HUGE_RECORDS, **{name: _longest(name) for name in SPAN_SETTINGS}
    )
    most = timedelta(hours=23, minutes=59)  # the largest offset RFC 3339 and datetime both allow
    earliest = datetime(TIMESTAMP_YEARS[0], 1, 1, tzinfo=timezone(most))
    latest = datetime(TIMESTAMP_YEARS[1], 12, 31, 23, 59, 59, tzinfo=timezone(-most))
    for when in (earliest, latest):
        responses = Responses(settings, random.Random(0))
        scored = responses.score("e1", when, good=True)
        assert scored["event_type"] == "RESPONSE_SCORED"
        state = TraceState(tenant_id="t", trace_id="x", partition=0, last_event_time=when)
        stage = TraceStage(settings, scoring_configs(settings), metrics.create(CollectorRegistry()))
        assert stage.sweep_after(b"", state)[1] > when


def test_schemas_are_current() -> None:
    for name, content in schemas.render().items():
        path = ROOT / "schemas" / name
        assert path.exists(), f"{name} missing: run `make schemas`"
        assert path.read_text() == content, f"{name} is stale: run `make schemas`"


def test_scoring_imports_no_kafka_faust_or_network() -> None:
    allowed_roots = {
        "__future__",
        "math",
        "typing",
        "dataclasses",
        "datetime",
        "collections",
        "functools",
        "itertools",
        "re",
        "unicodedata",
        "pydantic",
        "streams",
        "enum",
        "bisect",
        "heapq",
        "statistics",
        "operator",
        "abc",
        "types",
        "string",
    }
    for path in (ROOT / "streams" / "scoring").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
                if node.module.startswith("streams") and not node.module.startswith("streams.scoring"):
                    raise AssertionError(f"{path.name} imports {node.module}")
            for name in names:
                assert name.split(".")[0] in allowed_roots, f"{path.name} imports {name}"


def _cli_command(command: list[str]) -> list[str]:
    """The command a service runs, with `sh -c "... exec confidence-streams ..."` unwrapped."""
    if command[:2] == ["sh", "-c"] and "exec " in command[2]:
        return shlex.split(command[2].split("exec ", 1)[1])
    return command


def test_docker_compose_runs_only_existing_cli_commands() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert services["kafka"]["image"].startswith("apache/kafka")
    commands = [_cli_command(s["command"]) for s in services.values() if isinstance(s.get("command"), list)]
    cli_commands = [c for c in commands if c and c[0] == "confidence-streams"]
    assert len(cli_commands) >= 2
    for command in cli_commands:
        # `--help` after the command proves argparse knows it, without running it.
        with pytest.raises(SystemExit) as exit_:
            main([*command[1:], "--help"]) if command[1] != "worker" else main(["--help"])
        assert exit_.value.code == 0
    assert any(c[1] == "worker" for c in cli_commands)
    assert any(c[1:3] == ["topics", "create"] for c in cli_commands)


def test_docker_compose_worker_health_uses_readyz_and_restarts_on_failure() -> None:
    worker = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["worker"]
    assert "/readyz" in " ".join(worker["healthcheck"]["test"])
    assert worker["restart"] == "on-failure"  # exit 70 after a failed batch: a restart re-reads it


def test_each_compose_replica_advertises_its_own_address_for_view_routing() -> None:
    """Faust routes a view to the URL its owner advertises (`WEB_HOST`); replicas sharing one value
    (it was 0.0.0.0) each answered every view themselves, missing the keys the other owned."""
    worker = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["worker"]
    assert worker["deploy"]["replicas"] > 1
    assert "WEB_HOST" not in worker.get("environment", {})  # one value would be every replica's
    assert worker["command"][:2] == ["sh", "-c"]
    assert "WEB_HOST=$$(hostname -i) exec confidence-streams worker" in worker["command"][2]


def test_web_host_defaults_to_this_machine_as_faust_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WEB_HOST", raising=False)
    from streams.app import create_app

    settings = load_settings()
    assert settings.web_host == socket.gethostname()
    assert create_app(settings).app.conf.canonical_url.host == socket.gethostname().lower()


def test_log_level_is_case_insensitive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOG_LEVEL", "INFO")
    assert load_settings().log_level == "info"


def test_a_configuration_mistake_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CONFIDENCE_ON_LOW", "explode")
    assert main(["topics", "describe"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("confidence-streams: CONFIDENCE_ON_LOW: ") and len(err.splitlines()) == 1
    assert "Traceback" not in err


def test_a_bad_topics_create_flag_is_named_as_the_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Refused before any broker is asked, and named as the user gave it: not TOPIC_PARTITIONS.
    assert main(["topics", "create", "--partitions", "0", "--input-retention-ms", "5"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[1].strip() for line in lines] == ["--partitions", "--input-retention-ms"], lines
    monkeypatch.setenv("TOPIC_PARTITIONS", "0")  # the variable itself is still named as the variable
    assert main(["topics", "create"]) == 2
    assert capsys.readouterr().err.startswith("confidence-streams: TOPIC_PARTITIONS: ")


def test_the_worker_takes_no_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["worker", "--web-port", "7000"])  # it used to be dropped silently
    assert exit_.value.code == 2
    assert "unrecognized arguments: --web-port 7000" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["tail", "--limit", "0"], "argument --limit: must be at least 1, not 0"),
        (["tail", "--limit", "-3"], "argument --limit: must be at least 1, not -3"),
        (["tail", "--limit", "ten"], "argument --limit: 'ten' is not a whole number"),
        (["demo", "--timeout", "0"], "argument --timeout: must be a positive number of seconds, not 0"),
        (["demo", "--timeout", "nan"], "argument --timeout: must be a positive number of seconds, not nan"),
        (["demo", "--timeout", "inf"], "argument --timeout: must be a positive number of seconds, not inf"),
    ],
)
def test_counts_and_timeouts_on_the_command_line_are_refused_when_meaningless(
    argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tail --limit 0` printed one record; `demo --timeout 0` gave up before the worker started."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert complaint in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["topics", "describe"], ["topics", "create"], ["tail", "--limit", "1"], ["report", "--from", "t"]],
)
def test_a_broker_out_of_reach_is_one_line_naming_its_address(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """These commands printed aiokafka's traceback; now one line, as for a configuration mistake."""
    with socket.socket() as unused:  # a port nothing listens on: bound, never listening
        unused.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{unused.getsockname()[1]}"
        monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", address)
        assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"confidence-streams: cannot reach Kafka at {address}: " in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "spec",
    [
        "garbage",
        "send:score-events",
        "send:score-events:0",
        "send::1",
        "boom:x:1",
        # Specs that could never fire (at-least-once review): they injected nothing, silently.
        "sweep:score-events:1",
        "send:expiry:1",
        "send:score-event:1",
    ],
)
def test_a_malformed_fault_injection_is_one_line_at_start_up(
    spec: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It raised from inside the app's construction, with a traceback (or, at batch 0, never fired)."""
    monkeypatch.setenv("FAULT_INJECTION", spec)
    assert main(["topics", "describe"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("confidence-streams: FAULT_INJECTION: ") and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "inputs",
    [
        "agent-events,scored-events",
        "flagged-events",
        "agent-events-dlq",
        "confidence-streams-claims-by-tenant",
    ],
)
def test_an_input_topic_the_worker_writes_is_refused(inputs: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Reading its own outputs (or dead letters) back as input would loop; it was accepted."""
    with pytest.raises(ValidationError, match="INPUT_TOPICS names a topic the worker writes"):
        load_settings(input_topics=inputs)
    assert load_settings(input_topics="agent-events,more-agent-events").input_topic_names == (
        "agent-events",
        "more-agent-events",
    )


@pytest.mark.parametrize("tier", ["ephemeral", "task", "project", "persistent"])
def test_every_staleness_half_life_is_at_least_a_microsecond(tier: str) -> None:
    """Mutation review: the validator covers the four tiers, not only the one test_invalid_settings uses."""
    with pytest.raises(ValueError, match="at least one microsecond"):
        load_settings(**{f"staleness_half_life_{tier}_hours": 1e-10})


def test_demo_names_a_setting_mistake_before_starting_a_broker(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo read the settings only once its broker was up: a mistyped variable started (and
    stopped) the embedded broker, or waited for Docker, before the one-line error and exit 2."""
    import streams.demo_runner

    def no_broker(*_: object, **__: object) -> int:
        raise AssertionError("the demo started before its settings were checked")

    monkeypatch.setattr(streams.demo_runner, "run_demo", no_broker)
    monkeypatch.setenv("TRACE_TTL_HOURS", "soon")
    assert main(["demo"]) == 2
    assert "TRACE_TTL_HOURS" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "value", "field", "ours"),
    [
        ("PRODUCER_MAX_BATCH_SIZE", "5000000", "producer_max_batch_size", 262_144),  # a broker refuses it
        ("CONSUMER_AUTO_OFFSET_RESET", "latest", "consumer_auto_offset_reset", "earliest"),  # skips input
        ("TABLE_CLEANUP_INTERVAL", "0.5", "table_cleanup_interval", 60.0),  # SWEEP_INTERVAL_SECONDS
        ("BROKER_SESSION_TIMEOUT", "0.5", "broker_session_timeout", 10.0),  # below the heartbeat
        ("RECOVERY_CONSISTENCY_CHECK", "n", "recovery_consistency_check", False),  # Faust: TypeError
    ],
)
def test_faust_reads_no_environment_variable_of_its_own(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, field: str, ours: object
) -> None:
    """Review (thirtieth round): Faust read its own variables over the app's arguments, past this
    module's validation (`RECOVERY_CONSISTENCY_CHECK=n` passed it, then Faust raised a TypeError)."""
    from streams.app import create_app

    monkeypatch.setenv(name, value)
    assert getattr(create_app(load_settings()).app.conf, field) == ours


def test_faust_settings_a_deployment_changes_are_settings_here(monkeypatch: pytest.MonkeyPatch) -> None:
    from streams.app import create_app

    monkeypatch.setenv("WEB_BIND", "127.0.0.2")
    monkeypatch.setenv("TABLE_STANDBY_REPLICAS", "0")
    conf = create_app(load_settings()).app.conf
    assert (conf.web_bind, conf.table_standby_replicas) == ("127.0.0.2", 0)
    monkeypatch.setenv("TABLE_STANDBY_REPLICAS", "-1")
    with pytest.raises(ValidationError, match="table_standby_replicas"):
        load_settings()


def test_an_empty_broker_address_is_the_default_as_the_harness_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", " ")
    assert load_settings().kafka_bootstrap_servers == "localhost:9092"


def test_a_batch_as_large_as_the_largest_record_is_accepted() -> None:
    """Review (thirtieth round, mutations): only a batch limit above MAX_RECORD_BYTES was tested; one
    equal to it fits every broker that takes MAX_RECORD_BYTES."""
    settings = load_settings(max_record_bytes=100_000, producer_max_batch_bytes=100_000)
    assert settings.producer_max_batch_bytes == settings.max_record_bytes


def test_faust_settings_now_read_here_keep_faust_defaults() -> None:
    """Review (thirtieth round, mutations): with Faust's own environment reading off, WEB_BIND and
    TABLE_STANDBY_REPLICAS default here. Faust's defaults stay: every interface (a worker bound to
    loopback is out of its peers' and the container health check's reach) and one standby."""
    from streams.app import create_app

    conf = create_app(load_settings()).app.conf
    assert (conf.web_bind, conf.table_standby_replicas) == ("0.0.0.0", 1)


def test_faust_import_time_variables_do_not_move_the_web_server() -> None:
    """README review (thirtieth round): `env={}` stops Faust's settings lookup, but Faust also reads
    FAUST_*/F_* variables when imported, as defaults: FAUST_WEB_TRANSPORT moved the web server (health,
    metrics, views) to a unix socket. Run in a fresh interpreter, as they are read at import."""
    code = (
        "from streams.app import create_app; from streams.config import load_settings; "
        "print(create_app(load_settings()).app.conf.web_transport)"
    )
    env = {**os.environ, "FAUST_WEB_TRANSPORT": "unix:///tmp/not-here.sock"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "tcp:"


def test_fault_injection_names_the_agents_the_worker_registers() -> None:
    """The agent names FAULT_INJECTION accepts are the ones streams/agents.py registers."""
    import re
    from pathlib import Path

    from streams.faults import AGENTS

    source = (Path(__file__).parents[2] / "streams/agents.py").read_text()
    assert tuple(re.findall(r'@app\.agent\([^)]*name="([^"]+)"\)', source)) == AGENTS
