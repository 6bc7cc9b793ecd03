"""Stage 3, keyed by tenant: each tenant's claim graph, one CLAIM input at a time -> CLAIM_SCORED."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import orjson

from streams.config import ScoringConfigs, Settings
from streams.dlq import DeadLetter
from streams.events import ClaimScored, OutcomeEvent
from streams.ids import output_event_id
from streams.metrics import Metrics
from streams.scoring import claim_graph
from streams.scoring.claims import ClaimsConfig
from streams.stages.calibration import calibration_records, hand_on_outcome, upstream
from streams.stages.common import (
    ExpiryClock,
    InputRecord,
    MeasuredSizes,
    Outputs,
    Record,
    Rejected,
    StateSizes,
    ValueBound,
    is_flagged,
    now,
    tenant_partition,
)
from streams.state import CalibrationItem, CalibrationSubject, ClaimMessage, table_key

__all__ = ["ClaimStage", "ClaimWrite", "claim_message", "claim_outcome_message"]


def claim_message(
    settings: Settings,
    tenant_id: str,
    arrived: claim_graph.ClaimArrived,
    source: InputRecord,
    redelivered: bool = False,
    input_source: int | None = None,
) -> Record:
    """The record that carries a CLAIM input from stage 1 to the claim stage (key and partition: tenant).

    `input_source` is the input partition as the expiry clocks count it (stage 1's `_source`; by default
    the record's partition)."""
    value = ClaimMessage(
        tenant_id=tenant_id,
        arrived=arrived,
        received_at=source.timestamp,
        source_partition=source.partition if input_source is None else input_source,
        redelivered=redelivered,
    )
    return Record(
        settings.claims_topic,
        tenant_id.encode(),
        value.model_dump_json().encode(),
        partition=tenant_partition(tenant_id, settings.topic_partitions),
    )


def claim_outcome_message(
    settings: Settings, outcome: OutcomeEvent, source: InputRecord, input_source: int | None = None
) -> Record:
    """The record that carries an OUTCOME judging a claim from stage 1 through the claim stage.

    Keyed and partitioned by tenant like the CLAIMs, so stage 3 hands it to the calibration stage after
    the scores of every claim stage 1 sent before it: the outcome is counted against the score made
    last before it, whatever the batches or how far stage 3 lags (sent straight from stage 1, it
    overtook the scores of claims in the same batch and was counted against an older one).
    """
    value = ClaimMessage(
        tenant_id=outcome.tenant_id,
        outcome=outcome,
        received_at=source.timestamp,
        source_partition=source.partition if input_source is None else input_source,
    )
    return Record(
        settings.claims_topic,
        outcome.tenant_id.encode(),
        value.model_dump_json().encode(),
        partition=tenant_partition(outcome.tenant_id, settings.topic_partitions),
    )


@dataclass(frozen=True, slots=True)
class ClaimWrite:
    """A claim node to write to the table, and the changelog partition it belongs to (its tenant's)."""

    node: claim_graph.ClaimNode
    partition: int


@dataclass
class _Batch:
    """One batch's view of the claims table: nodes changed so far and an upper bound of their size."""

    load: Callable[[bytes], claim_graph.ClaimNode | None]
    sizes: StateSizes[claim_graph.ClaimNode]
    stored_facts: Callable[[bytes], claim_graph.NeighbourFacts | None]
    cfg: ClaimsConfig
    dirty: dict[bytes, ClaimWrite] = field(default_factory=dict)
    size_bound: dict[bytes, int] = field(default_factory=dict)  # key and encoded node, bytes at most

    def node(self, key: bytes) -> claim_graph.ClaimNode | None:
        write = self.dirty.get(key)
        return write.node if write is not None else self.load(key)

    def facts(self, key: bytes) -> claim_graph.NeighbourFacts | None:
        write = self.dirty.get(key)
        if write is not None:
            return claim_graph.neighbour_facts(write.node, self.cfg)
        return self.stored_facts(key)


class ClaimStage:
    """Stage 3: the claim graph of each tenant, processed in sequence (DESIGN 4b "Streaming")."""

    def __init__(self, settings: Settings, configs: ScoringConfigs, metrics: Metrics) -> None:
        self.settings = settings
        self.configs = configs
        self.metrics = metrics
        self.clock = ExpiryClock(
            timedelta(hours=settings.event_time_max_ahead_hours), settings.expiry_source_idle_seconds
        )
        self.node_bound = ValueBound(
            settings.claim_node_max_bytes,
            "CLAIM_NODE_MAX_BYTES",
            "a claim's table record",
            "claim_node_full",
            "ClaimNodeFull",
        )

    def process(
        self,
        records: list[InputRecord],
        load: Callable[[bytes], claim_graph.ClaimNode | None],
        sizes: StateSizes[claim_graph.ClaimNode] | None = None,
        facts: Callable[[bytes], claim_graph.NeighbourFacts | None] | None = None,
    ) -> tuple[list[Record], dict[bytes, ClaimWrite]]:
        """Process a batch in order; return records to send and the claim nodes to write (once each).

        `facts` answers `neighbour_facts` of a stored node (decoded_states.ClaimFacts keeps many of them).
        """
        out = Outputs(self.settings, self.metrics)
        cfg = self.configs.claims
        batch = _Batch(
            load,
            sizes or MeasuredSizes(load),
            facts or (lambda key: claim_graph.neighbour_facts(load(key), cfg)),
            cfg,
        )
        for record in records:
            out.guarded(record, "claim stage", lambda r: self._one(r, batch, out))
        out.settle()
        return [*out.records, *calibration_records(self.settings, out)], batch.dirty

    def _one(self, record: InputRecord, batch: _Batch, out: Outputs) -> None:
        message = ClaimMessage.model_validate_json(record.value or b"")
        tenant = message.tenant_id
        if message.outcome is not None:
            source = upstream("claims", record.partition)
            hand_on_outcome(out, message.outcome, message.received_at, message.source_partition, source)
            return
        assert message.arrived is not None  # the model holds exactly one of the two
        try:
            update = claim_graph.apply_claim(
                lambda claim_id: batch.node(table_key(tenant, claim_id)),
                message.arrived,
                self.configs.claims,
                lambda claim_id: batch.facts(table_key(tenant, claim_id)),
                # Expiry counts from the clock's bound: a mistyped far-future date would otherwise keep
                # the claim and every neighbour it touches for ever.
                touched_at=self.clock.bounded(message.arrived.event_time),
                redelivered=message.redelivered,
            )
        except claim_graph.GraphTooComplex as exc:
            letter = DeadLetter(record.value or b"", "claim_graph_too_complex", "GraphTooComplex", str(exc))
            raise Rejected(letter) from None
        writes = {table_key(tenant, claim_id): node for claim_id, node in update.nodes.items()}
        # Every node is checked before any is kept: a refused input changes no node at all.
        bounds = {key: self._checked_size(key, node, record, batch) for key, node in writes.items()}
        redelivered = not update.nodes  # its remembered score again: not a new score to calibrate
        for score in update.scores:  # before the nodes are kept: if this raised, nothing would be
            self._emit(tenant, score, message.received_at, record.partition, out, calibrate=not redelivered)
        for key, node in writes.items():
            batch.dirty[key] = ClaimWrite(node, record.partition)
        batch.size_bound.update(bounds)
        event_time = message.arrived.event_time
        self.clock.saw(record.partition, event_time, source=message.source_partition)

    def _checked_size(
        self, key: bytes, node: claim_graph.ClaimNode, record: InputRecord, batch: _Batch
    ) -> int:
        """An upper bound of the node's record size (key and value), exact (one encode) near the limit.

        Raises `Rejected` when it would exceed `CLAIM_NODE_MAX_BYTES` (`ValueBound`). The estimate:
        one input adds at most its own bytes to a neighbour (its id and edges) and twice them to its
        own node (its definition and the score it remembers), plus 4 KB.
        """
        if key not in batch.size_bound:
            batch.size_bound[key] = len(key) + batch.sizes.stored_bytes(key)
        estimate = batch.size_bound[key] + 2 * len(record.value or b"") + 4096
        return self.node_bound.checked(estimate, lambda: len(key) + batch.sizes.measure(key, node), record)

    def _emit(
        self,
        tenant: str,
        score: claim_graph.ClaimScore,
        received_at: float,
        partition: int,
        out: Outputs,
        calibrate: bool = True,
    ) -> None:
        output = ClaimScored(
            event_id=output_event_id("CLAIM_SCORED", score.source_event_id, tenant, score.claim_id),
            source_event_id=score.source_event_id,
            trace_id=score.trace_id,
            tenant_id=tenant,
            scored_at=now(),
            claim_id=score.claim_id,
            interval=score.interval,
            as_of=score.as_of,
            cause=score.cause,
        ).model_dump(mode="json")
        out.emit(output, score.trace_id.encode(), is_flagged(output), received_at)
        if self.settings.calibration_enabled and calibrate:
            subject = CalibrationSubject(
                subject_type="claim",
                subject_id=score.claim_id,
                event_time=score.as_of,
                scores={"claim": score.interval.midpoint},
                agent_type=score.agent_type,
            )
            source = upstream("claims", partition)
            out.calibrate(tenant, source, CalibrationItem(subject=subject, received_at=received_at))

    def sweep(
        self,
        past_ttl: Iterable[tuple[bytes, claim_graph.ClaimNode]],
        exists: Callable[[bytes], bool],
        load: Callable[[bytes], claim_graph.ClaimNode | None],
    ) -> tuple[list[bytes], dict[bytes, ClaimWrite]]:
        """What the sweep does with the claims past their TTL: the keys to delete, those no live claim
        points at (`claim_graph.sweepable`; the others stay due for the next sweep), and the nodes they
        pointed at, to rewrite without their entries (`claim_graph.without_expired`)."""
        by_tenant: dict[str, dict[str, tuple[bytes, claim_graph.ClaimNode]]] = {}
        for key, node in past_ttl:
            tenant, claim_id = orjson.loads(key)
            by_tenant.setdefault(str(tenant), {})[str(claim_id)] = (key, node)
        deletes: list[bytes] = []
        rewrites: dict[bytes, ClaimWrite] = {}
        for tenant, claims in by_tenant.items():
            nodes = {claim_id: node for claim_id, (_, node) in claims.items()}
            gone = claim_graph.sweepable(nodes, lambda claim_id, t=tenant: exists(table_key(t, claim_id)))
            deletes += [claims[claim_id][0] for claim_id in sorted(gone)]
            partition = tenant_partition(tenant, self.settings.topic_partitions)
            changed = claim_graph.without_expired(
                lambda claim_id, t=tenant: load(table_key(t, claim_id)), {c: nodes[c] for c in gone}
            )
            for claim_id, node in changed.items():
                rewrites[table_key(tenant, claim_id)] = ClaimWrite(node, partition)
        return deletes, rewrites

    def partition_of(self, key: bytes) -> int:
        """The changelog partition of a claims table key ([tenant, claim_id]): its tenant's."""
        tenant = orjson.loads(key)[0]
        return tenant_partition(str(tenant), self.settings.topic_partitions)

    def expired(self, key: bytes, node: claim_graph.ClaimNode) -> bool:
        """Claims (and stubs) live `claim_ttl_days` of event time after their last update, measured
        against their claims partition's watermark: the oldest newest claim event time of the input
        partitions still feeding it (`ExpiryClock.passed`)."""
        after = self.sweep_after(key, node)
        return after is not None and self.clock.passed(*after)

    def sweep_after(self, key: bytes, node: claim_graph.ClaimNode) -> tuple[int, datetime] | None:
        """(partition, event time) before which the sweep need not look at this node; None: never."""
        if node.last_event_time is None:
            return None
        return self.partition_of(key), node.last_event_time + timedelta(days=self.settings.claim_ttl_days)
