"""Views route between workers that share one web port on different addresses, as the compose file's
replicas do: each advertises its own `WEB_HOST` (README "HTTP"). Until the seventeenth round the
default was 0.0.0.0, so replicas advertised one URL and each answered every view itself."""

from __future__ import annotations

import urllib.error
import urllib.request

from streams.harness import RunningBroker
from tests.integration.fixtures import EventFactory, count_of, deploy, free_port, poll

HOSTS = ("127.0.0.2", "127.0.0.3")  # Linux answers on all of 127.0.0.0/8


def _get(host: str, port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:  # not listening yet
        return 0, b""


def test_a_view_asked_of_either_worker_answers_for_every_trace(kafka: RunningBroker) -> None:
    d = deploy(kafka, partitions=2)
    port = free_port()
    f = EventFactory(tenant="route")
    traces = [f"route-{i}" for i in range(12)]
    try:
        for host in HOSTS:
            # WEB_HOST is the address the worker advertises; WEB_BIND the one it listens on.
            # No standby copies (Faust keeps one by default): a worker would answer a misrouted view
            # from its copy of the other's partition, and the test could not tell routing from that.
            d.start_worker(WEB_HOST=host, WEB_BIND=host, WEB_PORT=str(port), TABLE_STANDBY_REPLICAS="0")
        ready = poll(
            lambda: [_get(host, port, "/readyz")[0] for host in HOSTS],
            lambda got: got == [200, 200],
            timeout=90,
        )
        assert ready == [200, 200], ready
        d.produce([f.tool(t, "find", f"Sym{i}", result_count=1) for i, t in enumerate(traces)])
        d.collect(count_of("TRACE_SCORED", len(traces), d.settings.scored_topic))
        # Both workers scored some of the traces: each owns a partition, so a view asked of one worker
        # is for the other's keys about half of the time.
        for host in HOSTS:
            assert (
                b'confidence_outputs_emitted_total{event_type="TRACE_SCORED"}'
                in _get(host, port, "/metrics")[1]
            )

        def answers() -> dict[tuple[str, str], int]:
            return {(h, t): _get(h, port, f"/traces/route/{t}")[0] for h in HOSTS for t in traces}

        seen = poll(answers, lambda got: set(got.values()) == {200}, timeout=60)
        assert set(seen.values()) == {200}, sorted(k for k, status in seen.items() if status != 200)

        # The second worker dies (no LeaveGroup): until the group notices, the first still forwards
        # views of its keys there. They answer 503 with JSON (a retry later succeeds), never a 500 page.
        gone = d.workers[1].process
        assert gone is not None
        gone.kill()
        gone.wait(timeout=10)
        after = {t: _get(HOSTS[0], port, f"/traces/route/{t}") for t in traces}
        assert {status for status, _ in after.values()} <= {200, 503}, after
        unreachable = [body for status, body in after.values() if status == 503]
        assert unreachable, "no view was forwarded to the dead worker (each owned half of the traces)"
        assert all(b"did not answer" in body or b"no worker owns" in body for body in unreachable)
    finally:
        d.stop()
