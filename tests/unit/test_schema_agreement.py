"""The published JSON Schemas and the decoder agree on edge cases a producer in another language meets.

DESIGN section 2: the schemas are for producers in other languages. An event that a producer validated
against its schema must not be dead-lettered for a rule the schema does not state, and the output
schemas must say which fields every output carries.
"""

from __future__ import annotations

import itertools
import json
import pathlib
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from streams.decode import decode
from streams.dlq import DeadLetter

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIMITS = (1_000_000, 100_000)
ABSENT = object()


def _validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads((ROOT / "schemas" / f"{name}.schema.json").read_text()))


def _example(event_type: str) -> dict[str, Any]:
    example: dict[str, Any] = json.loads((ROOT / "schemas" / "examples" / f"{event_type}.json").read_text())
    return example


def _decoded(doc: dict[str, Any]) -> Any:
    return decode(json.dumps(doc).encode(), *LIMITS)


# Each of an OUTCOME's subject and verdict fields absent, null or given: 81 combinations.
OUTCOME_FIELDS = {"subject_event_id": "resp-1", "claim_id": "claim-1", "correct": True, "score": 0.5}
OUTCOME_CASES = list(itertools.product((ABSENT, None, "value"), repeat=len(OUTCOME_FIELDS)))


@pytest.mark.parametrize(
    "case", OUTCOME_CASES, ids=lambda c: "-".join("a" if v is ABSENT else str(v) for v in c)
)
def test_an_outcome_is_valid_for_its_schema_exactly_when_the_decoder_accepts_it(
    case: tuple[Any, ...],
) -> None:
    doc = _example("OUTCOME")
    for (name, value), choice in zip(OUTCOME_FIELDS.items(), case, strict=True):
        doc.pop(name, None)
        if choice is not ABSENT:
            doc[name] = None if choice is None else value
    decoded = _decoded(doc)
    accepted = not isinstance(decoded, DeadLetter)
    assert _validator("OutcomeEvent").is_valid(doc) == accepted, getattr(decoded, "message", decoded)


@pytest.mark.parametrize(
    ("field", "value", "read_as"),
    [
        ("result_count", 3.0, 3),
        ("factors_found", 4.0, 4),
        ("schema_version", 1.0, 1),
        ("result_count", 3.5, None),
        ("factors_found", 5.0, None),
        ("schema_version", 2.0, None),
        ("schema_version", True, None),
        ("result_count", True, None),  # a boolean is no whole number
        ("result_count", -1, None),  # the bound stays in the schema ("minimum", not pydantic's "ge")
        ("result_count", -1.0, None),
    ],
)
def test_an_integer_written_with_a_zero_fraction_is_that_integer(
    field: str, value: Any, read_as: int | None
) -> None:
    """JSON Schema's "integer" is any number without a fraction: 3.0 is valid there."""
    doc = {**_example("TOOL_INVOCATION"), "tool": "discovery", field: value}
    decoded = _decoded(doc)
    assert _validator("ToolInvocation").is_valid(doc) == (read_as is not None)
    if read_as is None:
        assert isinstance(decoded, DeadLetter)
    else:
        assert not isinstance(decoded, DeadLetter), decoded.message
        assert getattr(decoded, field) == read_as and type(getattr(decoded, field)) is int


@pytest.mark.parametrize(
    ("timestamp", "valid"),
    [
        ("1900-01-01T00:00:00+01:00", True),  # 1899 in UTC: the year is the one written
        ("1900-01-01T00:00:00Z", True),
        ("8999-12-31T23:59:59-05:00", True),  # 9000 in UTC
        ("1899-12-31T23:59:59Z", False),
        ("1899-12-31T23:59:59-01:00", False),  # 1900 in UTC
        ("9000-01-01T00:00:00Z", False),
        ("9999-12-31T23:59:59Z", False),
        ("2026-11-22T12:00:00", False),  # no zone: a validator that skips "format" saw no problem
        ("2026-11-22 12:00:00.5+05:30", True),
        ("2026-11-22t12:00:00z", True),  # RFC 3339 allows lower-case "t" and "z"; the decoder reads them
        ("2026-11-22T12:00:00Zjunk", False),
        # Field by field out of range (a day past its month's end, 2026-02-30, is beyond a pattern).
        ("2026-13-01T00:00:00Z", False),
        ("2026-11-22T24:00:00Z", False),
        ("2026-11-22T12:60:00Z", False),
        ("2026-11-22T12:00:00+24:00", False),
        ("2026-11-22T12:00:00+23:60", False),
        # Read as +06:00 and +01:00 before (an hour off what was written); the schema refused them.
        ("2026-11-22T12:00:00+05:60", False),
        ("2026-11-22T12:00:00+00:60", False),
        ("2026-11-22T23:59:60Z", True),  # RFC 3339's leap second
        ("2026-11-22T12:00:00-23:59", True),
    ],
)
def test_the_timestamp_year_bound_is_in_the_schema(timestamp: str, valid: bool) -> None:
    for event_type, name in (("TOOL_INVOCATION", "ToolInvocation"), ("CLAIM", "ClaimEvent")):
        doc = {**_example(event_type), "timestamp": timestamp}
        assert _validator(name).is_valid(doc) == valid, event_type
        decoded = _decoded(doc)
        assert isinstance(decoded, DeadLetter) != valid, event_type
        if not valid and timestamp.startswith(("18", "9")):
            assert decoded.reason == "out_of_range"


@pytest.mark.parametrize(
    "name", ["ResponseScored", "TraceScored", "ClaimScored", "SynthesisScored", "CalibrationUpdated"]
)
def test_an_output_schema_requires_every_field_an_output_carries(name: str) -> None:
    """Outputs are dumped whole, nulls and defaults included (DESIGN 3: every output has its event_type)."""
    schema = json.loads((ROOT / "schemas" / f"{name}.schema.json").read_text())
    objects = [schema, *schema.get("$defs", {}).values()]
    assert "event_type" in schema["required"]
    for obj in objects:
        if "properties" in obj:
            assert sorted(obj["required"]) == sorted(obj["properties"]), obj.get("title")
