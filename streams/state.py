"""What the worker keeps in its tables, and the messages it passes between its stages (never a logprob)."""

from __future__ import annotations

import base64
import zlib
from functools import cached_property
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from streams.events import LlmResponse, OutcomeEvent, ScoreKind, SubjectType
from streams.scoring.calibration import ActionStats, BinStats
from streams.scoring.claim_graph import ClaimArrived
from streams.scoring.evidence import EvidenceState
from streams.scoring.heuristic import Component, HeuristicResult
from streams.scoring.synthesis import TraceClaim
from streams.scoring.times import StdDatetime

__all__ = [
    "AgentHistory",
    "CalibrationItem",
    "CalibrationMessage",
    "CalibrationSubject",
    "ClaimMessage",
    "GroupCalibration",
    "HistoryEntry",
    "HistoryHour",
    "HourBucket",
    "HourCounts",
    "PendingResponse",
    "ResponseOutcome",
    "SubCallRecord",
    "SubjectEntry",
    "TraceState",
    "decode_responses_message",
    "encode_history_hour",
    "remembered_outputs",
    "remembering",
    "table_key",
]


def table_key(tenant_id: str, name: str) -> bytes:
    """Tables are scoped per tenant: the key is the JSON array [tenant_id, name]."""
    return orjson.dumps([tenant_id, name])


class SubCallRecord(BaseModel):
    """A `sub_call` response remembered for its trace's synthesis: text, heuristic, rounded confidence."""

    model_config = ConfigDict(frozen=True)
    sub_call_id: str
    content: str
    components: tuple[Component, ...]
    logprob_confidence: float | None


class TraceState(BaseModel):
    """Everything one trace needs: evidence, sub results, claims (first N) and outputs per applied input."""

    model_config = ConfigDict(frozen=True)
    tenant_id: str
    trace_id: str
    partition: int = Field(description="Input partition of the trace: its changelog records go there too.")
    last_event_time: StdDatetime
    evidence: EvidenceState = Field(default_factory=EvidenceState)
    sub_calls: dict[str, SubCallRecord] = Field(default_factory=dict)
    claims: dict[str, TraceClaim] = Field(default_factory=dict)
    # Input event id -> the outputs it produced here, so a re-delivery re-emits them unchanged: the
    # latest inputs' as they are, older ones in compressed blocks (`remembering`, `remembered_outputs`).
    remembered: dict[str, list[dict[str, object]]] = Field(default_factory=dict)
    archived: tuple[str, ...] = Field((), description="Blocks of older `remembered` entries: zlib, base64.")
    archived_in: dict[str, int] = Field(default_factory=dict, description="Input event id -> its block.")
    response_times: dict[str, StdDatetime] = Field(
        default_factory=dict,
        description="LLM_RESPONSE event id -> its event time when first applied: a re-delivery that its "
        "producer re-stamped is forwarded with it, so the agent stage finds the response it counted "
        "and re-emits the same scores (none in states written before this field).",
    )
    response_agents: dict[str, str] = Field(
        default_factory=dict,
        description="LLM_RESPONSE event id -> its agent_name: an OUTCOME judging it goes to that agent's "
        "partition of the responses topic, behind the response (none in states written before this field).",
    )


# A trace's outputs look alike (same fields, the same ids repeated), so a block of 64 compresses about
# 10x: about 50 B per input instead of 520 for a TRACE_SCORED, and a trace reaches
# TRACE_STATE_MAX_BYTES about four times later. A block is written once and read only on re-delivery.
REMEMBERED_BLOCK = 64


def remembering(state: TraceState, event_id: str, produced: list[dict[str, object]]) -> dict[str, object]:
    """The TraceState fields that remember `produced` as `event_id`'s outputs (one block when full)."""
    remembered = {**state.remembered, event_id: produced}
    if len(remembered) < REMEMBERED_BLOCK:
        return {"remembered": remembered}
    block = base64.b64encode(zlib.compress(orjson.dumps(remembered))).decode("ascii")
    index = len(state.archived)
    return {
        "remembered": {},
        "archived": (*state.archived, block),
        "archived_in": {**state.archived_in, **dict.fromkeys(remembered, index)},
    }


def remembered_outputs(state: TraceState, event_id: str) -> list[dict[str, object]] | None:
    """The outputs `event_id` produced in this trace, or None if it was never applied here."""
    recent = state.remembered.get(event_id)
    if recent is not None:
        return recent
    index = state.archived_in.get(event_id)
    if index is None:
        return None
    block: dict[str, list[dict[str, object]]] = orjson.loads(
        zlib.decompress(base64.b64decode(state.archived[index]))
    )
    return block[event_id]


class PendingResponse(BaseModel):
    """An LLM response on its way to the agent-history stage: logprobs replaced by their confidence."""

    model_config = ConfigDict(frozen=True)
    event: LlmResponse
    confidence: float | None
    logprobs_present: bool
    heuristic: HeuristicResult
    received_at: float = Field(description="Producer timestamp of the input record, epoch seconds.")
    source_partition: int = Field(
        0, description="Input partition the response came from (expiry watermark; stages/trace `_source`)."
    )
    redelivered: bool = Field(
        False, description="Stage 1 had applied this event id already: stage 2 must not count it again."
    )


class ResponseOutcome(BaseModel):
    """An OUTCOME judging a response, on its way through the agent stage to the calibration stage.

    It travels on the responses topic, in the partition of the response's agent, so the agent stage
    hands it on behind the response's score: sent straight from stage 1, it could wait at the
    calibration stage while the score was still on its way and be counted unmatched by the sweep.
    `outcome` is the first field: `decode_responses_message` tells the two messages apart by it.
    """

    model_config = ConfigDict(frozen=True)
    outcome: OutcomeEvent
    received_at: float = Field(description="Producer timestamp of the input record, epoch seconds.")
    source_partition: int = Field(
        description="Input partition the outcome came from (expiry clock; stages/trace `_source`)."
    )


_RESPONSE_OUTCOME_PREFIX = b'{"outcome":'


def decode_responses_message(raw: bytes) -> PendingResponse | ResponseOutcome:
    """A message of the responses topic: a response (almost all) or an outcome judging one.

    Told apart by the outcome's first field rather than a pydantic union, which cost each response half
    as much again to decode (12 -> 18 us); the workers are the topic's only writers.
    """
    if raw.startswith(_RESPONSE_OUTCOME_PREFIX):
        return ResponseOutcome.model_validate_json(raw)
    return PendingResponse.model_validate_json(raw)


class HistoryEntry(BaseModel):
    """One applied response of an agent, as seed 004's history JSONL records it."""

    model_config = ConfigDict(frozen=True)
    event_id: str
    event_time: StdDatetime
    threshold_met: bool
    composite: float
    blocked: bool
    history_score: float = Field(description="The history factor this response was scored with.")

    @cached_property
    def encoded(self) -> bytes:
        """This entry as JSON, encoded once: a chunk is rewritten on every response of its hour, and
        its entries do not change (`encode_history_hour`)."""
        return self.model_dump_json().encode()


class HourCounts(BaseModel):
    """How many responses an agent had in one hour of event time, and how many met their threshold."""

    model_config = ConfigDict(frozen=True)
    hour: int = Field(description="Hours since the Unix epoch (the hour starting at hour * 3600 s).")
    total: int
    met: int
    chunks: int = Field(1, description="Stored chunks of this hour's entries (HISTORY_CHUNK_BYTES each).")


class AgentHistory(BaseModel):
    """Summary of one (tenant, agent_name)'s rolling history: per-hour counts, newest event time.

    The entries themselves live in the agent-history-hours table, one or more chunks per hour
    (`HistoryHour`), so a response rewrites one chunk and this summary, not the agent's whole week
    (README "Performance").
    """

    model_config = ConfigDict(frozen=True)
    tenant_id: str
    agent_name: str
    agent_type: str
    newest: StdDatetime | None = Field(None, description="Newest event time applied (retention is from it).")
    hours: tuple[HourCounts, ...] = Field((), description="Hours with responses, ascending.")
    entries: tuple[HistoryEntry, ...] = Field(
        (),
        description="Only in values written before the history was split by hour: moved to hour keys "
        "on the agent's next response.",
    )

    @field_validator("entries")
    @classmethod
    def _sorted_by_event_time(cls, entries: tuple[HistoryEntry, ...]) -> tuple[HistoryEntry, ...]:
        # Histories written before entries were kept sorted (out-of-order responses were appended).
        return tuple(sorted(entries, key=lambda e: e.event_time))


class HistoryHour(BaseModel):
    """One chunk of an hour of an agent's responses (key: tenant, agent, hour[, chunk]).

    A new entry goes to the hour's last chunk, or a new one when it would pass HISTORY_CHUNK_BYTES, so
    each chunk is sorted but chunks of one hour may overlap in time when responses arrive out of order.
    """

    model_config = ConfigDict(frozen=True)
    entries: tuple[HistoryEntry, ...] = Field((), description="Sorted by event time (stage 2 bisects).")

    @cached_property
    def met(self) -> int:
        """How many entries met their threshold: counted once per value (a chunk is never copied with
        new entries, which would carry this cached count over), so a window counts a whole chunk in O(1)."""
        return sum(entry.threshold_met for entry in self.entries)


def encode_history_hour(hour: HistoryHour) -> bytes:
    """`hour.model_dump_json()`, byte for byte, from its entries' cached encodings: a busy agent's
    chunk of up to HISTORY_CHUNK_BYTES was encoded whole on every response, half of its stage-2 time."""
    return b'{"entries":[' + b",".join([entry.encoded for entry in hour.entries]) + b"]}"


class ClaimMessage(BaseModel):
    """A CLAIM input on its way to the claim stage (keyed by tenant): the claim as the graph keeps it.

    Or an OUTCOME that judges a claim: it goes the same way, so that the calibration stage receives it
    behind the scores of the claims stage 1 sent before it (and not ahead of them, straight from stage 1).
    """

    model_config = ConfigDict(frozen=True)
    tenant_id: str
    arrived: ClaimArrived | None = None
    outcome: OutcomeEvent | None = Field(None, description="An OUTCOME with a claim_id (then no claim).")
    received_at: float = Field(description="Producer timestamp of the input record, epoch seconds.")
    source_partition: int = Field(
        0, description="Input partition the claim came from (expiry watermark; stages/trace `_source`)."
    )
    redelivered: bool = Field(
        False, description="Stage 1 applied this input before: the claim stage re-emits, never re-applies."
    )

    @model_validator(mode="after")
    def _one_input(self) -> ClaimMessage:
        if (self.arrived is None) == (self.outcome is None):
            raise ValueError("a claim message carries a claim or an outcome, exactly one")
        return self


class CalibrationSubject(BaseModel):
    """What the calibration join keeps of one emitted score (no logprobs, no text)."""

    model_config = ConfigDict(frozen=True)
    subject_type: SubjectType
    subject_id: str = Field(description="Input event id (response), trace id or claim id.")
    event_time: StdDatetime
    scores: dict[ScoreKind, float]
    action: Literal["allow", "flag", "reject"] | None = None
    model: str | None = None
    agent_type: str | None = None


class CalibrationItem(BaseModel):
    """A score just emitted, or an OUTCOME, for the calibration stage."""

    model_config = ConfigDict(frozen=True)
    subject: CalibrationSubject | None = None
    outcome: OutcomeEvent | None = None
    received_at: float = Field(description="Producer timestamp of the input record, epoch seconds.")
    clock_source: int | None = Field(
        None,
        description="The upstream source whose expiry clock the item moves when not its message's: an "
        "OUTCOME handed on by the claim or agent stage moves its input partition's, as when stage 1 sent "
        "it, not the clock of the claim or response scores it travels with.",
    )


class CalibrationMessage(BaseModel):
    """A tenant's calibration items of one upstream batch, in order (one record, not one per score)."""

    model_config = ConfigDict(frozen=True)
    tenant_id: str
    items: list[CalibrationItem]
    source: int = Field(
        description="Upstream stage and partition (expiry watermark), see stages/calibration."
    )


class SubjectEntry(BaseModel):
    """One scored subject of a tenant: its latest score, the outcomes counted, outcomes waiting for it."""

    model_config = ConfigDict(frozen=True)
    subject: CalibrationSubject | None = None
    applied: tuple[str, ...] = Field((), description="Outcome event ids already counted (re-delivery).")
    applied_until: StdDatetime | None = Field(
        None,
        description="Until this event time a newer score could still join a counted outcome: `applied` "
        "outlives the score that long, so a re-delivered one is still known (none before this field).",
    )
    waiting: tuple[OutcomeEvent, ...] = Field((), description="Outcomes that arrived before the score.")


class HourBucket(BaseModel):
    """One hour (event time of the outcomes) of a group's calibration, kept to leave the window later."""

    model_config = ConfigDict(frozen=True)
    bins: dict[int, BinStats] = Field(default_factory=dict)
    actions: dict[str, ActionStats] = Field(default_factory=dict)


class GroupCalibration(BaseModel):
    """Calibration of one (tenant, model or agent type, score kind) over a sliding window of hours.

    `bins` and `actions` are the window's running totals: an outcome adds to them and to its hour's
    bucket (a key of its own), and an hour leaving the window is subtracted. So an update reads and
    writes two small values, never the whole week.
    """

    model_config = ConfigDict(frozen=True)
    tenant_id: str
    dimension: Literal["model", "agent_type"]
    value: str
    kind: ScoreKind
    newest: StdDatetime = Field(description="Newest outcome time: the window ends here.")
    hours: tuple[int, ...] = Field((), description="Epoch hours that have a bucket, oldest first.")
    bins: dict[int, BinStats] = Field(default_factory=dict)
    actions: dict[str, ActionStats] = Field(default_factory=dict)
    last_emitted_ece: float | None = None
    last_emitted_at: StdDatetime | None = None
