"""Publishing the event stream to the company's message broker: NATS JetStream or RabbitMQ.

An :class:`EventPublisher` takes a batch of events in stream order and returns only when
the broker has them (a JetStream publish ack, a RabbitMQ publisher confirm); on any failure
it raises, and the caller sends the whole batch again. So a receiver may see an event twice,
and each message carries the event's id to let it drop the repeat:

- NATS: subject ``<prefix>.<kind>``, header ``Nats-Msg-Id: <id>``; JetStream itself drops a
  repeat within the stream's duplicate window (2 minutes unless the stream says otherwise).
- RabbitMQ: a durable topic exchange, routing key ``<kind>``, ``message_id = <id>``,
  persistent; RabbitMQ has no de-duplication, so consumers key on ``message_id``.

The body is ``json.dumps(event.to_json())``. A URL may carry credentials: they are used to
connect and never appear in an error or a log line.

nats-py is asyncio: a :class:`NatsPublisher` runs its own event loop in a daemon thread, so
the client's pings and reconnects go on between batches and a caller in any thread (or
inside another event loop) can publish; the dataset consumer in
``shamal.datasets._brokers`` instead drives its loop from the caller's thread, which suits
a loop that is always receiving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, Literal, Protocol, TypeVar
from urllib.parse import urlsplit

from shamal.errors import InvalidParameter, NotImplementedFeature, ServiceUnavailable
from shamal.events._entities import Event

__all__ = ["EventPublisher", "NatsPublisher", "RabbitPublisher", "open_publisher"]

logger = logging.getLogger(__name__)

_CONNECT_SECONDS = 10.0
_ACK_SECONDS = 10.0
_T = TypeVar("_T")


class EventPublisher(Protocol):
    """What the delivery loop needs of a broker.

    ``publish`` is all-or-raise and idempotent per event id (a repeat carries the same id,
    which the broker or the consumer uses to drop it). Not safe for concurrent ``publish``
    calls from several threads unless an implementation says so.
    """

    def publish(self, events: Sequence[Event]) -> None:
        """Hand ``events`` to the broker in order; return once it holds all of them.

        Raises:
            ServiceUnavailable: the broker is unreachable or did not confirm; send the
                batch again later.
        """
        ...

    def close(self) -> None:
        """Release the connection; the publisher is unusable after."""
        ...


def _where(url: str) -> str:
    """The URL without credentials, path or query (what may be printed)."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "the configured broker"
    return f"{parts.scheme}://{parts.hostname or ''}{port}"


def _body(event: Event) -> bytes:
    return json.dumps(event.to_json()).encode()


def _check_token(value: str, what: str) -> str:
    # Subjects, streams and exchange names are dot-separated words; wildcards, spaces and
    # control characters would change what a name means to the broker.
    if not value or not value.isascii() or any(c in value for c in " *>\t\r\n\x00"):
        raise InvalidParameter(f"the {what} is a non-empty ASCII name without spaces, * or >")
    return value


# ---------------------------------------------------------------------- NATS JetStream
class _LoopThread:
    """An asyncio loop of our own, running in a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, work: Coroutine[Any, Any, _T], timeout: float) -> _T:
        future = asyncio.run_coroutine_threadsafe(work, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=_CONNECT_SECONDS)
        if not self._thread.is_alive():
            self.loop.close()


class NatsPublisher:
    """Publishes to a JetStream stream, creating it (subjects ``<prefix>.>``) if missing.

    The client does not reconnect by itself (its reconnect loop would hold a batch for as
    long as NATS is down): a lost connection makes :meth:`publish` raise, and the next call
    connects afresh, so the delivery loop's backoff paces the attempts.

    Args:
        url: ``nats://[user:password@]host[:port]``.
        stream: the JetStream stream's name.
        subject_prefix: events go to ``<subject_prefix>.<kind>``.

    Raises:
        InvalidParameter: a stream or prefix that is no plain NATS name; a stream of that
            name exists but does not take ``<prefix>.>``.
        ServiceUnavailable: NATS cannot be reached, or has no JetStream.
    """

    def __init__(
        self, url: str, *, stream: str = "SHAMAL_EVENTS", subject_prefix: str = "shamal.events"
    ) -> None:
        self._stream = _check_token(stream, "NATS stream name")
        if "." in stream:
            raise InvalidParameter("a JetStream stream name has no dots")
        self._prefix = _check_token(subject_prefix, "NATS subject prefix").rstrip(".")
        self._url = url  # kept to connect again; never printed (it may hold a password)
        self._where = _where(url)
        self._nc: Any = None
        self._js: Any = None
        self._stale = False
        import nats  # here, not in the loop: a missing library must not read as "unreachable"

        del nats
        self._runner = _LoopThread("shamal-events-nats")
        try:
            self._runner.run(self._connect(), _CONNECT_SECONDS * 2)
        except InvalidParameter:
            self._runner.stop()
            raise
        except Exception as exc:
            self._runner.stop()
            raise ServiceUnavailable(
                f"cannot publish to NATS JetStream at {self._where} ({type(exc).__name__})"
            ) from None

    async def _on_error(self, exc: Exception) -> None:
        logger.warning("NATS at %s: %s", self._where, type(exc).__name__)

    async def _connect(self) -> None:
        import nats
        from nats.js.errors import NotFoundError

        nc = await nats.connect(
            servers=[self._url],
            connect_timeout=_CONNECT_SECONDS,
            allow_reconnect=False,
            # nats-py's first connect loops over its server list until a server has failed
            # more than max_reconnect_attempts times (0 or less: forever): two quick tries.
            max_reconnect_attempts=1,
            reconnect_time_wait=0.2,
            error_cb=self._on_error,
        )
        try:
            js = nc.jetstream(timeout=_ACK_SECONDS)
            wanted = f"{self._prefix}.>"
            try:
                info = await js.stream_info(self._stream)
            except NotFoundError:
                await js.add_stream(name=self._stream, subjects=[wanted])
            else:
                if wanted not in (info.config.subjects or []):
                    raise InvalidParameter(
                        f"the JetStream stream {self._stream} exists but does not take "
                        f"{wanted}; add that subject or name another stream"
                    )
        except BaseException:
            await nc.close()
            raise
        self._nc, self._js = nc, js

    async def _publish(self, events: Sequence[Event]) -> None:
        if self._stale or self._nc is None or self._nc.is_closed:
            # After any failure start over: a fresh connection, and the stream made again
            # if someone deleted it.
            if self._nc is not None:
                with contextlib.suppress(Exception):
                    await self._nc.close()
            self._nc = None
            await self._connect()
            self._stale = False
        # One at a time, each ack awaited: the stream keeps our order, and a failure
        # leaves a prefix published (re-sent, then dropped by Nats-Msg-Id).
        for event in events:
            await self._js.publish(
                f"{self._prefix}.{event.kind.value}",
                _body(event),
                timeout=_ACK_SECONDS,
                stream=self._stream,
                headers={"Nats-Msg-Id": str(event.id)},
            )

    def publish(self, events: Sequence[Event]) -> None:
        """Publish ``events`` in order, each acknowledged by JetStream.

        Raises:
            ServiceUnavailable: no ack (NATS down, stream gone, timeout).
            InvalidParameter: on reconnecting, the stream turned out to take other subjects.
        """
        if not events:
            return
        budget = _CONNECT_SECONDS * 2 + _ACK_SECONDS * len(events)
        try:
            self._runner.run(self._publish(events), budget)
        except InvalidParameter:
            self._stale = True
            raise
        except Exception as exc:
            self._stale = True
            raise ServiceUnavailable(
                f"NATS at {self._where} did not acknowledge the events ({type(exc).__name__}); "
                "they will be sent again"
            ) from None

    def close(self) -> None:
        """Close the connection, then stop the loop's thread."""
        if self._nc is not None:
            with contextlib.suppress(Exception):
                self._runner.run(self._nc.close(), _CONNECT_SECONDS)
        self._runner.stop()


# ---------------------------------------------------------------------- RabbitMQ
class RabbitPublisher:
    """Publishes to a durable topic exchange with publisher confirms.

    A dropped connection makes :meth:`publish` raise; the next call connects again. Not
    thread-safe (pika's BlockingConnection is not); a lock makes concurrent calls wait.

    Args:
        url: ``amqp://user:password@host[:port]/[vhost]`` (pika's URL form).
        exchange: the topic exchange's name (declared durable if missing).

    Raises:
        InvalidParameter: an exchange name that is no plain name, or an exchange of that
            name that is not a durable topic exchange.
        ServiceUnavailable: RabbitMQ cannot be reached or refuses the login.
    """

    def __init__(self, url: str, *, exchange: str = "shamal.events") -> None:
        import pika

        self._exchange = _check_token(exchange, "RabbitMQ exchange name")
        self._where = _where(url)
        try:
            self._params = pika.URLParameters(url)
        except Exception:
            raise InvalidParameter(
                "the RabbitMQ URL does not parse: amqp://user:password@host:port/vhost"
            ) from None
        self._params.connection_attempts = 1
        self._params.socket_timeout = _CONNECT_SECONDS
        self._params.blocked_connection_timeout = _ACK_SECONDS
        self._lock = threading.Lock()
        self._connection: Any = None
        self._channel: Any = None
        self._connect()

    def _connect(self) -> None:
        import pika
        import pika.exceptions

        try:
            connection = pika.BlockingConnection(self._params)
        except pika.exceptions.AMQPError as exc:
            raise ServiceUnavailable(
                f"cannot reach RabbitMQ at {self._where} ({type(exc).__name__})"
            ) from None
        try:
            channel = connection.channel()
            channel.exchange_declare(self._exchange, exchange_type="topic", durable=True)
            channel.confirm_delivery()
        except pika.exceptions.ChannelClosedByBroker:
            connection.close()
            raise InvalidParameter(
                f"the exchange {self._exchange} exists with other settings; Shamal needs a "
                "durable topic exchange"
            ) from None
        self._connection, self._channel = connection, channel

    def _drop(self) -> None:
        with contextlib.suppress(Exception):
            self._connection.close()
        self._connection = self._channel = None

    def publish(self, events: Sequence[Event]) -> None:
        """Publish ``events`` in order, each confirmed by RabbitMQ.

        Raises:
            ServiceUnavailable: the connection dropped or a message was not confirmed.
        """
        import pika
        import pika.exceptions

        with self._lock:
            if self._channel is None or self._connection.is_closed:
                self._drop()
                self._connect()
            try:
                for event in events:
                    properties = pika.BasicProperties(
                        content_type="application/json",
                        delivery_mode=pika.DeliveryMode.Persistent,
                        message_id=str(event.id),
                        type=event.kind.value,
                    )
                    # With confirms on, basic_publish returns once the broker confirmed.
                    self._channel.basic_publish(
                        self._exchange, event.kind.value, _body(event), properties
                    )
            except pika.exceptions.AMQPError as exc:
                self._drop()
                raise ServiceUnavailable(
                    f"RabbitMQ at {self._where} did not confirm the events "
                    f"({type(exc).__name__}); they will be sent again"
                ) from None

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._drop()


def open_publisher(kind: Literal["nats", "rabbitmq"], url: str, **options: Any) -> EventPublisher:
    """Connect a publisher of ``kind``.

    Args:
        kind: ``"nats"`` (options ``stream``, ``subject_prefix``) or ``"rabbitmq"``
            (option ``exchange``).
        url: the broker's URL; may hold credentials, which are never repeated.
        options: passed to the publisher's constructor.

    Raises:
        InvalidParameter: an unknown kind or option.
        NotImplementedFeature: the broker's client library is not installed.
        ServiceUnavailable: the broker cannot be reached.
    """
    known = {"nats": {"stream", "subject_prefix"}, "rabbitmq": {"exchange"}}
    if kind not in known:
        raise InvalidParameter("the event broker is 'nats' or 'rabbitmq'")
    unknown = sorted(set(options) - known[kind])
    if unknown:
        raise InvalidParameter(
            f"unknown option(s) {', '.join(unknown)} for {kind}; known: "
            f"{', '.join(sorted(known[kind]))}"
        )
    try:
        if kind == "nats":
            return NatsPublisher(url, **options)
        return RabbitPublisher(url, **options)
    except ModuleNotFoundError as exc:
        raise NotImplementedFeature(
            f"publishing events to {kind} needs {exc.name}, which this install lacks: "
            "pip install 'shamal[streams]'"
        ) from None
