"""Faust's aiokafka transport with a configurable consumer fetch wait (`CONSUMER_FETCH_MAX_WAIT_MS`).

faust-streaming 0.15.3 hard-codes `fetch_max_wait_ms=1500` for the worker's consumer. A fetch that
finds no data waits that long, and on brokers that hold fetches (Tansu holds each one for about half
of it even when data is there, DESIGN section 7) every hop between stages pays it. These subclasses
change only that one argument; everything else is Faust's own code.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

__all__ = ["FetchWaitApp"]


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):  # type: ignore[misc]
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = self.app.consumer_fetch_max_wait_ms  # read by its Fetcher at start
        return consumer


class _Consumer(faust_aiokafka.Consumer):  # type: ignore[misc]
    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _Transport(faust_aiokafka.Transport):  # type: ignore[misc]
    Consumer = _Consumer


class FetchWaitApp(faust.App):  # type: ignore[misc]
    """A Faust app whose worker consumer waits at most `consumer_fetch_max_wait_ms` per fetch."""

    def __init__(self, *args: Any, consumer_fetch_max_wait_ms: int = 1500, **kwargs: Any) -> None:
        self.consumer_fetch_max_wait_ms = consumer_fetch_max_wait_ms
        super().__init__(*args, **kwargs)

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)
