"""Output event ids: UUIDv5 over the output kind and the input's event id, stable across releases."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from streams.ids import _NAMESPACE, output_event_id


@given(st.text(max_size=20), st.text(max_size=60), st.lists(st.text(max_size=20), max_size=3))
def test_a_uuid5_of_the_parts_joined_by_unit_separators(kind: str, source: str, parts: list[str]) -> None:
    name = "\x1f".join((kind, source, *parts))
    assert output_event_id(kind, source, *parts) == str(uuid.uuid5(_NAMESPACE, name))


def test_known_value_is_stable() -> None:
    # Pinned: consumers de-duplicate by these ids, so they must never change between releases.
    assert output_event_id("TRACE_SCORED", "e1") == "94e2cc8f-7704-5c08-aa9a-d36d817dd898"
