"""Stage 1, keyed by trace: decode, dead-letter, evidence, synthesis; forward responses and claims."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from streams.config import ScoringConfigs, Settings
from streams.decode import decode
from streams.decoded_states import UndecodableState
from streams.dlq import DeadLetter
from streams.events import (
    ClaimEvent,
    LlmResponse,
    OutcomeEvent,
    SynthesisScored,
    ToolInvocation,
    TraceScored,
)
from streams.ids import output_event_id
from streams.metrics import Metrics
from streams.scoring import claim_graph, evidence, heuristic, response, synthesis
from streams.stages.calibration import calibration_records, upstream
from streams.stages.claims import claim_message, claim_outcome_message
from streams.stages.common import (
    INPUT_SOURCE_STRIDE,
    ExpiryClock,
    InputRecord,
    MeasuredSizes,
    Outputs,
    Record,
    StateSizes,
    ValueBound,
    is_flagged,
    key_partition,
    now,
    with_scored_at,
    without_scored_at,
)
from streams.state import (
    CalibrationItem,
    CalibrationSubject,
    PendingResponse,
    ResponseOutcome,
    SubCallRecord,
    TraceState,
    remembered_outputs,
    remembering,
    table_key,
)

__all__ = ["TraceStage", "claim_definition"]

StateChanges = dict[str, object]  # TraceState fields an input changes, applied in one copy


@dataclass
class _Batch:
    """One batch's view of the trace table: states changed so far and an upper bound of their size."""

    load: Callable[[bytes], TraceState | None]
    sizes: StateSizes[TraceState]
    dirty: dict[bytes, TraceState] = field(default_factory=dict)
    size_bound: dict[bytes, int] = field(default_factory=dict)  # encoded bytes, at most

    def state(self, key: bytes) -> TraceState | None:
        """The trace's state as this batch has left it so far, else as stored."""
        return self.dirty.get(key) or self.load(key)


WRONG_KEY_MESSAGE = (
    "the record's key is not the event's trace_id as UTF-8: every event of a trace must carry it, so "
    'that the trace\'s events reach one partition (README "Producing events")'
)


class TraceStage:
    """Stage 1: everything keyed by trace."""

    def __init__(self, settings: Settings, configs: ScoringConfigs, metrics: Metrics) -> None:
        self.settings = settings
        self.configs = configs
        self.metrics = metrics
        # With several input topics, the topics sharing a partition number are that partition's sources
        # and its clock is the oldest of their newest times: a topic read ahead must not expire the
        # traces whose next events wait unread in another (a trace's events may be in both). A topic
        # that goes quiet leaves the watermark after EXPIRY_SOURCE_IDLE_SECONDS, as on the later stages.
        topics = settings.input_topic_names
        self._topic_source = {topic: index for index, topic in enumerate(topics)}
        self.clock = ExpiryClock(
            timedelta(hours=settings.event_time_max_ahead_hours),
            settings.expiry_source_idle_seconds if len(topics) > 1 else None,
        )
        self.state_bound = ValueBound(
            settings.trace_state_max_bytes,
            "TRACE_STATE_MAX_BYTES",
            "the trace's state",
            "trace_state_full",
            "TraceStateFull",
        )

    def process(
        self,
        records: list[InputRecord],
        load: Callable[[bytes], TraceState | None],
        sizes: StateSizes[TraceState] | None = None,
    ) -> tuple[list[Record], dict[bytes, TraceState]]:
        """Process a batch in order; return records to send and the trace states to write (once each)."""
        out = Outputs(self.settings, self.metrics)
        batch = _Batch(load, sizes or MeasuredSizes(load))
        for record in records:
            out.guarded(record, "trace stage", lambda r: self._one(r, batch, out))
        out.settle()
        return [*out.records, *calibration_records(self.settings, out)], batch.dirty

    def _one(self, record: InputRecord, batch: _Batch, out: Outputs) -> None:
        event = decode(record.value, self.settings.max_event_bytes, self.settings.max_array_items)
        if isinstance(event, DeadLetter):
            out.dead_letter(event, record)
            return
        if record.key != event.trace_id.encode():
            # Keyed otherwise (or not at all), a trace's events can land on several partitions, each
            # owner scoring them against a state without the others': wrong scores, silently.
            out.dead_letter(
                DeadLetter(record.value or b"", "wrong_key", "WrongKey", WRONG_KEY_MESSAGE), record
            )
            return
        # Counted with the batch: an input dead-lettered later (trace_state_full, a scorer error) is not.
        out.meter(self.metrics.child(self.metrics.events_processed, event.event_type).inc)
        self.clock.saw(record.partition, event.timestamp, source=self._topic_source.get(record.topic, 0))
        if isinstance(event, OutcomeEvent):
            self._outcome(event, batch, record, out)  # changes no trace state: stage 4 de-duplicates
            return
        key = table_key(event.tenant_id, event.trace_id)
        state = batch.state(key)
        if key not in batch.size_bound:
            batch.size_bound[key] = batch.sizes.stored_bytes(key)
        if state is None:
            state = TraceState(
                tenant_id=event.tenant_id,
                trace_id=event.trace_id,
                partition=record.partition,
                last_event_time=self.clock.bounded(event.timestamp),
            )
        emitted_before = out.emitted_bytes
        changed = self._apply(state, event, record, out)
        if changed is not state:  # a re-delivery changes nothing, and is not written again
            emitted = out.emitted_bytes - emitted_before  # the outputs it remembers
            batch.size_bound[key] = self._checked_size(key, changed, record, emitted, batch)
            batch.dirty[key] = changed

    def _checked_size(
        self, key: bytes, state: TraceState, record: InputRecord, emitted: int, batch: _Batch
    ) -> int:
        """An upper bound of `state`'s encoded size, exact (one encode) once it nears the limit.

        Raises `Rejected` when the state would exceed `TRACE_STATE_MAX_BYTES` (`ValueBound`). The
        estimate: an input adds at most three times its own bytes (ids and targets are kept twice, and
        lower-casing a target can grow it by half: "İ" is 2 bytes, its lower case 3), its outputs and
        4 KB; the match index's entries of earlier targets (at most six list names each)
        stay well within the quarter of the limit below which the estimate is used.
        """
        estimate = batch.size_bound[key] + 3 * len(record.value or b"") + emitted + 4096
        return self.state_bound.checked(estimate, lambda: batch.sizes.measure(key, state), record)

    def _apply(
        self,
        state: TraceState,
        event: LlmResponse | ToolInvocation | ClaimEvent,  # OUTCOME never reaches trace state
        record: InputRecord,
        out: Outputs,
    ) -> TraceState:
        key = event.trace_id.encode()
        remembered = remembered_outputs(state, event.event_id)
        if remembered is not None:
            # Re-delivery: the same outputs again (fresh scored_at), and no state change.
            for output in remembered:
                out.emit(with_scored_at(output), key, is_flagged(output), record.timestamp)
            self._forward(event, state, record, out)
            return state
        if isinstance(event, ToolInvocation):
            changes, produced = self._tool(state, event, record, out)
        elif isinstance(event, LlmResponse):
            changes, produced = self._response(state, event, record, out)
        else:
            changes, produced = self._claim(state, event, record, out)
        # One copy per event: the handlers name the fields they change (a copy is about 1.5 us).
        return state.model_copy(
            update={
                **changes,
                # Bounded as the expiry clock is: a far-future date would keep the trace for ever.
                "last_event_time": max(state.last_event_time, self.clock.bounded(event.timestamp)),
                **remembering(state, event.event_id, produced),
            }
        )

    # --- TOOL_INVOCATION -> TRACE_SCORED ---------------------------------------------------------------

    def _tool(
        self, state: TraceState, event: ToolInvocation, record: InputRecord, out: Outputs
    ) -> tuple[StateChanges, list[dict[str, object]]]:
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
            scored_at=now(),
            **vars(result),  # the evidence fields, top level (vars: a model's dict() iterates, 3-4 us)
        ).model_dump(mode="json")
        m = self.metrics
        out.meter(m.child(m.evidence_band, result.band).inc)
        if result.recovery_recommended:
            out.meter(m.recovery_recommended.inc)
        out.emit(output, event.trace_id.encode(), is_flagged(output), record.timestamp)
        if self.settings.calibration_enabled:
            subject = CalibrationSubject(
                subject_type="trace",
                subject_id=event.trace_id,
                event_time=event.timestamp,
                scores={"evidence": result.score},
                agent_type=event.agent_type,
            )
            source = upstream("trace", self._source(record))
            item = CalibrationItem(subject=subject, received_at=record.timestamp)
            out.calibrate(event.tenant_id, source, item)
        return {"evidence": new_evidence}, [without_scored_at(output)]

    # --- OUTCOME -> the calibration stage ------------------------------------------------------------

    def _outcome(self, event: OutcomeEvent, batch: _Batch, record: InputRecord, out: Outputs) -> None:
        """To the calibration stage the way the scores it judges go, so it arrives behind them.

        Sent straight from here, an outcome could reach the calibration stage before the score it
        judges, still on its way through a later stage: counted against an older score (a claim's), or
        waiting until the sweep counted it unmatched (a response's, when the clock had passed its wait;
        a response the agent stage dead-letters still makes no score to wait for).
        A response this trace does not know (another trace id, a trace expired, or applied before
        `response_agents` existed or while calibration was off) has no known route: it goes straight, as before.
        """
        if not self.settings.calibration_enabled:
            self.metrics.outcomes.labels("disabled").inc()
            return
        if event.subject_type == "claim":
            out.forward(claim_outcome_message(self.settings, event, record, self._source(record)))
            return
        agent = self._agent_of_response(event, batch) if event.subject_type == "response" else None
        if agent is not None:
            message = ResponseOutcome(
                outcome=event, received_at=record.timestamp, source_partition=self._source(record)
            )
            key = table_key(event.tenant_id, agent)  # the response's own key and partition (`_send_pending`)
            partition = key_partition(key, self.settings.topic_partitions)
            value = message.model_dump_json().encode()
            out.forward(Record(self.settings.responses_topic, key, value, partition=partition))
            return
        source = upstream("trace", self._source(record))
        out.calibrate(event.tenant_id, source, CalibrationItem(outcome=event, received_at=record.timestamp))

    @staticmethod
    def _agent_of_response(event: OutcomeEvent, batch: _Batch) -> str | None:
        """The agent of the response an outcome judges, if the outcome's trace applied it (the only
        outcomes that read trace state: a claim's or a trace's route needs none). A trace state this
        version cannot read gives no route: the outcome needs none of it, so it goes straight rather
        than to the dead-letter topic."""
        key = table_key(event.tenant_id, event.trace_id)
        try:
            state = batch.state(key)
        except UndecodableState:
            return None
        return None if state is None else state.response_agents.get(event.subject_id)

    # --- LLM_RESPONSE -> (SYNTHESIS_SCORED) + forward to the agent stage ---------------------------------

    def _response(
        self, state: TraceState, event: LlmResponse, record: InputRecord, out: Outputs
    ) -> tuple[StateChanges, list[dict[str, object]]]:
        changes: StateChanges = {"response_times": {**state.response_times, event.event_id: event.timestamp}}
        if self.settings.calibration_enabled:  # the route of an OUTCOME judging it; dropped when off
            changes["response_agents"] = {**state.response_agents, event.event_id: event.agent_name}
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
            changes["sub_calls"] = {**state.sub_calls, sub_id: sub}
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
                scored_at=now(),
                overall_confidence=result.overall,
                level=result.level,
                sources=list(result.sources),
                conflicts=list(result.conflicts),
                warnings=list(result.warnings),
                filtered_count=result.filtered_count,
            ).model_dump(mode="json")
            m = self.metrics
            out.meter(functools.partial(m.synthesis_confidence.observe, result.overall))
            out.meter(functools.partial(m.synthesis_conflicts.observe, len(result.conflicts)))
            out.meter(functools.partial(m.synthesis_filtered.observe, result.filtered_count))
            out.emit(output, event.trace_id.encode(), is_flagged(output), record.timestamp)
            produced.append(without_scored_at(output))
        self._send_pending(pending, out)
        return changes, produced

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
            source_partition=self._source(record),
        )

    def _send_pending(self, pending: PendingResponse, out: Outputs) -> None:
        key = table_key(pending.event.tenant_id, pending.event.agent_name)
        partition = key_partition(key, self.settings.topic_partitions)  # the key's, as Kafka would pick
        out.forward(
            Record(
                self.settings.responses_topic, key, pending.model_dump_json().encode(), partition=partition
            )
        )

    # --- CLAIM -> remembered for synthesis + forward to the claim stage --------------------------------

    def _claim(
        self, state: TraceState, event: ClaimEvent, record: InputRecord, out: Outputs
    ) -> tuple[StateChanges, list[dict[str, object]]]:
        changes: StateChanges = {}
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
            changes["claims"] = {**claims, event.claim_id: trace_claim}
        self._send_claim(event, record, out)
        return changes, []

    def _send_claim(
        self, event: ClaimEvent, record: InputRecord, out: Outputs, redelivered: bool = False
    ) -> None:
        arrived = claim_graph.ClaimArrived(
            definition=claim_definition(event), source_event_id=event.event_id, event_time=event.timestamp
        )
        message = claim_message(
            self.settings, event.tenant_id, arrived, record, redelivered, self._source(record)
        )
        out.forward(message)

    def _forward(
        self,
        event: LlmResponse | ToolInvocation | ClaimEvent,
        state: TraceState,
        record: InputRecord,
        out: Outputs,
    ) -> None:
        """On re-delivery, downstream stages get the input again and re-emit their remembered outputs."""
        if isinstance(event, LlmResponse):
            # At its first event time, should its producer have re-stamped the retry: the agent stage
            # finds the entry it counted there and re-emits the same scores (DESIGN 4b).
            first = state.response_times.get(event.event_id, event.timestamp)
            if first != event.timestamp:
                event = event.model_copy(update={"timestamp": first})
            self._send_pending(self._pending(event, record).model_copy(update={"redelivered": True}), out)
        elif isinstance(event, ClaimEvent):
            # Marked, so the claim stage never applies it again, even where the claim has forgotten
            # it (more than `max_remembered_events` later inputs of the claim).
            self._send_claim(event, record, out, redelivered=True)

    def _source(self, record: InputRecord) -> int:
        """The input partition as the later stages' expiry clocks count it: one source per input topic's
        partition (partition numbers of the first topic as they are; INPUT_SOURCE_STRIDE apart after)."""
        return self._topic_source.get(record.topic, 0) * INPUT_SOURCE_STRIDE + record.partition

    def input_latest(self, topic: str, partition: int) -> datetime | None:
        """The event time of the latest input read from this topic's partition (input alignment)."""
        return self.clock.latest_of(partition, self._topic_source.get(topic, 0))

    def expired(self, state: TraceState) -> bool:
        """Idle longer than the trace TTL, measured against its partition's newest event time (with
        several input topics, the oldest of those topics' newest: `ExpiryClock.passed`)."""
        return self.clock.passed(*self.sweep_after(b"", state))

    def sweep_after(self, key: bytes, state: TraceState) -> tuple[int, datetime]:
        """(partition, event time) before which the sweep need not look at this trace."""
        return state.partition, state.last_event_time + timedelta(hours=self.settings.trace_ttl_hours)


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
        agent_type=event.agent_type,
    )
