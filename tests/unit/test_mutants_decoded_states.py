"""Mutation review (thirty-second round): what the sweep-index and decoded-states tests left open in
streams/decoded_states.py."""

from __future__ import annotations

from datetime import timedelta

from streams.decoded_states import ClaimFacts, DecodedStates
from streams.scoring.claim_graph import ClaimNode, neighbour_facts
from streams.scoring.claims import ClaimsConfig
from tests.unit.test_claim_graph import define
from tests.unit.test_sweep_index import T0, Value, _passed_at, _sweep_after


def test_a_key_deleted_swept_and_written_again_with_the_same_moment_is_due_again() -> None:
    """Mutation `forget` without `self._due.pop(key)`: the forgotten key kept its index entry, the
    sweep then popped its heap entry (the key was gone), and the same state written again (an input
    re-delivered after its state expired: same event time, same moment) was taken as "already in the
    heap": it never expired again."""
    table: dict[bytes, bytes] = {}
    states = DecodedStates(table, Value, sweep_after=_sweep_after)  # type: ignore[arg-type]
    key = b"0-a"
    table[key] = states.encode(key, Value(last=T0))
    late = _passed_at({0: T0 + timedelta(hours=2)})
    assert [k for k, _ in states.due(late)] == [key]
    del table[key]  # the sweep expired it: its tombstone, and the index forgets it
    states.forget(key)
    assert states.due(late) == []
    table[key] = states.encode(key, Value(last=T0))  # the same state again
    assert [k for k, _ in states.due(late)] == [key]


def test_a_key_revoked_swept_and_restored_with_the_same_value_is_due_again() -> None:
    """Mutation: the sweep does not `forget` a key it finds gone (`if raw is None: self.forget(key)`).
    Its index entry stayed while its heap entry was popped, so when the partition came back and the
    recovery restored the same value (same moment), the scan took it as "already in the heap": the
    restored state never expired."""
    table: dict[bytes, bytes] = {}
    states = DecodedStates(table, Value, sweep_after=_sweep_after)  # type: ignore[arg-type]
    key = b"0-a"
    stored = states.encode(key, Value(last=T0))
    table[key] = stored
    late = _passed_at({0: T0 + timedelta(hours=2)})
    assert states.due(_passed_at({0: T0})) == []  # a sweep before: not due yet (the start's scan done)
    del table[key]  # its partition revoked: the table drops it without forget()
    assert states.due(late) == []
    table[key] = bytes(bytearray(stored))  # assigned here again: the changelog restores the same value
    states.restored()
    assert [k for k, _ in states.due(late)] == [key]


def _facts_of() -> tuple[ClaimFacts, dict[bytes, bytes], DecodedStates[ClaimNode]]:
    table: dict[bytes, bytes] = {}
    nodes = DecodedStates(table, ClaimNode)  # type: ignore[arg-type]
    return ClaimFacts(nodes, ClaimsConfig(), max_entries=2), table, nodes


def test_claim_facts_follow_a_node_replaced_without_the_worker_writing_it() -> None:
    """Mutation `hit[0] is raw` -> `True` in `ClaimFacts.get`: a node restored from the changelog (new
    bytes, no `forget` from the worker) kept its old facts, and its neighbours were scored with them."""
    facts, table, _ = _facts_of()
    table[b"x"] = ClaimNode(definition=define("x", conf=0.8)).model_dump_json().encode()
    before = facts.get(b"x")
    assert before is not None and before.tier == "task"
    table[b"x"] = ClaimNode(definition=define("x", conf=0.3, tier="project")).model_dump_json().encode()
    after = facts.get(b"x")
    assert after == neighbour_facts(
        ClaimNode(definition=define("x", conf=0.3, tier="project")), ClaimsConfig()
    )
    assert after is not None and after.tier == "project" and after != before


def test_claim_facts_keep_at_most_max_entries() -> None:
    """Mutation of the bound (`>=` -> `>` and beyond): the cache of facts outgrew `max_entries`."""
    facts, table, _ = _facts_of()
    for name in ("a", "b", "c", "d"):
        key = name.encode()
        table[key] = ClaimNode(definition=define(name)).model_dump_json().encode()
        assert facts.get(key) is not None
        assert len(facts._facts) <= 2


def test_the_sweep_index_stays_bounded_while_a_due_key_is_swept_and_another_rewritten() -> None:
    """A key rewritten with a later moment leaves its older heap entry behind; the heaps are rebuilt
    once they hold more than about twice the keys. Mutation: a due key put back into its heap not
    counted (`self._indexed += len(returned)` dropped): every sweep lowered the count by one, the
    rebuild never came, and the heaps grew by one entry per rewrite without bound."""
    table: dict[bytes, bytes] = {}
    states = DecodedStates(table, Value, sweep_after=_sweep_after)  # type: ignore[arg-type]
    table[b"0-due"] = states.encode(b"0-due", Value(last=T0))  # due at every sweep below (kept)
    swept = _passed_at({0: T0 + timedelta(hours=2)})
    for i in range(3_000):
        key = b"0-busy"
        table[key] = states.encode(key, Value(last=T0 + timedelta(days=1, seconds=i)))  # never due here
        assert [k for k, _ in states.due(swept)] == [b"0-due"]
    entries = sum(len(heap) for heap in states._moments.values())
    assert entries <= 2 * len(table) + 1024 + 1


def test_decoded_values_and_measured_encodings_are_kept_within_their_bounds() -> None:
    """Mutations of the two memory bounds: `_remember` keeping more than `max_entries` decoded values,
    `measure` keeping more than 64 encodings of values never written (rejected inputs)."""
    table: dict[bytes, bytes] = {}
    states = DecodedStates(table, Value, max_entries=3)  # type: ignore[arg-type]
    for i in range(10):
        key = f"0-{i}".encode()
        table[key] = Value(last=T0).model_dump_json().encode()
        assert states.load(key) == Value(last=T0)
        assert len(states._decoded) <= 3
    assert list(states._decoded) == [b"0-7", b"0-8", b"0-9"]  # the oldest went first
    for i in range(200):
        states.measure(f"0-m{i}".encode(), Value(last=T0))
        assert len(states._measured) <= 64
