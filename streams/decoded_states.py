"""Table values as pydantic models: decoded once and reused while the table holds the same bytes,
with the expiry sweep's index of when each key is due, and claim nodes' neighbour facts."""

from __future__ import annotations

import heapq
import logging
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from streams.scoring.claim_graph import ClaimNode, NeighbourFacts, neighbour_facts
from streams.scoring.claims import ClaimsConfig

if TYPE_CHECKING:  # streams.app imports the stages, which import this module
    from streams.app import SourcePartitionedTable

__all__ = ["ClaimFacts", "DecodedStates", "SweepAfter", "UndecodableState", "decode_stored"]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


class UndecodableState(ValueError):
    """A stored value that does not validate as its table's model (written by another version of
    this code, or by something other than a worker). Its text names the table, never the value."""


def decode_stored(model: type[M], raw: bytes, table: str) -> M:
    """`raw` as `model`, or UndecodableState naming the table and the first error (never the value)."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.error_count()
        raise UndecodableState(
            f"a stored value of table {table} is not a valid {model.__name__} "
            f"({errors} validation error{'s' * (errors != 1)}, the first at {_location(exc)})"
        ) from None


SweepAfter = Callable[[bytes, M], tuple[int, datetime] | None]


def _encode_json(value: BaseModel) -> bytes:
    return value.model_dump_json().encode()


class DecodedStates(Generic[M]):
    """A table's values as models: decoded once, reused while the table still holds the same bytes.

    Each input loads several states (a claim input about 40 nodes) and pydantic's `validate_json` was
    most of the claim stage's time. The memory store returns the very bytes object that was written,
    so an identity check tells whether the cached model is still current (a restore or another
    writer leaves new bytes and the value is decoded again). Bounded: oldest entries are dropped.

    With `sweep_after` it also indexes, per key, the (partition, event time) before which the expiry
    sweep need not look at the value: one min-heap of (event time, key) per partition, so a sweep pops
    the keys that are due instead of visiting every key (at 300k calibration scores, a 1 s sweep
    interval spent a third of the worker's time walking the table). Values enter the index when
    written through `encode`; values restored from the changelog enter it by a full scan after each
    recovery (`restored`), the only other way values reach these tables.
    """

    def __init__(
        self,
        table: SourcePartitionedTable,
        model: type[M],
        max_entries: int = 1024,
        sweep_after: SweepAfter[M] | None = None,
        encoder: Callable[[M], bytes] | None = None,
        on_undecodable: Callable[[str], None] | None = None,
    ) -> None:
        self.table = table
        self.name = str(getattr(table, "name", model.__name__))
        self.on_undecodable = on_undecodable  # called with the table's name when the sweep skips a value
        self.model = model
        self.encoder = encoder or _encode_json
        self.max_entries = max_entries
        self.sweep_after = sweep_after
        self._decoded: OrderedDict[bytes, tuple[bytes, M]] = OrderedDict()
        self._measured: dict[bytes, tuple[M, bytes]] = {}  # key -> (value, its encoding): `measure`
        # key -> (the bytes it was computed from, when the sweep must look again); every indexed key.
        self._due: dict[bytes, tuple[bytes, tuple[int, datetime] | None]] = {}
        # partition -> heap of (sweep moment, key). An entry counts only while `_due` holds the same
        # moment for its key; older ones (the key was rewritten or forgotten) are dropped when popped.
        self._moments: dict[int, list[tuple[datetime, bytes]]] = {}
        self._indexed = 0  # entries in all heaps, current or not
        self._scan_needed = True  # the table may hold values the index has not seen (start, restore)
        self._sweeping = False  # inside `due`: its loop holds the heaps, so no rebuild meanwhile
        if sweep_after is not None and hasattr(table, "on_recover"):
            table.on_recover(self._on_recover)

    async def _on_recover(self) -> None:
        self.restored()

    def restored(self) -> None:
        """Values entered the table without `encode` (a changelog recovery): index them on the next sweep."""
        self._scan_needed = True

    def load(self, key: bytes) -> M | None:
        raw = self.table.get(key)
        if raw is None:
            self.forget(key)
            return None
        return self._model(key, raw)

    def stored_bytes(self, key: bytes) -> int:
        """Size of the value stored for `key`; 0 if none."""
        raw = self.table.get(key)
        return 0 if raw is None else len(raw)

    def measure(self, key: bytes, value: M) -> int:
        """Size of `value` encoded; the encoding is kept in case `value` is the one written next."""
        raw = self.encoder(value)
        self._measured[key] = (value, raw)
        if len(self._measured) > 64:  # values measured but never written (rejected inputs)
            self._measured.clear()
        return len(raw)

    def encode(self, key: bytes, value: M) -> bytes:
        """The bytes to write for `value` (remembered with it, so the next load skips decoding)."""
        measured = self._measured.pop(key, None)
        raw = measured[1] if measured is not None and measured[0] is value else self.encoder(value)
        self._remember(key, raw, value)
        if self.sweep_after is not None:
            self._note_due(key, raw, value)
        return raw

    def forget(self, key: bytes) -> None:
        """Drop `key` (its state left the table)."""
        self._decoded.pop(key, None)
        self._due.pop(key, None)
        self._measured.pop(key, None)

    def due(self, passed: Callable[[int, datetime], bool]) -> list[tuple[bytes, M]]:
        """The keys whose sweep moment `passed`, decoded; the others are not looked at.

        A key stays due (and is returned again by the next sweep) until it is rewritten or forgotten.
        """
        if self._scan_needed:
            self._scan()
        due: list[tuple[bytes, M]] = []
        self._sweeping = True
        try:
            self._pop_due(passed, due)
        finally:
            self._sweeping = False
        if self._indexed > 2 * len(self._due) + 1024:
            self._rebuild()
        return due

    def _pop_due(self, passed: Callable[[int, datetime], bool], due: list[tuple[bytes, M]]) -> None:
        """Append to `due` each current entry whose moment passed; put those entries back in their heap."""
        seen: set[bytes] = set()
        # A snapshot: re-indexing a value written outside `encode` may add a partition's heap.
        for partition, heap in list(self._moments.items()):
            returned: list[tuple[datetime, bytes]] = []
            while heap and passed(partition, heap[0][0]):
                moment, key = heapq.heappop(heap)
                self._indexed -= 1
                known = self._due.get(key)
                if known is None or known[1] != (partition, moment) or key in seen:
                    continue  # rewritten (a newer entry exists), forgotten, or a copy (moment A, B, A)
                seen.add(key)
                raw = self.table.get(key)
                if raw is None:  # left with a revoked partition
                    self.forget(key)
                elif raw is not known[0]:  # not written through encode: index what is there now
                    del self._due[key]  # its heap entry is gone: push the new moment even if equal
                    self._index(key, raw)
                    seen.discard(key)  # and if that moment passed too, pop it in this sweep
                else:
                    try:
                        due.append((key, self._model(key, raw)))
                    except UndecodableState as exc:  # written here, yet no longer valid: never raise
                        self._skip(key, raw, exc)
                        continue
                    returned.append((moment, key))
            for entry in returned:
                heapq.heappush(heap, entry)
            self._indexed += len(returned)

    def _scan(self) -> None:
        """Index every value the table holds that was not written through `encode`; drop keys gone."""
        for key, raw in list(self.table.items()):
            known = self._due.get(key)
            if known is None or known[0] is not raw:
                self._index(key, raw)
        if len(self._due) > len(self.table):
            self._due = {key: value for key, value in self._due.items() if key in self.table}
        self._scan_needed = False

    def _index(self, key: bytes, raw: bytes) -> None:
        """Index a value that entered the table without `encode`. One the sweep cannot read (it does
        not validate, or its key or times do not compute a sweep moment) is skipped instead of raising
        at every tick, which would crash the worker after each restart and restore."""
        assert self.sweep_after is not None, "the sweep index needs sweep_after"
        try:
            value = self._model(key, raw)
            where = self.sweep_after(key, value)
            if where is not None and where[1].tzinfo is None:  # would raise in the heap and the clock
                raise TypeError("a sweep moment without a time zone")
        except _UNREADABLE as exc:
            self._skip(key, raw, exc)
            return
        self._note_moment(key, raw, where)

    def _skip(self, key: bytes, raw: bytes, exc: Exception) -> None:
        """Leave the value where it is, out of the sweep until rewritten; log and count it."""
        log.error("the sweep skips key %r of table %s: %s: %s", key, self.name, type(exc).__name__, exc)
        self._due[key] = (raw, None)
        if self.on_undecodable is not None:
            self.on_undecodable(self.name)

    def _model(self, key: bytes, raw: bytes) -> M:
        hit = self._decoded.get(key)
        if hit is not None and hit[0] is raw:
            return hit[1]
        # An input that needs a value it cannot decode is dead-lettered with UndecodableState (guard).
        value = decode_stored(self.model, raw, self.name)
        self._remember(key, raw, value)
        return value

    def _remember(self, key: bytes, raw: bytes, value: M) -> None:
        self._decoded[key] = (raw, value)
        self._decoded.move_to_end(key)
        while len(self._decoded) > self.max_entries:
            self._decoded.popitem(last=False)

    def _note_due(self, key: bytes, raw: bytes, value: M) -> None:
        assert self.sweep_after is not None, "the sweep index needs sweep_after"
        self._note_moment(key, raw, self.sweep_after(key, value))

    def _note_moment(self, key: bytes, raw: bytes, where: tuple[int, datetime] | None) -> None:
        previous = self._due.get(key)
        self._due[key] = (raw, where)
        if where is None or (previous is not None and previous[1] == where):
            return  # never due, or already in the heap with this moment
        heapq.heappush(self._moments.setdefault(where[0], []), (where[1], key))
        self._indexed += 1
        if self._indexed > 2 * len(self._due) + 1024 and not self._sweeping:  # mostly superseded: rebuild
            self._rebuild()

    def _rebuild(self) -> None:
        self._moments = {}
        for key, (_, where) in self._due.items():
            if where is not None:
                self._moments.setdefault(where[0], []).append((where[1], key))
        for heap in self._moments.values():
            heapq.heapify(heap)
        self._indexed = sum(len(heap) for heap in self._moments.values())


# What a value written by something other than this code can raise while the sweep indexes it: it does
# not validate (UndecodableState), its key is not JSON, or its times overflow or are naive.
_UNREADABLE = (ValueError, TypeError, OverflowError, LookupError)


def _location(exc: ValidationError) -> str:
    """Where the first error is ("." joined path), without the offending input value."""
    first = exc.errors(include_input=False, include_url=False)[0]
    return ".".join(str(part) for part in first["loc"]) or "the top level"


class ClaimFacts:
    """`neighbour_facts` of stored claim nodes, kept for many more claims than `DecodedStates` keeps nodes.

    A claim's score reads every claim that supports or contradicts it, so a new supporter of a claim
    with n supporters reads n nodes. Decoding them (the node cache holds 1,024) cost 85 ms per input at
    2,000 supporters; a facts tuple is small, and is computed again only when its node's bytes change
    (the same identity check as `DecodedStates`; the worker also drops an entry when it writes the node).
    """

    def __init__(self, nodes: DecodedStates[ClaimNode], cfg: ClaimsConfig, max_entries: int = 32_768) -> None:
        self.nodes = nodes
        self.cfg = cfg
        self.max_entries = max_entries
        self._facts: dict[bytes, tuple[bytes, NeighbourFacts | None]] = {}

    def get(self, key: bytes) -> NeighbourFacts | None:
        raw = self.nodes.table.get(key)
        if raw is None:
            self._facts.pop(key, None)
            return None
        hit = self._facts.get(key)
        if hit is not None and hit[0] is raw:
            return hit[1]
        facts = neighbour_facts(self.nodes.load(key), self.cfg)
        if hit is None and len(self._facts) >= self.max_entries:
            del self._facts[next(iter(self._facts))]  # the oldest entry
        self._facts[key] = (raw, facts)
        return facts

    def forget(self, key: bytes) -> None:
        self._facts.pop(key, None)
