"""Deterministic output event ids: the same input always yields the same output id."""

from __future__ import annotations

import uuid

__all__ = ["output_event_id"]

_NAMESPACE = uuid.UUID("6f1d3c1e-3f7a-5d2b-9c61-0b8f3b7e2a10")


def output_event_id(kind: str, source_event_id: str, *parts: str) -> str:
    """A UUIDv5 over the output kind, the causing input's event id and any disambiguating parts."""
    name = "\x1f".join((kind, source_event_id, *parts))
    return str(uuid.uuid5(_NAMESPACE, name))
