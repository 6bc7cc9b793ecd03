"""Stage 2's agent history (kept sorted, windows found by bisection) against a brute-force reference.

Responses arrive in shuffled event-time order and some are re-delivered; after every input the history
factor must equal seed 004's rule computed over every distinct response applied before it, the stored
history must be sorted and hold each event id once, and a history stored unsorted (by an older
version) must decode sorted.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry

from streams import metrics
from streams.config import load_settings, scoring_configs
from streams.scoring import composite
from streams.stages import AgentStage, InputRecord, TraceStage
from streams.state import AgentHistory, HistoryEntry

T0 = datetime(2026, 11, 1, tzinfo=UTC)
EXAMPLE = orjson.loads((Path(__file__).parents[2] / "schemas/examples/LLM_RESPONSE.json").read_bytes())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_history_factor_equals_brute_force_with_shuffled_times_and_redelivery(seed: int) -> None:
    rng = random.Random(seed)
    settings = load_settings()
    configs = scoring_configs(settings)
    trace_stage = TraceStage(settings, configs, metrics.create(CollectorRegistry()))
    stage = AgentStage(settings, configs, metrics.create(CollectorRegistry()))
    window = timedelta(hours=settings.history_window_hours)

    def forwarded(event_id: str, when: datetime, offset: int) -> bytes:
        retrieval = [{"similarity": rng.choice([0.2, 0.9]), "source": "s"}]
        event = {**EXAMPLE, "event_id": event_id, "timestamp": when.isoformat(), "retrieval": retrieval}
        out, _ = trace_stage.process([InputRecord("in", 0, offset, 1.0, orjson.dumps(event))], lambda k: None)
        return next(r.value for r in out if r.topic == settings.responses_topic)

    # 120 responses over 60 h (inside the 168 h retention), shuffled; equal times on purpose.
    times = [T0 + timedelta(minutes=30 * rng.randrange(120)) for _ in range(120)]
    inputs = [(str(uuid.uuid4()), when) for when in times]
    order = [*inputs, *rng.sample(inputs, 15)]  # 15 re-deliveries
    rng.shuffle(order)
    table: dict[bytes, AgentHistory] = {}
    applied: dict[str, tuple[datetime, bool, float]] = {}  # event id -> (time, threshold_met, factor)
    for offset, (event_id, when) in enumerate(order):
        record = InputRecord(settings.responses_topic, 0, offset, 1.0, forwarded(event_id, when, offset))
        outputs, dirty = stage.process([record], table.get)
        table.update(dirty)
        (scored,) = [orjson.loads(r.value) for r in outputs if r.topic == settings.scored_topic]
        factor = scored["composite"]["factors"]["agent_history"]
        if event_id in applied:
            assert factor == applied[event_id][2]  # re-delivery: the factor it was scored with
            continue
        expected = composite.history_score([(t, met) for t, met, _ in applied.values()], when, window)
        assert factor == pytest.approx(expected, abs=1e-12)
        applied[event_id] = (when, bool(scored["composite"]["threshold_met"]), factor)
    (history,) = table.values()
    assert [e.event_time for e in history.entries] == sorted(e.event_time for e in history.entries)
    assert sorted(e.event_id for e in history.entries) == sorted(applied)


def test_a_history_stored_unsorted_decodes_sorted() -> None:
    entries = [
        HistoryEntry(
            event_id=str(i),
            event_time=T0 + timedelta(hours=h),
            threshold_met=True,
            composite=0.8,
            blocked=False,
            history_score=0.5,
        )
        for i, h in enumerate([5, 1, 3, 2])
    ]
    raw = orjson.dumps(
        {
            "tenant_id": "t",
            "agent_name": "a",
            "agent_type": "planner",
            "entries": [e.model_dump(mode="json") for e in entries],
        }
    )
    history = AgentHistory.model_validate_json(raw)
    assert [e.event_id for e in history.entries] == ["1", "3", "2", "0"]
