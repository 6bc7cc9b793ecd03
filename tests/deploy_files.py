"""Checks of the deployment files (compose, Grafana provisioning and dashboard, OPA policy), as functions
returning a list of problems, so tests can show that a broken copy fails as well as the real file passes."""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any
from urllib.parse import urlparse

import yaml
from jsonschema import Draft202012Validator

ROOT = pathlib.Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_SCHEMA = ROOT / "tests" / "data" / "compose-spec.json"
GRAFANA = ROOT / "deploy" / "grafana"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDERS = GRAFANA / "provisioning" / "dashboards"
DASHBOARD = GRAFANA / "dashboards" / "confidence-streams.json"
REGO = ROOT / "deploy" / "opa" / "confidence.rego"

GRID_COLUMNS = 24  # Grafana's dashboard grid width


def load_yaml(path: pathlib.Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


# --- docker-compose.yml -------------------------------------------------------------------------------


def compose_schema_problems(compose: Any) -> list[str]:
    """Violations of the Compose Specification's JSON Schema (vendored, tests/data/README.md)."""
    validator = Draft202012Validator(json.loads(COMPOSE_SCHEMA.read_text()))
    return [
        f"{'/'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
        for error in sorted(validator.iter_errors(compose), key=lambda e: list(e.absolute_path))
    ]


# --- Grafana provisioning -----------------------------------------------------------------------------

# Keys Grafana reads from a provisioning file (grafana.com/docs, "Provision Grafana"); anything else is
# ignored by Grafana without a word, which is how a typo goes unnoticed.
_DATASOURCE_KEYS = {
    "name", "type", "uid", "access", "orgId", "url", "user", "database", "basicAuth", "basicAuthUser",
    "withCredentials", "isDefault", "jsonData", "secureJsonData", "version", "editable",
}  # fmt: skip
_PROVIDER_KEYS = {
    "name", "orgId", "folder", "folderUid", "type", "disableDeletion", "updateIntervalSeconds",
    "allowUiUpdates", "options",
}  # fmt: skip


def datasource_problems(doc: Any, compose: Any) -> list[str]:
    """A datasources provisioning file: right keys, and a Prometheus URL that is a compose service."""
    if not isinstance(doc, dict):
        return ["not a mapping"]
    problems = [f"unknown top-level key {k!r}" for k in doc if k not in {"apiVersion", "datasources"}]
    if doc.get("apiVersion") != 1:
        problems.append("apiVersion must be 1")
    sources = doc.get("datasources")
    if not isinstance(sources, list) or not sources:
        return [*problems, "datasources must be a non-empty list"]
    services = compose.get("services", {})
    for i, source in enumerate(sources):
        where = f"datasources[{i}]"
        if not isinstance(source, dict):
            problems.append(f"{where}: not a mapping")
            continue
        problems += [f"{where}: unknown key {k!r}" for k in source if k not in _DATASOURCE_KEYS]
        problems += [f"{where}: missing {k!r}" for k in ("name", "type", "uid", "url") if k not in source]
        if source.get("access", "proxy") not in {"proxy", "direct"}:
            problems.append(f"{where}: access must be proxy or direct")
        if source.get("type") == "prometheus":
            url = urlparse(str(source.get("url", "")))
            service = services.get(url.hostname or "")
            if service is None:
                problems.append(f"{where}: url host {url.hostname!r} is not a compose service")
            elif not any(str(p).endswith(f":{url.port}") for p in service.get("ports", [])):
                problems.append(f"{where}: service {url.hostname!r} does not serve port {url.port}")
    return problems


def provider_problems(doc: Any) -> list[str]:
    """A dashboards provisioning file: right keys, file providers with a path."""
    if not isinstance(doc, dict):
        return ["not a mapping"]
    problems = [f"unknown top-level key {k!r}" for k in doc if k not in {"apiVersion", "providers"}]
    if doc.get("apiVersion") != 1:
        problems.append("apiVersion must be 1")
    providers = doc.get("providers")
    if not isinstance(providers, list) or not providers:
        return [*problems, "providers must be a non-empty list"]
    for i, provider in enumerate(providers):
        where = f"providers[{i}]"
        if not isinstance(provider, dict):
            problems.append(f"{where}: not a mapping")
            continue
        problems += [f"{where}: unknown key {k!r}" for k in provider if k not in _PROVIDER_KEYS]
        if "name" not in provider:
            problems.append(f"{where}: missing 'name'")
        if provider.get("type", "file") != "file":
            problems.append(f"{where}: type must be file")
        if not isinstance(provider.get("options"), dict) or not provider["options"].get("path"):
            problems.append(f"{where}: options.path missing")
    return problems


# --- PromQL metric names -------------------------------------------------------------------------------

_NOT_METRICS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "inf", "nan",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (function, aggregation and label names left out)."""
    text = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', '""', expr)  # strings may hold anything
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges, subqueries, $__rate_interval
    text = re.sub(
        r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text
    )  # label lists
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        start, rest = match.start(), text[match.end() :].lstrip()
        if start and (text[start - 1].isdigit() or text[start - 1] in ".$"):
            continue  # an exponent or duration unit (1e3, 5m) or a Grafana variable
        if rest.startswith("(") or match.group().lower() in _NOT_METRICS:
            continue
        names.add(match.group())
    return names


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard's panel targets."""
    return [
        str(target["expr"])
        for panel in dashboard.get("panels", [])
        for target in panel.get("targets", [])
        if "expr" in target
    ]


def template_queries(dashboard: dict[str, Any]) -> list[str]:
    """The query of every query-type template variable."""
    queries = []
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        queries.append(str(query.get("query", "") if isinstance(query, dict) else query or ""))
    return queries


def dashboard_metric_names(dashboard: dict[str, Any]) -> set[str]:
    """Metric names of the panels' expressions and of the template variables' `label_values(metric, ...)`."""
    names: set[str] = set()
    for expr in dashboard_exprs(dashboard):
        names |= metric_names(expr)
    for query in template_queries(dashboard):
        match = re.match(r"\s*label_values\(\s*(.+?)\s*,\s*\w+\s*\)\s*$", query)
        if match:
            names |= metric_names(match.group(1))
    return names


def exported_sample_names(families: Any) -> set[str]:
    """Sample names as Prometheus stores them (`_bucket`, `_sum`, `_count`, `_total`, ...)."""
    return {sample.name for family in families for sample in family.samples}


# --- dashboard structure -------------------------------------------------------------------------------


def dashboard_problems(dashboard: Any, datasource_uid: str) -> list[str]:
    """Title, uid, unique ids, a grid position inside the grid without overlaps, a data source and targets
    with an `expr` on every panel, and every data source reference naming the provisioned one.

    A row (`"type": "row"`) is a full-width header one unit high with no query of its own; it must be
    expanded with its panels at the top level (a collapsed row nests them, out of reach of these checks
    and of `dashboard_exprs`)."""
    if not isinstance(dashboard, dict):
        return ["not an object"]
    problems = [f"missing {k!r}" for k in ("title", "uid", "panels", "schemaVersion") if not dashboard.get(k)]
    uid = str(dashboard.get("uid", ""))
    if len(uid) > 40 or not re.fullmatch(r"[A-Za-z0-9_-]*", uid):
        problems.append("uid must be at most 40 characters of [A-Za-z0-9_-]")
    panels = dashboard.get("panels", [])
    ids = [p.get("id") for p in panels]
    problems += [f"duplicate panel id {i}" for i in sorted({i for i in ids if ids.count(i) > 1}, key=str)]
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        where = f"panel {panel.get('id')} ({panel.get('title', '?')})"
        if not isinstance(panel.get("id"), int):
            problems.append(f"{where}: id must be an integer")
        if not panel.get("title"):
            problems.append(f"{where}: missing title")
        pos = panel.get("gridPos")
        if not isinstance(pos, dict) or not all(isinstance(pos.get(k), int) for k in "xywh"):
            problems.append(f"{where}: gridPos needs integer x, y, w, h")
        elif (
            pos["x"] < 0 or pos["y"] < 0 or pos["w"] < 1 or pos["h"] < 1 or pos["x"] + pos["w"] > GRID_COLUMNS
        ):
            problems.append(f"{where}: gridPos outside the {GRID_COLUMNS}-column grid")
        else:
            for x in range(pos["x"], pos["x"] + pos["w"]):
                for y in range(pos["y"], pos["y"] + pos["h"]):
                    if (x, y) in cells:
                        problems.append(f"{where}: overlaps {cells[(x, y)]}")
                        break
                    cells[(x, y)] = where
                else:
                    continue
                break
        if panel.get("type") == "row":
            problems += _row_problems(panel, where)
            continue
        if (panel.get("datasource") or {}).get("uid") != datasource_uid:
            problems.append(f"{where}: datasource must be the provisioned uid {datasource_uid!r}")
        targets = panel.get("targets")
        if not isinstance(targets, list) or not targets:
            problems.append(f"{where}: no targets")
            continue
        ref_ids = [t.get("refId") for t in targets]
        if len(set(ref_ids)) != len(ref_ids) or None in ref_ids:
            problems.append(f"{where}: every target needs a distinct refId")
        for target in targets:
            if not str(target.get("expr", "")).strip():
                problems.append(f"{where}: target {target.get('refId')} has no expr")
            if (target.get("datasource") or {}).get("uid", datasource_uid) != datasource_uid:
                problems.append(f"{where}: target {target.get('refId')} names another data source")
    for variable in dashboard.get("templating", {}).get("list", []):
        if (
            variable.get("type") == "query"
            and (variable.get("datasource") or {}).get("uid") != datasource_uid
        ):
            problems.append(f"variable {variable.get('name')}: datasource must be {datasource_uid!r}")
    return problems


def _row_problems(row: dict[str, Any], where: str) -> list[str]:
    problems = []
    pos = row.get("gridPos")
    if isinstance(pos, dict) and (pos.get("x"), pos.get("w"), pos.get("h")) != (0, GRID_COLUMNS, 1):
        problems.append(f"{where}: a row spans the grid (x 0, w {GRID_COLUMNS}, h 1)")
    if row.get("collapsed") or row.get("panels"):
        problems.append(f"{where}: a row must be expanded, its panels at the top level")
    if row.get("targets"):
        problems.append(f"{where}: a row has no targets")
    return problems


# --- OPA ------------------------------------------------------------------------------------------------

# Seed 003, "Component 6: OPA Integration", "Example OPA policy", verbatim.
SEED_003_POLICY = """package somaagent.confidence

default allow = true

deny[msg] {
    input.confidence_enabled
    input.confidence != null
    input.confidence < 0.3
    msg := sprintf("Confidence %v below minimum threshold 0.3", [input.confidence])
}
"""


def rego_problems(text: str) -> list[str]:
    """The policy file must hold seed 003's example policy verbatim (comments aside)."""
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")).strip()
    if code != SEED_003_POLICY.strip():
        return ["the policy differs from seed 003's example (Component 6: OPA Integration)"]
    return []


def rego_denials(text: str, policy_input: dict[str, Any]) -> set[str]:
    """The `deny` messages of the policy for `policy_input`, evaluated by rego-cpp (regopy)."""
    from regopy import Interpreter

    interpreter = Interpreter()
    interpreter.add_module("confidence", text)
    interpreter.set_input_term(json.dumps(policy_input))
    output = interpreter.query("denials := [m | data.somaagent.confidence.deny[m]]")
    bindings = json.loads(str(output)).get("bindings", {})
    return set(bindings.get("denials", []))


def rego_allow(text: str) -> bool:
    from regopy import Interpreter

    interpreter = Interpreter()
    interpreter.add_module("confidence", text)
    interpreter.set_input_term(json.dumps({}))
    return bool(json.loads(str(interpreter.query("data.somaagent.confidence.allow")))["expressions"][0])
