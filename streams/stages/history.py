"""Stage 2, keyed by (tenant, agent): the composite with the agent's rolling history -> RESPONSE_SCORED."""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable
from datetime import datetime, timedelta

from streams.config import ScoringConfigs, Settings
from streams.events import (
    PolicyInput,
    RejectionError,
    ResponseMetadata,
    ResponseScored,
    ScoreKind,
)
from streams.ids import output_event_id
from streams.metrics import Metrics
from streams.scoring import composite, response
from streams.stages.calibration import calibration_records, upstream
from streams.stages.common import InputRecord, Outputs, Record, is_flagged, now
from streams.state import (
    AgentHistory,
    CalibrationItem,
    CalibrationSubject,
    HistoryEntry,
    PendingResponse,
    table_key,
)

__all__ = ["AgentStage"]

_EVENT_TIME = operator.attrgetter("event_time")


def _between(
    entries: tuple[HistoryEntry, ...], start: datetime, end: datetime, inclusive: bool = False
) -> tuple[HistoryEntry, ...]:
    """The entries (sorted by event time) with start <= event_time < end (<= end if `inclusive`)."""
    low = bisect.bisect_left(entries, start, key=_EVENT_TIME)
    bound = bisect.bisect_right if inclusive else bisect.bisect_left
    return entries[low : bound(entries, end, lo=low, key=_EVENT_TIME)]


class AgentStage:
    """Stage 2: composite with the agent's rolling history, keyed by (tenant, agent_name)."""

    def __init__(self, settings: Settings, configs: ScoringConfigs, metrics: Metrics) -> None:
        self.settings = settings
        self.configs = configs
        self.metrics = metrics

    def process(
        self, records: list[InputRecord], load: Callable[[bytes], AgentHistory | None]
    ) -> tuple[list[Record], dict[bytes, AgentHistory]]:
        """Process a batch in order; return records to send and the histories to write (once each)."""
        out = Outputs(self.settings, self.metrics)
        dirty: dict[bytes, AgentHistory] = {}
        for record in records:
            out.guarded(record, "history stage", lambda r: self._one(r, load, dirty, out))
        return [*out.records, *calibration_records(self.settings, out)], dirty

    def _one(
        self,
        record: InputRecord,
        load: Callable[[bytes], AgentHistory | None],
        dirty: dict[bytes, AgentHistory],
        out: Outputs,
    ) -> None:
        pending = PendingResponse.model_validate_json(record.value or b"")
        event = pending.event
        key = table_key(event.tenant_id, event.agent_name)
        history = dirty.get(key) or load(key)
        if history is None:
            history = AgentHistory(
                tenant_id=event.tenant_id, agent_name=event.agent_name, agent_type=event.agent_type
            )
        dirty[key] = self._apply(history, pending, record, out)

    def _apply(
        self, history: AgentHistory, pending: PendingResponse, record: InputRecord, out: Outputs
    ) -> AgentHistory:
        event = pending.event
        entries = history.entries  # sorted by event time (see below), so windows are found by bisection
        # A re-delivered response has the same event time: only entries at that time can be it.
        same_time = _between(entries, event.timestamp, event.timestamp, inclusive=True)
        known = next((e for e in same_time if e.event_id == event.event_id), None)
        if known is not None:
            history_factor = known.history_score
        else:
            window = timedelta(hours=self.settings.history_window_hours)
            history_factor = composite.history_score(
                [
                    (e.event_time, e.threshold_met)
                    for e in _between(entries, event.timestamp - window, event.timestamp)
                ],
                event.timestamp,
                window,
            )
        output = self._scored(pending, history_factor)
        out.emit(output, event.trace_id.encode(), is_flagged(output), pending.received_at)
        if self.settings.calibration_enabled:
            self._send_subject(pending, output, record, out)
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
        newest = max(event.timestamp, entries[-1].event_time) if entries else event.timestamp
        horizon = newest - timedelta(hours=self.settings.history_retention_hours)
        # Kept sorted: the new entry goes after those with the same or an earlier time.
        at = bisect.bisect_right(entries, event.timestamp, key=_EVENT_TIME)
        kept = (*entries[:at], entry, *entries[at:])
        kept_entries = kept[bisect.bisect_left(kept, horizon, key=_EVENT_TIME) :]
        self._observe(pending, output, kept_entries)
        return history.model_copy(update={"entries": kept_entries, "agent_type": event.agent_type})

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
            scored_at=now(),
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
            policy_input=PolicyInput(
                confidence=decision.confidence,
                confidence_enabled=cfg.enabled,
                request_id=event.request_id,
                tenant_id=event.tenant_id,
                endpoint=event.endpoint,
                model=event.model,
            ),
        ).model_dump(mode="json")

    def _send_subject(
        self, pending: PendingResponse, output: dict[str, object], record: InputRecord, out: Outputs
    ) -> None:
        """Tell the calibration stage which confidence and composite this response was given."""
        event = pending.event
        comp = output["composite"]
        assert isinstance(comp, dict)
        scores: dict[ScoreKind, float] = {"composite": float(comp["score"])}
        if pending.confidence is not None:
            scores["response"] = pending.confidence
        action = output["action"]
        assert action in ("allow", "flag", "reject")
        subject = CalibrationSubject(
            subject_type="response",
            subject_id=event.event_id,
            event_time=event.timestamp,
            scores=scores,
            action=action,
            model=event.model,
            agent_type=event.agent_type,
        )
        source = upstream("responses", record.partition)
        out.calibrate(
            event.tenant_id, source, CalibrationItem(subject=subject, received_at=pending.received_at)
        )

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
                m.child(m.confidence_missing, *labels).inc()
        else:
            m.child(m.confidence_histogram, *labels).observe(pending.confidence)
            gauge = m.child(m.confidence_average, *labels)
            previous = gauge._value.get()
            gauge.set(
                pending.confidence if previous == 0 else previous + 0.05 * (pending.confidence - previous)
            )
        m.child(m.response_actions, str(output["action"])).inc()
        if output["action"] == "reject":
            m.child(m.confidence_rejected, *labels).inc()
        comp = output["composite"]
        assert isinstance(comp, dict)
        if comp["should_block"]:
            m.child(m.composite_blocked, m.labels("agent_type", event.agent_type.lower())).inc()
        window_start = event.timestamp - timedelta(hours=self.settings.history_window_hours)
        recent = entries[bisect.bisect_left(entries, window_start, key=_EVENT_TIME) :]
        if recent:
            m.child(
                m.agent_success_rate, m.labels("tenant", event.tenant_id), m.labels("agent", event.agent_name)
            ).set(sum(e.threshold_met for e in recent) / len(recent))
