"""A real Prometheus (Debian's `prometheus` binary) scrapes a running worker through a real broker: our
metrics read back through its query API, and every dashboard expression is valid PromQL to it.

Needs `apt-get install prometheus` (`.ci/run` tries to install it); without the binary the test skips and
says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from streams.harness import RunningBroker
from tests.deploy_files import dashboard_exprs, load_dashboard
from tests.integration.fixtures import STRONG_COMPOSITE, EventFactory, deploy, free_port
from tests.integration.test_dashboard_metrics import _wait_until
from tests.integration.test_metrics_values import _outputs_seen

# Grafana's variables, as Prometheus must see them once Grafana has substituted them.
GRAFANA_VARIABLES = {"$__rate_interval": "30s", "$tenant": ".*", "$model": ".*"}
# Read back non-zero through Prometheus; the first two are plain counters, the third a histogram sample.
READ_BACK = (
    "sum(confidence_events_processed_total)",
    "sum(confidence_outputs_emitted_total)",
    "sum(llm_confidence_histogram_count)",
    "sum(confidence_response_actions_total)",
)


def _prometheus_binary() -> str:
    found = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None
    )
    if found is None:
        pytest.skip("Debian's prometheus binary is not installed: apt-get install prometheus")
    return found


@dataclass
class Prometheus:
    """A Prometheus server subprocess on a free loopback port with its storage in a temporary directory."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: str

    def get(self, path: str, **params: str) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return dict(json.loads(response.read()))
        except urllib.error.HTTPError as exc:  # 400/422 carry a JSON error body
            return dict(json.loads(exc.read()))

    def query(self, expr: str) -> dict[str, Any]:
        return self.get("/api/v1/query", query=expr)

    def log_tail(self) -> str:
        with open(self.log_path, errors="replace") as handle:
            return handle.read()[-3000:]


@pytest.fixture
def prometheus_for() -> Iterator[Any]:
    """Start Prometheus scraping 127.0.0.1:<port> every second; stopped (SIGTERM) after the test."""
    binary = _prometheus_binary()
    started: list[Prometheus] = []

    def start(target_port: int) -> Prometheus:
        workdir = tempfile.mkdtemp(prefix="confidence-prometheus-")
        config = os.path.join(workdir, "prometheus.yml")
        with open(config, "w") as handle:
            handle.write(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n  - job_name: confidence-streams\n"
                f"    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
            )
        port = free_port()
        log_path = os.path.join(workdir, "prometheus.log")
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={os.path.join(workdir, 'data')}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        server = Prometheus(process, port, log_path)
        started.append(server)
        _wait_until(
            lambda: True if server.get("/api/v1/status/buildinfo").get("status") == "success" else None,
            30,
            lambda: f"prometheus not answering (exit {process.poll()}):\n{server.log_tail()}",
        )
        return server

    yield start
    for server in started:
        server.process.terminate()
        try:
            status = server.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(timeout=10)
            raise AssertionError(f"prometheus ignored SIGTERM for 30 s:\n{server.log_tail()}") from None
        assert status == 0, f"prometheus exited {status}:\n{server.log_tail()}"


def _value(result: dict[str, Any]) -> float | None:
    """The single sample of an instant-vector answer, None while Prometheus has none."""
    if result.get("status") != "success" or not result["data"]["result"]:
        return None
    return float(result["data"]["result"][0]["value"][1])


def _substituted(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def test_a_real_prometheus_scrapes_the_worker(kafka: RunningBroker, prometheus_for: Any) -> None:

    d = deploy(kafka, partitions=1)
    f = EventFactory(tenant="prom")
    d.start_worker()
    try:
        prometheus: Prometheus = prometheus_for(d.web_ports[0])
        d.produce(
            [
                f.tool("p-ev", "find", "Widget", result_count=2),
                f.response("p-r", token_logprobs=[-0.05], **STRONG_COMPOSITE),
                f.response("p-r", minutes=1, token_logprobs=[-0.2], **STRONG_COMPOSITE),
            ]
        )
        d.collect(_outputs_seen(d, {"TRACE_SCORED": 1, "RESPONSE_SCORED": 2}, 0))
        # The target is up: Prometheus's own view of the scrape, not only the worker's.
        _wait_until(
            lambda: True if _value(prometheus.query('up{job="confidence-streams"}')) == 1.0 else None,
            60,
            lambda: f"target not up: {prometheus.get('/api/v1/targets')}\n{prometheus.log_tail()}",
        )
        read: dict[str, float | None] = {}

        def all_non_zero() -> bool | None:
            read.update({expr: _value(prometheus.query(expr)) for expr in READ_BACK})
            return True if all(read[expr] for expr in READ_BACK) else None

        _wait_until(all_non_zero, 60, lambda: f"read back {read}")
        assert read["sum(confidence_events_processed_total)"] == 3.0
        assert read["sum(llm_confidence_histogram_count)"] == 2.0  # both responses carried logprobs
        # Every dashboard expression parses and evaluates in Prometheus (Grafana variables substituted).
        failures = {
            expr: answer.get("error")
            for expr in dashboard_exprs(load_dashboard())
            if (answer := prometheus.query(_substituted(expr))).get("status") != "success"
        }
        assert failures == {}
    finally:
        d.stop()
