"""Hand mutation review of the edge modules (views, metrics, config, events): each test kills a mutant
that survived the existing unit tests, and asserts what DESIGN.md, the README or a seed promises."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from streams import metrics
from streams.config import load_settings, scoring_configs
from streams.metrics import SharedSeries
from streams.scoring import claim_graph
from streams.scoring.claims import ClaimInterval
from streams.stages.calibration import group_key
from streams.state import AgentHistory, GroupCalibration, HistoryEntry, table_key
from streams.views import agent_statistics, claim_matches
from tests.unit.test_views import _ask, _owning_every_key, _store_agent, _stored_group

# --- views ------------------------------------------------------------------------------------------


def test_claim_filters_are_inclusive_and_compare_after_rounding() -> None:
    """README: inclusive bounds, compared after rounding to 9 decimals (DESIGN 4b)."""
    assert claim_matches(0.3, 0.8, min_upper=0.8)  # upper exactly at min_upper
    assert claim_matches(0.5, 0.9, max_lower=0.5)  # lower exactly at max_lower
    assert claim_matches(0.1, 0.7999999999999999, min_upper=0.8)  # upper computed with float error
    assert not claim_matches(0.1, 0.79, min_upper=0.8)
    assert not claim_matches(0.51, 0.9, max_lower=0.5)


def _entry(i: int, met: bool, composite: float, blocked: bool) -> HistoryEntry:
    return HistoryEntry(
        event_id=f"e{i}",
        event_time=datetime(2026, 3, 2, tzinfo=UTC) - timedelta(minutes=i),
        threshold_met=met,
        composite=composite,
        blocked=blocked,
        history_score=0.05,
    )


def test_agent_statistics_are_seed_004s() -> None:
    """DESIGN 9: total, success rate, average composite, blocked count, threshold."""
    history = AgentHistory(
        tenant_id="acme", agent_name="p1", agent_type="patcher", newest=datetime(2026, 3, 2, tzinfo=UTC)
    )
    entries = [_entry(0, True, 0.9, False), _entry(1, False, 0.5, False), _entry(2, False, 0.3, True)]
    stats = agent_statistics(history, entries, 168.0, 0.8)
    assert stats["total_executions"] == 3
    assert stats["success_rate"] == pytest.approx(1 / 3)
    assert stats["average_confidence"] == pytest.approx((0.9 + 0.5 + 0.3) / 3)
    assert stats["blocked_count"] == 1
    assert stats["threshold"] == 0.8


def test_the_agent_view_defaults_to_168_hours() -> None:
    """DESIGN 4b: agent statistics `hours` default 168 (seed 004's example)."""
    svc = _owning_every_key()  # HISTORY_RETENTION_HOURS 168 by default
    _store_agent(svc, [timedelta(0), timedelta(hours=100), timedelta(hours=200)])

    async def check(client: Any) -> None:
        response = await client.get("/agents/acme/patcher-1")
        body = await response.json()
        assert (response.status, body["lookback_hours"], body["total_executions"]) == (200, 168.0, 2)

    _ask(svc, check)


def test_the_agent_view_refuses_hours_that_are_not_positive() -> None:
    svc = _owning_every_key()
    _store_agent(svc, [timedelta(0)])

    async def check(client: Any) -> None:
        for hours in ("0", "-1", "nan"):
            response = await client.get("/agents/acme/patcher-1", params={"hours": hours})
            assert response.status == 400, hours

    _ask(svc, check)


def _store_agent_type_group(svc: Any) -> None:
    group = GroupCalibration(
        tenant_id="acme",
        dimension="agent_type",
        value="planner",
        kind="composite",
        newest=datetime(2026, 1, 1, tzinfo=UTC),
    )
    key = group_key("acme", "agent_type", "planner", "composite")
    svc.calibration_groups.data[key] = group.model_dump_json().encode()


def test_the_calibration_view_defaults_and_names_the_setting() -> None:
    """README "Calibration": target_precision default 0.9; `setting` names CONFIDENCE_MIN_ACCEPTANCE for
    kind=response; `agent_type=` matches either spelling."""
    svc = _owning_every_key()
    _stored_group(svc)
    _store_agent_type_group(svc)

    async def check(client: Any) -> None:
        response = await client.get("/calibration/acme", params={"kind": "response"})
        body = await response.json()
        assert response.status == 200, body
        assert body["target_precision"] == 0.9
        assert [g["advice"]["setting"]["name"] for g in body["groups"]] == ["CONFIDENCE_MIN_ACCEPTANCE"]
        response = await client.get("/calibration/acme", params={"agent_type": "Planner"})
        body = await response.json()
        assert response.status == 200, body
        assert [(g["dimension"], g["value"]) for g in body["groups"]] == [("agent_type", "planner")]
        response = await client.get("/calibration/acme", params={"target_precision": "1"})
        assert response.status == 200  # a precision of 1 is a precision: (0, 1]

    _ask(svc, check)


def test_the_calibration_view_answers_500_when_only_unreadable_groups_might_match() -> None:
    """README: a 500 when none it can read matches the filter and some it cannot read might."""
    svc = _owning_every_key()
    svc.calibration_groups.data[group_key("acme", "model", "m", "response")] = b"not a group"

    async def check(client: Any) -> None:
        response = await client.get("/calibration/acme")
        body = await response.json()
        assert (response.status, body["unreadable_groups"]) == (500, 1)

    _ask(svc, check)


def _definition(claim_id: str) -> claim_graph.ClaimDefinition:
    return claim_graph.ClaimDefinition(claim_id=claim_id, trace_id="t1", statement="s", tier="task")


def test_a_claim_whose_graph_is_too_complex_answers_422(monkeypatch: pytest.MonkeyPatch) -> None:
    """README: past the claim graph's walk bounds the claim view answers 422 with {"error": ...}."""
    svc = _owning_every_key()
    node = claim_graph.ClaimNode(definition=_definition("c1"))
    svc.claims.data[table_key("acme", "c1")] = node.model_dump_json().encode()

    def too_complex(*args: object, **kwargs: object) -> ClaimInterval:
        raise claim_graph.GraphTooComplex("derived_from deeper than the bound")

    monkeypatch.setattr(claim_graph, "interval_of", too_complex)

    async def check(client: Any) -> None:
        response = await client.get("/claims/acme/c1")
        assert (response.status, await response.json()) == (
            422,
            {"error": "derived_from deeper than the bound"},
        )

    _ask(svc, check)


def test_a_claim_only_pointed_at_is_an_unknown_claim() -> None:
    """A stub node (edges towards a claim that never arrived) answers a JSON 404, not a crash."""
    svc = _owning_every_key()
    svc.claims.data[table_key("acme", "stub")] = claim_graph.ClaimNode().model_dump_json().encode()

    async def check(client: Any) -> None:
        response = await client.get("/claims/acme/stub")
        assert (response.status, response.content_type) == (404, "application/json")

    _ask(svc, check)


def test_healthz_answers_503_while_not_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """README HTTP table: liveness is a 503 with the reason while the worker is stopping."""
    svc = _owning_every_key()
    monkeypatch.setattr(svc.health, "liveness", lambda app: (False, "stopping"))

    async def check(client: Any) -> None:
        response = await client.get("/healthz")
        body = await response.json()
        assert (response.status, body["status"], body["reason"]) == (503, "failing", "stopping")

    _ask(svc, check)


# --- metrics ----------------------------------------------------------------------------------------

# README "Metrics": sample name -> label names, in the order the stages pass their values.
README_SERIES: dict[str, tuple[str, ...]] = {
    "llm_confidence_missing_total": ("tenant", "model", "endpoint"),
    "llm_confidence_rejected_total": ("tenant", "model", "endpoint"),
    "confidence_events_processed_total": ("event_type",),
    "confidence_events_dead_lettered_total": ("reason",),
    "confidence_outputs_emitted_total": ("event_type",),
    "confidence_evidence_band_total": ("band",),
    "confidence_composite_blocked_total": ("agent_type",),
    "confidence_state_undecodable_total": ("table",),
    "confidence_response_actions_total": ("action",),
    "confidence_outcomes_total": ("status",),
    "confidence_input_holds_total": (),
    "confidence_recovery_recommended_total": (),
    "confidence_outcomes_unmatched_total": (),
}
README_GAUGES: dict[str, tuple[str, ...]] = {
    "llm_confidence_average": ("tenant", "model", "endpoint"),
    "confidence_agent_success_rate": ("tenant", "agent"),
    "confidence_table_keys": ("table",),
    "confidence_consumer_lag": ("topic", "partition"),
    "confidence_calibration_ece": ("tenant", "dimension", "group", "kind"),
    "confidence_calibration_brier": ("tenant", "dimension", "group", "kind"),
    "confidence_input_partitions_paused": (),
    "confidence_internal_backlog_records": (),
}
README_HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "llm_confidence_histogram": ("tenant", "model", "endpoint"),
    "rlm_synthesis_confidence": (),
    "rlm_synthesis_conflicts": (),
    "rlm_synthesis_filtered_results": (),
    "confidence_processing_latency_seconds": ("event_type",),
    "confidence_batch_seconds": ("agent", "phase"),
}


def _by_name(m: metrics.Metrics) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for collector in m:
        name = getattr(collector, "_name", None)
        if name is not None:
            found[name] = collector
    return found


def _touch(m: metrics.Metrics, collector: Any, labels: tuple[str, ...], action: str) -> dict[str, str]:
    values = {label: f"v-{label}" for label in labels}
    target = m.child(collector, *values.values()) if labels else collector
    getattr(target, action)(0.05) if action == "observe" else getattr(target, action)()
    return values


def test_every_readme_metric_has_its_name_and_labels() -> None:
    registry = CollectorRegistry()
    m = metrics.create(registry)
    collectors = _by_name(m)
    for sample, labels in README_SERIES.items():
        values = _touch(m, collectors[sample.removesuffix("_total")], labels, "inc")
        assert registry.get_sample_value(sample, values) == 1.0, sample
    for sample, labels in README_GAUGES.items():
        values = _touch(m, collectors[sample], labels, "inc")
        assert registry.get_sample_value(sample, values) == 1.0, sample
    for sample, labels in README_HISTOGRAMS.items():
        values = _touch(m, collectors[sample], labels, "observe")
        assert registry.get_sample_value(f"{sample}_count", values) == 1.0, sample


def _bounds(registry: CollectorRegistry, family: str) -> list[float]:
    return [
        float(s.labels["le"])
        for metric in registry.collect()
        if metric.name == family
        for s in metric.samples
        if s.name == f"{family}_bucket" and s.labels["le"] != "+Inf"
    ]


def test_histogram_buckets_are_the_seeds() -> None:
    """Seed 003: buckets 0.1 .. 1.0; seed 000: LinearBuckets(0, 0.1, 11) and LinearBuckets(0, 1, 10)."""
    registry = CollectorRegistry()
    m = metrics.create(registry)
    m.child(m.confidence_histogram, "t", "m", "e").observe(0.5)
    m.synthesis_confidence.observe(0.5)
    m.synthesis_conflicts.observe(1)
    m.synthesis_filtered.observe(1)
    assert _bounds(registry, "llm_confidence_histogram") == [round(0.1 * i, 1) for i in range(1, 11)]
    assert _bounds(registry, "rlm_synthesis_confidence") == [round(0.1 * i, 1) for i in range(11)]
    assert _bounds(registry, "rlm_synthesis_conflicts") == [float(i) for i in range(10)]
    assert _bounds(registry, "rlm_synthesis_filtered_results") == [float(i) for i in range(10)]


def test_a_shared_series_leaves_with_its_last_subject_even_if_one_was_added_twice() -> None:
    """README: the series leaves once every agent that fed it was swept; stages add a subject per event."""
    shared: SharedSeries[str] = SharedSeries()
    shared.add("a", ("other",))
    shared.add("a", ("other",))
    shared.add("b", ("other",))
    assert shared.remove("a") == (("other",), False)
    assert shared.remove("b") == (("other",), True)


# --- config -----------------------------------------------------------------------------------------

# README "Configuration" table, as written there.
README_DEFAULTS: dict[str, object] = {
    "kafka_bootstrap_servers": "localhost:9092",
    "app_id": "confidence-streams",
    "input_topics": "agent-events",
    "scored_topic": "scored-events",
    "flagged_topic": "flagged-events",
    "dlq_topic": "agent-events-dlq",
    "topic_partitions": 4,
    "topic_replication_factor": 1,
    "input_retention_ms": 3_600_000,
    "web_port": 6066,
    "data_dir": "./confidence-streams-data",
    "web_bind": "0.0.0.0",
    "table_standby_replicas": 1,
    "batch_size": 500,
    "batch_within_seconds": 0.01,
    "broker_session_timeout_seconds": 10,
    "broker_heartbeat_interval_seconds": 1,
    "broker_rebalance_timeout_seconds": 10,
    "producer_max_batch_bytes": 262_144,
    "producer_linger_ms": 0,
    "consumer_fetch_max_wait_ms": 20,
    "consumer_fetch_max_bytes": 1_048_576,
    "recovery_consistency_check": True,
    "internal_backlog_max_records": 200,
    "input_alignment_max_lead_hours": 2,
    "input_alignment_idle_seconds": 2,
    "input_alignment_max_hold_seconds": 600,
    "gc_gen0_threshold": 10_000,
    "log_level": "info",
    "max_event_bytes": 1_000_000,
    "max_array_items": 100_000,
    "confidence_enabled": True,
    "confidence_aggregation": "average",
    "confidence_min_acceptance": 0.40,
    "confidence_on_low": "flag",
    "confidence_treat_null_as_low": False,
    "confidence_precision_decimals": 3,
    "composite_default_threshold": 0.75,
    "history_window_hours": 24,
    "history_retention_hours": 168,
    "history_chunk_bytes": 65_536,
    "kb_relevance_threshold": 0.7,
    "evidence_recovery_threshold": 0.50,
    "evidence_stop_threshold": 0.20,
    "evidence_tool_categories": "find=search,grep=search,references=search,read=read,discovery=discovery,"
    "cmake=verification,ctest=verification,git=git,gh=ci",
    "claims_boost_factor": 0.1,
    "claims_penalty_factor": 0.2,
    "claims_diversity_max_types": 3,
    "staleness_half_life_ephemeral_hours": 4,
    "staleness_half_life_task_hours": 72,
    "staleness_half_life_project_hours": 672,
    "staleness_half_life_persistent_hours": 4380,
    "synthesis_min_confidence": 0.3,
    "synthesis_conflict_threshold": 0.5,
    "synthesis_max_claims": 50,
    "max_record_bytes": 1_040_000,
    "trace_state_max_bytes": 524_288,
    "claim_node_max_bytes": 1_040_000,
    "trace_ttl_hours": 24,
    "claim_ttl_days": 30,
    "sweep_interval_seconds": 60,
    "expiry_source_idle_seconds": 300,
    "event_time_max_ahead_hours": 1,
    "calibration_enabled": True,
    "calibration_window_hours": 168,
    "calibration_join_window_hours": 168,
    "calibration_outcome_wait_hours": 1,
    "calibration_max_outcomes_per_subject": 32,
    "calibration_min_samples": 20,
    "calibration_ece_change": 0.02,
    "calibration_update_min_interval_minutes": 10,
    "calibration_ece_alert": 0.1,
    "metrics_label_cap": 100,
    "send_timeout_seconds": 60,
    "shutdown_timeout_seconds": 25,
    "fatal_exit_delay_seconds": 3,
    "fault_injection": "",
}


def test_every_default_is_the_readmes(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in README_DEFAULTS:
        monkeypatch.delenv(name.upper(), raising=False)
    settings = load_settings(_env_file=None)
    assert {name: getattr(settings, name) for name in README_DEFAULTS} == README_DEFAULTS


# README "Configuration": (setting, the last value accepted, the first refused).
README_BOUNDS: list[tuple[str, float, float]] = [
    ("topic_partitions", 1024, 1025),
    ("batch_size", 100_000, 100_001),
    ("batch_within_seconds", 10, 10.001),
    ("input_retention_ms", 60_000, 59_999),
    ("producer_max_batch_bytes", 16_384, 16_383),
    ("producer_max_batch_bytes", 1_000_000, 1_000_001),
    ("trace_state_max_bytes", 16_384, 16_383),
    ("claim_node_max_bytes", 16_384, 16_383),
    ("history_chunk_bytes", 1, 0),
    ("table_standby_replicas", 0, -1),
    ("table_standby_replicas", 16, 17),
    ("calibration_max_outcomes_per_subject", 48, 49),
    ("calibration_window_hours", 1, 0.99),
    # At the default MAX_RECORD_BYTES "at most 16,441 and 115,099 hours".
    ("history_retention_hours", 16_441, 16_442),
    ("calibration_window_hours", 115_099, 115_100),
]


@pytest.mark.parametrize(("name", "accepted", "refused"), README_BOUNDS)
def test_numbers_have_the_readmes_bounds(name: str, accepted: float, refused: float) -> None:
    assert getattr(load_settings(**{name: accepted}), name) == accepted
    with pytest.raises(ValidationError) as err:
        load_settings(**{name: refused})
    assert name.upper() in str(err.value).upper()


def test_max_record_bytes_takes_its_lower_bound() -> None:
    assert load_settings(max_record_bytes=16_384, producer_max_batch_bytes=16_384).max_record_bytes == 16_384
    with pytest.raises(ValidationError):
        load_settings(max_record_bytes=16_383, producer_max_batch_bytes=16_384)


def test_settings_that_must_agree_are_checked_at_their_edges() -> None:
    """README: batch bytes *at most* MAX_RECORD_BYTES, linger *below* SEND_TIMEOUT_SECONDS, heartbeat
    *below* the session timeout, retention *at least* the window."""
    assert load_settings(producer_max_batch_bytes=500_000, max_record_bytes=500_000)
    assert load_settings(history_retention_hours=24, history_window_hours=24)
    with pytest.raises(ValidationError, match="PRODUCER_LINGER_MS"):
        load_settings(producer_linger_ms=60_000, send_timeout_seconds=60)
    with pytest.raises(ValidationError, match="BROKER_HEARTBEAT_INTERVAL_SECONDS"):
        load_settings(broker_heartbeat_interval_seconds=10, broker_session_timeout_seconds=10)


def test_log_level_in_either_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOG_LEVEL", "DEBUG")
    assert load_settings().log_level == "debug"


def test_alignment_holds_at_most_half_the_input_retention() -> None:
    settings = load_settings(input_retention_ms=600_000, input_alignment_max_hold_seconds=600)
    assert settings.alignment_max_hold_seconds == 300


def test_evidence_thresholds_reach_the_scorer() -> None:
    configs = scoring_configs(load_settings(evidence_recovery_threshold=0.6, evidence_stop_threshold=0.1))
    assert (configs.evidence.recovery_threshold, configs.evidence.stop_threshold) == (0.6, 0.1)


def test_readyz_counts_the_partitions_it_consumes_not_the_changelogs(monkeypatch: pytest.MonkeyPatch) -> None:
    """README HTTP table: 200 with `assigned_partitions`, the input and internal-topic partitions it
    consumes (not the changelogs it restores)."""
    svc = _owning_every_key()
    changelog = sorted(svc.app.tables.changelog_topics)[0]
    assignment = {TP("agent-events", 0), TP("agent-events", 1), TP(changelog, 0)}
    monkeypatch.setattr(svc.health, "readiness", lambda app: (True, "ready"))
    monkeypatch.setattr(svc.app, "consumer", SimpleNamespace(assignment=lambda: assignment))

    async def check(client: Any) -> None:
        response = await client.get("/readyz")
        body = await response.json()
        assert (response.status, body["status"], body["assigned_partitions"]) == (200, "ready", 2)

    _ask(svc, check)


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ("min_upper=high", "filters must be numbers"),
        ("max_lower=nan", "filters must be finite numbers"),
        ("min_width=inf", "filters must be finite numbers"),
    ],
)
def test_a_claim_filter_that_is_not_a_finite_number_is_a_400_that_says_so(query: str, error: str) -> None:
    """Mutants: the 400s for a non-numeric or non-finite filter removed (a NaN bound matches nothing, so
    the answer would be an empty 200 or a 500); a bad query is the client's error and says which."""
    svc = _owning_every_key()

    async def check(client: Any) -> None:
        response = await client.get(f"/claims/acme/c1?{query}")
        assert response.status == 400
        assert (await response.json()) == {"error": error}

    _ask(svc, check)


def test_an_unknown_trace_is_a_json_404() -> None:
    """Mutant: an unknown trace answered 200. A trace the worker does not hold (never seen, or expired)
    must not look like one with an empty evidence score."""
    svc = _owning_every_key()

    async def check(client: Any) -> None:
        response = await client.get("/traces/acme/never-seen")
        assert (response.status, response.content_type) == (404, "application/json")
        assert (await response.json()) == {"error": "unknown trace"}

    _ask(svc, check)
