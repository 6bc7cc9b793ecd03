"""Table writes queue their changelog record as it will be sent: the key's source partition, raw bytes."""

from __future__ import annotations

import pytest

from streams.app import create_app
from streams.batch_send import Outgoing
from streams.config import load_settings


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
