"""HTTP on the worker's web port: /metrics, /healthz, /readyz and read-only query views over the tables.

Each view is routed to the worker that owns the key (Faust's router), so any worker can be asked.
Claims are re-scored at the wall clock in the view (DESIGN 4); traces and agents are read as stored.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, get_args

import aiohttp
import faust
import orjson
from faust.web import Request, Response, View
from multidict import CIMultiDict
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from yarl import URL

from streams.app import Service
from streams.decoded_states import UndecodableState, decode_stored
from streams.events import ScoreKind
from streams.scoring import calibration, claim_graph, evidence
from streams.stages.history import agent_entries
from streams.state import AgentHistory, GroupCalibration, HistoryEntry, HistoryHour, TraceState, table_key

__all__ = [
    "agent_statistics",
    "attach_views",
    "calibration_group_matches",
    "calibration_summary",
    "claim_matches",
    "tenant_of_key",
]


# A view for a key another worker owns is forwarded to it; until the group notices that worker is gone
# (the session timeout), forwarding fails: a 503 the caller can retry, not a 500 page.
OWNER_UNREACHABLE = (aiohttp.ClientError, asyncio.TimeoutError)

log = logging.getLogger(__name__)
SCORE_KINDS: tuple[str, ...] = get_args(ScoreKind)  # what the calibration view's kind= may name

_Get = Callable[..., Awaitable[Response]]


def _answers_unreadable_state(get: _Get) -> _Get:
    """A stored value this version cannot decode (see `UndecodableState`) answers a JSON 500 naming the
    table, and is logged; before, aiohttp's bare 500 page said nothing of why."""

    @functools.wraps(get)
    async def answer(view: View, request: Request, **params: str) -> Response:
        try:
            return await get(view, request, **params)
        except UndecodableState as exc:
            log.error("view %s: %s", request.url, exc)
            return _json(view.web, {"error": str(exc)}, 500)

    return answer


def _json(web: Any, body: object, status: int = 200) -> Response:
    return web.bytes(orjson.dumps(body), content_type="application/json", status=status)


# Set on a view request one worker forwards to another. A request that carries it is never forwarded
# again: while a rebalance moves a partition, two workers can each name the other its owner, and
# without the mark they would pass the request back and forth, a nested request per hop, until a
# timeout.
FORWARDED_HEADER = "X-Confidence-Forwarded-By"


async def _from_owner(
    web: Any, app: faust.App, request: Request, owner: Callable[[], URL], what: str
) -> Response | None:
    """The owning worker's answer, or None when this worker owns the key (the view then answers from
    its own table). `owner` is Faust's router lookup for the key; it is forwarded as Faust's
    `Router._route_req` forwards, with the one-hop mark added."""
    try:
        url = owner()
    except KeyError:  # the assignment is not known yet
        return _json(web, {"error": f"no worker owns this {what} yet"}, 503)
    here = app.conf.canonical_url
    host, port = _host_and_port(url)
    if (host, port) == _host_and_port(here):
        return None
    if FORWARDED_HEADER in request.headers:
        return _json(
            web,
            {
                "error": f"the workers disagree on which owns this {what} (a rebalance is moving it); retry",
                "forwarded_by": request.headers[FORWARDED_HEADER],
            },
            503,
        )
    headers = CIMultiDict(request.headers)
    headers[FORWARDED_HEADER] = str(here)
    try:
        async with app.http_client.request(
            method=request.method, headers=headers, url=request.url.with_host(host).with_port(port)
        ) as response:
            return web.bytes(
                await response.read(), content_type=response.content_type, status=response.status
            )
    except OWNER_UNREACHABLE:
        return _json(web, {"error": f"the worker that owns this {what} did not answer"}, 503)


def _host_and_port(url: URL) -> tuple[str, int]:
    """As Faust's router compares workers' URLs (a URL without a scheme is a bare host)."""
    return (url.host if url.scheme else url.path) or "", int(url.port or 80)


def _float_param(request: Request, name: str) -> float | None:
    raw = request.query.get(name)
    return None if raw is None else float(raw)


def claim_matches(
    lower: float,
    upper: float,
    *,
    min_lower: float | None = None,
    min_width: float | None = None,
    min_upper: float | None = None,
    max_lower: float | None = None,
) -> bool:
    """Seed 002's three queries: lower above x; width above x; upper high but lower low.

    Bounds are inclusive and compared after rounding to 9 decimals (DESIGN 4b), so a width computed
    as 0.19999999999999996 meets `min_width=0.2`.
    """
    lower, upper, width = round(lower, 9), round(upper, 9), round(upper - lower, 9)
    if min_lower is not None and not lower >= min_lower:
        return False
    if min_width is not None and not width >= min_width:
        return False
    if min_upper is not None and not upper >= min_upper:
        return False
    return not (max_lower is not None and not lower <= max_lower)


def agent_statistics(
    history: AgentHistory, recent: Iterable[HistoryEntry], hours: float, threshold: float
) -> dict[str, object]:
    """Seed 004's `get_agent_statistics` over `recent`, the agent's entries of the last `hours`."""
    entries = list(recent)
    total = len(entries)
    return {
        "tenant_id": history.tenant_id,
        "agent_name": history.agent_name,
        "agent_type": history.agent_type,
        "lookback_hours": hours,
        "total_executions": total,
        "success_rate": (sum(e.threshold_met for e in entries) / total) if total else 0.0,
        "average_confidence": (sum(e.composite for e in entries) / total) if total else 0.0,
        "blocked_count": sum(e.blocked for e in entries),
        "threshold": threshold,
    }


def _hour_loader(svc: Service) -> Callable[[bytes], HistoryHour | None]:
    def load(key: bytes) -> HistoryHour | None:
        raw = svc.agent_history_hours.get(key)
        return None if raw is None else decode_stored(HistoryHour, raw, svc.agent_history_hours.name)

    return load


def attach_views(
    svc: Service, claim_facts: Callable[[bytes], claim_graph.NeighbourFacts | None] | None = None
) -> None:
    """Register the HTTP endpoints on `svc.app`. `claim_facts` (the claim agent's cache, by table key)
    spares the claim view decoding every supporter of a much-supported claim."""
    app = svc.app

    @app.page("/metrics")
    class MetricsView(View):  # type: ignore[misc]
        async def get(self, request: Request) -> Response:
            return self.bytes(generate_latest(svc.registry), content_type=CONTENT_TYPE_LATEST.split(";")[0])

    @app.page("/healthz")
    class HealthView(View):  # type: ignore[misc]
        """Liveness: 503 while the worker is stopping (failed batch, shutdown, crash) or an agent crashed recently."""

        async def get(self, request: Request) -> Response:
            alive, reason = svc.health.liveness(app)
            body = {"status": "ok" if alive else "failing", "reason": reason, "app_id": svc.settings.app_id}
            return _json(self.web, body, 200 if alive else 503)

    @app.page("/readyz")
    class ReadyView(View):  # type: ignore[misc]
        """Readiness: alive, partitions assigned and tables recovered; 503 with the reason otherwise."""

        async def get(self, request: Request) -> Response:
            ready, reason = svc.health.readiness(app)
            body = {
                "status": "ready" if ready else "not_ready",
                "reason": reason,
                "app_id": svc.settings.app_id,
                # Partitions it consumes (inputs, internal topics), not the changelogs it restores.
                "assigned_partitions": (
                    sum(tp.topic not in app.tables.changelog_topics for tp in app.consumer.assignment())
                    if ready
                    else None
                ),
            }
            return _json(self.web, body, 200 if ready else 503)

    # Faust's router cannot route by a topic object with several names, and every input topic is
    # partitioned alike (same key, same partition count), so route trace lookups by the first one.
    routing_topic = app.topic(svc.settings.input_topic_names[0], key_type=bytes, value_type=bytes)

    @app.page("/traces/{tenant_id}/{trace_id}")
    class TraceView(View):  # type: ignore[misc]
        @_answers_unreadable_state
        async def get(self, request: Request, tenant_id: str, trace_id: str) -> Response:
            # Traces live with their input partition: route by the input topic's key.
            owner = functools.partial(app.router.external_topic_key_store, routing_topic, trace_id.encode())
            if (answer := await _from_owner(self.web, app, request, owner, "trace")) is not None:
                return answer
            raw = svc.traces.get(table_key(tenant_id, trace_id))
            if raw is None:
                return _json(self.web, {"error": "unknown trace"}, 404)
            state = decode_stored(TraceState, raw, svc.traces.name)
            result = evidence.score(state.evidence, svc.configs.evidence)
            return _json(
                self.web,
                {
                    "tenant_id": tenant_id,
                    "trace_id": trace_id,
                    "last_event_time": state.last_event_time.isoformat(),
                    "evidence": result.model_dump(mode="json"),
                    "sub_calls": sorted(state.sub_calls),
                    "claims": sorted(state.claims),
                },
            )

    @app.page("/claims/{tenant_id}/{claim_id}")
    class ClaimView(View):  # type: ignore[misc]
        @_answers_unreadable_state
        async def get(self, request: Request, tenant_id: str, claim_id: str) -> Response:
            # A tenant's claim graph lives with its partition of the claims topic (keyed by tenant).
            owner = functools.partial(
                app.router.external_topic_key_store, svc.claims_topic, tenant_id.encode()
            )
            if (answer := await _from_owner(self.web, app, request, owner, "claim")) is not None:
                return answer
            try:
                filters = {
                    name: _float_param(request, name)
                    for name in ("min_lower", "min_width", "min_upper", "max_lower")
                }
            except ValueError:
                return _json(self.web, {"error": "filters must be numbers"}, 400)
            if any(v is not None and not math.isfinite(v) for v in filters.values()):  # NaN matched nothing
                return _json(self.web, {"error": "filters must be finite numbers"}, 400)

            def load(other: str) -> claim_graph.ClaimNode | None:
                raw = svc.claims.get(table_key(tenant_id, other))
                return None if raw is None else decode_stored(claim_graph.ClaimNode, raw, svc.claims.name)

            node = load(claim_id)
            if node is None or node.definition is None:
                return _json(self.web, {"error": "unknown claim"}, 404)
            as_of = datetime.now(UTC)
            facts = None if claim_facts is None else lambda other: claim_facts(table_key(tenant_id, other))
            try:
                interval = claim_graph.interval_of(load, claim_id, as_of, svc.configs.claims, facts)
            except claim_graph.GraphTooComplex as exc:  # its neighbours changed since it was scored
                return _json(self.web, {"error": str(exc)}, 422)
            return _json(
                self.web,
                {
                    "tenant_id": tenant_id,
                    "claim_id": claim_id,
                    "trace_id": node.definition.trace_id,
                    "as_of": as_of.isoformat(),
                    "matches": claim_matches(interval.lower, interval.upper, **filters),
                    "filters": {k: v for k, v in filters.items() if v is not None},
                    "interval": interval.model_dump(mode="json"),
                },
            )

    @app.page("/agents/{tenant_id}/{agent_name}")
    class AgentView(View):  # type: ignore[misc]
        @_answers_unreadable_state
        async def get(self, request: Request, tenant_id: str, agent_name: str) -> Response:
            key = table_key(tenant_id, agent_name)
            owner = functools.partial(app.router.key_store, svc.agents_history.name, key)
            if (answer := await _from_owner(self.web, app, request, owner, "agent")) is not None:
                return answer
            try:
                param = _float_param(request, "hours")
            except ValueError:
                return _json(self.web, {"error": "hours must be a number"}, 400)
            hours = 168.0 if param is None else param  # seed 004's default only when absent
            if not 0 < hours < float("inf"):  # also false for NaN
                return _json(self.web, {"error": "hours must be a positive number"}, 400)
            raw = svc.agents_history.get(key)
            if raw is None:
                return _json(self.web, {"error": "unknown agent"}, 404)
            history = decode_stored(AgentHistory, raw, svc.agents_history.name)
            newest = history.newest or max((e.event_time for e in history.entries), default=datetime.now(UTC))
            threshold = svc.configs.composite.threshold_for(history.agent_type)
            # The window ends at the agent's newest event (event time), not the wall clock, and
            # reaches back at most as far as the history is kept: the hours reported are those counted.
            retention = svc.settings.history_retention_hours
            hours = min(hours, retention)
            # (newest - hours, newest], but the whole retention from its horizon itself: the stage
            # keeps and counts an entry dated exactly there (its windows start at the horizon).
            if hours >= retention:
                since = newest - timedelta(hours=retention)
            else:
                since = newest + timedelta(microseconds=1) - timedelta(hours=hours)
            recent = agent_entries(history, _hour_loader(svc), since)
            return _json(self.web, agent_statistics(history, recent, hours, threshold))

    @app.page("/calibration/{tenant_id}")
    class CalibrationView(View):  # type: ignore[misc]
        """Reliability bins, ECE, Brier and threshold advice of a tenant's calibration groups."""

        @_answers_unreadable_state
        async def get(self, request: Request, tenant_id: str) -> Response:
            # A tenant's calibration lives with its partition of the calibration topic (keyed by tenant).
            owner = functools.partial(
                app.router.external_topic_key_store, svc.calibration_topic, tenant_id.encode()
            )
            if (answer := await _from_owner(self.web, app, request, owner, "tenant")) is not None:
                return answer
            try:
                param = _float_param(request, "target_precision")
            except ValueError:
                return _json(self.web, {"error": "target_precision must be a number"}, 400)
            target = 0.9 if param is None else param
            if not 0 < target <= 1:  # also false for NaN
                return _json(self.web, {"error": "target_precision must be in (0, 1]"}, 400)
            kind = request.query.get("kind")
            if kind is not None and kind not in SCORE_KINDS:  # a typo must not read as "no data"
                return _json(self.web, {"error": f"kind must be one of {', '.join(SCORE_KINDS)}"}, 400)
            wanted = {
                "model": request.query.get("model"),
                "agent_type": request.query.get("agent_type"),
                "kind": kind,
            }
            groups: list[GroupCalibration] = []
            unreadable = 0  # a group this version cannot decode must not hide the tenant's others
            for key, raw in list(svc.calibration_groups.items()):
                if tenant_of_key(key) != tenant_id:
                    continue
                try:
                    groups.append(decode_stored(GroupCalibration, raw, svc.calibration_groups.name))
                except UndecodableState as exc:
                    log.error("view %s skips key %r: %s", request.url, key, exc)
                    unreadable += 1
            selected = sorted(
                (g for g in groups if calibration_group_matches(g, **wanted)),
                key=lambda g: (g.dimension, g.value, g.kind),
            )
            if not selected and unreadable:  # they may be what was asked for: not a "no data"
                error = f"{unreadable} stored calibration group(s) of this tenant cannot be read, see the log"
                return _json(self.web, {"error": error, "unreadable_groups": unreadable}, 500)
            if not selected:
                return _json(self.web, {"error": "no calibration data for this tenant and filter"}, 404)
            return _json(
                self.web,
                {
                    "tenant_id": tenant_id,
                    "window_hours": svc.settings.calibration_window_hours,
                    "target_precision": target,
                    "groups": [calibration_summary(svc, g, target) for g in selected],
                    "unreadable_groups": unreadable,  # skipped, each logged (it may match the filter)
                },
            )

    del MetricsView, HealthView, ReadyView, TraceView, ClaimView, AgentView, CalibrationView


def tenant_of_key(key: bytes) -> object:
    """The tenant of a (tenant, ...) table key; None for a key no worker wrote (not a JSON array)."""
    try:
        parts = orjson.loads(key)
    except orjson.JSONDecodeError:
        return None
    return parts[0] if isinstance(parts, list) and parts else None


def calibration_group_matches(
    group: GroupCalibration, model: str | None, agent_type: str | None, kind: str | None
) -> bool:
    """`model=` and `agent_type=` select groups of that dimension (either, when both are given); agent
    types are grouped lower-cased, so `agent_type=` matches them case-insensitively."""
    if kind is not None and group.kind != kind:
        return False
    if model is None and agent_type is None:
        return True
    return (model is not None and group.dimension == "model" and group.value == model) or (
        agent_type is not None and group.dimension == "agent_type" and group.value == agent_type.lower()
    )


def calibration_summary(svc: Service, group: GroupCalibration, target_precision: float) -> dict[str, object]:
    """One group's window: bins, ECE, Brier, accuracy per action and the threshold advice."""
    histogram = group.bins
    advice = calibration.advise_threshold(histogram, target_precision)
    # Which setting the advice is for (seed 003's min_acceptance, seed 004's per-agent-type threshold).
    setting: dict[str, object] | None = None
    if group.kind == "response":
        setting = {"name": "CONFIDENCE_MIN_ACCEPTANCE", "current": svc.settings.confidence_min_acceptance}
    elif group.kind == "composite" and group.dimension == "agent_type":
        current = svc.configs.composite.threshold_for(group.value)
        setting = {"name": f"composite threshold of agent type {group.value}", "current": current}
    return {
        "dimension": group.dimension,
        "value": group.value,
        "kind": group.kind,
        "samples": calibration.total(histogram),
        "window_end": group.newest.isoformat(),
        "ece": calibration.ece(histogram),
        "brier": calibration.brier(histogram),
        "bins": [b.model_dump(mode="json") for b in calibration.reliability(histogram)],
        "accuracy_by_action": {
            action: {"count": stats.n, "observed_accuracy": stats.observed_accuracy}
            for action, stats in sorted(group.actions.items())
        },
        "advice": {**advice.model_dump(mode="json"), "setting": setting},
    }
