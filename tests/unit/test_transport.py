"""Worker tuning settings reach what they tune: CONSUMER_FETCH_MAX_WAIT_MS the aiokafka consumer Faust
builds (Faust hard-codes 1500 ms), GC_GEN0_THRESHOLD the garbage collector."""

from __future__ import annotations

import gc

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


def test_gc_threshold_setting_sets_generation_0_only() -> None:
    from streams.cli import tune_gc

    before = gc.get_threshold()
    try:
        tune_gc(load_settings(gc_gen0_threshold=12_345).gc_gen0_threshold)
        assert gc.get_threshold() == (12_345, *before[1:])
        tune_gc(0)  # 0 leaves whatever is set
        assert gc.get_threshold() == (12_345, *before[1:])
    finally:
        gc.set_threshold(*before)
