"""Mutation review (thirty-second round): what the stage tests left open in streams/state.py."""

from __future__ import annotations

from datetime import UTC, datetime

from streams.state import REMEMBERED_BLOCK, TraceState, remembered_outputs, remembering


def test_every_input_of_a_trace_finds_its_outputs_across_several_compressed_blocks() -> None:
    """The stage test re-delivers an input of the first block only. Mutation `index = len(archived)`
    -> one less: the second block's inputs pointed at the first (KeyError on a re-delivery: the input
    dead-lettered instead of its outputs re-emitted). Mutation `archived_in` without the older blocks'
    entries: re-delivered inputs of the first block were taken as new and applied again. Mutation: a
    recent input remembered with part of its outputs (each input here has two, as a scored response
    has its score and its calibration item): a re-delivery re-emitted only the first."""
    state = TraceState(
        tenant_id="t", trace_id="tr", partition=0, last_event_time=datetime(2026, 1, 1, tzinfo=UTC)
    )
    count = 3 * REMEMBERED_BLOCK + 7
    for i in range(count):
        state = state.model_copy(
            update=remembering(state, f"e{i}", [{"event_id": f"out-{i}", "n": i}, {"event_id": f"cal-{i}"}])
        )
    assert len(state.archived) == 3 and len(state.remembered) == 7
    for i in range(count):
        assert remembered_outputs(state, f"e{i}") == [
            {"event_id": f"out-{i}", "n": i},
            {"event_id": f"cal-{i}"},
        ], i
    assert remembered_outputs(state, "never-applied") is None
