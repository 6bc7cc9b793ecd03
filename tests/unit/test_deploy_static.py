"""Deployment files without a broker: compose against the Compose Specification schema, Grafana
provisioning and dashboard structure, the dashboard's metric names against `streams/metrics.py`, and the
OPA policy (seed 003's example, evaluated by rego-cpp). Each check is also shown to fail on a broken copy."""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from streams import metrics
from streams.config import Settings
from tests.deploy_files import (
    COMPOSE,
    COMPOSE_SCHEMA,
    DASHBOARD_PROVIDERS,
    DATASOURCES,
    REGO,
    ROOT,
    compose_schema_problems,
    dashboard_metric_names,
    dashboard_problems,
    datasource_problems,
    exported_sample_names,
    load_dashboard,
    load_yaml,
    metric_names,
    provider_problems,
    rego_allow,
    rego_denials,
    rego_problems,
)

Mutation = Callable[[dict[str, Any]], None]


def _compose() -> dict[str, Any]:
    return dict(load_yaml(COMPOSE))


def _datasource_uid() -> str:
    return str(load_yaml(DATASOURCES)["datasources"][0]["uid"])


def _mutated(doc: dict[str, Any], mutate: Mutation) -> dict[str, Any]:
    broken = copy.deepcopy(doc)
    mutate(broken)
    return broken


# --- docker-compose.yml ---------------------------------------------------------------------------------


def test_vendored_compose_schema_is_the_recorded_file() -> None:
    recorded = re.search(r"sha256 `([0-9a-f]{64})`", (ROOT / "tests" / "data" / "README.md").read_text())
    assert recorded is not None
    assert hashlib.sha256(COMPOSE_SCHEMA.read_bytes()).hexdigest() == recorded.group(1)


def test_compose_file_follows_the_compose_specification() -> None:
    assert compose_schema_problems(_compose()) == []


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda c: c["services"]["grafana"].update(imagee="grafana/grafana"), "services/grafana"),
        (lambda c: c["services"]["opa"].update(profiles="policy"), "services/opa/profiles"),
        (lambda c: c["services"]["grafana"].update(ports=3000), "services/grafana/ports"),
        (
            lambda c: c["services"]["worker"]["depends_on"]["topics"].update(condition="service_finished"),
            "services/worker/depends_on",
        ),
        (lambda c: c.update(servics={}), "<root>"),
    ],
    ids=[
        "unknown-service-key",
        "profiles-not-a-list",
        "ports-not-a-list",
        "bad-condition",
        "unknown-top-key",
    ],
)
def test_a_broken_compose_file_fails_the_schema(mutate: Mutation, where: str) -> None:
    problems = compose_schema_problems(_mutated(_compose(), mutate))
    assert any(p.startswith(where) for p in problems), problems


def test_compose_grafana_and_opa_services() -> None:
    services = _compose()["services"]
    grafana, opa = services["grafana"], services["opa"]
    assert grafana["image"].startswith("grafana/grafana:")
    assert "3000:3000" in grafana["ports"]
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert opa["image"].startswith("openpolicyagent/opa:")
    assert opa["profiles"] == ["policy"]  # optional: `docker compose --profile policy up`
    assert opa["command"][:4] == ["run", "--server", "--addr", ":8181"]
    assert opa["command"][-1] == "/policies"
    # Seed 003's policy is Rego v0 syntax; OPA 1.x refuses it without this flag.
    assert "--v0-compatible" in opa["command"]
    assert "./deploy/opa:/policies:ro" in opa["volumes"]


def test_every_compose_bind_mount_exists_and_grafana_paths_agree() -> None:
    services = _compose()["services"]
    mounts = {
        service: dict(v.split(":")[:2] for v in spec.get("volumes", []) if v.startswith("./"))
        for service, spec in services.items()
    }
    for service, by_host in mounts.items():
        for host in by_host:
            assert (ROOT / host).exists(), f"{service} mounts {host}, which is not in the repository"
    grafana = {container: host for host, container in mounts["grafana"].items()}
    assert grafana["/etc/grafana/provisioning"] == "./deploy/grafana/provisioning"
    # The provider's path and the home dashboard are container paths: they must land on the mount.
    provider_path = load_yaml(DASHBOARD_PROVIDERS / "confidence-streams.yml")["providers"][0]["options"][
        "path"
    ]
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(provider_path + "/")
    assert (ROOT / grafana[provider_path] / home.removeprefix(provider_path + "/")).is_file()


# --- Grafana provisioning -------------------------------------------------------------------------------


def test_datasource_provisioning_points_at_the_compose_prometheus() -> None:
    doc = load_yaml(DATASOURCES)
    assert datasource_problems(doc, _compose()) == []
    assert doc["datasources"][0]["type"] == "prometheus"
    assert doc["datasources"][0]["url"] == "http://prometheus:9090"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d.update(datasource=d.pop("datasources")), "datasources must be a non-empty list"),
        (lambda d: d["datasources"][0].update(url="http://prometheus-server:9090"), "not a compose service"),
        (lambda d: d["datasources"][0].update(url="http://prometheus:9091"), "does not serve port 9091"),
        (lambda d: d["datasources"][0].update(isDefualt=True), "unknown key 'isDefualt'"),
        (lambda d: d["datasources"][0].pop("uid"), "missing 'uid'"),
    ],
)
def test_a_broken_datasource_file_fails(mutate: Mutation, expected: str) -> None:
    problems = datasource_problems(_mutated(load_yaml(DATASOURCES), mutate), _compose())
    assert any(expected in p for p in problems), problems


def test_dashboard_provider_provisioning() -> None:
    files = sorted(DASHBOARD_PROVIDERS.glob("*.yml"))
    assert files
    for path in files:
        assert provider_problems(load_yaml(path)) == [], path.name


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["providers"][0]["options"].pop("path"), "options.path missing"),
        (lambda d: d["providers"][0].update(type="url"), "type must be file"),
        (lambda d: d["providers"][0].update(foldr="x"), "unknown key 'foldr'"),
        (lambda d: d.update(apiVersion=2), "apiVersion must be 1"),
    ],
)
def test_a_broken_dashboard_provider_fails(mutate: Mutation, expected: str) -> None:
    doc = load_yaml(DASHBOARD_PROVIDERS / "confidence-streams.yml")
    problems = provider_problems(_mutated(doc, mutate))
    assert any(expected in p for p in problems), problems


# --- the dashboard --------------------------------------------------------------------------------------


def test_dashboard_structure() -> None:
    dashboard = load_dashboard()
    assert dashboard_problems(dashboard, _datasource_uid()) == []
    assert dashboard["uid"] == "confidence-streams"


def _panel(dashboard: dict[str, Any], index: int) -> dict[str, Any]:
    return dict(dashboard["panels"][index])


def _row(dashboard: dict[str, Any]) -> dict[str, Any]:
    return next(p for p in dashboard["panels"] if p.get("type") == "row")


def _selecting(dashboard: dict[str, Any], metric: str) -> dict[str, Any]:
    """The one panel whose expressions select `metric`."""
    (panel,) = [
        p for p in dashboard["panels"] if any(metric in metric_names(t["expr"]) for t in p.get("targets", []))
    ]
    return dict(panel)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["panels"][1].update(id=d["panels"][0]["id"]), "duplicate panel id"),
        (lambda d: d["panels"][0].pop("datasource"), "datasource must be the provisioned uid"),
        (lambda d: d["panels"][0]["targets"][0].pop("expr"), "has no expr"),
        (lambda d: d["panels"][0].update(targets=[]), "no targets"),
        (lambda d: d["panels"][0].pop("gridPos"), "gridPos needs integer x, y, w, h"),
        (lambda d: d["panels"][0]["gridPos"].update(x=20), "outside the 24-column grid"),
        (lambda d: d["panels"][1].update(gridPos=dict(d["panels"][0]["gridPos"])), "overlaps"),
        (lambda d: d.pop("uid"), "missing 'uid'"),
        (lambda d: d["templating"]["list"][0].update(datasource={"uid": "other"}), "variable tenant"),
        (lambda d: _row(d)["gridPos"].update(w=12), "a row spans the grid"),
        (lambda d: _row(d).update(collapsed=True, panels=[d["panels"].pop()]), "a row must be expanded"),
        (lambda d: _row(d).update(targets=[{"refId": "A", "expr": "up"}]), "a row has no targets"),
    ],
)
def test_a_broken_dashboard_fails(mutate: Mutation, expected: str) -> None:
    problems = dashboard_problems(_mutated(load_dashboard(), mutate), _datasource_uid())
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (le) (rate(a_bucket{x=~"$m"}[$__rate_interval]))', {"a_bucket"}),
        ("histogram_quantile(0.99, sum by (le, event_type) (rate(b_bucket[5m])))", {"b_bucket"}),
        ("sum(rate(c_sum[1m])) / sum(rate(c_count[1m]))", {"c_sum", "c_count"}),
        ("max(d) by (topic) > 1e3 and on (topic) e offset 5m", {"d", "e"}),
        ('count(f{job="sum(rate(x[1m]))"})', {"f"}),  # a label value is not a selector
        ('bottomk(10, g{tenant=~"$tenant"})', {"g"}),
        ("sum without (instance) (h:recorded:rate5m)", {"h:recorded:rate5m"}),
    ],
)
def test_metric_names_of_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def _sample_names_of_metrics_module() -> set[str]:
    """Every sample name `streams/metrics.py` can export, suffixes as Prometheus stores them."""
    registry = CollectorRegistry()
    m = metrics.create(registry)
    names: set[str] = set()
    for field in m._fields:
        collector = getattr(m, field)
        if field in ("labels", "child"):  # the label cap and the children cache, not collectors
            continue
        # Describe instead of collect: a labelled metric with no children yet describes no samples.
        for family in collector.describe():
            if family.type == "counter":
                names |= {f"{family.name}_total"}
            elif family.type == "histogram":
                names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count")}
            else:
                names |= {family.name}
    return names


def test_every_dashboard_metric_is_one_the_worker_defines() -> None:
    referenced = dashboard_metric_names(load_dashboard())
    assert referenced, "no metric names found in the dashboard"
    assert referenced - _sample_names_of_metrics_module() == set()
    # The panels the dashboard promises (README "Dashboards and monitoring").
    for name in (
        "llm_confidence_histogram_bucket",
        "llm_confidence_rejected_total",
        "confidence_response_actions_total",
        "confidence_evidence_band_total",
        "confidence_composite_blocked_total",
        "confidence_events_dead_lettered_total",
        "confidence_processing_latency_seconds_bucket",
        "confidence_consumer_lag",
        "confidence_input_partitions_paused",
        "confidence_internal_backlog_records",
        "rlm_synthesis_conflicts_sum",
        "confidence_calibration_ece",
        "confidence_calibration_brier",
        "confidence_outcomes_total",
        "confidence_outcomes_unmatched_total",
    ):
        assert name in referenced, name


def test_calibration_row_and_the_ece_alert_line() -> None:
    dashboard = load_dashboard()
    row = _row(dashboard)
    assert row["title"] == "Calibration"
    panels = [
        _selecting(dashboard, metric)
        for metric in (
            "confidence_calibration_ece",
            "confidence_calibration_brier",
            "confidence_outcomes_total",
            "confidence_outcomes_unmatched_total",
        )
    ]
    assert len({p["id"] for p in panels}) == 3  # ECE, Brier, and outcomes with unmatched on one panel
    assert all(p["gridPos"]["y"] == row["gridPos"]["y"] + 1 for p in panels)  # directly under the row
    ece = panels[0]
    assert "by (tenant, dimension, group, kind)" in ece["targets"][0]["expr"]
    defaults = ece["fieldConfig"]["defaults"]
    alert = Settings.model_fields["calibration_ece_alert"].default
    assert alert == 0.1
    assert defaults["thresholds"]["steps"][-1]["value"] == alert
    assert defaults["custom"]["thresholdsStyle"]["mode"] in ("line", "dashed", "line+area", "dashed+area")
    assert all("rate(" in t["expr"] for t in panels[2]["targets"])  # counters as rates


def test_a_dashboard_naming_an_unknown_or_unsuffixed_metric_is_caught() -> None:
    defined = _sample_names_of_metrics_module()
    for wrong in ("llm_confidence_histogram", "confidence_events_processed", "confidence_consumer_lag_total"):
        broken = load_dashboard()
        broken["panels"][0]["targets"][0]["expr"] = f"sum(rate({wrong}[1m]))"
        assert wrong in dashboard_metric_names(broken) - defined


def test_exported_sample_names_keep_suffixes() -> None:
    registry = CollectorRegistry()
    m = metrics.create(registry)
    m.events_processed.labels("CLAIM").inc()
    m.processing_latency.labels("CLAIM_SCORED").observe(0.1)
    names = exported_sample_names(registry.collect())
    assert {"confidence_events_processed_total", "confidence_processing_latency_seconds_bucket"} <= names
    assert "confidence_events_processed" not in names


# --- OPA ------------------------------------------------------------------------------------------------


def test_rego_file_is_seed_003s_policy() -> None:
    assert rego_problems(REGO.read_text()) == []


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t.replace("< 0.3", "< 0.5"),
        lambda t: t.replace("package somaagent.confidence", "package confidence"),
        lambda t: t.replace("default allow = true", "default allow = false"),
        lambda t: t.replace("    input.confidence != null\n", ""),
    ],
)
def test_an_edited_policy_is_caught(edit: Callable[[str], str]) -> None:
    assert rego_problems(edit(REGO.read_text())) != []


@pytest.mark.parametrize(
    ("policy_input", "denials"),
    [
        ({"confidence": 0.2, "confidence_enabled": True}, {"Confidence 0.2 below minimum threshold 0.3"}),
        ({"confidence": 0.3, "confidence_enabled": True}, set()),  # strictly below 0.3
        ({"confidence": 0.87, "confidence_enabled": True}, set()),
        ({"confidence": None, "confidence_enabled": True}, set()),  # no logprobs: not denied
        ({"confidence": 0.2, "confidence_enabled": False}, set()),
    ],
)
def test_policy_denies_only_enabled_confidence_below_0_3(
    policy_input: dict[str, Any], denials: set[str]
) -> None:
    text = REGO.read_text()
    assert rego_denials(text, policy_input) == denials
    assert rego_allow(text) is True  # `default allow = true`; the seed's policy decides through deny


def test_an_edited_threshold_changes_the_evaluated_decision() -> None:
    edited = REGO.read_text().replace("< 0.3", "< 0.5")
    assert rego_denials(edited, {"confidence": 0.4, "confidence_enabled": True}) == {
        "Confidence 0.4 below minimum threshold 0.3"
    }
