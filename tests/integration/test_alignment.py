"""Input alignment through Kafka: a partition far ahead in event time waits for a lagging backlog.

The test, not the broker, decides the order. Partition 1 delivers first (one event at hour 0), so the
worker knows it lags before partition 0 gets anything. Then partition 0 gets a backlog ten hours of
event time *ahead* (hours 10-20): stage 1 must pause it after a batch or two (the worker logs it).
Only then does partition 1 get its own backlog (hours 0-10). Partition 0's backlog was in the broker
all along, so without the gate it is read while partition 1's is still being produced; with it,
partition 0 stays paused until partition 1 is within INPUT_ALIGNMENT_MAX_LEAD_HOURS of it. And
everything is scored in the end.
"""

from __future__ import annotations

from datetime import datetime

from streams.harness import RunningBroker
from streams.stages.common import key_partition
from tests.integration.fixtures import EventFactory, count_of, deploy, poll

PER_PARTITION = 4_000
TRACES_PER_PARTITION = 20
SPAN_MINUTES = 600.0  # each partition's backlog spans ten hours of event time
BATCH = 100
# Partition 1 counts as delivering (holds partition 0 back) for this long after its event time last
# moved on: longer than the test takes between its anchor event and its backlog (the default, 2 s,
# would let partition 0 go while the test waits for the pause and produces the lagging backlog).
IDLE_SECONDS = "300"
PAUSED_ZERO = "input alignment: partitions paused now: ['{topic}[0]']"  # streams/alignment.py, INFO


def _traces_on(partition: int) -> list[str]:
    found: list[str] = []
    n = 0
    while len(found) < TRACES_PER_PARTITION:
        trace = f"align-{partition}-{n}"
        if key_partition(trace.encode(), 2) == partition:
            found.append(trace)
        n += 1
    return found


def _run(kafka: RunningBroker, lead_hours: str) -> tuple[int, int]:
    """With this lead: partition-0 events scored before partition 1 reached 9 h, and all events scored."""
    d = deploy(
        kafka,
        partitions=2,
        BATCH_SIZE=str(BATCH),
        INPUT_ALIGNMENT_MAX_LEAD_HOURS=lead_hours,
        INPUT_ALIGNMENT_IDLE_SECONDS=IDLE_SECONDS,
    )
    f = EventFactory(tenant="align")
    ahead, lagging = _traces_on(0), _traces_on(1)
    anchor = f.tool(lagging[0], "find", "anchor", minutes=0.0)
    events: dict[int, list[dict[str, object]]] = {
        partition: [
            f.tool(traces[i % len(traces)], "find", f"t{i}", minutes=start + i * SPAN_MINUTES / PER_PARTITION)
            for i in range(PER_PARTITION)
        ]
        for partition, traces, start in ((0, ahead, SPAN_MINUTES), (1, lagging, 0.0))
    }
    # Partition 1 ends where partition 0 does: once it is read, partition 1 holds nobody back (with the
    # long idle time, its last backlog event at 10 h would hold partition 0 for IDLE_SECONDS).
    closing = f.tool(lagging[1], "find", "closing", minutes=2 * SPAN_MINUTES)
    scored = d.settings.scored_topic
    d.start_worker()
    try:
        d.produce([anchor])
        d.collect(count_of("TRACE_SCORED", 1, scored, {str(anchor["event_id"])}))
        d.produce(events[0])
        # The gate's decision: partition 0 paused (more than the lead ahead of partition 1 at 0 h).
        paused_zero = PAUSED_ZERO.format(topic=d.settings.input_topic_names[0])
        paused = poll(lambda: paused_zero in d.log_text(), bool, timeout=60, interval=0.2)
        assert paused, f"partition 0 was never paused by input alignment\n{d.log_tails()}"
        d.produce([*events[1], closing])
        ids = {str(e["event_id"]) for e in [anchor, *events[0], *events[1], closing]}
        records = d.collect(count_of("TRACE_SCORED", len(ids), scored, ids), timeout=180)
    finally:
        d.stop()
    scored_at = {
        o["source_event_id"]: datetime.fromisoformat(o["scored_at"])
        for o in d.outputs(records)
        if o["event_type"] == "TRACE_SCORED"
    }
    # Partition 1 at 9 h of its 10: from then on partition 0 (10-20 h) is within a 1 h lead.
    nine_hours = scored_at[str(events[1][int(0.9 * PER_PARTITION)]["event_id"])]
    early = sum(1 for e in events[0] if scored_at[str(e["event_id"])] < nine_hours)
    return early, sum(1 for i in ids if i in scored_at)


def test_a_partition_ahead_in_event_time_waits_for_the_lagging_one(kafka: RunningBroker) -> None:
    early, scored = _run(kafka, lead_hours="1")
    assert scored == 2 * PER_PARTITION + 2  # alignment delays, it never skips (anchor and closing too)
    # Partition 0's whole backlog was in the broker before partition 1's was produced: only the pause
    # keeps it back. What gets through: the batch whose check pauses it, what was already handed to
    # the stream (one fetch hand-over of BATCH records and a stream buffer of 2 x BATCH), and a batch
    # or two if Faust resumes it (its on_buffer_drop, docs/DECISIONS.md) before the next check pauses
    # it again (every batch and every 0.5 s).
    assert early <= 6 * BATCH, (
        f"{early} of {PER_PARTITION} events of the partition ahead were scored before the lagging "
        f"partition reached 9 h, though it was paused before the lagging backlog was produced"
    )
