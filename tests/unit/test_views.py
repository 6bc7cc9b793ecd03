"""The query views: claim filters (pure part), unreadable state, and the calibration view asked offline."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from streams.app import Service, create_app
from streams.config import load_settings
from streams.decoded_states import UndecodableState
from streams.harness import free_port
from streams.stages.calibration import group_key
from streams.stages.history import hour_key, stored_hours
from streams.state import AgentHistory, GroupCalibration, HistoryEntry, encode_history_hour, table_key
from streams.views import (
    FORWARDED_HEADER,
    _answers_unreadable_state,
    attach_views,
    claim_matches,
    tenant_of_key,
)


def test_width_computed_with_float_error_meets_its_threshold() -> None:
    lower, upper = 0.7, 0.9  # upper - lower = 0.20000000000000007; and 0.6 - 0.4 = 0.19999999999999996
    assert claim_matches(lower, upper, min_width=0.2)
    assert claim_matches(0.4, 0.6, min_width=0.2)
    assert not claim_matches(0.4, 0.6, min_width=0.200000002)


def test_seed_002_queries() -> None:
    assert claim_matches(0.7, 0.85, min_lower=0.7)  # "lower bound above 0.7", inclusive
    assert not claim_matches(0.69, 0.85, min_lower=0.7)
    assert claim_matches(0.3, 0.9, min_upper=0.8, max_lower=0.5)  # high upper, low lower
    assert not claim_matches(0.6, 0.9, min_upper=0.8, max_lower=0.5)


def test_tenant_of_key_reads_table_keys_and_refuses_what_no_worker_wrote() -> None:
    assert tenant_of_key(table_key("acme", "group")) == "acme"
    assert tenant_of_key(b"not json") is None  # the calibration view raised on it: a 500 for every tenant
    assert tenant_of_key(b"{}") is None
    assert tenant_of_key(b"[]") is None


class _Web:
    def bytes(self, body: bytes, content_type: str, status: int) -> tuple[int, dict[str, Any]]:
        return status, orjson.loads(body)


def test_an_unreadable_stored_value_answers_a_json_500_and_other_errors_still_raise() -> None:
    view, request = SimpleNamespace(web=_Web()), SimpleNamespace(url="/traces/t/x")

    @_answers_unreadable_state
    async def unreadable(view: Any, request: Any, **params: str) -> Any:
        raise UndecodableState("a stored value of table traces is not a valid TraceState (...)")

    @_answers_unreadable_state
    async def broken(view: Any, request: Any, **params: str) -> Any:
        raise KeyError("a bug")

    @_answers_unreadable_state
    async def fine(view: Any, request: Any, **params: str) -> Any:
        return params

    status, body = asyncio.run(unreadable(view, request, tenant_id="t"))
    assert (status, body) == (
        500,
        {"error": "a stored value of table traces is not a valid TraceState (...)"},
    )
    with pytest.raises(KeyError):
        asyncio.run(broken(view, request))
    assert asyncio.run(fine(view, request, tenant_id="t", trace_id="x")) == {
        "tenant_id": "t",
        "trace_id": "x",
    }


NEWEST = datetime(2026, 3, 2, 12, tzinfo=UTC)


def _routed_to(svc: Service, owner: Callable[[], URL]) -> None:
    """Make `svc`'s router name `owner()` the owner of every key, of tables and topics alike."""
    svc.app.router.key_store = lambda *_: owner()
    svc.app.router.external_topic_key_store = lambda *_: owner()


def _owning_every_key(**overrides: object) -> Service:
    """A service with its views attached, whose router says this worker owns every key."""
    svc = create_app(load_settings(**overrides))
    _routed_to(svc, lambda: svc.app.conf.canonical_url)
    attach_views(svc)
    svc.app.web.init_server()
    return svc


def _ask(svc: Service, check: Callable[[TestClient], Awaitable[None]]) -> None:
    """`check` against the real aiohttp routes, in process."""

    async def run() -> None:
        async with TestClient(TestServer(svc.app.web.web_app)) as client:
            await check(client)

    asyncio.run(run())


def _stored_group(svc: Service) -> None:
    group = GroupCalibration(
        tenant_id="acme",
        dimension="model",
        value="gpt-4o",
        kind="response",
        newest=datetime(2026, 1, 1, tzinfo=UTC),
    )
    svc.calibration_groups.data[group_key("acme", "model", "gpt-4o", "response")] = (
        group.model_dump_json().encode()
    )


def test_the_calibration_view_refuses_a_kind_that_does_not_exist() -> None:
    svc = _owning_every_key()
    _stored_group(svc)

    async def check(client: TestClient) -> None:
        async def ask(kind: str) -> tuple[int, dict[str, Any]]:
            response = await client.get("/calibration/acme", params={"kind": kind})
            return response.status, await response.json()

        status, body = await ask("response")
        assert status == 200 and [g["kind"] for g in body["groups"]] == ["response"]
        assert (await ask("claim"))[0] == 404  # a kind with no group here: no data
        assert await ask("responses") == (
            400,
            {"error": "kind must be one of response, composite, evidence, claim"},
        )

    _ask(svc, check)


def _store_agent(svc: Service, ages: list[timedelta]) -> None:
    """An agent whose responses are `ages` older than NEWEST, stored as stage 2 stores them."""
    entries = tuple(
        HistoryEntry(
            event_id=f"e{i}",
            event_time=NEWEST - age,
            threshold_met=True,
            composite=0.9,
            blocked=False,
            history_score=0.5,
        )
        for i, age in sorted(enumerate(ages), key=lambda pair: -pair[1])
    )
    counts, chunks = stored_hours(entries, svc.settings.history_chunk_bytes)
    summary = AgentHistory(
        tenant_id="acme", agent_name="patcher-1", agent_type="patcher", newest=NEWEST, hours=counts
    )
    svc.agents_history.data[table_key("acme", "patcher-1")] = summary.model_dump_json().encode()
    for (hour, index), chunk in chunks.items():
        svc.agent_history_hours.data[hour_key("acme", "patcher-1", hour, index)] = encode_history_hour(chunk)


def test_the_agent_view_reports_the_hours_it_counted() -> None:
    """hours=168 on a worker keeping 24 h counted a day and said "lookback_hours": 168 (review).
    A window past datetime's range (1e9 h) was a 400 though it is cut at the retention anyway."""
    svc = _owning_every_key(history_retention_hours=24.0, history_window_hours=24.0)
    _store_agent(svc, [timedelta(0), timedelta(hours=10), timedelta(hours=30)])

    async def check(client: TestClient) -> None:
        answers = []
        for hours in ("168", "1e9", "12", "24"):
            response = await client.get("/agents/acme/patcher-1", params={"hours": hours})
            body = await response.json()
            answers.append((response.status, body.get("lookback_hours"), body.get("total_executions")))
        assert answers == [(200, 24.0, 2), (200, 24.0, 2), (200, 12.0, 2), (200, 24.0, 2)]

    _ask(svc, check)


def test_the_agent_view_caps_hours_at_the_retention_not_the_window() -> None:
    """Mutation review: the cap is `history_retention_hours` (what is kept), not the default window."""
    svc = _owning_every_key(history_retention_hours=48.0, history_window_hours=24.0)
    _store_agent(svc, [timedelta(0), timedelta(hours=10), timedelta(hours=30), timedelta(hours=60)])

    async def check(client: TestClient) -> None:
        response = await client.get("/agents/acme/patcher-1", params={"hours": "168"})
        body = await response.json()
        assert (response.status, body.get("lookback_hours"), body.get("total_executions")) == (200, 48.0, 3)

    _ask(svc, check)


def _two_workers(
    owner_seen_by_a: Callable[[Service, Service], URL],
    owner_seen_by_b: Callable[[Service, Service], URL],
    check: Callable[[TestClient, Service, Service], Awaitable[None]],
) -> None:
    """Workers A and B serving their views on real ports, each with its own idea of who owns every key;
    `check` asks A."""
    a, b = (create_app(load_settings(web_host="127.0.0.1", web_port=free_port())) for _ in range(2))
    _routed_to(a, lambda: owner_seen_by_a(a, b))
    _routed_to(b, lambda: owner_seen_by_b(a, b))
    for svc in (a, b):
        attach_views(svc)
        svc.app.web.init_server()
    _stored_group(b)

    async def run() -> None:
        servers = [
            TestServer(svc.app.web.web_app, host="127.0.0.1", port=svc.settings.web_port) for svc in (a, b)
        ]
        try:
            async with TestClient(servers[0]) as client:
                await servers[1].start_server()
                await asyncio.wait_for(check(client, a, b), timeout=20)
        finally:
            await servers[1].close()
            for svc in (a, b):
                await svc.app.http_client.close()

    asyncio.run(run())


def test_a_view_is_answered_by_the_worker_that_owns_its_key() -> None:
    async def check(client: TestClient, a: Service, b: Service) -> None:
        response = await client.get("/calibration/acme")
        body = await response.json()
        assert response.status == 200, body
        assert [g["value"] for g in body["groups"]] == ["gpt-4o"]  # B's table, through A

    _two_workers(lambda a, b: b.app.conf.canonical_url, lambda a, b: b.app.conf.canonical_url, check)


def test_a_forwarded_view_is_not_forwarded_again_when_two_workers_name_each_other_the_owner() -> None:
    """Mid-rebalance, A can still name B the owner while B already names A. Forwarded again, the request
    went back and forth (a nested request per hop) until a timeout; it is forwarded once now, and B
    answers a 503 the caller can retry."""

    async def check(client: TestClient, a: Service, b: Service) -> None:
        for path in ("/calibration/acme", "/traces/acme/t1", "/claims/acme/c1", "/agents/acme/patcher-1"):
            response = await client.get(path)
            body = await response.json()
            assert response.status == 503, (path, body)
            assert "disagree" in body["error"], (path, body)
            assert body["forwarded_by"] == str(a.app.conf.canonical_url)
        assert FORWARDED_HEADER not in (await client.get("/healthz")).headers

    _two_workers(lambda a, b: b.app.conf.canonical_url, lambda a, b: a.app.conf.canonical_url, check)


def test_each_view_asks_the_router_for_the_owner_of_its_own_key() -> None:
    """Review (thirtieth round, mutations): the tests' routers named one owner for every key, so a view
    that looked up another topic, table or key (the tenant for a trace, the claim for a tenant) passed."""
    svc = create_app(load_settings())
    asked: list[tuple[str, str, bytes]] = []

    def key_store(table: str, key: bytes) -> URL:
        asked.append(("table", table, key))
        return svc.app.conf.canonical_url

    def external_topic_key_store(topic: Any, key: bytes) -> URL:
        asked.append(("topic", topic.get_topic_name(), key))
        return svc.app.conf.canonical_url

    svc.app.router.key_store = key_store
    svc.app.router.external_topic_key_store = external_topic_key_store
    attach_views(svc)
    svc.app.web.init_server()

    async def check(client: TestClient) -> None:
        for path in ("/traces/acme/t1", "/claims/acme/c1", "/agents/acme/patcher-1", "/calibration/acme"):
            await client.get(path)

    _ask(svc, check)
    settings = svc.settings
    assert asked == [
        ("topic", settings.input_topic_names[0], b"t1"),  # traces live with their input partition
        ("topic", settings.claims_topic, b"acme"),  # a tenant's claim graph: its claims partition
        ("table", svc.agents_history.name, table_key("acme", "patcher-1")),
        ("topic", svc.calibration_topic.get_topic_name(), b"acme"),
    ]


@pytest.mark.parametrize(
    ("owner_error", "error"),
    [
        (KeyError, "no worker owns this {what} yet"),  # the assignment is not known yet
        (None, "the worker that owns this {what} did not answer"),  # nothing listens at the owner's port
    ],
)
def test_a_view_whose_owner_is_unknown_or_unreachable_answers_503(
    owner_error: type[Exception] | None, error: str
) -> None:
    """Review (thirtieth round, mutations): the router's KeyError and an owner that does not answer
    had no test; either would otherwise reach aiohttp as a 500 with no JSON body."""
    svc = create_app(load_settings(web_host="127.0.0.1", web_port=free_port()))
    elsewhere = URL(f"http://127.0.0.1:{free_port()}")

    def owner() -> URL:
        if owner_error is not None:
            raise owner_error("unknown")
        return elsewhere

    _routed_to(svc, owner)
    attach_views(svc)
    svc.app.web.init_server()

    async def check(client: TestClient) -> None:
        try:
            paths = {
                "trace": "/traces/acme/t1",
                "claim": "/claims/acme/c1",
                "agent": "/agents/acme/patcher-1",
                "tenant": "/calibration/acme",
            }
            for what, path in paths.items():
                response = await client.get(path)
                body = await response.json()
                assert (response.status, body) == (503, {"error": error.format(what=what)}), path
        finally:
            await svc.app.http_client.close()

    _ask(svc, check)


def test_a_forwarded_answer_keeps_the_owners_status_and_content_type() -> None:
    """Review (thirtieth round, mutations): every forwarded answer in the tests was JSON. The owner's
    plain-text 500 (here its own router fails) reaches the caller as that, not relabelled JSON."""

    def broken(a: Service, b: Service) -> URL:
        raise RuntimeError("a bug in the owner")

    async def check(client: TestClient, a: Service, b: Service) -> None:
        response = await client.get("/calibration/acme")
        assert (response.status, response.content_type) == (500, "text/plain"), await response.text()

    _two_workers(lambda a, b: b.app.conf.canonical_url, broken, check)


def test_the_agent_view_counts_a_response_at_the_horizon_as_the_stage_does() -> None:
    """Views review: the view's window began 1 us after the retention horizon, while the stage, its
    success-rate gauge and DECISIONS ("windows, the success-rate gauge, the view and re-delivery all
    start at the horizon") count a response dated exactly there (view: 1 execution, rate 0.0)."""
    import random

    from tests.unit.test_history_stage import EXAMPLE, T0, Responses

    kw = {"history_retention_hours": 24.0, "history_window_hours": 24.0}
    responses = Responses(load_settings(**kw), random.Random(1))
    responses.score("a", T0 - timedelta(hours=24), good=True)  # exactly at newest - retention
    responses.score("b", T0, good=False)
    assert responses.success_rate() == 0.5  # the stage counts both
    svc = _owning_every_key(**kw)
    for key, summary in responses.tables.summary.items():
        svc.agents_history.data[key] = summary.model_dump_json().encode()
    for key, hour in responses.tables.hours.items():
        svc.agent_history_hours.data[key] = encode_history_hour(hour)

    async def check(client: TestClient) -> None:
        for query in ("", "?hours=24", "?hours=168"):
            response = await client.get(f"/agents/{EXAMPLE['tenant_id']}/{EXAMPLE['agent_name']}{query}")
            body = await response.json()
            assert (body["total_executions"], body["success_rate"]) == (2, 0.5), (query, body)

    _ask(svc, check)
