"""The three stages' per-event logic over table state, as plain functions (no Faust, no Kafka).

Stage 1 (`TraceStage`, input topics keyed by trace): decode, dead-letter, evidence, synthesis, and
forwarding of responses (to the agent-history stage) and claims (to the claim stage), without logprobs.
Stage 2 (`AgentStage`, keyed by tenant + agent): composite with agent history -> RESPONSE_SCORED.
Stage 3 (`ClaimStage`, keyed by tenant + claim id): the claim graph -> CLAIM_SCORED.
Each stage returns `Record`s for the agent to send; the agent owns tables and the producer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import orjson

from streams.config import ScoringConfigs, Settings
from streams.decode import decode
from streams.dlq import DeadLetter, connect_headers, strip_logprobs
from streams.events import (
    ClaimEvent,
    ClaimScored,
    LlmResponse,
    RejectionError,
    ResponseMetadata,
    ResponseScored,
    SynthesisScored,
    ToolInvocation,
    TraceScored,
)
from streams.ids import output_event_id
from streams.metrics import Metrics
from streams.scoring import claim_graph, composite, evidence, heuristic, response, synthesis
from streams.state import (
    AgentHistory,
    ClaimMessage,
    HistoryEntry,
    PendingResponse,
    SubCallRecord,
    TraceState,
    table_key,
)

__all__ = ["AgentStage", "ClaimStage", "InputRecord", "Record", "TraceStage"]


@dataclass(frozen=True, slots=True)
class InputRecord:
    """The parts of a consumed Kafka record the stages need."""

    topic: str
    partition: int
    offset: int
    timestamp: float  # producer timestamp, epoch seconds
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Record:
    """One record to produce."""

    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]] | None = None


def _now() -> datetime:
    return datetime.now(UTC)


def _dump(model: object) -> bytes:
    return orjson.dumps(model, default=_default)


def _default(value: object) -> object:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    raise TypeError(type(value).__name__)


@dataclass
class _Outputs:
    """Collects the records of one stage's batch and counts what it emits."""

    settings: Settings
    metrics: Metrics
    records: list[Record] = field(default_factory=list)

    def emit(self, output: dict[str, object], key: bytes, flagged: bool, received_at: float) -> None:
        value = orjson.dumps(output)
        self.records.append(Record(self.settings.scored_topic, key, value))
        if flagged:
            self.records.append(Record(self.settings.flagged_topic, key, value))
        event_type = str(output["event_type"])
        self.metrics.outputs_emitted.labels(event_type).inc()
        self.metrics.processing_latency.labels(event_type).observe(max(0.0, _now().timestamp() - received_at))


def _with_scored_at(output: dict[str, object]) -> dict[str, object]:
    return {**output, "scored_at": _now().isoformat()}


class TraceStage:
    """Stage 1: everything keyed by trace."""

    def __init__(self, settings: Settings, configs: ScoringConfigs, metrics: Metrics) -> None:
        self.settings = settings
        self.configs = configs
        self.metrics = metrics
        self.newest_event_time: datetime | None = None

    def process(
        self, records: list[InputRecord], load: Callable[[bytes], TraceState | None]
    ) -> tuple[list[Record], dict[bytes, TraceState]]:
        """Process a batch in order; return records to send and the trace states to write (once each)."""
        out = _Outputs(self.settings, self.metrics)
        dirty: dict[bytes, TraceState] = {}
        for record in records:
            event = decode(record.value, self.settings.max_event_bytes, self.settings.max_array_items)
            if isinstance(event, DeadLetter):
                self._dead_letter(event, record, out)
                continue
            self.metrics.events_processed.labels(event.event_type).inc()
            if self.newest_event_time is None or event.timestamp > self.newest_event_time:
                self.newest_event_time = event.timestamp
            key = table_key(event.tenant_id, event.trace_id)
            state = dirty.get(key) or load(key)
            if state is None:
                state = TraceState(
                    tenant_id=event.tenant_id,
                    trace_id=event.trace_id,
                    partition=record.partition,
                    last_event_time=event.timestamp,
                )
            dirty[key] = self._apply(state, event, record, out)
        return out.records, dirty

    def _dead_letter(self, letter: DeadLetter, record: InputRecord, out: _Outputs) -> None:
        self.metrics.events_dead_lettered.labels(letter.reason).inc()
        out.records.append(
            Record(
                self.settings.dlq_topic,
                b"",
                strip_logprobs(letter.raw, self.settings.max_event_bytes),
                connect_headers(letter, record.topic, record.partition, record.offset),
            )
        )

    def _apply(
        self,
        state: TraceState,
        event: LlmResponse | ToolInvocation | ClaimEvent,
        record: InputRecord,
        out: _Outputs,
    ) -> TraceState:
        key = event.trace_id.encode()
        remembered = state.remembered.get(event.event_id)
        if remembered is not None:
            # Re-delivery: the same outputs again (fresh scored_at), and no state change.
            for output in remembered:
                out.emit(_with_scored_at(output), key, _is_flagged(output), record.timestamp)
            self._forward(event, state, record, out)
            return state
        last_time = max(state.last_event_time, event.timestamp)
        if isinstance(event, ToolInvocation):
            state, produced = self._tool(state, event, record, out)
        elif isinstance(event, LlmResponse):
            state, produced = self._response(state, event, record, out)
        else:
            state, produced = self._claim(state, event, record, out)
        return state.model_copy(
            update={
                "last_event_time": last_time,
                "remembered": {**state.remembered, event.event_id: produced},
            }
        )

    # --- TOOL_INVOCATION -> TRACE_SCORED ---------------------------------------------------------------

    def _tool(
        self, state: TraceState, event: ToolInvocation, record: InputRecord, out: _Outputs
    ) -> tuple[TraceState, list[dict[str, object]]]:
        cfg = self.configs.evidence
        invocation = evidence.Invocation(
            event_id=event.event_id,
            tool=event.tool,
            target=event.target,
            phase=event.phase,
            status=event.status,
            result_count=event.result_count,
            factors_found=event.factors_found,
            build_passed=event.build_passed,
            tests_passed=event.tests_passed,
            complete=event.complete,
        )
        new_evidence = evidence.update(state.evidence, invocation, cfg)
        result = evidence.score(new_evidence, cfg)
        output = TraceScored(
            event_id=output_event_id("TRACE_SCORED", event.event_id),
            source_event_id=event.event_id,
            trace_id=event.trace_id,
            tenant_id=event.tenant_id,
            scored_at=_now(),
            evidence=result,
        ).model_dump(mode="json")
        self.metrics.evidence_band.labels(result.band).inc()
        if result.recovery_recommended:
            self.metrics.recovery_recommended.inc()
        out.emit(output, event.trace_id.encode(), _is_flagged(output), record.timestamp)
        return state.model_copy(update={"evidence": new_evidence}), [_without_scored_at(output)]

    # --- LLM_RESPONSE -> (SYNTHESIS_SCORED) + forward to the agent stage ---------------------------------

    def _response(
        self, state: TraceState, event: LlmResponse, record: InputRecord, out: _Outputs
    ) -> tuple[TraceState, list[dict[str, object]]]:
        produced: list[dict[str, object]] = []
        pending = self._pending(event, record)
        if event.role == "sub_call":
            sub_id = event.sub_call_id or event.request_id
            sub = SubCallRecord(
                sub_call_id=sub_id,
                content=event.response,
                components=pending.heuristic.components,
                logprob_confidence=pending.confidence,
            )
            state = state.model_copy(update={"sub_calls": {**state.sub_calls, sub_id: sub}})
        elif event.role == "synthesis":
            result = synthesis.synthesize(
                [
                    synthesis.SubResult(
                        sub_call_id=s.sub_call_id,
                        content=s.content,
                        heuristic_components=s.components,
                        logprob_confidence=s.logprob_confidence,
                    )
                    for s in state.sub_calls.values()
                ],
                list(state.claims.values()),
                self.configs.synthesis,
            )
            output = SynthesisScored(
                event_id=output_event_id("SYNTHESIS_SCORED", event.event_id),
                source_event_id=event.event_id,
                trace_id=event.trace_id,
                tenant_id=event.tenant_id,
                scored_at=_now(),
                overall_confidence=result.overall,
                level=result.level,
                sources=list(result.sources),
                conflicts=list(result.conflicts),
                warnings=list(result.warnings),
                filtered_count=result.filtered_count,
            ).model_dump(mode="json")
            self.metrics.synthesis_confidence.observe(result.overall)
            self.metrics.synthesis_conflicts.observe(len(result.conflicts))
            self.metrics.synthesis_filtered.observe(result.filtered_count)
            out.emit(output, event.trace_id.encode(), _is_flagged(output), record.timestamp)
            produced.append(_without_scored_at(output))
        self._send_pending(pending, out)
        return state, produced

    def _pending(self, event: LlmResponse, record: InputRecord) -> PendingResponse:
        cfg = self.configs.response
        confidence = (
            response.calculate_confidence(event.token_logprobs, cfg.aggregation, cfg.precision)
            if cfg.enabled
            else None
        )
        return PendingResponse(
            # The logprobs stop here: only their scalar confidence travels on.
            event=event.model_copy(update={"token_logprobs": None}),
            confidence=confidence,
            logprobs_present=bool(event.token_logprobs),
            heuristic=heuristic.score_heuristic(event.response),
            received_at=record.timestamp,
        )

    def _send_pending(self, pending: PendingResponse, out: _Outputs) -> None:
        key = table_key(pending.event.tenant_id, pending.event.agent_name)
        out.records.append(Record(self.settings.responses_topic, key, pending.model_dump_json().encode()))

    # --- CLAIM -> remembered for synthesis + forward to the claim stage --------------------------------

    def _claim(
        self, state: TraceState, event: ClaimEvent, record: InputRecord, out: _Outputs
    ) -> tuple[TraceState, list[dict[str, object]]]:
        claims = state.claims
        if event.claim_id in claims or len(claims) < self.settings.synthesis_max_claims:
            trace_claim = synthesis.TraceClaim(
                claim_id=event.claim_id,
                statement=event.statement,
                source_id=event.source_id,
                contradicts=tuple(
                    (r.target, r.strength) for r in event.relationships if r.type == "contradicts"
                ),
            )
            state = state.model_copy(update={"claims": {**claims, event.claim_id: trace_claim}})
        self._send_claim(event, record, out)
        return state, []

    def _send_claim(self, event: ClaimEvent, record: InputRecord, out: _Outputs) -> None:
        message = ClaimMessage(
            kind="arrived",
            tenant_id=event.tenant_id,
            recipient=event.claim_id,
            arrived=claim_graph.ClaimArrived(
                definition=claim_definition(event),
                source_event_id=event.event_id,
                event_time=event.timestamp,
            ),
            received_at=record.timestamp,
        )
        key = table_key(event.tenant_id, event.claim_id)
        out.records.append(Record(self.settings.claims_topic, key, message.model_dump_json().encode()))

    def _forward(
        self,
        event: LlmResponse | ToolInvocation | ClaimEvent,
        state: TraceState,
        record: InputRecord,
        out: _Outputs,
    ) -> None:
        """On re-delivery, downstream stages get the input again and re-emit their remembered outputs."""
        if isinstance(event, LlmResponse):
            self._send_pending(self._pending(event, record), out)
        elif isinstance(event, ClaimEvent):
            self._send_claim(event, record, out)

    def expired(self, state: TraceState) -> bool:
        """Idle longer than the trace TTL, measured against the newest event time seen."""
        if self.newest_event_time is None:
            return False
        return self.newest_event_time - state.last_event_time > timedelta(hours=self.settings.trace_ttl_hours)


def claim_definition(event: ClaimEvent) -> claim_graph.ClaimDefinition:
    """The claim as the claim graph keeps it."""
    from streams.scoring.claims import Provenance

    return claim_graph.ClaimDefinition(
        claim_id=event.claim_id,
        trace_id=event.trace_id,
        statement=event.statement,
        source_id=event.source_id,
        provenance=tuple(
            Provenance(source_type=p.source_type, confidence=p.confidence, source_id=p.source_id)
            for p in event.provenance
        ),
        tier=event.tier,
        staleness_at=event.staleness_at,
        relationships=tuple(
            claim_graph.Relationship(type=r.type, target=r.target, strength=r.strength)
            for r in event.relationships
        ),
        derived_from=tuple(event.derived_from),
        assessed_upper=event.assessed_upper,
        instance_trust=event.instance_trust,
    )


def _without_scored_at(output: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in output.items() if k != "scored_at"}


def _is_flagged(output: dict[str, object]) -> bool:
    """DESIGN section 3's rule for copying an output to flagged-events."""
    kind = output["event_type"]
    if kind == "RESPONSE_SCORED":
        comp = output["composite"]
        assert isinstance(comp, dict)
        return output["action"] in ("flag", "reject") or bool(comp["should_block"])
    if kind == "TRACE_SCORED":
        ev = output["evidence"]
        assert isinstance(ev, dict)
        return ev["band"] in ("weak", "failed")
    if kind == "SYNTHESIS_SCORED":
        return bool(output["warnings"]) or bool(output["conflicts"])
    if kind == "CLAIM_SCORED":
        interval = output["interval"]
        assert isinstance(interval, dict)
        factors = interval["factors"]
        assert isinstance(factors, dict)
        return float(factors["contradiction_penalty"]) < 1.0
    return False


class AgentStage:
    """Stage 2: composite with the agent's rolling history, keyed by (tenant, agent_name)."""

    def __init__(self, settings: Settings, configs: ScoringConfigs, metrics: Metrics) -> None:
        self.settings = settings
        self.configs = configs
        self.metrics = metrics

    def process(
        self, values: list[bytes], load: Callable[[bytes], AgentHistory | None]
    ) -> tuple[list[Record], dict[bytes, AgentHistory]]:
        out = _Outputs(self.settings, self.metrics)
        dirty: dict[bytes, AgentHistory] = {}
        for value in values:
            pending = PendingResponse.model_validate_json(value)
            event = pending.event
            key = table_key(event.tenant_id, event.agent_name)
            history = dirty.get(key) or load(key)
            if history is None:
                history = AgentHistory(
                    tenant_id=event.tenant_id, agent_name=event.agent_name, agent_type=event.agent_type
                )
            dirty[key] = self._apply(history, pending, out)
        return out.records, dirty

    def _apply(self, history: AgentHistory, pending: PendingResponse, out: _Outputs) -> AgentHistory:
        event = pending.event
        known = next((e for e in history.entries if e.event_id == event.event_id), None)
        if known is not None:
            history_factor = known.history_score
        else:
            history_factor = composite.history_score(
                [(e.event_time, e.threshold_met) for e in history.entries],
                event.timestamp,
                timedelta(hours=self.settings.history_window_hours),
            )
        output = self._scored(pending, history_factor)
        out.emit(output, event.trace_id.encode(), _is_flagged(output), pending.received_at)
        if known is not None:
            return history
        comp = output["composite"]
        assert isinstance(comp, dict)
        entry = HistoryEntry(
            event_id=event.event_id,
            event_time=event.timestamp,
            threshold_met=bool(comp["threshold_met"]),
            composite=float(comp["score"]),
            blocked=bool(comp["should_block"]),
            history_score=history_factor,
        )
        newest = max([event.timestamp, *(e.event_time for e in history.entries)])
        horizon = newest - timedelta(hours=self.settings.history_retention_hours)
        entries = tuple(e for e in (*history.entries, entry) if e.event_time >= horizon)
        self._observe(pending, output, entries)
        return history.model_copy(update={"entries": entries, "agent_type": event.agent_type})

    def _scored(self, pending: PendingResponse, history_factor: float) -> dict[str, object]:
        event = pending.event
        cfg = self.configs.response
        decision = response.evaluate_confidence(pending.confidence, cfg)
        result = composite.score_composite(
            agent_type=event.agent_type,
            retrieval_similarities=None
            if event.retrieval is None
            else [hit.similarity for hit in event.retrieval],
            code_validation=None
            if event.code_validation is None
            else composite.CodeValidation(**event.code_validation.model_dump()),
            response_text=event.response,
            history=history_factor,
            cfg=self.configs.composite,
        )
        flags = list(decision.flags)
        error: RejectionError | None = None
        text: str | None = event.response
        if decision.action == "reject":
            # Reject (seed 003) wins over the composite's block (DESIGN 4b).
            text = None
            error = RejectionError(
                details={"confidence": decision.confidence, "min_acceptance": cfg.min_acceptance}
            )
        elif result.should_block:
            text = composite.I_DONT_KNOW_ANSWER
        if result.should_block:
            flags.append("COMPOSITE_BLOCKED")
        return ResponseScored(
            event_id=output_event_id("RESPONSE_SCORED", event.event_id),
            source_event_id=event.event_id,
            trace_id=event.trace_id,
            tenant_id=event.tenant_id,
            scored_at=_now(),
            confidence=decision.confidence,
            heuristic=pending.heuristic,
            composite=result,
            action=decision.action,
            flags=flags,
            response=text,
            error=error,
            metadata=ResponseMetadata(
                request_id=event.request_id,
                tenant_id=event.tenant_id,
                model=event.model,
                endpoint=event.endpoint,
                agent_name=event.agent_name,
                agent_type=event.agent_type,
                role=event.role,
            ),
        ).model_dump(mode="json")

    def _observe(
        self, pending: PendingResponse, output: dict[str, object], entries: tuple[HistoryEntry, ...]
    ) -> None:
        m = self.metrics
        event = pending.event
        labels = (
            m.labels("tenant", event.tenant_id),
            m.labels("model", event.model),
            m.labels("endpoint", event.endpoint),
        )
        if pending.confidence is None:
            if self.configs.response.enabled:
                m.confidence_missing.labels(*labels).inc()
        else:
            m.confidence_histogram.labels(*labels).observe(pending.confidence)
            gauge = m.confidence_average.labels(*labels)
            previous = gauge._value.get()
            gauge.set(
                pending.confidence if previous == 0 else previous + 0.05 * (pending.confidence - previous)
            )
        if output["action"] == "reject":
            m.confidence_rejected.labels(*labels).inc()
        comp = output["composite"]
        assert isinstance(comp, dict)
        if comp["should_block"]:
            m.composite_blocked.labels(m.labels("agent_type", event.agent_type.lower())).inc()
        window_start = event.timestamp - timedelta(hours=self.settings.history_window_hours)
        recent = [e for e in entries if e.event_time >= window_start]
        if recent:
            m.agent_success_rate.labels(
                m.labels("tenant", event.tenant_id), m.labels("agent", event.agent_name)
            ).set(sum(e.threshold_met for e in recent) / len(recent))


class ClaimStage:
    """Stage 3: the claim graph, keyed by (tenant, claim_id)."""

    def __init__(self, settings: Settings, configs: ScoringConfigs, metrics: Metrics) -> None:
        self.settings = settings
        self.configs = configs
        self.metrics = metrics
        self.newest_event_time: datetime | None = None

    def process(
        self, values: list[bytes], load: Callable[[bytes], claim_graph.ClaimState | None]
    ) -> tuple[list[Record], dict[bytes, claim_graph.ClaimState]]:
        out = _Outputs(self.settings, self.metrics)
        dirty: dict[bytes, claim_graph.ClaimState] = {}
        for value in values:
            envelope = ClaimMessage.model_validate_json(value)
            message: claim_graph.ClaimArrived | claim_graph.PeerUpdate | None = (
                envelope.arrived if envelope.kind == "arrived" else envelope.peer
            )
            assert message is not None
            claim_id = envelope.recipient
            key = table_key(envelope.tenant_id, claim_id)
            state = dirty.get(key) or load(key)
            new_state, result = claim_graph.handle(state, claim_id, message, self.configs.claims)
            dirty[key] = new_state
            if self.newest_event_time is None or message.event_time > self.newest_event_time:
                self.newest_event_time = message.event_time
            for score in result.scores:
                self._emit(envelope, score, out)
            for recipient, update in result.messages:
                forward = ClaimMessage(
                    kind="peer",
                    tenant_id=envelope.tenant_id,
                    recipient=recipient,
                    peer=update,
                    received_at=envelope.received_at,
                )
                key = table_key(envelope.tenant_id, recipient)
                out.records.append(
                    Record(self.settings.claims_topic, key, forward.model_dump_json().encode())
                )
        return out.records, dirty

    def _emit(self, envelope: ClaimMessage, score: claim_graph.ClaimScore, out: _Outputs) -> None:
        output = ClaimScored(
            event_id=output_event_id(
                "CLAIM_SCORED",
                score.source_event_id,
                envelope.tenant_id,
                score.claim_id,
                score.cause,
                str(score.sequence),
            ),
            source_event_id=score.source_event_id,
            trace_id=score.trace_id,
            tenant_id=envelope.tenant_id,
            scored_at=_now(),
            claim_id=score.claim_id,
            interval=score.interval,
            as_of=score.as_of,
            cause=score.cause,
        ).model_dump(mode="json")
        out.emit(output, score.trace_id.encode(), _is_flagged(output), envelope.received_at)

    def expired(self, state: claim_graph.ClaimState) -> bool:
        """Claims live `claim_ttl_days` of event time after their last update."""
        if self.newest_event_time is None or state.last_event_time is None:
            return False
        return self.newest_event_time - state.last_event_time > timedelta(days=self.settings.claim_ttl_days)
