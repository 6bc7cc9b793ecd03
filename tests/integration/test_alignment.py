"""Input alignment through Kafka: a partition far ahead in event time waits for a lagging backlog.

Two input partitions each hold a backlog before the worker starts: partition 0 ten hours of event
time *ahead* of partition 1's. Stage 1 must read partition 1 up to within INPUT_ALIGNMENT_MAX_LEAD_HOURS
of partition 0 before it reads partition 0 beyond a batch or two, and it must still score everything.
"""

from __future__ import annotations

from datetime import datetime

from streams.harness import RunningBroker
from streams.stages.common import key_partition
from tests.integration.fixtures import EventFactory, count_of, deploy

PER_PARTITION = 4_000
TRACES_PER_PARTITION = 20
SPAN_MINUTES = 600.0  # each partition's backlog spans ten hours of event time
BATCH = 100


def _traces_on(partition: int) -> list[str]:
    found: list[str] = []
    n = 0
    while len(found) < TRACES_PER_PARTITION:
        trace = f"align-{partition}-{n}"
        if key_partition(trace.encode(), 2) == partition:
            found.append(trace)
        n += 1
    return found


def _run(kafka: RunningBroker, lead_hours: str) -> tuple[int, int, int]:
    """With this lead: partition-0 events scored before partition 1's first, partition-0 events scored
    from then until partition 1 reached 9 h, and all events scored."""
    d = deploy(kafka, partitions=2, BATCH_SIZE=str(BATCH), INPUT_ALIGNMENT_MAX_LEAD_HOURS=lead_hours)
    f = EventFactory(tenant="align")
    events: dict[int, list[dict[str, object]]] = {}
    for partition, offset in ((0, SPAN_MINUTES), (1, 0.0)):
        traces = _traces_on(partition)
        events[partition] = [
            f.tool(
                traces[i % len(traces)], "find", f"t{i}", minutes=offset + i * SPAN_MINUTES / PER_PARTITION
            )
            for i in range(PER_PARTITION)
        ]
    d.produce(events[0])  # the partition ahead goes in first: a broker reading in order favours it
    d.produce(events[1])
    d.start_worker()
    try:
        ids = {str(e["event_id"]) for part in events.values() for e in part}
        records = d.collect(count_of("TRACE_SCORED", len(ids), d.settings.scored_topic, ids), timeout=180)
    finally:
        d.stop()
    scored_at = {
        o["source_event_id"]: datetime.fromisoformat(o["scored_at"])
        for o in d.outputs(records)
        if o["event_type"] == "TRACE_SCORED"
    }
    # Until partition 1 delivers, the worker cannot know it lags: which partition the broker serves
    # first decides what is scored before (Tansu tends to serve one partition's backlog first).
    first_lagging = min(scored_at[str(e["event_id"])] for e in events[1])
    # Partition 1 at 9 h of its 10: from then on partition 0 (10-20 h) is within a 1 h lead.
    nine_hours = scored_at[str(events[1][int(0.9 * PER_PARTITION)]["event_id"])]
    before = sum(1 for e in events[0] if scored_at[str(e["event_id"])] < first_lagging)
    early = sum(1 for e in events[0] if first_lagging <= scored_at[str(e["event_id"])] < nine_hours)
    return before, early, sum(1 for i in ids if i in scored_at)


def test_a_partition_ahead_in_event_time_waits_for_the_lagging_one(kafka: RunningBroker) -> None:
    before, early, scored = _run(kafka, lead_hours="1")
    assert scored == 2 * PER_PARTITION  # alignment delays, it never skips
    # Once the lagging partition delivers, a batch or two of partition 0 may still go through before
    # the check, plus what was already handed to the stream (one fetch hand-over and the stream buffer).
    assert early <= 6 * BATCH, (
        f"{early} events of the partition ahead were scored after the lagging one began and before "
        f"it caught up ({before} before it began)"
    )
