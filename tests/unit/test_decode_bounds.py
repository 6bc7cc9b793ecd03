"""The decoder's array bounds and error reporting, at their edges (from a mutation review of decode.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from streams.decode import decode
from streams.dlq import DeadLetter
from streams.events import ClaimEvent, LlmResponse
from tests.unit.test_decode import BASE, CLAIM

MAX_ITEMS = 5

ARRAYS: list[tuple[dict[str, Any], str, object]] = [
    (BASE, "token_logprobs", -0.5),
    (BASE, "retrieval", {"similarity": 0.5}),
    (CLAIM, "provenance", {"source_type": "doc", "confidence": 0.5}),
    (CLAIM, "relationships", {"type": "supports", "target": "c2", "strength": 0.5}),
    (CLAIM, "derived_from", "c2"),
]


@pytest.mark.parametrize(("base", "field", "item"), ARRAYS, ids=[a[1] for a in ARRAYS])
def test_every_bounded_array_takes_max_items_and_refuses_one_more(
    base: dict[str, Any], field: str, item: object
) -> None:
    at_bound = decode(orjson.dumps({**base, field: [item] * MAX_ITEMS}), 10_000, MAX_ITEMS)
    assert isinstance(at_bound, LlmResponse | ClaimEvent), at_bound
    letter = decode(orjson.dumps({**base, field: [item] * (MAX_ITEMS + 1)}), 10_000, MAX_ITEMS)
    assert isinstance(letter, DeadLetter) and letter.reason == "oversized_array", letter
    assert letter.message == f"{field} has {MAX_ITEMS + 1} entries, more than {MAX_ITEMS}"


def test_the_reason_is_the_first_errors_and_the_message_lists_five() -> None:
    """With several errors, the reason code is the first one's (pydantic's field order), and the
    message names the first five."""
    bad = {k: v for k, v in BASE.items() if k not in ("request_id", "model", "endpoint")}
    bad |= {"schema_version": 2, "response": 5, "tenant_id": ""}
    letter = decode(orjson.dumps(bad), 10_000, MAX_ITEMS)
    assert isinstance(letter, DeadLetter), letter
    parts = letter.message.split("; ")
    assert len(parts) == 5, parts
    assert parts[0].startswith("LLM_RESPONSE.tenant_id: ")
    assert letter.reason == "invalid_value"  # tenant_id's too short string, not a later field's


def test_a_record_without_a_value_is_invalid_json() -> None:
    assert decode(None, 10_000, MAX_ITEMS) == DeadLetter(
        b"", "invalid_json", "EmptyRecord", "record has no value"
    )
