"""schemas/examples: each example is valid against its JSON Schema and decoded by the service's decoder."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from streams.decode import decode
from streams.dlq import DeadLetter
from streams.producer import INPUT_MODELS, encode, event_type_of

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "schemas" / "examples").glob("*.json"))
# event_type -> its model, from the service's input union: a new input type needs no change here.
MODEL_BY_TYPE = {event_type_of(model): model for model in INPUT_MODELS}
LIMITS = (1_000_000, 100_000)  # the service's default MAX_EVENT_BYTES, MAX_ARRAY_ITEMS


def _validator(event_type: str) -> Draft202012Validator:
    schema = json.loads((ROOT / "schemas" / f"{MODEL_BY_TYPE[event_type].__name__}.schema.json").read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _load(path: pathlib.Path) -> dict[str, Any]:
    example: dict[str, Any] = json.loads(path.read_text())
    return example


def test_every_input_type_has_an_example() -> None:
    assert {p.stem for p in EXAMPLES} == set(MODEL_BY_TYPE), (
        "one schemas/examples/<EVENT_TYPE>.json per input type"
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_matches_its_schema_and_decodes(path: pathlib.Path) -> None:
    example = _load(path)
    assert example["event_type"] == path.stem, "file named after its event_type"
    _validator(path.stem).validate(example)

    decoded = decode(path.read_bytes(), *LIMITS)
    assert isinstance(decoded, MODEL_BY_TYPE[path.stem]), decoded
    # What the producer kit would send for it decodes to the same event.
    assert decode(encode(decoded), *LIMITS) == decoded


def _drop_trace_id(e: dict[str, Any]) -> None:
    del e["trace_id"]


def _string_version(e: dict[str, Any]) -> None:
    e["schema_version"] = "1"


def _unknown_version(e: dict[str, Any]) -> None:
    e["schema_version"] = 2


def _numeric_tenant(e: dict[str, Any]) -> None:
    e["tenant_id"] = 7


def _empty_event_id(e: dict[str, Any]) -> None:
    e["event_id"] = ""


MUTATIONS = [_drop_trace_id, _string_version, _unknown_version, _numeric_tenant, _empty_event_id]


@pytest.mark.parametrize("mutate", MUTATIONS, ids=lambda m: m.__name__.lstrip("_"))
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_mutated_example_is_rejected_by_schema_and_decoder(path: pathlib.Path, mutate: Any) -> None:
    example = _load(path)
    mutate(example)
    assert list(_validator(path.stem).iter_errors(example)), "the JSON Schema accepted a broken event"
    assert isinstance(decode(json.dumps(example).encode(), *LIMITS), DeadLetter)
