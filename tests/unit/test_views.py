"""The claim filters of the query view (pure part): inclusive bounds compared after rounding to 9 decimals."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from streams.decoded_states import UndecodableState
from streams.state import table_key
from streams.views import _answers_unreadable_state, claim_matches, tenant_of_key


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
