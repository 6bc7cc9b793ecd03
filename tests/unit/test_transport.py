"""CONSUMER_FETCH_MAX_WAIT_MS reaches the aiokafka consumer Faust builds (Faust hard-codes 1500 ms)."""

from __future__ import annotations

from streams.app import create_app
from streams.config import load_settings


async def test_fetch_wait_setting_reaches_the_worker_consumer() -> None:
    svc = create_app(load_settings(consumer_fetch_max_wait_ms=37))
    thread = svc.app.consumer._thread
    consumer = thread._create_worker_consumer(svc.app.transport)
    try:
        assert consumer._fetch_max_wait_ms == 37
    finally:
        await consumer.stop()
