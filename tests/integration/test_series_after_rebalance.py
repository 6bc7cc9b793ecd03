"""A worker stops exporting the per-subject series of partitions a rebalance moved away.

The agent success rate and the calibration ECE / Brier gauges are set by the worker that scores the
subject. After a rebalance the new owner sets them; a stale copy left on the old owner stays at its
last value on every dashboard, beside the new one (sums double, averages mix old and new).
"""

from __future__ import annotations

import urllib.error
from collections.abc import Callable

from streams.harness import RunningBroker
from streams.stages.common import key_partition, tenant_partition
from streams.state import table_key
from tests.integration.fixtures import Deployment, EventFactory, assigned_partitions, count_of, deploy, poll
from tests.integration.workload import scrape

PARTITIONS = 2


def _first(names: list[str], partition_of: Callable[[str], int], partition: int) -> str:
    return next(n for n in names if partition_of(n) == partition)


# One tenant per calibration partition, whose responses (agent planner-1) are on the responses partition
# of the same number, so each partition moving away takes a tenant's average with it; and one agent per
# responses partition (with tenant "series").
TENANTS = [
    _first(
        [f"tenant-{i}" for i in range(200)],
        lambda t: (
            tenant_partition(t, PARTITIONS)
            if tenant_partition(t, PARTITIONS) == key_partition(table_key(t, "planner-1"), PARTITIONS)
            else -1
        ),
        p,
    )
    for p in range(PARTITIONS)
]
AGENTS = [
    _first([f"agent-{i}" for i in range(50)], lambda a: key_partition(table_key("series", a), PARTITIONS), p)
    for p in range(PARTITIONS)
]


def _exported(port: int) -> tuple[set[str], set[str], set[str]] | None:
    """(tenants with an ECE series, agents with a success-rate series, tenants with a confidence-average
    series) on the worker at `port`. Each tenant's responses come from one agent, so its average has
    one owner (thirty-first round: the average stayed on the old owner, frozen)."""
    try:
        s = scrape(port, timeout=5)
    except (urllib.error.URLError, OSError, AssertionError):
        return None
    tenants = {dict(labels)["tenant"] for labels in s.series("confidence_calibration_ece")}
    agents = {dict(labels)["agent"] for labels in s.series("confidence_agent_success_rate")}
    averaged = {dict(labels)["tenant"] for labels in s.series("llm_confidence_average")}
    return tenants & set(TENANTS), agents & set(AGENTS), averaged & set(TENANTS)


def _traffic(d: Deployment, minutes: float) -> None:
    """A scored response and its outcome per tenant, and a response per agent; waits for the scores."""
    events = []
    for tenant in TENANTS:
        f = EventFactory(tenant=tenant)
        response = f.response(f"{tenant}-trace", minutes, token_logprobs=[-0.2])
        events += [
            response,
            f.outcome(f"{tenant}-trace", minutes + 1, subject_event_id=response["event_id"], correct=True),
        ]
    f = EventFactory(tenant="series")
    events += [f.response(f"{agent}-trace", minutes, agent=agent) for agent in AGENTS]
    d.produce(events)
    ids = {e["event_id"] for e in events}
    d.collect(count_of("RESPONSE_SCORED", len(TENANTS) + len(AGENTS), d.settings.scored_topic, ids))


def _ready(port: int) -> bool:
    return (assigned_partitions(port) or 0) > 0


def test_series_of_partitions_that_moved_away_leave_the_old_owner(kafka: RunningBroker) -> None:
    assert len(set(TENANTS)) == len(set(AGENTS)) == PARTITIONS
    d = deploy(kafka, partitions=PARTITIONS, SWEEP_INTERVAL_SECONDS="0.5")
    d.start_worker()
    try:
        first = d.web_ports[0]
        _traffic(d, 0)
        everything = (set(TENANTS), set(AGENTS), set(TENANTS))
        assert poll(lambda: _exported(first), lambda e: e == everything, 60) == everything

        d.start_worker()  # takes one partition of each topic
        second = d.web_ports[1]
        assert poll(lambda: _ready(first) and _ready(second), bool, 90), "the two workers never settled"
        # The first worker keeps the series of the partition it still owns, and only those.
        kept = poll(lambda: _exported(first), lambda e: e is not None and len(e[0]) == len(e[1]) == 1, 60)
        assert kept is not None and len(kept[0]) == len(kept[1]) == 1, kept

        # New traffic: each subject is exported by exactly one worker, its owner.
        _traffic(d, 10)

        def split() -> tuple[set[str], ...] | None:
            a, b = _exported(first), _exported(second)
            return None if a is None or b is None else (a[0], b[0], a[1], b[1], a[2], b[2])

        def disjoint_and_complete(s: tuple[set[str], ...] | None) -> bool:
            wanted = (set(TENANTS), set(AGENTS), set(TENANTS))
            return s is not None and all(s[2 * i] | s[2 * i + 1] == w for i, w in enumerate(wanted))

        def apart(s: tuple[set[str], ...] | None) -> bool:
            return s is not None and not any(s[i] & s[i + 1] for i in (0, 2, 4))

        final = poll(split, lambda s: disjoint_and_complete(s) and apart(s), 60)
        assert disjoint_and_complete(final), final
        assert apart(final), final
    finally:
        d.stop()
