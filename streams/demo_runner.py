"""`confidence-streams demo`: broker (harness), topics, a worker, demo traffic, progress, a summary, exit 0."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from streams.config import load_settings
from streams.demo import DemoTraffic, demo_traffic
from streams.harness import RunningBroker, broker, free_port
from streams.kafka_io import Consumed, WorkerProcess, collect, produce
from streams.progress import StepProgress
from streams.topics import create_topics

__all__ = ["expected_outputs", "received_of", "run_demo", "worker_env"]

log = logging.getLogger(__name__)


def worker_env(
    broker: RunningBroker, suffix: str, data_dir: str, web_port: int, **extra: str
) -> dict[str, str]:
    """Environment for a worker on a private set of topics (`suffix`) with fast group timeouts."""
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "APP_ID": f"confidence-streams{suffix}",
        "INPUT_TOPICS": f"agent-events{suffix}",
        "SCORED_TOPIC": f"scored-events{suffix}",
        "FLAGGED_TOPIC": f"flagged-events{suffix}",
        "DLQ_TOPIC": f"agent-events-dlq{suffix}",
        "DATA_DIR": data_dir,
        "WEB_PORT": str(web_port),
        "WEB_HOST": "127.0.0.1",
        # Short group timeouts: a fresh worker joins in seconds instead of ~30 s (DESIGN section 7).
        "BROKER_SESSION_TIMEOUT_SECONDS": "6",
        "BROKER_HEARTBEAT_INTERVAL_SECONDS": "0.5",
        "BROKER_REBALANCE_TIMEOUT_SECONDS": "4",
        **broker.worker_settings,
    }
    env.update(extra)
    return env


def expected_outputs(traffic: DemoTraffic) -> Counter[str]:
    """What the demo waits for, by kind (DLQ records under "DLQ"): at least this many of each."""
    return Counter(
        {
            "RESPONSE_SCORED": traffic.responses,
            "TRACE_SCORED": traffic.tools,
            "SYNTHESIS_SCORED": traffic.syntheses,
            "CLAIM_SCORED": traffic.claims + traffic.claim_rescores,
            "DLQ": traffic.bad,
        }
    )


def received_of(records: list[Consumed], expected: Counter[str], scored: str, dlq: str) -> int:
    """How many of the expected outputs have arrived (each kind counted up to what is expected)."""
    kinds: Counter[str] = Counter()
    for r in records:
        if r.topic == dlq:
            kinds["DLQ"] += 1
        elif r.topic == scored:
            kinds[orjson.loads(r.value)["event_type"]] += 1
    return sum(min(kinds[kind], n) for kind, n in expected.items())


def _wait_ready(worker: WorkerProcess, web_port: int, timeout: float) -> None:
    """Until the worker's /readyz answers 200 (partitions assigned, tables recovered)."""
    deadline = time.monotonic() + timeout
    url = f"http://127.0.0.1:{web_port}/readyz"
    while True:
        if not worker.alive():
            raise RuntimeError("the worker exited before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:  # URLError and HTTPError are OSErrors
            pass  # not listening yet, or 503 while it joins the group and restores its tables
        if time.monotonic() > deadline:
            raise TimeoutError(f"the worker was not ready after {timeout:.0f}s")
        time.sleep(0.2)


def run_demo(timeout: float = 120.0, report_dir: str | None = None) -> int:
    """Run the whole demo; return the process exit code."""
    console = Console(soft_wrap=True)  # paths and reason lists stay on one line
    traffic = demo_traffic()
    expected = expected_outputs(traffic)
    with StepProgress(console) as progress, contextlib.ExitStack() as stack:
        progress.begin("broker", "starting the broker")
        running = stack.enter_context(broker())
        progress.finish("broker", f"broker up: {running.kind} at {running.bootstrap_servers}")
        # A private suffix keeps a shared cluster's existing topics and groups out of the demo.
        suffix = "" if running.is_tansu else f"-demo-{uuid.uuid4().hex[:8]}"
        data_dir = tempfile.mkdtemp(prefix="confidence-demo-")
        web_port = free_port()
        # Few outcomes in a demo: report calibration from 5 of them (default 20).
        env = worker_env(running, suffix, data_dir, web_port, CALIBRATION_MIN_SAMPLES="5")
        settings = load_settings(**{k.lower(): v for k, v in env.items()})
        progress.begin("topics", "creating topics")
        created = asyncio.run(create_topics(settings))
        progress.finish("topics", f"topics ready ({len(created)} created)")
        log_path = os.path.join(data_dir, "worker.log")
        started = time.monotonic()
        worker = stack.enter_context(WorkerProcess(env, log_path))
        progress.begin("worker", f"starting the worker (web 127.0.0.1:{web_port}, log {log_path})")
        try:
            _wait_ready(worker, web_port, timeout)
        except (RuntimeError, TimeoutError) as exc:
            progress.finish("worker", "worker not ready")
            console.print(f"[red]demo failed[/]: {exc}; see {log_path}")
            return 1
        progress.finish("worker", "worker ready")
        progress.begin("sent", "events sent", total=len(traffic.records))

        def counted() -> Iterator[tuple[bytes, bytes]]:
            for n, record in enumerate(traffic.records, start=1):
                yield record
                progress.update("sent", n)

        input_topic = settings.input_topic_names[0]
        asyncio.run(produce(running.bootstrap_servers, input_topic, counted()))
        progress.finish("sent")
        total = sum(expected.values())
        progress.begin("received", "outputs received", total=total)

        def done(records: list[Consumed]) -> bool:
            received = received_of(records, expected, settings.scored_topic, settings.dlq_topic)
            progress.update("received", received)
            return received >= total

        topics = [settings.scored_topic, settings.flagged_topic, settings.dlq_topic]
        try:
            records = asyncio.run(collect(running.bootstrap_servers, topics, done, timeout))
        except TimeoutError as exc:
            progress.finish("received", "outputs received (incomplete)")
            console.print(f"[red]demo failed[/]: {exc}; see {log_path}")
            return 1
        progress.finish("received", "outputs received")
        progress.begin("calibration", "outcomes joined", total=sum(traffic.response_outcomes.values()))
        try:
            calibration = _calibration_views(web_port, traffic.response_outcomes, timeout, progress)
        except TimeoutError as exc:
            progress.finish("calibration", "outcomes joined (incomplete)")
            console.print(f"[red]demo failed[/]: {exc}; see {log_path}")
            return 1
        progress.finish("calibration", "outcomes joined")
        elapsed = time.monotonic() - started
        progress.begin("stop", "stopping the worker and the broker")
        stack.close()
        progress.finish("stop", "worker and broker stopped")
    shutil.rmtree(data_dir, ignore_errors=True)  # kept only when the demo failed: its log is there
    _summary(console, records, settings.scored_topic, settings.flagged_topic, settings.dlq_topic, elapsed)
    _calibration_summary(console, calibration)
    if report_dir is not None:
        from streams.report import write_report

        values = [r.value for r in records if r.topic == settings.scored_topic]
        png, html = write_report(
            [orjson.loads(v) for v in values], report_dir, source="demo run", title="confidence-streams demo"
        )
        # The outputs too, as `tail --json` writes them: `report --from` can redraw them.
        lines = os.path.join(report_dir, "outputs.jsonl")
        with open(lines, "wb") as handle:
            handle.writelines(v + b"\n" for v in values)
        console.print(f"report: {html}, {png}; outputs: {lines}")
    return 0


def _calibration_views(
    web_port: int, outcomes: dict[str, int], timeout: float, progress: StepProgress
) -> dict[str, dict[str, Any]]:
    """Poll each tenant's /calibration view until every response outcome is counted; return them."""
    deadline = time.monotonic() + timeout
    views: dict[str, dict[str, Any]] = {}
    while True:
        joined = 0
        for tenant, expected in outcomes.items():
            url = f"http://127.0.0.1:{web_port}/calibration/{tenant}?kind=composite"
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    body = orjson.loads(response.read())
            except OSError:  # 404 until the first outcome of the tenant is joined
                continue
            counted = sum(g["samples"] for g in body["groups"] if g["dimension"] == "model")
            joined += min(counted, expected)
            if counted >= expected:
                with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/calibration/{tenant}") as response:
                    views[tenant] = orjson.loads(response.read())
        progress.update("calibration", joined)
        if len(views) == len(outcomes):
            return views
        if time.monotonic() > deadline:
            raise TimeoutError(f"outcomes joined: {joined} of {sum(outcomes.values())}")
        time.sleep(0.2)


def _calibration_summary(console: Console, views: dict[str, dict[str, Any]]) -> None:
    """Per model: response confidence and composite; per agent type: evidence and claim scores."""
    table = Table(title="calibration: /calibration/{tenant} (advice for precision 0.9)")
    for column in ("tenant", "group", "kind", "n", "ECE", "Brier", "advice"):
        table.add_column(column, justify="left" if column in ("tenant", "group", "kind") else "right")
    for tenant, body in sorted(views.items()):
        for g in body["groups"]:
            if (g["dimension"] == "model") != (g["kind"] in ("response", "composite")):
                continue
            advice = g["advice"]
            threshold = "none" if advice["threshold"] is None else f">= {advice['threshold']:.2f}"
            table.add_row(
                tenant,
                g["value"],
                g["kind"],
                str(g["samples"]),
                f"{g['ece']:.3f}",
                f"{g['brier']:.3f}",
                threshold,
            )
    console.print(table)


def _summary(
    console: Console, records: list[Consumed], scored: str, flagged: str, dlq: str, elapsed: float
) -> None:
    outputs = [orjson.loads(r.value) for r in records if r.topic == scored]
    flagged_count = sum(1 for r in records if r.topic == flagged)
    dead = [r for r in records if r.topic == dlq]
    kinds = Counter(o["event_type"] for o in outputs)
    responses = [o for o in outputs if o["event_type"] == "RESPONSE_SCORED"]
    totals = Table(title=f"confidence-streams demo ({elapsed:.1f}s)")
    for column in ("scored", "flagged", "rejected", "blocked", "dead-lettered"):
        totals.add_column(column, justify="right")
    totals.add_row(
        str(len(outputs)),
        str(flagged_count),
        str(sum(1 for o in responses if o["action"] == "reject")),
        str(sum(1 for o in responses if o["composite"]["should_block"])),
        str(len(dead)),
    )
    console.print(totals)
    by_kind = Table(title="outputs by type")
    by_kind.add_column("event_type")
    by_kind.add_column("count", justify="right")
    for kind, count in sorted(kinds.items()):
        by_kind.add_row(kind, str(count))
    console.print(by_kind)
    examples = Table(title="example outputs")
    for column in ("type", "trace", "score", "decision"):
        examples.add_column(column)
    shown: set[str] = set()
    for o in outputs:
        if o["event_type"] in shown:
            continue
        shown.add(o["event_type"])
        examples.add_row(o["event_type"], o["trace_id"], *_describe(o))
    console.print(examples)
    reasons = Counter(dict(r.headers).get("__connect.errors.reason", b"?").decode() for r in dead)
    console.print("dead-letter reasons: " + ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())))


def _describe(output: dict[str, object]) -> tuple[str, str]:
    kind = output["event_type"]
    if kind == "RESPONSE_SCORED":
        comp = output["composite"]
        assert isinstance(comp, dict)
        return (
            f"conf={output['confidence']} composite={comp['score']:.3f}",
            f"{output['action']} {comp['level']}",
        )
    if kind == "TRACE_SCORED":
        return f"{output['score']:.3f}", str(output["band"])
    if kind == "CALIBRATION_UPDATED":
        group = output["group"]
        assert isinstance(group, dict)
        return f"ECE {output['ece']:.3f}", f"{group['dimension']}={group['value']} {group['kind']}"
    if kind == "CLAIM_SCORED":
        interval = output["interval"]
        assert isinstance(interval, dict)
        return f"[{interval['lower']:.3f}, {interval['upper']:.3f}]", str(output["claim_id"])
    return f"{output['overall_confidence']:.3f}", "; ".join(output["warnings"])  # type: ignore[arg-type]
