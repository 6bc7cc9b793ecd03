"""Stage 3, keyed by (tenant, claim_id): the claim graph -> CLAIM_SCORED and neighbour messages."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from streams.config import ScoringConfigs, Settings
from streams.events import (
    ClaimScored,
)
from streams.ids import output_event_id
from streams.metrics import Metrics
from streams.scoring import claim_graph
from streams.stages.common import InputRecord, Outputs, Record, is_flagged, now
from streams.state import (
    ClaimMessage,
    table_key,
)

__all__ = ["ClaimStage"]


class ClaimStage:
    """Stage 3: the claim graph, keyed by (tenant, claim_id)."""

    def __init__(self, settings: Settings, configs: ScoringConfigs, metrics: Metrics) -> None:
        self.settings = settings
        self.configs = configs
        self.metrics = metrics
        self.newest_event_time: datetime | None = None

    def process(
        self, records: list[InputRecord], load: Callable[[bytes], claim_graph.ClaimState | None]
    ) -> tuple[list[Record], dict[bytes, claim_graph.ClaimState]]:
        """Process a batch in order; return records to send and the claim states to write (once each)."""
        out = Outputs(self.settings, self.metrics)
        dirty: dict[bytes, claim_graph.ClaimState] = {}
        for record in records:
            out.guarded(record, "claim stage", lambda r: self._one(r, load, dirty, out))
        return out.records, dirty

    def _one(
        self,
        record: InputRecord,
        load: Callable[[bytes], claim_graph.ClaimState | None],
        dirty: dict[bytes, claim_graph.ClaimState],
        out: Outputs,
    ) -> None:
        envelope = ClaimMessage.model_validate_json(record.value or b"")
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
            recipient_key = table_key(envelope.tenant_id, recipient)
            out.records.append(
                Record(self.settings.claims_topic, recipient_key, forward.model_dump_json().encode())
            )

    def _emit(self, envelope: ClaimMessage, score: claim_graph.ClaimScore, out: Outputs) -> None:
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
            scored_at=now(),
            claim_id=score.claim_id,
            interval=score.interval,
            as_of=score.as_of,
            cause=score.cause,
        ).model_dump(mode="json")
        out.emit(output, score.trace_id.encode(), is_flagged(output), envelope.received_at)

    def expired(self, state: claim_graph.ClaimState) -> bool:
        """Claims live `claim_ttl_days` of event time after their last update."""
        if self.newest_event_time is None or state.last_event_time is None:
            return False
        return self.newest_event_time - state.last_event_time > timedelta(days=self.settings.claim_ttl_days)
