"""A fix for a record-loss race in faust-streaming 0.15.3's table recovery (pinned in pyproject.toml).

After restoring tables, Faust's `Recovery.on_recovery_completed` *resumes* the stream partitions and
only then seeks them to their committed offsets. Flow is already active at that point (it was resumed
to read the changelogs), so the fetcher delivers stream records while the seek (one broker round trip)
is in progress. The record in flight on each partition when the seek lands is dropped, and Faust's
commit gap check (`min(acked) - committed > 1`, where `committed` is already the *next* offset) lets a
single missing offset through, so that offset is committed without ever reaching an agent. We saw it
as 1-2 of 400 inputs without output after a SIGTERM and restart (tests/integration/test_shutdown.py,
3 to 4 runs in 8 on Tansu). Upstream context: faust-streaming issues #216 and #221.

The fix is an ordering change: seek while the stream partitions are still paused, then resume them.

A second loss on the same path: records fetched before a rebalance reach the stream afterwards with
an old generation id, and Faust's stream skips them (its pure-Python loop also acks them; our consumer
refuses those acks, streams/transport.py). Where the partition has a
committed offset, the seek brings them back; where it has none (a new group, or an internal topic
nothing was committed on yet), aiokafka's `seek_to_committed` leaves the position after them, so
they are committed without ever being processed. We saw it as the first records of the repartition
topics missing after a worker restart (tests/integration/test_reliability.py). So partitions without
a committed offset are sought to their beginning, which is what the app's `earliest` reset means.

A third: a fetch can return records of a paused stream partition *after* the seek (it started before
the rebalance and waited it out). Faust's `getmany` skips them, aiokafka's position is past them, and
the seek that would have brought them back is already done. Our consumer records such partitions
(streams/transport.py), and the seek is repeated until no stream partition lost records after it.
Two more guards on Faust's path. A rebalance that starts while the seek is in progress must not
see this recovery resume the stream partitions (the next recovery does, after restoring), nor stop
the worker when it makes the seek fail (Faust's `_wait` raises `RebalanceAgain` on its signal, aiokafka
`IllegalStateError` for a partition no longer assigned: Faust's loop moves on to that recovery); and a
recovery step that times out must stop the worker: Faust's `_wait` reports a timeout as "stopped",
and its recovery loop then ends for good, leaving the streams paused while the worker looks alive.
The seek's own failures (a broker that does not answer the committed-offset lookup, records lost on
every seek) stop the worker the same way: raised through Faust, they crashed the app by its graceful
shutdown instead, with /healthz still "ok" while it ran.
Everything else is Faust's own code path, unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiokafka.errors import IllegalStateError
from faust.tables import TableManager
from faust.tables.recovery import RebalanceAgain, Recovery, ServiceStopped

__all__ = ["SeekThenResumeRecovery", "SeekThenResumeTableManager"]

_MAX_SEEKS = 10


class SeekThenResumeRecovery(Recovery):  # type: ignore[misc]
    """Faust's `Recovery` with stream partitions sought to committed offsets *before* they resume."""

    # Called with the reason when a recovery step cannot finish (the worker sets `stop_worker`).
    on_failure: Callable[[str], None] | None = None

    def _failed(self, reason: str) -> None:
        self.log.error(reason)
        if self.on_failure is not None:
            self.on_failure(reason)

    async def _wait(self, coro: Any, timeout: Any = None) -> None:
        try:
            await super()._wait(coro, timeout=timeout)
        except ServiceStopped:
            if self.should_stop or timeout is None:
                raise  # really stopping
            self._failed(f"a table recovery step took longer than {timeout} s: partitions would stay paused")
            raise

    async def _seek_then_resume_streams(self) -> bool:
        """Seek, then resume; False (nothing resumed) when another rebalance began meanwhile."""
        app: Any = self.app
        rebalances = app.rebalancing_count
        consumer = app.consumer
        assignment = consumer.assignment()
        if not assignment:
            return True
        streams = {tp for tp in assignment if not self._is_changelog_tp(tp)}

        def rebalancing_again() -> bool:
            return app.rebalancing_count != rebalances or self.signal_recovery_start.is_set()

        try:
            await self._seek_until_nothing_dropped(consumer, streams)
        except ServiceStopped:
            raise  # stopping, or a timeout `_wait` has already reported
        except Exception as exc:
            # RebalanceAgain (`_wait` saw the next rebalance's signal) and IllegalStateError (a partition
            # left the assignment mid-seek) are what Faust's recovery loop reads as "another rebalance
            # began": that rebalance's recovery seeks again, so the worker must not stop for them.
            if isinstance(exc, RebalanceAgain | IllegalStateError) or rebalancing_again():
                self.log.warning(f"Another rebalance began during the seek ({exc!r}): streams stay paused")
                return False
            # Otherwise the streams would stay paused in a worker that looks alive.
            self._failed(f"seeking the stream partitions to their committed offsets failed: {exc!r}")
            raise
        if rebalancing_again():
            # Those partitions may not be this worker's any more, and the next recovery restores its
            # tables before it resumes them: resuming now would let records reach half-restored state.
            self.log.warning("Another rebalance began during the seek: streams stay paused for its recovery")
            return False
        consumer.resume_partitions(streams)  # no await since the last check: nothing drops in between
        return True

    async def _seek_until_nothing_dropped(self, consumer: Any, streams: set[Any]) -> None:
        for attempt in range(1, _MAX_SEEKS + 1):
            # A fetch that returns while the streams are paused drops their records past the
            # position just sought (streams/transport.py); seek again until none did.
            dropped = getattr(consumer, "dropped_partitions", set())
            dropped.clear()
            self.log.info("Seek stream partitions to committed offsets (partitions still paused).")
            await self._seek_to_committed(consumer, streams)
            if not dropped & streams:
                return
            self.log.info(f"Records of {sorted(dropped & streams)} were fetched during the seek ({attempt})")
        raise RuntimeError(f"stream partitions kept losing fetched records after {_MAX_SEEKS} seeks")

    async def _seek_to_committed(self, consumer: Any, streams: set[Any]) -> None:
        timeout = self.app.conf.broker_request_timeout
        await self._wait(consumer.perform_seek(), timeout=timeout)
        committed = await asyncio.wait_for(consumer.seek_to_committed(), timeout)
        uncommitted = {tp for tp in streams if not committed.get(tp)}
        if uncommitted:
            earliest = await asyncio.wait_for(consumer.earliest_offsets(*uncommitted), timeout)
            for tp in sorted(uncommitted):
                await consumer.seek(tp, earliest[tp])

    async def _start_flow(self, standbys_ready: bool) -> None:
        # Faust's common ending of both paths: let records flow and announce the worker ready.
        app: Any = self.app
        self.completed.set()
        app.flow_control.resume()
        app.consumer.resume_flow()
        await app._fetcher.maybe_start()
        self.tables.on_actives_ready()
        if standbys_ready:
            self.tables.on_standbys_ready()
        app.on_rebalance_end()
        self.log.info("Worker ready")

    async def on_recovery_completed(self, generation_id: int = 0) -> None:
        # Mirrors faust 0.15.3 Recovery.on_recovery_completed with the seek moved before the resume.
        app: Any = self.app
        self.log.info("Restore complete!")
        await app.on_rebalance_complete.send()
        self._set_recovery_ended()
        for table in self.tables.values():
            await table.on_recovery_completed(self.actives_for_table[table], self.standbys_for_table[table])
        if app.consumer_generation_id != generation_id:
            self.log.warning(
                f"Recovery rebalancing again app id {app.consumer_generation_id} param {generation_id}"
            )
            return
        if await self._seek_then_resume_streams():
            await self._start_flow(standbys_ready=not app.assignor.assigned_standbys())

    async def _resume_streams(self, generation_id: int = 0) -> None:
        # Same fix for Faust's path without tables to recover.
        app: Any = self.app
        await app.on_rebalance_complete.send()
        if app.consumer_generation_id != generation_id:
            self.log.warning("Recovery rebalancing again")
            return
        if await self._seek_then_resume_streams():
            await self._start_flow(standbys_ready=True)


class SeekThenResumeTableManager(TableManager):  # type: ignore[misc]
    """Faust's `TableManager` using `SeekThenResumeRecovery` (set as the app's `TableManager`)."""

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = SeekThenResumeRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery
