"""The `confidence-streams` command: worker, topics create|describe, demo, tail, report."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import math
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = ["main", "tune_gc"]


def tune_gc(gen0_threshold: int) -> None:
    """Collect generation 0 every `gen0_threshold` allocations (0: leave Python's default)."""
    if gen0_threshold:
        gc.set_threshold(gen0_threshold, *gc.get_threshold()[1:])


def _count(text: str) -> int:
    """An argument counting things, at least one (`tail --limit 0` printed one record)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (`demo --timeout 0` or `nan` gave up at once)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (0 < value < math.inf):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def _worker(_: argparse.Namespace) -> int:
    from streams.agents import attach_agents
    from streams.app import DeadlinedWorker, changelog_topics, create_app
    from streams.batch_runner import EXIT_BATCH_FAILED
    from streams.config import load_settings
    from streams.lag import attach_lag_monitor
    from streams.topics import TopicProblem, ensure_topics
    from streams.views import attach_views

    settings = load_settings()
    svc = create_app(settings)
    # Every topic must exist with the expected partitions before anything consumes (README "Guarantees").
    try:
        asyncio.run(ensure_topics(settings, changelog_topics(svc)))
    except TopicProblem as exc:
        print(f"confidence-streams worker: {exc}", file=sys.stderr)
        return 2
    claim_facts = attach_agents(svc)
    attach_views(svc, claim_facts.get)
    attach_lag_monitor(svc)
    tune_gc(settings.gc_gen0_threshold)
    # Never `-l warn`: Faust then installs its spinner and sets the root logger to DEBUG (DESIGN 10).
    # debug=False: Faust's F_DEBUG would start its blocking detector and console.
    worker = DeadlinedWorker(svc.app, loglevel=settings.log_level, quiet=True, debug=False)
    worker.shutdown_timeout_seconds = settings.shutdown_timeout_seconds
    try:
        worker.execute_from_commandline()
    except SystemExit:
        if svc.health.fatal is not None:  # a batch failed: stopped on purpose, not a clean exit
            return EXIT_BATCH_FAILED
        raise
    return 0


_TOPICS_CREATE_FLAGS = {"topic_partitions": "--partitions", "input_retention_ms": "--input-retention-ms"}


def _topics(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from streams.app import changelog_topics, create_app
    from streams.config import load_settings
    from streams.topics import TopicProblem, ensure_topics

    overrides: dict[str, object] = {}
    if args.partitions is not None:
        overrides["topic_partitions"] = args.partitions
    if args.input_retention_ms is not None:
        overrides["input_retention_ms"] = args.input_retention_ms
    try:
        settings = load_settings(**overrides)
    except ValidationError as exc:  # a setting given as a flag is named as the flag
        _print_setting_errors(exc, {f: flag for f, flag in _TOPICS_CREATE_FLAGS.items() if f in overrides})
        return 2
    try:  # as the worker checks them: the missing ones created, partition counts verified
        created = asyncio.run(ensure_topics(settings, changelog_topics(create_app(settings))))
    except TopicProblem as exc:
        print(f"confidence-streams topics create: {exc}", file=sys.stderr)
        return 2
    print("created:", ", ".join(created) or "nothing (all topics existed)")
    return 0


def _topics_describe(args: argparse.Namespace) -> int:
    import orjson
    from rich.console import Console

    from streams.app import changelog_topics, create_app
    from streams.config import load_settings
    from streams.describe import describe_topics, table_of, to_json

    settings = load_settings()
    states = asyncio.run(describe_topics(settings, changelog_topics(create_app(settings))))
    if args.json:
        report = to_json(states, settings.app_id, settings.kafka_bootstrap_servers)
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        Console(soft_wrap=True).print(table_of(states, settings.app_id))
    return 0


def _report_extra_missing() -> bool:
    """True (after one line on stderr) when the `report` extra (matplotlib) is not installed."""
    try:
        import streams.report_plot  # noqa: F401
    except ImportError as exc:
        print(
            f"confidence-streams: {exc.name} is missing for the report; install the extra: "
            "pip install 'confidence-streams[report]'",
            file=sys.stderr,
        )
        return True
    return False


def _demo(args: argparse.Namespace) -> int:
    from streams.config import load_settings
    from streams.demo_runner import run_demo
    from streams.harness import stop_on_sigterm

    if args.report is not None and _report_extra_missing():
        return 2
    load_settings()  # a mistake in the environment is named before a broker is started for nothing
    stop_on_sigterm()  # the broker and the worker it starts stop with it
    return run_demo(timeout=args.timeout, report_dir=args.report)


def _tail(args: argparse.Namespace) -> int:
    from streams.tail import Source, run

    source: Source = "dlq" if args.dlq else "flagged" if args.flagged else "scored"
    return run(source, limit=args.limit, as_json=args.json, color=args.color)


def _report(args: argparse.Namespace) -> int:
    from streams.config import load_settings
    from streams.report import read_source, write_report

    if _report_extra_missing():
        return 2
    settings = load_settings()
    try:
        records, source = read_source(args.source, settings.kafka_bootstrap_servers)
    except (LookupError, TimeoutError) as exc:
        print(f"confidence-streams report: {exc}", file=sys.stderr)
        return 1
    png, html = write_report(records, args.out, source=source, title=args.title)
    print(f"report: {html} and {png} ({len(records)} records from {source})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    from aiokafka.errors import KafkaConnectionError
    from pydantic import ValidationError

    from streams.config import Settings, configured_bootstrap_servers

    parser = argparse.ArgumentParser(prog="confidence-streams", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "worker",
        help="run a Faust worker (configuration from the environment)",
        description="Runs a worker. It takes no arguments: every setting is an environment variable "
        '(README "Configuration").',
    ).set_defaults(run=_worker)
    topics = commands.add_parser("topics", help="manage the service's topics")
    topics_commands = topics.add_subparsers(dest="topics_command", required=True)
    create = topics_commands.add_parser("create", help="create input, output, DLQ and internal topics")
    create.add_argument("--partitions", type=int, default=None, help="override TOPIC_PARTITIONS")
    create.add_argument("--input-retention-ms", type=int, default=None, help="override INPUT_RETENTION_MS")
    create.set_defaults(run=_topics)
    describe = topics_commands.add_parser(
        "describe", help="partitions, retention, end offsets, the group's committed offsets and lag"
    )
    describe.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    describe.set_defaults(run=_topics_describe)
    demo = commands.add_parser("demo", help="broker, topics, worker and demo traffic, then a summary")
    demo.add_argument("--timeout", type=_seconds, default=120.0, help="seconds to wait for all outputs")
    demo.add_argument(
        "--report", metavar="DIR", default=None, help="also write the run's report (HTML + PNG) here"
    )
    demo.set_defaults(run=_demo)
    tail = commands.add_parser("tail", help="one line per scored (or flagged, or dead-lettered) event")
    which = tail.add_mutually_exclusive_group()
    which.add_argument("--flagged", action="store_true", help="follow flagged-events instead")
    which.add_argument("--dlq", action="store_true", help="follow the dead-letter topic instead")
    tail.add_argument("--limit", type=_count, default=None, help="stop after this many events")
    tail.add_argument("--json", action="store_true", help="print each record's value as one JSON line")
    tail.add_argument(
        "--color", choices=("auto", "always", "never"), default="auto", help="auto: only on a terminal"
    )
    tail.set_defaults(run=_tail)

    report = commands.add_parser("report", help="HTML page and PNG charts of a run's outputs")
    report.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="TOPIC|FILE",
        help="an existing JSON-lines file (e.g. from `tail --json`), - for stdin, else a topic name",
    )
    report.add_argument("--out", default="confidence-report", metavar="DIR", help="output directory")
    report.add_argument("--title", default="confidence report", help="title of the page and the image")
    report.set_defaults(run=_report)

    # argparse refuses arguments `worker` does not take (they were once meant for Faust's command
    # line, which never read them): the worker is configured from the environment only.
    args = parser.parse_args(argv)
    try:
        if args.command == "worker":
            sys.argv = [sys.argv[0], "worker"]  # what Faust's Worker reads as its own command line
            logging.basicConfig(level=logging.INFO)
            return _worker(args)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("aiokafka").setLevel(logging.WARNING)  # client chatter; the worker logs its own
        logging.getLogger("matplotlib").setLevel(logging.WARNING)  # font cache notices (report)
        return int(args.run(args))
    except KafkaConnectionError as exc:
        # No broker at the address (or not yet): one line naming it, as for a configuration mistake.
        default = Settings.model_fields["kafka_bootstrap_servers"].default
        servers = configured_bootstrap_servers() or f"{default} (the default)"
        print(f"confidence-streams: cannot reach Kafka at {servers}: {exc}", file=sys.stderr)
        return 1
    except ValidationError as exc:
        if exc.title != Settings.__name__:
            raise
        _print_setting_errors(exc)
        return 2


def _print_setting_errors(exc: ValidationError, flags: dict[str, str] | None = None) -> None:
    """One line per mistake, named as the user set it, no traceback: the command-line flag for the
    settings in `flags` (field name -> flag), else the environment variable."""
    for error in exc.errors(include_url=False, include_input=False):
        field = "_".join(str(part) for part in error["loc"])
        name = (flags or {}).get(field) or field.upper() or "configuration"
        print(f"confidence-streams: {name}: {error['msg']}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
