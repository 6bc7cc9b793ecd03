"""Thin Faust agents: take a batch, hand it to its stage, write each table key once, send the outputs.

Batches come from `take_events` and outputs go through the app's producer (DESIGN section 10): Faust
flushes the producer before it commits the batch's offsets, so delivery is at-least-once and every
stage is idempotent by input event id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

import faust
from pydantic import BaseModel

from streams.app import Service
from streams.scoring.claim_graph import ClaimState
from streams.stages import InputRecord, Record
from streams.state import AgentHistory, TraceState

__all__ = ["attach_agents"]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


def _loader(table: faust.Table, model: type[M]) -> Callable[[bytes], M | None]:
    def load(key: bytes) -> M | None:
        raw = table.get(key)
        return None if raw is None else model.model_validate_json(raw)

    return load


def _records(events: Sequence[faust.EventT[bytes]]) -> list[InputRecord]:
    return [
        InputRecord(e.message.topic, e.message.partition, e.message.offset, e.message.timestamp, e.value)
        for e in events
    ]


async def _send(app: faust.App, records: Sequence[Record]) -> None:
    producer = app.producer
    for record in records:
        await producer.send(record.topic, record.key, record.value, None, None, record.headers)


def attach_agents(svc: Service) -> None:
    """Register the three stage agents and the state sweeps on `svc.app`."""
    app, settings = svc.app, svc.settings
    batch, within = settings.batch_size, settings.batch_within_seconds
    load_trace = _loader(svc.traces, TraceState)
    load_history = _loader(svc.agents_history, AgentHistory)
    load_claim = _loader(svc.claims, ClaimState)

    @app.agent(svc.input_topic, name="score-events")
    async def score_events(stream: faust.StreamT[bytes]) -> None:
        async for events in stream.take_events(batch, within=within):
            outputs, states = svc.trace_stage.process(_records(events), load_trace)
            for key, state in states.items():
                svc.traces.set_from(key, state.model_dump_json().encode(), state.partition)
            await _send(app, outputs)

    @app.agent(svc.responses_topic, name="score-responses")
    async def score_responses(stream: faust.StreamT[bytes]) -> None:
        async for events in stream.take_events(batch, within=within):
            outputs, states = svc.agent_stage.process(_records(events), load_history)
            for key, history in states.items():
                svc.agents_history[key] = history.model_dump_json().encode()
            await _send(app, outputs)

    @app.agent(svc.claims_topic, name="score-claims")
    async def score_claims(stream: faust.StreamT[bytes]) -> None:
        async for events in stream.take_events(batch, within=within):
            outputs, states = svc.claim_stage.process(_records(events), load_claim)
            for key, claim in states.items():
                svc.claims[key] = claim.model_dump_json().encode()
            await _send(app, outputs)

    @app.timer(interval=settings.sweep_interval_seconds)
    async def sweep_expired_state() -> None:
        """Drop traces idle past their TTL and claims past theirs (event time, this worker's partitions)."""
        expired_traces = [
            (key, state.partition)
            for key, raw in list(svc.traces.items())
            if svc.trace_stage.expired(state := TraceState.model_validate_json(raw))
        ]
        for key, partition in expired_traces:
            svc.traces.set_from(key, None, partition)
        expired_claims = [
            key
            for key, raw in list(svc.claims.items())
            if svc.claim_stage.expired(ClaimState.model_validate_json(raw))
        ]
        for key in expired_claims:
            svc.claims.pop(key, None)
        if expired_traces or expired_claims:
            log.info(
                "swept %d expired traces and %d expired claims", len(expired_traces), len(expired_claims)
            )

    del score_events, score_responses, score_claims, sweep_expired_state  # registered on the app
