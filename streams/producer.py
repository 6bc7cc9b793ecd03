"""Producer kit for agents: input event models in, JSON keyed by trace_id on the input topic out."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal, TypeVar, get_args, get_origin

import pydantic_core
from aiokafka import AIOKafkaProducer
from aiokafka.structs import RecordMetadata
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError
from pydantic_core.core_schema import ErrorType

from streams.config import Settings, load_settings
from streams.decode import decode
from streams.dlq import DeadLetter
from streams.events import InputEvent

_PYDANTIC_ERROR_TYPES = frozenset(get_args(ErrorType))  # the types it can rebuild by name

__all__ = [
    "INPUT_MODELS",
    "SCHEMA_VERSION",
    "Batch",
    "EventProducer",
    "RejectedEvent",
    "SendError",
    "build",
    "encode",
    "event_type_of",
    "key_of",
]

SCHEMA_VERSION = 1

# Read from the service's own union, so an input type added to `InputEvent` works here unchanged.
INPUT_MODELS: tuple[type[BaseModel], ...] = get_args(get_args(InputEvent)[0])

E = TypeVar("E", bound=BaseModel)


def event_type_of(event_class: type[BaseModel]) -> str:
    """The `event_type` an input model carries (its single Literal value)."""
    annotation = event_class.model_fields["event_type"].annotation
    if get_origin(annotation) is not Literal or len(get_args(annotation)) != 1:
        raise TypeError(f"{event_class.__name__}.event_type is not a single literal")
    return str(get_args(annotation)[0])


def build(event_class: type[E], /, **fields: Any) -> E:
    """An input event validated exactly as the service decodes it, with the boilerplate filled in.

    Fills `event_type` and `schema_version` (1), and, unless given, `event_id` (a uuid4) and `timestamp`
    (now, UTC). Datetimes may be passed as aware `datetime` objects or RFC 3339 strings. An unknown field
    name raises TypeError (the model would silently drop it). Invalid values raise pydantic's
    ValidationError, whose message names fields but no input values.
    """
    if event_class not in INPUT_MODELS:
        raise TypeError(f"{event_class.__name__} is not an input event model ({_names()})")
    unknown = set(fields) - set(event_class.model_fields)
    if unknown:
        raise TypeError(f"{event_class.__name__} has no field(s) {', '.join(sorted(unknown))}")
    fields.setdefault("event_type", event_type_of(event_class))
    fields.setdefault("schema_version", SCHEMA_VERSION)
    fields.setdefault("event_id", str(uuid.uuid4()))
    fields.setdefault("timestamp", datetime.now(UTC))
    # Through JSON on purpose: strict JSON decoding is what the service applies, so whatever `build`
    # accepts, the worker accepts (a Python-mode strict validation would, e.g., refuse nested dicts).
    try:
        encoded = _json(fields)
    except pydantic_core.PydanticSerializationError:
        # A str that is not valid Unicode (a lone surrogate) has no JSON form, and the worker refuses
        # its escape as `invalid_json`: refused here as a ValidationError like any other bad value.
        raise ValidationError.from_exception_data(
            event_class.__name__,
            [_unencodable(name) for name, value in fields.items() if not _encodes(value)],
            input_type="json",
            hide_input=True,
        ) from None
    try:
        return event_class.model_validate_json(encoded)
    except ValidationError as exc:
        # The message leaves input values out, so a logprob never lands in the agent's logs.
        raise ValidationError.from_exception_data(
            exc.title, [_init_details(e) for e in exc.errors()], input_type="json", hide_input=True
        ) from None


def _encodes(value: Any) -> bool:
    try:
        _json(value)
    except pydantic_core.PydanticSerializationError:
        return False
    return True


def _unencodable(name: str) -> InitErrorDetails:
    message = "cannot be encoded as JSON (a value JSON has no form for, e.g. a string with a lone surrogate)"
    return InitErrorDetails(type=PydanticCustomError("invalid_text", message), loc=(name,), input=None)


def _init_details(error: ErrorDetails) -> InitErrorDetails:
    # The models' own error types (e.g. outcome_invalid) are not pydantic's: rebuilt from their message.
    kind = error["type"]
    details = InitErrorDetails(
        type=kind if kind in _PYDANTIC_ERROR_TYPES else PydanticCustomError(kind, error["msg"]),
        loc=error["loc"],
        input=error["input"],
    )
    if "ctx" in error:
        details["ctx"] = error["ctx"]
    return details


def encode(event: BaseModel) -> bytes:
    """The record value: the event as JSON, non-finite logprobs as the NaN / Infinity literals."""
    _check_input(event)
    # model_dump_json would write NaN and Infinity as null (the models' default); the service reads
    # the literals, and a producer should send the logprobs it was given.
    return _json(event.model_dump(by_alias=True))


def key_of(event: BaseModel) -> bytes:
    """The record key: trace_id as UTF-8, so one trace's events reach one partition in order."""
    return _field(event, "trace_id").encode()


def _json(value: Any) -> bytes:
    return pydantic_core.to_json(value, inf_nan_mode="constants")


def _check_input(event: BaseModel) -> None:
    if not isinstance(event, INPUT_MODELS):
        raise TypeError(f"{type(event).__name__} is not an input event ({_names()})")


def _field(event: BaseModel, name: str) -> str:
    # Common fields of every input model; read by name because the models share no public base class.
    _check_input(event)
    return str(vars(event)[name])


def _names() -> str:
    return ", ".join(model.__name__ for model in INPUT_MODELS)


class RejectedEvent(ValueError):
    """The service would dead-letter this event (for example it exceeds MAX_EVENT_BYTES); not sent."""

    def __init__(self, event_id: str, dead_letter: DeadLetter) -> None:
        super().__init__(f"event {event_id}: {dead_letter.reason}: {dead_letter.message}")
        self.event_id = event_id
        self.reason = dead_letter.reason


class SendError(Exception):
    """Some events of a batch were not acknowledged by the broker; the others were."""

    def __init__(self, failures: list[tuple[str, BaseException]], acknowledged: int) -> None:
        first_id, first = failures[0]
        super().__init__(
            f"{len(failures)} event(s) not acknowledged ({acknowledged} were), first {first_id}: {first!r}"
        )
        self.failures = failures
        self.acknowledged = acknowledged


class EventProducer:
    """Publishes input events to the service's input topic; use as `async with EventProducer() as p`.

    Bootstrap servers, input topic and the size limits come from the service's settings
    (`load_settings()`, i.e. the same environment variables) unless passed here. Given both
    `bootstrap_servers` and `topic` (and no `settings`), the environment is not read at all and the
    size limits are the service's defaults: an agent's process has its own variables (a `LOG_LEVEL`
    the worker would refuse must not stop its producer). `kafka_options` go to
    aiokafka's AIOKafkaProducer (security, SASL, compression, ...). A record counts as sent once all
    in-sync replicas have it (acks=all). Idempotence is off by default because the embedded test broker
    (Tansu 0.6.0) refuses InitProducerId. Without it a retried request may write a record twice: the
    service takes that as a re-delivery (same event_id: state not counted twice, outputs with the same
    event_id), and order per partition holds either way, since aiokafka keeps one request in flight per
    partition. Against Apache Kafka pass `enable_idempotence=True`.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        bootstrap_servers: str | None = None,
        topic: str | None = None,
        enable_idempotence: bool = False,
        linger_ms: int = 5,
        max_batch_size: int = 262_144,
        **kafka_options: Any,
    ) -> None:
        if settings is None:
            explicit = bootstrap_servers is not None and topic is not None
            settings = Settings.model_construct() if explicit else load_settings()  # defaults only
        self.topic = topic or settings.input_topic_names[0]
        self.bootstrap_servers = bootstrap_servers or settings.kafka_bootstrap_servers
        self._max_event_bytes = settings.max_event_bytes
        self._max_array_items = settings.max_array_items
        # 256 KB batches: the 16 KB default halves aiokafka's throughput (DESIGN section 7).
        self._options: dict[str, Any] = {
            "acks": "all",
            "enable_idempotence": enable_idempotence,
            "linger_ms": linger_ms,
            "max_batch_size": max_batch_size,
            **kafka_options,
        }
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        """Connect; the aiokafka producer is made here because it binds to the running event loop."""
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap_servers, **self._options)
        try:
            await producer.start()
        except BaseException:
            await producer.stop()  # closes the connections a failed start left open
            raise
        self._producer = producer

    async def stop(self) -> None:
        """Flush what is buffered and close the connections."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()

    async def __aenter__(self) -> EventProducer:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    def record(self, event: BaseModel) -> tuple[bytes, bytes]:
        """(key, value) for one event, refused with RejectedEvent if the service would dead-letter it."""
        key, value = key_of(event), encode(event)
        # The service's own decoder is the check, so the kit cannot drift from it (size and list limits
        # included); it costs microseconds next to a broker round trip.
        decoded = decode(value, self._max_event_bytes, self._max_array_items)
        if isinstance(decoded, DeadLetter):
            raise RejectedEvent(_field(event, "event_id"), decoded)
        return key, value

    async def send(self, event: BaseModel) -> RecordMetadata:
        """Send one event and wait until the broker acknowledged it."""
        future = await self._enqueue(self.record(event))
        return await future

    async def send_many(self, events: Iterable[BaseModel]) -> list[RecordMetadata]:
        """Send the events concurrently, in order; return once every one is acknowledged.

        All events are encoded and checked first, so a rejected event sends nothing. Raises SendError
        naming the events the broker did not acknowledge.
        """
        pairs = [(_field(e, "event_id"), self.record(e)) for e in events]
        async with self.batch() as batch:
            for event_id, record in pairs:
                await batch.enqueue(event_id, record)
        return batch.metadata

    def batch(self) -> Batch:
        """`async with producer.batch() as b: await b.send(e)`: all acknowledged when the block exits."""
        return Batch(self)

    async def _enqueue(self, record: tuple[bytes, bytes]) -> asyncio.Future[RecordMetadata]:
        # Returns once the record is in aiokafka's buffer; the future resolves on the broker's ack.
        if self._producer is None:
            raise RuntimeError("EventProducer is not started: use `async with` or `await start()`")
        key, value = record
        future: asyncio.Future[RecordMetadata] = await self._producer.send(self.topic, value, key=key)
        return future


class Batch:
    """Events sent without waiting for each ack; leaving the block waits for all of them.

    If the block raises, the events already sent are still awaited and the block's exception
    propagates, with a note naming the events the broker did not acknowledge (also in `failures`).
    Otherwise a failed ack raises SendError after every other ack has arrived.
    """

    def __init__(self, producer: EventProducer) -> None:
        self._producer = producer
        self._pending: list[tuple[str, asyncio.Future[RecordMetadata]]] = []
        self.metadata: list[RecordMetadata] = []
        self.failures: list[tuple[str, BaseException]] = []

    async def send(self, event: BaseModel) -> None:
        """Queue one event (waits only while aiokafka's buffer is full)."""
        await self.enqueue(_field(event, "event_id"), self._producer.record(event))

    async def enqueue(self, event_id: str, record: tuple[bytes, bytes]) -> None:
        """Queue an already encoded (key, value) record."""
        self._pending.append((event_id, await self._producer._enqueue(record)))

    async def __aenter__(self) -> Batch:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        results = await asyncio.gather(*(future for _, future in self._pending), return_exceptions=True)
        self.failures = [
            (event_id, result)
            for (event_id, _), result in zip(self._pending, results, strict=True)
            if isinstance(result, BaseException)
        ]
        self.metadata = [result for result in results if not isinstance(result, BaseException)]
        if not self.failures:
            return
        error = SendError(self.failures, len(self.metadata))
        if exc is None:
            raise error from self.failures[0][1]
        # The block's own exception wins, but the caller must still learn which events may be lost.
        exc.add_note(f"and on leaving the batch: {error}")
