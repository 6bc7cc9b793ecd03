"""`confidence-streams demo`: broker (harness), topics, a worker, demo traffic, a summary table, exit 0."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
import time
import uuid
from collections import Counter

import orjson
from rich.console import Console
from rich.table import Table

from streams.config import load_settings
from streams.demo import DemoTraffic, demo_traffic
from streams.harness import broker
from streams.kafka_io import Consumed, WorkerProcess, collect, produce
from streams.topics import create_topics

__all__ = ["run_demo", "worker_env"]

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_env(bootstrap: str, suffix: str, data_dir: str, web_port: int, **extra: str) -> dict[str, str]:
    """Environment for a worker on a private set of topics (`suffix`) with fast group timeouts."""
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
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
    }
    env.update(extra)
    return env


def _self_outputs_done(traffic: DemoTraffic, scored: str, dlq: str) -> object:
    def done(records: list[Consumed]) -> bool:
        kinds: Counter[str] = Counter()
        dead = 0
        for r in records:
            if r.topic == dlq:
                dead += 1
            elif r.topic == scored:
                kinds[orjson.loads(r.value)["event_type"]] += 1
        return (
            dead >= traffic.bad
            and kinds["RESPONSE_SCORED"] >= traffic.responses
            and kinds["TRACE_SCORED"] >= traffic.tools
            and kinds["SYNTHESIS_SCORED"] >= traffic.syntheses
            and kinds["CLAIM_SCORED"] >= traffic.claims + traffic.claim_rescores
        )

    return done


def run_demo(timeout: float = 120.0) -> int:
    """Run the whole demo; return the process exit code."""
    console = Console()
    traffic = demo_traffic()
    with broker() as running:
        console.print(f"[bold]broker[/]: {running.kind} at {running.bootstrap_servers}")
        # A private suffix keeps a shared cluster's existing topics and groups out of the demo.
        suffix = "" if running.is_tansu else f"-demo-{uuid.uuid4().hex[:8]}"
        data_dir = tempfile.mkdtemp(prefix="confidence-demo-")
        web_port = _free_port()
        env = worker_env(running.bootstrap_servers, suffix, data_dir, web_port)
        settings = load_settings(**{k.lower(): v for k, v in env.items()})
        asyncio.run(create_topics(settings))
        log_path = os.path.join(data_dir, "worker.log")
        started = time.monotonic()
        with WorkerProcess(env, log_path):
            console.print(f"worker started (web on 127.0.0.1:{web_port}, log {log_path})")
            sent = asyncio.run(
                produce(running.bootstrap_servers, settings.input_topic_names[0], traffic.records)
            )
            console.print(f"produced {sent} events ({traffic.bad} deliberately bad)")
            topics = [settings.scored_topic, settings.flagged_topic, settings.dlq_topic]
            try:
                records = asyncio.run(
                    collect(
                        running.bootstrap_servers,
                        topics,
                        _self_outputs_done(traffic, settings.scored_topic, settings.dlq_topic),  # type: ignore[arg-type]
                        timeout,
                    )
                )
            except TimeoutError as exc:
                console.print(f"[red]demo failed[/]: {exc}; see {log_path}")
                return 1
        elapsed = time.monotonic() - started
    _summary(console, records, settings.scored_topic, settings.flagged_topic, settings.dlq_topic, elapsed)
    return 0


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
    if kind == "CLAIM_SCORED":
        interval = output["interval"]
        assert isinstance(interval, dict)
        return f"[{interval['lower']:.3f}, {interval['upper']:.3f}]", str(output["claim_id"])
    return f"{output['overall_confidence']:.3f}", "; ".join(output["warnings"])  # type: ignore[arg-type]
