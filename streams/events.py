"""Pydantic models of every input and output event: the single source of truth for the wire format.

Inputs are decoded by `streams.decode.decode` (one discriminated union on `event_type`), in strict mode:
a string is never coerced to a number or a boolean. Unknown extra fields are accepted and dropped, so
they never reach an output. Non-finite numbers are accepted only as
entries of `token_logprobs` (DESIGN 4b); everywhere else a number outside [0, 1] or non-finite is bad
input. Output events embed the scoring results of `streams.scoring` directly.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    field_validator,
    model_validator,
)
from pydantic.json_schema import GenerateJsonSchema, WithJsonSchema
from pydantic_core import PydanticCustomError

from streams.scoring.calibration import ReliabilityBin
from streams.scoring.claim_graph import SELF
from streams.scoring.claims import ClaimInterval
from streams.scoring.composite import CompositeResult
from streams.scoring.evidence import EvidenceResult
from streams.scoring.heuristic import HeuristicResult
from streams.scoring.response import Action
from streams.scoring.synthesis import Conflict, SourceScore
from streams.scoring.times import standard_zone

__all__ = [
    "INPUT_EVENT_TYPES",
    "CalibrationUpdated",
    "ClaimEvent",
    "ClaimScored",
    "CodeValidation",
    "InputEvent",
    "LlmResponse",
    "OutcomeEvent",
    "OutputEvent",
    "PolicyInput",
    "ProvenanceEntry",
    "RelationshipEntry",
    "ResponseScored",
    "RetrievalHit",
    "SynthesisScored",
    "ToolInvocation",
    "TraceScored",
    "input_adapter",
]

# The scores calibration follows: response confidence, composite, trace evidence, claim midpoint.
ScoreKind = Literal["response", "composite", "evidence", "claim"]
UnitFloat = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
# RFC 3339 date-time; a missing zone is left to AwareDatetime, which reports it as such. An offset's
# minutes are 00-59: `fromisoformat` reads "+05:60" as +06:00, an hour off what was written.
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:(?P<second>\d{2})(?P<fraction>\.\d+)?([Zz]|[+-]\d{2}:[0-5]\d)?",
    re.ASCII,
)


def _rfc3339(value: object) -> object:
    # pydantic also reads a number, or a numeric string ("0", "1700000000"), as a Unix time: bad input.
    match = _RFC3339.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError("should be an RFC 3339 date-time string")
    text = match.string
    if match["second"] == "60":
        # RFC 3339 allows a leap second (23:59:60Z), which Python's datetime cannot hold: it is read as
        # the last microsecond of its minute, so it still sorts after every earlier time of that minute.
        zone_at = match.end("second") + len(match["fraction"] or "")
        text = f"{text[: match.start('second')]}59.999999{text[zone_at:]}"
    return standard_zone(text)


# Event times take part in date arithmetic (TTLs, windows, half-lives): one dated 9999-12-31 overflowed
# when its expiry was computed, outside the per-record guard, and stopped the worker on every restart.
# Years 1900 to 8999 leave centuries of room either way. The year is the one written, in the event's own
# offset, as the JSON Schema's pattern can check it (an offset under a day moves the instant less than
# that). `test_project.py` runs the date arithmetic on the extreme instants.
TIMESTAMP_YEARS = (1900, 8999)


def _in_range(value: datetime) -> datetime:
    if not TIMESTAMP_YEARS[0] <= value.year <= TIMESTAMP_YEARS[1]:
        raise PydanticCustomError("timestamp_out_of_range", "should be a date-time from year 1900 to 8999")
    return value


_TIMESTAMP_SCHEMA = {
    "type": "string",
    "format": "date-time",
    # What `_rfc3339` and `_in_range` accept, for validators that do not check "format" (most, by
    # default): field by field in range, except a day past its month's end (2026-02-30), which a
    # pattern cannot see; the decoder refuses it.
    "pattern": (
        r"^(19\d\d|[2-8]\d\d\d)-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])[Tt ]([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)"
        r"(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)$"
    ),
    "description": "RFC 3339 date-time with a zone (Z or +hh:mm), year 1900 to 8999 as written.",
}


# After a before-validator the value is checked as Python input, where a strict datetime takes no string:
# hence Strict(False), which parses the (already checked) string exactly as strict JSON decoding would.
Timestamp = Annotated[
    AwareDatetime,
    Strict(False),
    BeforeValidator(_rfc3339),
    AfterValidator(_in_range),
    WithJsonSchema(_TIMESTAMP_SCHEMA),
]


def _whole_number(value: object) -> object:
    # JSON Schema's "integer" is any number without a fraction, so 3.0 is valid there, and Python's json
    # writes a float that way: it is the integer 3 here too (3.5 stays a float and is refused).
    return int(value) if isinstance(value, float) and value.is_integer() else value


WholeNumber = BeforeValidator(_whole_number)  # after the bounds in an Annotated, so they stay in the schema
# Ids and names become Kafka keys, table keys and metric labels, and outputs repeat them: an output
# whose key and value each carried a 600 KB trace id would pass Apache Kafka's 1 MB record limit, and
# the broker's refusal would stop the worker on that record after every restart. 1,024 characters is
# far beyond any id agents use; a longer one is dead-lettered (reason `oversized_field`).
ID_MAX_CHARS = 1024
Id = Annotated[str, Field(min_length=1, max_length=ID_MAX_CHARS)]
INPUT_EVENT_TYPES = ("LLM_RESPONSE", "TOOL_INVOCATION", "CLAIM", "OUTCOME")


class _Envelope(BaseModel):
    """What every input carries (DESIGN section 2)."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    event_id: Id
    timestamp: Timestamp
    tenant_id: Id
    trace_id: Id
    schema_version: Literal[1]

    @field_validator("schema_version", mode="before")
    @classmethod
    def _integer_one(cls, value: object) -> object:
        # `true == 1` in Python: without this a JSON boolean would pass as version 1. 1.0 is the integer 1,
        # as in the JSON Schema (`const: 1`), and 1.5 is refused as a float.
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError("schema_version must be the integer 1")
        return _whole_number(value)


class _Input(_Envelope):
    """An input produced by an agent: it names the agent."""

    agent_name: Id
    agent_type: Id


class RetrievalHit(BaseModel):
    """One RAG retrieval result; `similarity` is required (DESIGN 4b)."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    similarity: UnitFloat
    source: str | None = None


class CodeValidation(BaseModel):
    """Seed 004's code validation checks; an absent key means false (DESIGN 4b)."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    code_exists: bool = False
    syntax_valid: bool = False
    type_valid: bool = False
    tests_exist: bool = False
    tests_pass: bool = False


class LlmResponse(_Input):
    """Every LLM response, with its token logprobs (which never leave memory)."""

    event_type: Literal["LLM_RESPONSE"]
    request_id: Id
    model: Id
    endpoint: Id
    role: Literal["single", "sub_call", "synthesis"] = "single"
    sub_call_id: Annotated[str, Field(max_length=ID_MAX_CHARS)] | None = None
    subtask: str | None = None
    query: str | None = None
    response: str
    # Entries may be null, NaN or +/-Infinity: seed 003 filters the invalid ones.
    token_logprobs: list[float | None] | None = Field(default=None, repr=False)
    retrieval: list[RetrievalHit] | None = None
    code_validation: CodeValidation | None = None


class ToolInvocation(_Input):
    """One tool call of an investigation (seed 001)."""

    event_type: Literal["TOOL_INVOCATION"]
    tool: Id
    target: str
    phase: Literal["primary", "recovery"] = "primary"
    status: Literal["ok", "empty", "error"]
    result_count: Annotated[int, Field(ge=0), WholeNumber] | None = None
    factors_found: Annotated[int, Field(ge=0, le=4), WholeNumber] | None = None
    build_passed: bool | None = None
    tests_passed: bool | None = None
    complete: bool | None = None


class ProvenanceEntry(BaseModel):
    """Where a claim came from and how much that source is trusted."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    source_type: Id
    confidence: UnitFloat
    source_id: Annotated[str, Field(max_length=ID_MAX_CHARS)] | None = None


class RelationshipEntry(BaseModel):
    """'This claim supports / contradicts `target`' with a strength in [0, 1]."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    type: Literal["supports", "contradicts"]
    target: Id
    strength: UnitFloat


class ClaimEvent(_Input):
    """A factual claim (seed 002)."""

    event_type: Literal["CLAIM"]
    # "self" is the `cause` of a claim's own CLAIM_SCORED: as a claim id, the re-scores it causes
    # would read as their claims' own inputs.
    claim_id: Annotated[Id, Field(json_schema_extra={"not": {"const": SELF}})]
    statement: str
    source_id: Annotated[str, Field(max_length=ID_MAX_CHARS)] | None = None
    provenance: list[ProvenanceEntry] = Field(default_factory=list)
    tier: Literal["ephemeral", "task", "project", "persistent"]
    staleness_at: Timestamp | None = None
    relationships: list[RelationshipEntry] = Field(default_factory=list)
    derived_from: list[Id] = Field(default_factory=list)
    assessed_upper: UnitFloat | None = None
    instance_trust: UnitFloat = 1.0

    @field_validator("claim_id")
    @classmethod
    def _not_the_cause_of_its_own_score(cls, value: str) -> str:
        if value == SELF:
            raise PydanticCustomError("claim_id_reserved", f"claim_id {SELF!r} is reserved for `cause`")
        return value


SubjectType = Literal["response", "trace", "claim"]


def _given(name: str, json_type: str) -> dict[str, Any]:
    """JSON Schema: `name` is present and of `json_type` (so not null)."""
    return {"required": [name], "properties": {name: {"type": json_type}}}


class OutcomeEvent(_Envelope):
    """Feedback on something the service scored: was it right? (calibration, README "Calibration").

    The subject is the LLM_RESPONSE with input `subject_event_id`, or the claim `claim_id`, or, when
    neither is given, the evidence score of the trace `trace_id`. The verdict is `correct` or a graded
    `score` in [0, 1], exactly one of them.
    """

    # The JSON Schema states the same two rules as `_one_subject_one_verdict` (a field counts when it
    # is present and not null), so a producer validating against it is not dead-lettered for them.
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {"not": {"allOf": [_given("subject_event_id", "string"), _given("claim_id", "string")]}},
                {"oneOf": [_given("correct", "boolean"), _given("score", "number")]},
            ]
        }
    )

    event_type: Literal["OUTCOME"]
    subject_event_id: Id | None = None
    claim_id: Id | None = None
    correct: bool | None = None
    score: UnitFloat | None = None
    source: Literal["human", "test", "ci", "judge"]

    @model_validator(mode="after")
    def _one_subject_one_verdict(self) -> OutcomeEvent:
        if self.subject_event_id is not None and self.claim_id is not None:
            raise PydanticCustomError("outcome_invalid", "give subject_event_id or claim_id, not both")
        if (self.correct is None) == (self.score is None):
            raise PydanticCustomError("outcome_invalid", "give exactly one of correct and score")
        return self

    @property
    def subject_type(self) -> SubjectType:
        if self.subject_event_id is not None:
            return "response"
        return "claim" if self.claim_id is not None else "trace"

    @property
    def subject_id(self) -> str:
        return self.subject_event_id or self.claim_id or self.trace_id

    @property
    def observed(self) -> float:
        """The outcome as a number: 1.0 correct, 0.0 wrong, or the graded score."""
        if self.score is not None:
            return self.score
        return 1.0 if self.correct else 0.0


InputEvent = Annotated[
    LlmResponse | ToolInvocation | ClaimEvent | OutcomeEvent, Field(discriminator="event_type")
]
input_adapter: TypeAdapter[LlmResponse | ToolInvocation | ClaimEvent | OutcomeEvent] = TypeAdapter(InputEvent)


# --- Outputs ------------------------------------------------------------------------------------------


class _Output(BaseModel):
    model_config = ConfigDict(frozen=True)

    event_id: str = Field(description="Deterministic: derived from the input that caused this output.")
    source_event_id: str
    trace_id: str
    tenant_id: str
    scored_at: datetime = Field(description="Processing time; the only field a re-delivery may change.")


class ResponseMetadata(BaseModel):
    """Seed 003's response metadata."""

    model_config = ConfigDict(frozen=True)
    request_id: str
    tenant_id: str
    model: str
    endpoint: str
    agent_name: str
    agent_type: str
    role: Literal["single", "sub_call", "synthesis"]


class RejectionError(BaseModel):
    """Seed 003's error object for a response rejected for low confidence."""

    model_config = ConfigDict(frozen=True)
    code: Literal["LOW_CONFIDENCE_REJECTED"] = "LOW_CONFIDENCE_REJECTED"
    message: str = "Response rejected due to low confidence."
    details: dict[str, float | None]


class PolicyInput(BaseModel):
    """Seed 003's OPA input document (component 6), ready to POST as `{"input": policy_input}`.

    Seed 003's example also shows `user`; the service never sees a user, so it is left out.
    """

    model_config = ConfigDict(frozen=True)
    confidence: float | None
    confidence_enabled: bool
    request_id: str
    tenant_id: str
    endpoint: str
    model: str


class ResponseScored(_Output):
    """Per LLM_RESPONSE: logprob confidence, heuristic, composite and the allow / flag / reject action."""

    event_type: Literal["RESPONSE_SCORED"] = "RESPONSE_SCORED"
    confidence: float | None
    heuristic: HeuristicResult
    composite: CompositeResult
    action: Action
    flags: list[str]
    response: str | None
    error: RejectionError | None = None
    metadata: ResponseMetadata
    policy_input: PolicyInput


class TraceScored(_Output, EvidenceResult):
    """Per TOOL_INVOCATION: the trace's evidence score, its fields at the top level (DESIGN section 3)."""

    event_type: Literal["TRACE_SCORED"] = "TRACE_SCORED"


class ClaimScored(_Output):
    """Per claim (re)scored: base and effective interval, projections and factors."""

    event_type: Literal["CLAIM_SCORED"] = "CLAIM_SCORED"
    claim_id: str
    interval: ClaimInterval
    as_of: datetime
    cause: str = Field(description="`self`, or the claim id whose change re-scored this claim.")


class SynthesisScored(_Output):
    """Per synthesis response: confidence-weighted synthesis of the trace's sub results."""

    event_type: Literal["SYNTHESIS_SCORED"] = "SYNTHESIS_SCORED"
    overall_confidence: float
    level: str
    sources: list[SourceScore]
    conflicts: list[Conflict]
    warnings: list[str]
    filtered_count: int


class CalibrationGroup(BaseModel):
    """Whose scores a calibration summarises: one model or one agent type of a tenant, one score kind."""

    model_config = ConfigDict(frozen=True)
    dimension: Literal["model", "agent_type"]
    value: str
    kind: ScoreKind


class CalibrationUpdated(_Output):
    """A group's calibration moved: ECE and Brier over the window, from outcomes (README "Calibration")."""

    event_type: Literal["CALIBRATION_UPDATED"] = "CALIBRATION_UPDATED"
    group: CalibrationGroup
    ece: float
    previous_ece: float | None
    brier: float
    samples: int
    window_hours: float
    alert: bool = Field(description="ECE at or above CALIBRATION_ECE_ALERT (then also on flagged-events).")
    bins: list[ReliabilityBin]


OutputEvent = Annotated[
    ResponseScored | TraceScored | ClaimScored | SynthesisScored | CalibrationUpdated,
    Field(discriminator="event_type"),
]


class _EmittedSchema(GenerateJsonSchema):
    """Outputs are dumped whole, defaults and nulls included: every field of theirs is always present."""

    def field_is_required(self, field: Any, total: bool) -> bool:
        return True


def json_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schema per event type, for producers and consumers in other languages (`make schemas`)."""
    inputs: list[type[BaseModel]] = [LlmResponse, ToolInvocation, ClaimEvent, OutcomeEvent]
    outputs: list[type[BaseModel]] = [
        ResponseScored,
        TraceScored,
        ClaimScored,
        SynthesisScored,
        CalibrationUpdated,
    ]
    return {model.__name__: model.model_json_schema() for model in inputs} | {
        model.__name__: model.model_json_schema(mode="serialization", schema_generator=_EmittedSchema)
        for model in outputs
    }
