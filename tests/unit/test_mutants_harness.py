"""Mutation review of the broker harness, the demo traffic and `confidence-streams demo` (offline).

No broker is started here: the Docker probe, the environment, process starts and the Kafka I/O are
replaced, as tests/unit/test_harness.py does. Expected values come from DESIGN section 7 and the
README ("Brokers", the `demo` progress lines, "Bad input").
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest
from aiokafka.errors import KafkaConnectionError

import streams.demo_runner as demo_runner
from streams import harness
from streams.decode import decode
from streams.demo import DemoTraffic, demo_traffic, encode
from streams.dlq import DeadLetter
from streams.harness import RunningBroker
from streams.kafka_io import Consumed

# --- the broker order (DESIGN section 7) ------------------------------------------------------------


@contextlib.contextmanager
def _fake(kind: harness.BrokerKind, calls: list[str]) -> Iterator[RunningBroker]:
    calls.append(kind)
    yield RunningBroker(kind, f"{kind}:1")


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """Which broker the harness started; no `.env` in reach, no address in the environment."""
    calls: list[str] = []
    monkeypatch.chdir(tmp_path)
    for name in ("KAFKA_BOOTSTRAP_SERVERS", "kafka_bootstrap_servers"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(harness, "_docker_kafka", lambda: _fake("apache-kafka", calls))
    monkeypatch.setattr(harness, "_tansu", lambda: _fake("tansu", calls))
    monkeypatch.setattr(harness, "wait_for_kafka", lambda servers, timeout=60.0, started=None: None)
    return calls


def _docker(monkeypatch: pytest.MonkeyPatch, answers: bool) -> None:
    monkeypatch.setattr(harness, "docker_available", lambda timeout=3.0: answers)


def test_a_configured_address_wins_over_docker(monkeypatch: pytest.MonkeyPatch, started: list[str]) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "cluster:9092")
    _docker(monkeypatch, True)
    with harness.broker() as running:
        assert running == RunningBroker("external", "cluster:9092")
    assert started == []


def test_a_configured_address_is_read_as_the_worker_reads_it(
    monkeypatch: pytest.MonkeyPatch, started: list[str], tmp_path: Path
) -> None:
    """README "Brokers": the environment, else `.env`, names in any case."""
    _docker(monkeypatch, True)
    (tmp_path / ".env").write_text("kafka_bootstrap_servers=from-dotenv:9092\n")
    with harness.broker() as running:
        assert running == RunningBroker("external", "from-dotenv:9092")
    assert started == []


def test_a_configured_address_is_waited_for_and_used_as_it_is(
    monkeypatch: pytest.MonkeyPatch, started: list[str]
) -> None:
    waited: list[str] = []
    monkeypatch.setattr(
        harness, "wait_for_kafka", lambda servers, timeout=60.0, started=None: waited.append(servers)
    )
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", " a:1,b:2 ")
    _docker(monkeypatch, False)
    with harness.broker() as running:
        assert running.kind == "external" and running.bootstrap_servers == "a:1,b:2"
    assert waited == ["a:1,b:2"]


def test_an_unreachable_configured_address_is_a_connection_error(
    monkeypatch: pytest.MonkeyPatch, started: list[str]
) -> None:
    def never(servers: str, timeout: float = 60.0, started: object = None) -> None:
        raise TimeoutError(f"Kafka at {servers} did not answer within {timeout:.0f}s")

    monkeypatch.setattr(harness, "wait_for_kafka", never)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    with pytest.raises(KafkaConnectionError, match="within 60s"), harness.broker():
        pass
    assert started == []


def test_docker_comes_before_the_embedded_broker(monkeypatch: pytest.MonkeyPatch, started: list[str]) -> None:
    _docker(monkeypatch, True)
    with harness.broker() as running:
        assert running.kind == "apache-kafka"
    assert started == ["apache-kafka"]


@pytest.mark.parametrize(
    ("docker", "testcontainers", "why"),
    [(False, True, "no Docker engine answers"), (True, False, "testcontainers is not installed")],
)
def test_the_embedded_broker_is_the_last_resort_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
    started: list[str],
    caplog: pytest.LogCaptureFixture,
    docker: bool,
    testcontainers: bool,
    why: str,
) -> None:
    _docker(monkeypatch, docker)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (
            (real_find_spec(name, *a) if testcontainers else None)
            if name == "testcontainers"
            else real_find_spec(name, *a)
        ),
    )
    with caplog.at_level(logging.INFO, logger="streams.harness"), harness.broker() as running:
        assert running.kind == "tansu"
    assert started == ["tansu"]
    assert f"broker: {why}; starting the embedded Tansu broker" in caplog.messages


# --- the Docker probe -------------------------------------------------------------------------------


def _docker_cli(
    monkeypatch: pytest.MonkeyPatch, outcome: subprocess.CompletedProcess[bytes] | BaseException
) -> list[list[str]]:
    calls: list[list[str]] = []

    def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
        calls.append(argv)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/docker")
    monkeypatch.setattr(subprocess, "run", run)
    return calls


def test_docker_answers_only_with_a_server_version(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _docker_cli(monkeypatch, subprocess.CompletedProcess([], 0, b"27.1.0\n", b""))
    assert harness.docker_available() is True
    assert calls == [["docker", "info", "--format", "{{.ServerVersion}}"]]


@pytest.mark.parametrize(
    "outcome",
    [
        subprocess.CompletedProcess([], 1, b"27.1.0\n", b"Cannot connect to the Docker daemon"),
        subprocess.CompletedProcess([], 0, b"  \n", b""),
        subprocess.TimeoutExpired(["docker"], 3.0),
        OSError("permission denied"),
    ],
)
def test_a_docker_cli_without_an_engine_is_no_docker(
    monkeypatch: pytest.MonkeyPatch, outcome: subprocess.CompletedProcess[bytes] | BaseException
) -> None:
    _docker_cli(monkeypatch, outcome)
    assert harness.docker_available() is False


def test_no_docker_cli_is_no_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("docker was run"))
    assert harness.docker_available() is False


# --- the Docker path (apache/kafka, KRaft, one node) -------------------------------------------------


def test_the_docker_broker_is_apache_kafka_in_kraft_mode_on_the_advertised_host_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import testcontainers.core.container as tc

    seen: dict[str, Any] = {"env": {}}

    class Container:
        def __init__(self, image: str) -> None:
            seen["image"] = image

        def with_bind_ports(self, container: int, host: int) -> Container:
            seen["ports"] = (container, host)
            return self

        def with_env(self, name: str, value: str) -> Container:
            seen["env"][name] = value
            return self

        def __enter__(self) -> Container:
            seen["entered"] = True
            return self

        def __exit__(self, *_: object) -> None:
            seen["exited"] = True

    waits: list[tuple[str, float]] = []
    monkeypatch.setattr(tc, "DockerContainer", Container)
    monkeypatch.setattr(harness, "free_port", lambda: 23456)
    monkeypatch.setattr(
        harness,
        "wait_for_kafka",
        lambda servers, timeout=60.0, started=None: waits.append((servers, timeout)),
    )
    with harness._docker_kafka() as running:
        assert running == RunningBroker("apache-kafka", "localhost:23456")
        assert "exited" not in seen
    assert seen["exited"]
    assert seen["image"].startswith("apache/kafka:") and seen["ports"] == (9092, 23456)
    assert seen["env"] == harness.kraft_environment("localhost:23456")
    assert waits == [("localhost:23456", 120)]


def test_the_kraft_settings_are_one_combined_node_advertising_the_given_address() -> None:
    env = harness.kraft_environment("localhost:9")
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://localhost:9"
    assert env["KAFKA_LISTENERS"] == "PLAINTEXT://:9092,CONTROLLER://:9093"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@localhost:9093"
    assert env["KAFKA_NODE_ID"] == "1"
    for name in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        assert env[name] == "1"  # one node: a factor above it cannot be met


# --- the embedded path --------------------------------------------------------------------------------


class _Process:
    """A stand-in for the Tansu process: records how it is stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.terminated = False

    def poll(self) -> int | None:
        return self.returncode

    def terminate(self) -> None:
        self.terminated = True
        self.returncode = -15

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode or 0

    def kill(self) -> None:
        self.returncode = -9


@pytest.fixture
def tansu_parts(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """`_tansu` with the binary, the process start, the probe and the listener check replaced."""
    parts: dict[str, Any] = {"processes": [], "ports": iter(range(21000, 21010)), "probe": [], "listens": []}
    monkeypatch.setattr(harness, "tansu_binary", lambda: "/bin/tansu")
    monkeypatch.setattr(harness, "free_port", lambda: next(parts["ports"]))

    def start(binary: str, port: int, logfile: object) -> _Process:
        process = _Process(1000 + port)
        parts["processes"].append(process)
        return process

    def wait(servers: str, timeout: float = 60.0, started: object = None) -> None:
        outcome = parts["probe"].pop(0) if parts["probe"] else None
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(harness, "_start_tansu", start)
    monkeypatch.setattr(harness, "wait_for_kafka", wait)
    monkeypatch.setattr(
        harness, "_listens", lambda pid, port: parts["listens"].pop(0) if parts["listens"] else True
    )
    return parts


def test_the_embedded_broker_is_tansu_on_loopback_and_is_stopped(tansu_parts: dict[str, Any]) -> None:
    processes: list[_Process] = tansu_parts["processes"]
    with harness._tansu() as running:
        assert running.kind == "tansu" and running.is_tansu
        assert running.bootstrap_servers == "127.0.0.1:21000"
        assert len(processes) == 1 and running.process is processes[0]  # type: ignore[comparison-overlap]
        assert not processes[0].terminated
    assert processes[0].terminated


def test_a_tansu_that_exits_is_started_again_on_another_port(tansu_parts: dict[str, Any]) -> None:
    tansu_parts["probe"] = [RuntimeError("the broker exited with status 1 before it answered")]
    with harness._tansu() as running:
        assert running.bootstrap_servers == "127.0.0.1:21001"
        first, second = tansu_parts["processes"]
        assert first.terminated and not second.terminated


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the listener check is Linux's")
def test_a_tansu_that_does_not_hold_its_port_is_not_used(tansu_parts: dict[str, Any]) -> None:
    tansu_parts["listens"] = [False, True]
    with harness._tansu() as running:
        assert running.bootstrap_servers == "127.0.0.1:21001"
        assert tansu_parts["processes"][0].terminated


def test_tansu_is_tried_three_times_then_named_with_its_log(tansu_parts: dict[str, Any]) -> None:
    tansu_parts["probe"] = [RuntimeError("exited")] * 4
    refused = pytest.raises(
        RuntimeError, match=r"127\.0\.0\.1:21002: exited \(3 attempts\); its log: .*tansu-"
    )
    with refused, harness._tansu():
        pass
    assert len(tansu_parts["processes"]) == harness.TANSU_START_ATTEMPTS == 3
    assert all(p.terminated for p in tansu_parts["processes"])


def test_a_tansu_that_times_out_is_not_started_again(tansu_parts: dict[str, Any]) -> None:
    tansu_parts["probe"] = [TimeoutError("Kafka at x did not answer within 60s")]
    with pytest.raises(TimeoutError, match=r"embedded Tansu: .*its log: "), harness._tansu():
        pass
    assert len(tansu_parts["processes"]) == 1 and tansu_parts["processes"][0].terminated


def test_the_tansu_log_is_kept_only_when_something_failed(
    tansu_parts: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with harness._tansu():
        pass
    assert list(tmp_path.glob("tansu-*.log")) == []
    with pytest.raises(ValueError), harness._tansu():
        raise ValueError("a test failed")
    assert len(list(tmp_path.glob("tansu-*.log"))) == 1


def test_tansu_is_started_in_memory_on_the_port_it_advertises(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def popen(argv: list[str], **kwargs: Any) -> str:
        seen.update(argv=argv, **kwargs)
        return "started"

    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.delenv("TANSU_RUST_LOG", raising=False)
    assert harness._start_tansu("/bin/tansu", 21234, io.BytesIO()) == "started"  # type: ignore[comparison-overlap]
    url = "tcp://127.0.0.1:21234"
    assert seen["argv"] == [
        "/bin/tansu",
        "broker",
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--storage-engine",
        "memory://tansu/",
    ]
    assert seen["env"]["RUST_LOG"] == "warn" and seen["preexec_fn"] is not None


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc")
def test_the_listener_check_finds_this_process_s_own_listening_socket() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert harness._listens(os.getpid(), port)
        assert not harness._listens(os.getpid(), port + 1 if port < 65535 else port - 1)
    with socket.socket() as bound_only:  # bound, not listening: no broker there
        bound_only.bind(("127.0.0.1", 0))
        assert not harness._listens(os.getpid(), bound_only.getsockname()[1])
    # A connection from the port (state ESTABLISHED) is not a listener on it.
    with socket.socket() as listener, socket.socket() as client:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        client.bind(("127.0.0.1", 0))
        client.connect(listener.getsockname())
        with listener.accept()[0]:
            assert not harness._listens(os.getpid(), client.getsockname()[1])


def test_only_tansu_gets_the_consistency_check_turned_off() -> None:
    assert RunningBroker("tansu", "x:1").worker_settings == {"RECOVERY_CONSISTENCY_CHECK": "false"}
    assert RunningBroker("apache-kafka", "x:1").worker_settings == {}
    assert RunningBroker("external", "x:1").worker_settings == {}
    assert not RunningBroker("external", "x:1").is_tansu


# --- the demo traffic (README: 49 events, 27 scored inputs, 18 OUTCOMEs, 4 bad records) ---------------


def _decoded(traffic: DemoTraffic) -> list[object]:
    return [decode(raw, 1_000_000, 10_000) for _, raw in traffic.records]


def test_the_demo_traffic_is_what_the_readme_counts() -> None:
    traffic = demo_traffic()
    decoded = _decoded(traffic)
    good = [d for d in decoded if not isinstance(d, DeadLetter)]
    kinds = Counter(getattr(d, "event_type", None) for d in good)
    assert len(traffic.records) == 49
    assert kinds == {"LLM_RESPONSE": 16, "TOOL_INVOCATION": 8, "CLAIM": 3, "OUTCOME": 18}
    assert traffic.bad == len(decoded) - len(good) == 4
    assert (traffic.responses, traffic.tools, traffic.claims, traffic.syntheses) == (16, 8, 3, 1)
    assert sum(traffic.response_outcomes.values()) == 16  # "outcomes joined 16/16"
    assert traffic.response_outcomes == {"acme": 10, "globex": 6}


def test_every_bad_record_is_a_different_kind_of_bad_input() -> None:
    letters = [d for d in _decoded(demo_traffic()) if isinstance(d, DeadLetter)]
    assert sorted(letter.reason for letter in letters) == [
        "invalid_json",
        "missing_field",
        "unknown_event_type",
        "unsupported_schema_version",
    ]


def test_every_valid_demo_event_is_keyed_by_its_trace() -> None:
    """A valid event keyed otherwise is dead-lettered `wrong_key` (README "Bad input")."""
    traffic = demo_traffic()
    for (key, _), event in zip(traffic.records, _decoded(traffic), strict=True):
        if not isinstance(event, DeadLetter):
            assert key == str(getattr(event, "trace_id", "")).encode()


def test_the_demo_has_low_confidence_responses_sub_calls_a_synthesis_and_verdicts_of_each_kind() -> None:
    events = [orjson.loads(raw) for _, raw in demo_traffic().records[:-4]]
    responses = [e for e in events if e["event_type"] == "LLM_RESPONSE"]
    means = [
        sum(v for v in e["token_logprobs"] if v is not None)
        / len([v for v in e["token_logprobs"] if v is not None])
        for e in responses
    ]
    assert any(m < -1.0 for m in means) and any(m > -0.2 for m in means)
    assert all(e["token_logprobs"].count(None) == 1 for e in responses)  # a dropped logprob each
    assert Counter(e.get("role") for e in responses) == {None: 12, "sub_call": 3, "synthesis": 1}
    assert {e["tenant_id"] for e in events} == {"acme", "globex"}
    # The README's `tail` example: trace-globex-1-2 at confidence 0.200 (flagged), trace-acme-2-0 at 0.949.
    mean_of = {e["trace_id"]: m for e, m in zip(responses, means, strict=True) if "role" not in e}
    assert mean_of["trace-globex-1-2"] < -1.0 < -0.2 < mean_of["trace-acme-2-0"]
    assert sum(1 for m in mean_of.values() if m < -1.0) == 4  # a third of the 12 top-level responses
    outcomes = [e for e in events if e["event_type"] == "OUTCOME"]
    response_ids = {e["event_id"] for e in responses}
    assert sum(1 for o in outcomes if o.get("subject_event_id") in response_ids) == 16
    assert [o.get("claim_id") for o in outcomes if "subject_event_id" not in o] == [None, "c-nil-2"]
    assert {o["correct"] for o in outcomes} == {True, False}
    claims = {e["claim_id"]: e for e in events if e["event_type"] == "CLAIM"}
    assert {r["type"] for c in claims.values() for r in c["relationships"]} == {"contradicts", "supports"}


def test_the_demo_traffic_is_the_same_for_a_seed() -> None:
    assert demo_traffic(7) == demo_traffic(7)
    assert demo_traffic(7).records != demo_traffic(8).records


def test_non_finite_logprobs_are_written_as_the_literals_the_decoder_takes() -> None:
    event = {"a": 1, "token_logprobs": [math.nan, math.inf, -math.inf, None, -0.5]}
    assert encode(event) == b'{"a":1,"token_logprobs":[NaN,Infinity,-Infinity,null,-0.5]}'
    assert encode({"a": 1, "token_logprobs": [None, -0.5]}) == b'{"a":1,"token_logprobs":[null,-0.5]}'


# --- `confidence-streams demo`: what it waits for and its exit status --------------------------------


def test_the_demo_waits_for_29_scores_and_4_dead_letters() -> None:
    expected = demo_runner.expected_outputs(demo_traffic())
    assert expected == {
        "RESPONSE_SCORED": 16,
        "TRACE_SCORED": 8,
        "SYNTHESIS_SCORED": 1,
        "CLAIM_SCORED": 4,
        "DLQ": 4,
    }
    assert sum(expected.values()) == 33


def test_received_counts_dead_letters_and_only_the_scored_topic() -> None:
    expected = Counter({"RESPONSE_SCORED": 1, "DLQ": 2})

    def rec(topic: str, kind: str | None = None) -> Consumed:
        return Consumed(topic, 0, 0, None, orjson.dumps({"event_type": kind} if kind else {}), (), 0)

    assert demo_runner.received_of([rec("dlq"), rec("dlq")], expected, "scored", "dlq") == 2
    assert demo_runner.received_of([rec("flagged", "RESPONSE_SCORED")], expected, "scored", "dlq") == 0
    assert demo_runner.received_of([rec("scored", "TRACE_SCORED")], expected, "scored", "dlq") == 0


def test_the_worker_environment_names_private_topics_and_short_group_timeouts() -> None:
    env = demo_runner.worker_env(RunningBroker("tansu", "b:1"), "-s", "/d", 7000, EXTRA="1", DATA_DIR="/o")
    assert env["KAFKA_BOOTSTRAP_SERVERS"] == "b:1"
    assert (env["APP_ID"], env["INPUT_TOPICS"], env["SCORED_TOPIC"]) == (
        "confidence-streams-s",
        "agent-events-s",
        "scored-events-s",
    )
    assert (env["FLAGGED_TOPIC"], env["DLQ_TOPIC"]) == ("flagged-events-s", "agent-events-dlq-s")
    assert (env["WEB_PORT"], env["WEB_HOST"]) == ("7000", "127.0.0.1")
    assert env["BROKER_SESSION_TIMEOUT_SECONDS"] == "6"
    assert env["BROKER_HEARTBEAT_INTERVAL_SECONDS"] == "0.5"
    assert env["BROKER_REBALANCE_TIMEOUT_SECONDS"] == "4"
    assert env["RECOVERY_CONSISTENCY_CHECK"] == "false"
    assert (env["EXTRA"], env["DATA_DIR"]) == ("1", "/o")  # the caller's settings win


def _output(kind: str, n: int) -> dict[str, Any]:
    base: dict[str, Any] = {"event_type": kind, "trace_id": f"t-{n}"}
    if kind == "RESPONSE_SCORED":
        base.update(
            confidence=0.5,
            action="allow",
            composite={"score": 0.5, "level": "MODERATE", "should_block": False},
        )
    elif kind == "TRACE_SCORED":
        base.update(score=0.5, band="strong")
    elif kind == "CLAIM_SCORED":
        base.update(interval={"lower": 0.1, "upper": 0.2}, claim_id="c")
    else:
        base.update(overall_confidence=0.5, warnings=[])
    return base


def _all_outputs(settings_suffix: str = "") -> list[Consumed]:
    scored, dlq = f"scored-events{settings_suffix}", f"agent-events-dlq{settings_suffix}"
    records: list[Consumed] = []
    for kind, n in demo_runner.expected_outputs(demo_traffic()).items():
        for i in range(n):
            if kind == "DLQ":
                records.append(Consumed(dlq, 0, i, None, b"{}", (("__connect.errors.reason", b"x"),), 0))
            else:
                records.append(Consumed(scored, 0, i, None, orjson.dumps(_output(kind, i)), (), 0))
    return records


class _Worker:
    def __init__(self, env: dict[str, str], log_path: str) -> None:
        _Worker.envs.append(env)

    envs: ClassVar[list[dict[str, str]]] = []

    def __enter__(self) -> _Worker:
        return self

    def __exit__(self, *_: object) -> None:
        pass


@pytest.fixture
def offline_demo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """`run_demo` with its broker, topics, worker, producer and consumer replaced; `kind` picks the broker."""
    state: dict[str, Any] = {"kind": "tansu", "drop": None, "produced": [], "calibration_fails": False}
    _Worker.envs = []
    monkeypatch.chdir(tmp_path)
    for name in ("KAFKA_BOOTSTRAP_SERVERS", "APP_ID", "INPUT_TOPICS", "SCORED_TOPIC", "DLQ_TOPIC"):
        monkeypatch.delenv(name, raising=False)

    @contextlib.contextmanager
    def fake_broker() -> Iterator[RunningBroker]:
        yield RunningBroker(state["kind"], "127.0.0.1:1")

    async def create_topics(settings: object) -> list[str]:
        return []

    async def produce(bootstrap: str, topic: str, records: Iterable[tuple[bytes, bytes]]) -> None:
        state["produced"].extend(records)
        state["input_topic"] = topic

    async def collect(
        bootstrap: str, topics: Iterable[str], done: Callable[[list[Consumed]], bool], timeout: float
    ) -> list[Consumed]:
        topics = list(topics)
        suffix = topics[0].removeprefix("scored-events")
        records = [r for r in _all_outputs(suffix) if r.topic in topics]  # a real consumer reads these only
        if state["drop"] is not None:
            records = [r for r in records if not state["drop"](r)]
        state["done_on_all"] = done(records)
        if not done(records):
            raise TimeoutError(f"condition not met after {timeout:.0f}s with {len(records)} records")
        return records

    def views(port: int, outcomes: dict[str, int], timeout: float, progress: object) -> dict[str, Any]:
        if state["calibration_fails"]:
            raise TimeoutError("outcomes joined: 15 of 16")
        return {tenant: {"groups": []} for tenant in outcomes}

    monkeypatch.setattr(demo_runner, "broker", fake_broker)
    monkeypatch.setattr(demo_runner, "create_topics", create_topics)
    monkeypatch.setattr(demo_runner, "WorkerProcess", _Worker)
    monkeypatch.setattr(demo_runner, "_wait_ready", lambda worker, port, timeout: None)
    monkeypatch.setattr(demo_runner, "produce", produce)
    monkeypatch.setattr(demo_runner, "collect", collect)
    monkeypatch.setattr(demo_runner, "_calibration_views", views)
    return state


def test_the_demo_succeeds_when_every_expected_output_arrived(offline_demo: dict[str, Any]) -> None:
    assert demo_runner.run_demo(timeout=5) == 0
    assert offline_demo["done_on_all"] is True
    assert offline_demo["produced"] == demo_traffic().records
    assert offline_demo["input_topic"] == "agent-events"


@pytest.mark.parametrize(
    "missing",
    [
        lambda r: r.topic.startswith("agent-events-dlq") and r.offset == 0,  # one dead letter
        lambda r: b"CLAIM_SCORED" in r.value and r.offset == 3,  # the re-score
        lambda r: b"SYNTHESIS_SCORED" in r.value,
    ],
    ids=["a-dead-letter", "a-claim-rescore", "the-synthesis"],
)
def test_the_demo_fails_when_an_expected_output_is_missing(
    offline_demo: dict[str, Any], missing: Callable[[Consumed], bool]
) -> None:
    offline_demo["drop"] = missing
    assert demo_runner.run_demo(timeout=5) == 1
    assert offline_demo["done_on_all"] is False


def test_the_demo_fails_when_the_outcomes_are_not_joined(offline_demo: dict[str, Any]) -> None:
    offline_demo["calibration_fails"] = True
    assert demo_runner.run_demo(timeout=5) == 1


@pytest.mark.parametrize("error", [RuntimeError("exited"), TimeoutError("not ready")])
def test_the_demo_fails_when_the_worker_is_not_ready(
    offline_demo: dict[str, Any], monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    def not_ready(worker: object, port: int, timeout: float) -> None:
        raise error

    monkeypatch.setattr(demo_runner, "_wait_ready", not_ready)
    assert demo_runner.run_demo(timeout=5) == 1
    assert offline_demo["produced"] == []


def test_the_demo_uses_private_topics_on_a_shared_cluster(offline_demo: dict[str, Any]) -> None:
    offline_demo["kind"] = "external"
    assert demo_runner.run_demo(timeout=5) == 0
    (env,) = _Worker.envs
    assert env["INPUT_TOPICS"].startswith("agent-events-demo-") and env["INPUT_TOPICS"] != "agent-events"
    assert offline_demo["input_topic"] == env["INPUT_TOPICS"]
    assert "RECOVERY_CONSISTENCY_CHECK" not in env
    assert env["CALIBRATION_MIN_SAMPLES"] == "5"


class _Response(io.BytesIO):
    status = 200

    def __enter__(self) -> _Response:
        return self

    def __exit__(self, *_: object) -> None:
        pass


def test_readiness_waits_for_200_and_stops_on_a_dead_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[object] = [OSError("refused"), OSError("503"), _Response()]

    def urlopen(url: str, timeout: float = 0) -> object:
        answer = answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer

    class Alive:
        def __init__(self, alive: bool) -> None:
            self.is_alive = alive

        def alive(self) -> bool:
            return self.is_alive

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    demo_runner._wait_ready(Alive(True), 1, 30)  # type: ignore[arg-type]
    assert answers == []
    with pytest.raises(RuntimeError, match="exited before it was ready"):
        demo_runner._wait_ready(Alive(False), 1, 30)  # type: ignore[arg-type]


def test_calibration_waits_until_every_tenant_counted_its_outcomes(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = iter([1, 2, 2, 3])  # composite samples the acme view reports on each poll

    def urlopen(url: str, timeout: float = 0) -> _Response:
        if "kind=composite" in url:
            n = next(counts)
            return _Response(orjson.dumps({"groups": [{"dimension": "model", "samples": n}]}))
        return _Response(orjson.dumps({"groups": [], "full": True}))

    class Progress:
        def update(self, key: str, n: int) -> None:
            pass

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    views = demo_runner._calibration_views(1, {"acme": 3}, 30, Progress())  # type: ignore[arg-type]
    assert views == {"acme": {"groups": [], "full": True}}
    assert next(counts, None) is None  # it polled until the third outcome was counted


def test_calibration_waits_for_every_tenant(monkeypatch: pytest.MonkeyPatch) -> None:
    polls = Counter[str]()

    def urlopen(url: str, timeout: float = 0) -> _Response:
        tenant = url.split("/calibration/")[1].split("?")[0]
        if "kind=composite" in url:
            polls[tenant] += 1
            ready = tenant == "acme" or polls[tenant] >= 3  # globex's outcomes are joined later
            samples = (3 if tenant == "acme" else 2) if ready else 0  # acme: a verdict more than awaited
            return _Response(orjson.dumps({"groups": [{"dimension": "model", "samples": samples}]}))
        return _Response(orjson.dumps({"groups": [], "tenant": tenant}))

    shown: list[int] = []

    class Progress:
        def update(self, key: str, n: int) -> None:
            shown.append(n)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    views = demo_runner._calibration_views(1, {"acme": 2, "globex": 2}, 30, Progress())  # type: ignore[arg-type]
    assert set(views) == {"acme", "globex"} and polls["globex"] == 3
    assert shown == [2, 2, 4]  # "outcomes joined n/4", never past the 4 awaited


def test_the_demo_outcomes_are_over_confident_and_track_confidence() -> None:
    """README: "the demo's outcomes are over-confident by design": confident responses (about 0.95)
    are right less often than that, but more often than the hesitant ones."""
    events = [orjson.loads(raw) for _, raw in demo_traffic().records[:-4]]
    by_id = {e["event_id"]: e for e in events}
    verdicts: dict[bool, list[bool]] = {True: [], False: []}
    for outcome in events:
        if outcome["event_type"] == "OUTCOME" and "subject_event_id" in outcome:
            logprobs = [v for v in by_id[outcome["subject_event_id"]]["token_logprobs"] if v is not None]
            verdicts[sum(logprobs) / len(logprobs) > -0.5].append(outcome["correct"])
    confident, hesitant = (sum(v) / len(v) for v in (verdicts[True], verdicts[False]))
    assert hesitant < confident < 0.9
