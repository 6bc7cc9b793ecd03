"""Faust passthrough agents, the baselines of the pipeline benchmark: forward raw bytes, decode nothing.

`python -m bench.passthrough worker`, configured by the environment:

| variable | meaning |
|---|---|
| `PASSTHROUGH_MODE` | `naive`: `async for` + `await topic.send` per event; `batched`: `noack_take` batches, every event sent through the app's producer, the futures awaited, then each event acked (the shape of the confidence-streams agents) |
| `PASSTHROUGH_APP_ID`, `PASSTHROUGH_INPUT`, `PASSTHROUGH_OUTPUT` | its own group and topics |
| `KAFKA_BOOTSTRAP_SERVERS`, `TOPIC_PARTITIONS`, `WEB_PORT`, `DATA_DIR` | as for the worker |
| `CONSUMER_FETCH_MAX_WAIT_MS` | the consumer's fetch wait, the same value the worker gets (Faust alone hardcodes 1500) |
| `PASSTHROUGH_CONSUMER` | `faust` (default): Faust's own consumer, only its fetch wait and size set; `streams`: the worker's consumer (`streams.transport.FetchWaitApp`, with its cheaper hand-over of each record), to show what that change alone is worth |
| `BATCH_SIZE`, `BATCH_WITHIN_SECONDS`, `PRODUCER_*`, `BROKER_*`, `CONSUMER_FETCH_MAX_BYTES`, `GC_GEN0_THRESHOLD` | the worker's settings, so only the agent differs: the same fetch size and garbage-collector threshold |

Not the worker's stream buffer (`2 * BATCH_SIZE`) and records per fetch hand-over (`BATCH_SIZE`): with
them Faust's flow control stalls an agent that takes one event at a time. The naive passthrough on the
worker's consumer fell from 7,873-8,118 to 1,150-1,306 events/s at 0.13-0.18 cores, Faust's own from
5,149-5,999 to 3,028-3,067 at 0.53 (two alternating runs each): a crippled baseline would flatter the
worker, so the passthroughs keep Faust's defaults there.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

__all__ = ["create_app", "main", "set_fetch_limits"]

FAUST_FETCH_MAX_WAIT_MS = 1500  # what faust/transport/drivers/aiokafka.py passes to aiokafka


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def set_fetch_limits(milliseconds: int, max_bytes: int) -> None:
    """Make every Faust worker consumer created from now on wait at most `milliseconds` per fetch and
    fetch at most `max_bytes` at a time.

    Faust passes a literal `fetch_max_wait_ms=1500` to aiokafka and no `fetch_max_bytes`; aiokafka copies
    both attributes into its fetcher only in `start()`, so setting them on the fresh consumer is enough.
    """
    thread_class: Any = faust_aiokafka.AIOKafkaConsumerThread
    original = thread_class._create_worker_consumer
    if getattr(original, "_bench_patched", False):
        original = original._bench_original

    def create_worker_consumer(self: Any, transport: Any) -> Any:
        consumer = original(self, transport)
        consumer._fetch_max_wait_ms = milliseconds
        consumer._fetch_max_bytes = max_bytes
        return consumer

    create_worker_consumer._bench_patched = True  # type: ignore[attr-defined]
    create_worker_consumer._bench_original = original  # type: ignore[attr-defined]
    thread_class._create_worker_consumer = create_worker_consumer


def create_app() -> faust.App:
    """The passthrough app for the environment above."""
    mode = _env("PASSTHROUGH_MODE", "naive")
    if mode not in ("naive", "batched"):
        raise SystemExit(f"PASSTHROUGH_MODE must be naive or batched, not {mode!r}")
    fetch_wait = int(_env("CONSUMER_FETCH_MAX_WAIT_MS", str(FAUST_FETCH_MAX_WAIT_MS)))
    partitions = int(_env("TOPIC_PARTITIONS", "4"))
    bootstrap = _env("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")
    consumer = _env("PASSTHROUGH_CONSUMER", "faust")
    if consumer not in ("faust", "streams"):
        raise SystemExit(f"PASSTHROUGH_CONSUMER must be faust or streams, not {consumer!r}")
    fetch_max_bytes = int(_env("CONSUMER_FETCH_MAX_BYTES", "52428800"))  # aiokafka's default
    batch_size = int(_env("BATCH_SIZE", "500"))
    options: dict[str, Any] = {}
    app_class: type[faust.App] = faust.App
    if consumer == "streams":
        from streams.transport import FetchWaitApp

        app_class = FetchWaitApp
        options["consumer_fetch_max_wait_ms"] = fetch_wait
        options["consumer_fetch_max_bytes"] = fetch_max_bytes
    else:
        set_fetch_limits(fetch_wait, fetch_max_bytes)
    app = app_class(
        _env("PASSTHROUGH_APP_ID", f"bench-passthrough-{mode}-{consumer}"),
        **options,
        broker=[f"kafka://{server.strip()}" for server in bootstrap.split(",")],
        store="memory://",
        key_serializer="raw",
        value_serializer="raw",
        autodiscover=False,
        datadir=_env("DATA_DIR", "./bench-passthrough-data"),
        topic_partitions=partitions,
        web_enabled=True,
        web_host="127.0.0.1",
        web_port=int(_env("WEB_PORT", "6067")),
        broker_session_timeout=float(_env("BROKER_SESSION_TIMEOUT_SECONDS", "10")),
        broker_heartbeat_interval=float(_env("BROKER_HEARTBEAT_INTERVAL_SECONDS", "1")),
        broker_rebalance_timeout=float(_env("BROKER_REBALANCE_TIMEOUT_SECONDS", "10")),
        producer_max_batch_size=int(_env("PRODUCER_MAX_BATCH_BYTES", "262144")),
        producer_linger_ms=int(_env("PRODUCER_LINGER_MS", "5")),
        consumer_auto_offset_reset="earliest",
    )
    source = app.topic(_env("PASSTHROUGH_INPUT", "bench-in"), key_type=bytes, value_type=bytes)
    output_name = _env("PASSTHROUGH_OUTPUT", "bench-out")
    sink = app.topic(output_name, key_type=bytes, value_type=bytes, partitions=partitions)

    if mode == "naive":

        @app.agent(source, name="forward")
        async def forward(stream: faust.StreamT[bytes]) -> None:
            async for key, value in stream.items():
                await sink.send(key=key, value=value)

    else:
        within = float(_env("BATCH_WITHIN_SECONDS", "0.05"))

        @app.agent(source, name="forward")
        async def forward(stream: faust.StreamT[bytes]) -> None:
            async for events in stream.noack_take(batch_size, within=within):
                futures = [
                    await app.producer.send(output_name, e.key, e.value, None, None, None) for e in events
                ]
                await asyncio.gather(*futures)
                for event in events:
                    await stream.ack(event)

    del forward  # registered on the app
    return app


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["worker"]:
        print("usage: python -m bench.passthrough worker", file=sys.stderr)
        return 2
    from faust import Worker

    logging.basicConfig(level=logging.INFO)
    app = create_app()
    gen0 = int(_env("GC_GEN0_THRESHOLD", "0"))  # as the worker does at start (streams/cli.py tune_gc)
    if gen0:
        gc.set_threshold(gen0, *gc.get_threshold()[1:])
    # `-l info`, as the service's worker: at `warn` Faust sets the root logger to DEBUG (DESIGN 10).
    Worker(app, loglevel="info", quiet=True).execute_from_commandline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
