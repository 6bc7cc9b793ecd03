"""The committed JSON Schemas against DESIGN sections 2 and 3, field by field.

Producers and consumers in other languages read `schemas/`, which `make schemas` regenerates from the
models and `test_schemas_are_current` keeps equal to them. So a model change regenerated into the
schemas passes that test whatever it changed. The contract's own lists, transcribed here from
DESIGN.md, are what such a change must not break: every field it names is there, with the enum
values, constants, nullability and defaults it gives.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

SCHEMAS = pathlib.Path(__file__).resolve().parents[2] / "schemas"

# DESIGN 2, "Common fields" (of LLM_RESPONSE, TOOL_INVOCATION and CLAIM).
INPUT_COMMON = {
    "event_id",
    "event_type",
    "timestamp",
    "tenant_id",
    "trace_id",
    "agent_name",
    "agent_type",
    "schema_version",
}
# DESIGN 2, one list per input type.
INPUT_FIELDS = {
    "LlmResponse": {
        "request_id",
        "model",
        "endpoint",
        "role",
        "sub_call_id",
        "subtask",
        "query",
        "response",
        "token_logprobs",
        "retrieval",
        "code_validation",
    },
    "ToolInvocation": {
        "tool",
        "target",
        "phase",
        "status",
        "result_count",
        "factors_found",
        "build_passed",
        "tests_passed",
        "complete",
    },
    "ClaimEvent": {
        "claim_id",
        "statement",
        "source_id",
        "provenance",
        "tier",
        "staleness_at",
        "relationships",
        "derived_from",
        "assessed_upper",
        "instance_trust",
    },
}
EVENT_TYPES = {
    "LlmResponse": "LLM_RESPONSE",
    "ToolInvocation": "TOOL_INVOCATION",
    "ClaimEvent": "CLAIM",
    "ResponseScored": "RESPONSE_SCORED",
    "TraceScored": "TRACE_SCORED",
    "ClaimScored": "CLAIM_SCORED",
    "SynthesisScored": "SYNTHESIS_SCORED",
}
# DESIGN 3: "Outputs carry source_event_id, trace_id, tenant_id, scored_at, and event_type", and their
# own event_id.
OUTPUT_COMMON = {"event_id", "source_event_id", "trace_id", "tenant_id", "scored_at", "event_type"}
OUTPUT_FIELDS = {
    "ResponseScored": {
        "confidence",
        "heuristic",
        "composite",
        "action",
        "flags",
        "response",
        "error",
        "metadata",
    },
    "TraceScored": {
        "score",
        "band",
        "categories",
        "weights",
        "convergence",
        "recovery_recommended",
        "should_stop",
        "recovery_attempts",
    },
    "ClaimScored": {"interval", "as_of"},
    "SynthesisScored": {"overall_confidence", "level", "sources", "conflicts", "warnings", "filtered_count"},
}


def _schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    return loaded


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """`node` with a local `$ref` followed, and a nullable `anyOf` reduced to its non-null branch."""
    while True:
        if "$ref" in node:
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
        elif "anyOf" in node:
            branches = [b for b in node["anyOf"] if b != {"type": "null"}]
            if len(branches) != 1:
                return node
            node = branches[0]
        else:
            return node


def _nullable(node: dict[str, Any]) -> bool:
    return {"type": "null"} in node.get("anyOf", [])


def _field(name: str, *path: str) -> dict[str, Any]:
    """The resolved schema of a field, `path` going into nested objects and array items."""
    schema = _schema(name)
    node: dict[str, Any] = schema
    for step in path:
        node = _resolve(schema, node)
        node = node["items"] if step == "[]" else node["properties"][step]
    return node


def _properties(name: str, *path: str) -> set[str]:
    return set(_resolve(_schema(name), _field(name, *path))["properties"])


@pytest.mark.parametrize("name", sorted(INPUT_FIELDS))
def test_every_input_field_design_lists_is_in_the_schema(name: str) -> None:
    assert INPUT_COMMON | INPUT_FIELDS[name] <= _properties(name)


@pytest.mark.parametrize("name", sorted(OUTPUT_FIELDS))
def test_every_output_field_design_lists_is_in_the_schema(name: str) -> None:
    assert OUTPUT_COMMON | OUTPUT_FIELDS[name] <= _properties(name)


@pytest.mark.parametrize(("name", "event_type"), sorted(EVENT_TYPES.items()))
def test_event_type_discriminates(name: str, event_type: str) -> None:
    assert _field(name, "event_type")["const"] == event_type


@pytest.mark.parametrize("name", sorted(INPUT_FIELDS))
def test_schema_version_is_the_integer_one(name: str) -> None:
    node = _field(name, "schema_version")
    assert (node["type"], node["const"]) == ("integer", 1)
    assert "schema_version" in _schema(name)["required"]


def test_response_fields() -> None:
    role = _field("LlmResponse", "role")
    assert (set(role["enum"]), role["default"]) == ({"single", "sub_call", "synthesis"}, "single")
    # "list of natural-log probabilities, entries may be null; or absent"
    assert "token_logprobs" not in _schema("LlmResponse")["required"]
    item = _field("LlmResponse", "token_logprobs", "[]")
    assert _nullable(item) and _resolve(_schema("LlmResponse"), item)["type"] == "number"
    assert _properties("LlmResponse", "retrieval", "[]") == {"similarity", "source"}
    assert _properties("LlmResponse", "code_validation") == {
        "code_exists",
        "syntax_valid",
        "type_valid",
        "tests_exist",
        "tests_pass",
    }
    for optional in ("retrieval", "code_validation", "sub_call_id"):
        assert optional not in _schema("LlmResponse")["required"], optional


def test_tool_invocation_fields() -> None:
    assert set(_field("ToolInvocation", "phase")["enum"]) == {"primary", "recovery"}
    assert set(_field("ToolInvocation", "status")["enum"]) == {"ok", "empty", "error"}
    # "or other": the tool is free text, not an enum of the nine the seed names.
    assert "enum" not in _field("ToolInvocation", "tool")
    factors = _resolve(_schema("ToolInvocation"), _field("ToolInvocation", "factors_found"))
    assert (factors["minimum"], factors["maximum"]) == (0, 4)


def test_claim_fields() -> None:
    assert set(_field("ClaimEvent", "tier")["enum"]) == {"ephemeral", "task", "project", "persistent"}
    assert _nullable(_field("ClaimEvent", "staleness_at"))  # "time or null"
    assert _properties("ClaimEvent", "provenance", "[]") == {"source_type", "confidence", "source_id"}
    assert _properties("ClaimEvent", "relationships", "[]") == {"type", "target", "strength"}
    kinds = _field("ClaimEvent", "relationships", "[]", "type")
    assert set(kinds["enum"]) == {"supports", "contradicts"}
    assert _resolve(_schema("ClaimEvent"), _field("ClaimEvent", "derived_from", "[]"))["type"] == "string"
    assert _field("ClaimEvent", "instance_trust")["default"] == 1.0
    assert "assessed_upper" not in _schema("ClaimEvent")["required"]


def test_response_scored_fields() -> None:
    assert set(_field("ResponseScored", "action")["enum"]) == {"allow", "flag", "reject"}
    assert _nullable(_field("ResponseScored", "confidence"))  # "logprob confidence or null"
    assert _nullable(_field("ResponseScored", "response"))  # "when rejected, null"
    assert _nullable(_field("ResponseScored", "error"))
    assert _field("ResponseScored", "error", "code")["const"] == "LOW_CONFIDENCE_REJECTED"
    assert {"score", "level", "components"} <= _properties("ResponseScored", "heuristic")
    assert {
        "score",
        "level",
        "factors",
        "threshold",
        "threshold_met",
        "should_block",
        "block_reason",
        "missing_factors",
    } <= _properties("ResponseScored", "composite")
    assert {"request_id", "tenant_id", "model", "endpoint"} <= _properties("ResponseScored", "metadata")


def test_trace_claim_and_synthesis_scored_fields() -> None:
    # TRACE_SCORED: "convergence (categories, bonus, matched target)"
    assert {"categories", "bonus", "target"} <= _properties("TraceScored", "convergence")
    # CLAIM_SCORED: "base and effective interval, projections (midpoint, conservative, optimistic, width)
    # and the factors (aggregate bounds, diversity, staleness, support boost, contradiction penalty,
    # instance trust)"
    assert {
        "base_lower",
        "base_upper",
        "lower",
        "upper",
        "midpoint",
        "conservative",
        "optimistic",
        "width",
        "factors",
    } <= _properties("ClaimScored", "interval")
    assert {
        "aggregate_lower",
        "aggregate_upper",
        "diversity",
        "staleness",
        "support_boost",
        "contradiction_penalty",
        "instance_trust",
    } <= _properties("ClaimScored", "interval", "factors")
    # SYNTHESIS_SCORED: "per-source confidence and inclusion"
    assert {"confidence", "included"} <= _properties("SynthesisScored", "sources", "[]")
