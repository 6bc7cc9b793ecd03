"""Table writes queue their changelog record as it will be sent: the key's source partition, raw bytes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from faust.types import TP

from streams.agents import owned
from streams.app import create_app
from streams.batch_send import Outgoing
from streams.config import load_settings
from streams.stages.common import ExpiryClock


def test_a_write_and_a_delete_queue_records_for_the_source_partition_in_order() -> None:
    svc = create_app(load_settings(topic_partitions=4))
    table = svc.traces
    topic = table.changelog_topic.get_topic_name()

    table.set_from(b"acme/t1", b'{"a":1}', partition=3)
    table.set_from(b"acme/t2", b'{"b":2}', partition=1)
    table.set_from(b"acme/t1", None, partition=3)

    assert table.take_changelog() == [
        Outgoing(topic, b"acme/t1", b'{"a":1}', 3),
        Outgoing(topic, b"acme/t2", b'{"b":2}', 1),
        Outgoing(topic, b"acme/t1", None, 3),  # the tombstone
    ]
    assert table.take_changelog() == []  # taken once
    assert dict(table.items()) == {b"acme/t2": b'{"b":2}'}


def test_deleting_an_absent_key_queues_nothing() -> None:
    svc = create_app(load_settings())
    svc.claims.set_from(b"acme/never-written", None, partition=0)
    assert svc.claims.take_changelog() == []


def test_a_write_without_a_known_partition_is_refused() -> None:
    svc = create_app(load_settings())
    with pytest.raises(TypeError, match="no changelog partition"):
        svc.traces[b"acme/t1"] = b"{}"  # not through set_from, outside any stream: no partition


async def test_keys_written_here_leave_with_their_partition_after_a_rebalance() -> None:
    """Faust's memory store drops the keys of partitions this worker lost when recovery completes,
    but knew only the keys it had restored; keys written by the worker itself stayed behind."""
    svc = create_app(load_settings(topic_partitions=4))
    table = svc.traces
    topic = table.changelog_topic.get_topic_name()
    table.set_from(b"acme/kept", b"{}", partition=1)
    table.set_from(b"acme/lost", b"{}", partition=0)
    table.set_from(b"acme/deleted", b"{}", partition=0)
    table.set_from(b"acme/deleted", None, partition=0)

    await table.on_recovery_completed({TP(topic, 1)}, set())  # this worker now has partition 1 only

    assert dict(table.items()) == {b"acme/kept": b"{}"}


def test_the_sweep_looks_only_at_partitions_this_worker_owns_now() -> None:
    """A standby copy of a partition this worker had before keeps its old event time here: sweeping
    it would write to the changelog partition its new owner writes."""
    svc = create_app(load_settings(topic_partitions=4))
    topic = svc.traces.changelog_topic.get_topic_name()
    recovery = SimpleNamespace(actives_for_table={svc.traces: {TP(topic, 1)}})
    clock = ExpiryClock(timedelta(hours=1))
    clock.saw(0, datetime(2026, 11, 20, 12, tzinfo=UTC))
    clock.saw(1, datetime(2026, 11, 20, 12, tzinfo=UTC))
    due = owned(recovery, svc.traces, clock)  # type: ignore[arg-type]
    earlier = datetime(2026, 11, 20, 11, tzinfo=UTC)
    assert due(1, earlier) and not due(0, earlier)
    assert not owned(recovery, svc.claims, clock)(1, earlier)  # type: ignore[arg-type]  # no claims partition


def test_a_table_counts_its_keys_on_the_partitions_asked_for() -> None:
    svc = create_app(load_settings(topic_partitions=4))
    table = svc.claims
    for key, partition in ((b"a", 0), (b"b", 1), (b"c", 1), (b"d", 3)):
        table.set_from(key, b"{}", partition)
    table.set_from(b"c", None, 1)
    assert (table.keys_on({1}), table.keys_on({0, 3}), table.keys_on(set())) == (1, 2, 0)
