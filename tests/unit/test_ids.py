"""Output event ids: UUIDv5 over the output kind and the input's event id, stable across releases."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from streams.ids import _NAMESPACE, output_event_id

KINDS = st.sampled_from(["TRACE_SCORED", "CLAIM_SCORED", "CALIBRATION_UPDATED"])
NO_SEPARATOR = st.text(st.characters(exclude_characters="\x1f", exclude_categories=["Cs"]), max_size=60)
ANY_ID = st.text(alphabet="ab\x1f", max_size=4)  # small, so that ambiguous joins are likely


@given(KINDS, NO_SEPARATOR, st.lists(NO_SEPARATOR, max_size=3))
def test_a_uuid5_of_the_parts_joined_by_unit_separators(kind: str, source: str, parts: list[str]) -> None:
    """Every id whose parts hold no U+001F is the one earlier releases made (pinned: consumers
    de-duplicate by it)."""
    name = "\x1f".join((kind, source, *parts))
    assert output_event_id(kind, source, *parts) == str(uuid.uuid5(_NAMESPACE, name))


def test_ids_holding_the_separator_do_not_make_two_outputs_one_id() -> None:
    """The time-and-identity review: CLAIM x of tenant "t\x1fu" and CLAIM "x\x1ft" of tenant "u", both
    of claim c, were joined into one name, so their two CLAIM_SCOREDs shared an event id and a consumer
    de-duplicating by it dropped one."""
    assert output_event_id("CLAIM_SCORED", "x", "t\x1fu", "c") != output_event_id(
        "CLAIM_SCORED", "x\x1ft", "u", "c"
    )


@given(
    KINDS, ANY_ID, st.lists(ANY_ID, min_size=2, max_size=2), ANY_ID, st.lists(ANY_ID, min_size=2, max_size=2)
)
def test_different_parts_give_different_ids(
    kind: str, source: str, parts: list[str], other_source: str, other_parts: list[str]
) -> None:
    if (source, parts) != (other_source, other_parts):
        assert output_event_id(kind, source, *parts) != output_event_id(kind, other_source, *other_parts)


def test_known_value_is_stable() -> None:
    # Pinned: consumers de-duplicate by these ids, so they must never change between releases.
    assert output_event_id("TRACE_SCORED", "e1") == "94e2cc8f-7704-5c08-aa9a-d36d817dd898"
