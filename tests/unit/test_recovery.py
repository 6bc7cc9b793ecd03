"""The Faust recovery fix: stream partitions are sought to committed offsets while still paused.

The end-to-end evidence is tests/integration/test_shutdown.py (no input lost across SIGTERM and
restart); this test pins the ordering itself, which that test can only catch some of the time.
"""

from __future__ import annotations

from typing import Any

from faust.types import TP

from streams.app import create_app
from streams.config import load_settings
from streams.recovery import SeekThenResumeRecovery


class RecordingConsumer:
    """Records the order of the calls recovery makes; the assignment has one stream and one changelog."""

    def __init__(self, changelog_topic: str) -> None:
        self.calls: list[Any] = []
        self.paused = {TP("agent-events", 0), TP(changelog_topic, 0)}

    def assignment(self) -> set[TP]:
        return set(self.paused)

    async def perform_seek(self) -> None:
        self.calls.append(("seek", frozenset(self.paused)))

    def resume_partitions(self, partitions: set[TP]) -> None:
        self.calls.append(("resume", frozenset(partitions)))
        self.paused -= partitions


async def test_streams_are_sought_before_they_resume() -> None:
    svc = create_app(load_settings())
    recovery = svc.app.tables.recovery
    assert isinstance(recovery, SeekThenResumeRecovery)
    changelog = svc.traces.changelog_topic.get_topic_name()
    consumer = RecordingConsumer(changelog)
    svc.app.consumer = consumer

    await recovery._seek_then_resume_streams()

    stream_tp = TP("agent-events", 0)
    assert [name for name, _ in consumer.calls] == ["seek", "resume"]
    assert stream_tp in consumer.calls[0][1]  # the seek happened while the stream partition was paused
    assert consumer.calls[1][1] == {stream_tp}  # only stream partitions resume; changelogs stay with recovery
