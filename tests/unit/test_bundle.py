"""Bundles on the internal topics (`stages.bundle` / `unbundle`): order, partitions, size cap."""

from __future__ import annotations

import pytest

from streams.stages import InputRecord, Record
from streams.stages.common import bundle, unbundle

INTERNAL = frozenset({"responses", "claims"})


def _message(topic: str, partition: int, n: int) -> Record:
    return Record(topic, b"k", b'{"n":%d}' % n, partition=partition)


def test_one_record_per_topic_and_partition_in_order() -> None:
    records = [
        Record("scored", b"t1", b"out-1"),
        _message("responses", 0, 1),
        _message("claims", 1, 2),
        _message("responses", 1, 3),
        Record("scored", b"t2", b"out-2"),
        _message("responses", 0, 4),
    ]
    bundled = bundle(records, INTERNAL, max_bytes=1 << 20)
    assert [r.value for r in bundled[:2]] == [b"out-1", b"out-2"]  # other topics: as they were
    by_place = {(r.topic, r.partition): r.value for r in bundled[2:]}
    assert by_place == {
        ("responses", 0): b'{"n":1}\n{"n":4}',
        ("claims", 1): b'{"n":2}',
        ("responses", 1): b'{"n":3}',
    }
    assert len(bundled) == 5


def test_unbundle_gives_back_every_message_with_the_bundles_coordinates() -> None:
    records = [_message("responses", 2, n) for n in range(7)]
    (one,) = bundle(records, INTERNAL, max_bytes=1 << 20)
    consumed = InputRecord(one.topic, 2, 41, 1.5, one.value)
    parts = unbundle(consumed)
    assert [p.value for p in parts] == [r.value for r in records]
    assert {(p.topic, p.partition, p.offset, p.timestamp) for p in parts} == {("responses", 2, 41, 1.5)}


def test_a_single_message_and_an_empty_record_are_their_own_bundle() -> None:
    single = InputRecord("responses", 0, 1, 0.0, b'{"n":1}')
    assert unbundle(single) == [single]
    empty = InputRecord("responses", 0, 2, 0.0, None)
    assert unbundle(empty) == [empty]


def test_bundles_stay_under_the_byte_cap_and_keep_order() -> None:
    records = [_message("responses", 0, n) for n in range(100)]  # 8-9 bytes each
    bundled = bundle(records, INTERNAL, max_bytes=50)
    assert all(len(r.value) <= 50 for r in bundled)
    assert len(bundled) > 1
    values = [part for r in bundled for part in r.value.split(b"\n")]
    assert values == [r.value for r in records]


def test_a_message_larger_than_the_cap_travels_alone() -> None:
    big = Record("responses", b"k", b"x" * 100, partition=0)
    bundled = bundle([_message("responses", 0, 1), big, _message("responses", 0, 2)], INTERNAL, max_bytes=50)
    assert [r.value for r in bundled] == [b'{"n":1}', b"x" * 100, b'{"n":2}']


def test_an_internal_record_without_a_partition_is_refused() -> None:
    with pytest.raises(ValueError, match="explicit partition"):
        bundle([Record("responses", b"k", b"{}")], INTERNAL, max_bytes=1 << 20)
