"""What pydantic costs the stages per input event, and what msgspec Structs would cost instead.

A projection for a decision, not a change (eleventh round, docs/DECISIONS.md): `python -m
bench.codec_projection` (needs the dev extra's msgspec; not part of `make bench`).

It runs the four stages once over the pipeline benchmark's mix (`bench/stages.py`) while counting,
per model class, the encodes (`model_dump_json`), decodes (`model_validate_json`), copies
(`model_copy`), dict dumps (`model_dump`) and constructions, and keeping up to 200 samples of each.
Then it times each operation on the samples with pydantic and with a msgspec Struct generated from
the model's fields (same names, types and defaults; no validators), and weighs the times by the calls
per input event. Input validation (`streams.decode`) is left out: it stays pydantic either way (the
contract's JSON Schemas and error messages come from those models). Timed in a loop over warm
samples, both sides are cheaper than inside the stages, where py-spy finds pydantic at about a third
of the stages' samples.
"""

from __future__ import annotations

import datetime
import time
import types
import typing
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import msgspec
from pydantic import AwareDatetime, BaseModel
from rich.console import Console
from rich.table import Table

import streams.events
from bench.mix import build_mix
from bench.pipeline import MIX_EVENTS, MIX_TRACES
from bench.stages import _Pipeline
from streams.cli import tune_gc
from streams.config import load_settings

SAMPLES = 200
Operation = str  # "encode", "decode", "copy", "dump", "construct"


class _Recorder:
    """Counts pydantic operations per (operation, class) and keeps samples to time them on later."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[Operation, type[BaseModel]]] = Counter()
        self.samples: dict[tuple[Operation, type[BaseModel]], list[Any]] = defaultdict(list)

    def note(self, operation: Operation, cls: type[BaseModel], sample: Any) -> None:
        self.calls[operation, cls] += 1
        kept = self.samples[operation, cls]
        if len(kept) < SAMPLES:
            kept.append(sample)

    def install(self) -> Callable[[], None]:
        """Wrap BaseModel's methods (after every model class exists); returns the undo."""
        originals = {
            name: BaseModel.__dict__[name]
            for name in ("__init__", "model_dump_json", "model_validate_json", "model_copy", "model_dump")
        }
        recorder = self

        def init(self: BaseModel, /, **data: Any) -> None:
            recorder.note("construct", type(self), data)
            originals["__init__"](self, **data)

        def dump_json(self: BaseModel, **kwargs: Any) -> str:
            recorder.note("encode", type(self), self)
            return originals["model_dump_json"](self, **kwargs)  # type: ignore[no-any-return]

        def validate_json(cls: type[BaseModel], data: Any, **kwargs: Any) -> BaseModel:
            recorder.note("decode", cls, data)
            return originals["model_validate_json"].__func__(cls, data, **kwargs)  # type: ignore[no-any-return]

        def copy(self: BaseModel, *, update: dict[str, Any] | None = None, deep: bool = False) -> BaseModel:
            recorder.note("copy", type(self), (self, dict(update or {})))
            return originals["model_copy"](self, update=update, deep=deep)  # type: ignore[no-any-return]

        def dump(self: BaseModel, **kwargs: Any) -> dict[str, Any]:
            recorder.note("dump", type(self), self)
            return originals["model_dump"](self, **kwargs)  # type: ignore[no-any-return]

        BaseModel.__init__ = init  # type: ignore[method-assign]
        BaseModel.model_dump_json = dump_json  # type: ignore[method-assign,assignment]
        BaseModel.model_validate_json = classmethod(validate_json)  # type: ignore[method-assign,assignment]
        BaseModel.model_copy = copy  # type: ignore[method-assign,assignment]
        BaseModel.model_dump = dump  # type: ignore[method-assign,assignment]

        def undo() -> None:
            for name, original in originals.items():
                setattr(BaseModel, name, original)

        return undo


class _Twins:
    """msgspec Structs with the fields of pydantic models (nested models become nested Structs)."""

    def __init__(self) -> None:
        self._made: dict[type[BaseModel], type[msgspec.Struct]] = {}

    def of(self, cls: type[BaseModel]) -> type[msgspec.Struct]:
        if cls not in self._made:
            required: list[tuple[str, Any]] = []
            optional: list[tuple[str, Any, Any]] = []
            for name, info in cls.model_fields.items():
                kind = self._type(info.annotation)
                if info.is_required():
                    required.append((name, kind))
                elif info.default_factory is not None:
                    optional.append((name, kind, msgspec.field(default_factory=info.default_factory)))  # type: ignore[arg-type]
                else:
                    optional.append((name, kind, info.default))
            self._made[cls] = msgspec.defstruct(f"{cls.__name__}Struct", [*required, *optional], frozen=True)
        return self._made[cls]

    def value(self, value: Any) -> Any:
        """`value` with every pydantic model in it converted to its twin."""
        if isinstance(value, BaseModel):
            return msgspec.convert(value.model_dump(mode="json"), self.of(type(value)), strict=False)
        if isinstance(value, list | tuple):
            return type(value)(self.value(v) for v in value)
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        return value

    def _type(self, kind: Any) -> Any:
        if kind is AwareDatetime:
            return datetime.datetime
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            return self.of(kind)
        origin, args = typing.get_origin(kind), typing.get_args(kind)
        if origin is None or origin is typing.Literal:
            return kind
        if origin is typing.Annotated:
            return self._type(args[0])
        if origin in (typing.Union, types.UnionType):
            return typing.Union[tuple(self._type(a) for a in args)]  # noqa: UP007 (built from a tuple)
        if origin is tuple and args[-1] is Ellipsis:
            return tuple[self._type(args[0]), ...]  # type: ignore[misc]
        return origin[tuple(self._type(a) for a in args)]


def _best_us(operation: Callable[[], object], count: int) -> float:
    """Microseconds per item: the fastest of five passes over the samples."""
    passes = []
    for _ in range(5):
        began = time.perf_counter()
        operation()
        passes.append(time.perf_counter() - began)
    return min(passes) / count * 1e6


def _timed(
    operation: Operation, cls: type[BaseModel], samples: list[Any], twins: _Twins
) -> tuple[float, float]:
    """(pydantic, msgspec) microseconds per call of `operation` on `samples`."""
    twin = twins.of(cls)
    count = len(samples)
    if operation == "encode":
        structs = [twins.value(model) for model in samples]
        encoder = msgspec.json.Encoder()
        return _best_us(lambda: [m.model_dump_json() for m in samples], count), _best_us(
            lambda: [encoder.encode(s) for s in structs], count
        )
    if operation == "decode":
        decoder = msgspec.json.Decoder(twin)
        return _best_us(lambda: [cls.model_validate_json(raw) for raw in samples], count), _best_us(
            lambda: [decoder.decode(raw) for raw in samples], count
        )
    if operation == "copy":
        pairs = [(twins.value(model), twins.value(update)) for model, update in samples]
        return _best_us(lambda: [m.model_copy(update=u) for m, u in samples], count), _best_us(
            lambda: [msgspec.structs.replace(s, **u) for s, u in pairs], count
        )
    if operation == "dump":
        structs = [twins.value(model) for model in samples]
        return _best_us(lambda: [m.model_dump(mode="json") for m in samples], count), _best_us(
            lambda: [msgspec.to_builtins(s) for s in structs], count
        )
    fields = [twins.value(data) for data in samples]
    return _best_us(lambda: [cls(**data) for data in samples], count), _best_us(
        lambda: [twin(**data) for data in fields], count
    )


def main() -> None:
    settings = load_settings()
    tune_gc(settings.gc_gen0_threshold)
    mix = build_mix(MIX_EVENTS, MIX_TRACES)
    recorder = _Recorder()
    undo = recorder.install()
    try:
        _Pipeline(settings).run(mix)
    finally:
        undo()
    events = len(mix.records)
    twins = _Twins()
    rows: list[tuple[str, float, float, float, bool]] = []
    for (operation, cls), samples in recorder.samples.items():
        if cls.__module__.startswith("pydantic_settings") or cls.__name__ == "Settings":
            continue
        pydantic_us, msgspec_us = _timed(operation, cls, samples, twins)
        per_event = recorder.calls[operation, cls] / events
        contract = cls.__module__ == streams.events.__name__
        rows.append((f"{operation} {cls.__name__}", per_event, pydantic_us, msgspec_us, contract))
    rows.sort(key=lambda row: -row[1] * (row[2] - row[3]))

    table = Table(
        title=f"pydantic operations of the four stages per input event ({events:,} mix events), timed on "
        "samples against msgspec Structs with the same fields; top 25 by the time they would save"
    )
    for column in (
        "operation and class",
        "calls per event",
        "pydantic us",
        "msgspec us",
        "us per event saved",
    ):
        table.add_column(column, justify="left" if column.startswith("operation") else "right")
    for name, per_event, pydantic_us, msgspec_us, contract in rows[:25]:
        mark = " (contract)" if contract else ""
        saved = per_event * (pydantic_us - msgspec_us)
        table.add_row(
            name + mark, f"{per_event:.2f}", f"{pydantic_us:.2f}", f"{msgspec_us:.2f}", f"{saved:.2f}"
        )

    def total(selected: list[tuple[str, float, float, float, bool]]) -> tuple[float, float]:
        return sum(r[1] * r[2] for r in selected), sum(r[1] * r[3] for r in selected)

    for label, selected in (
        ("every class (input validation excluded)", rows),
        ("without the contract's (streams/events.py: inputs, outputs)", [r for r in rows if not r[4]]),
    ):
        pydantic_total, msgspec_total = total(selected)
        table.add_row(
            f"total: {label}",
            "",
            f"{pydantic_total:.1f} per event",
            f"{msgspec_total:.1f} per event",
            f"{pydantic_total - msgspec_total:.1f}",
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # a log or a pipe: one line per row
    console.print(table)


if __name__ == "__main__":
    main()
