"""Brokers a stream consumer reads: MQTT, NATS JetStream, RabbitMQ and Redis Streams, behind
one :class:`Broker` protocol (receive, acknowledge, close).

Each delivery becomes a :class:`Message` whose key is stable across redeliveries, so the
server can tell a record it already committed:

- MQTT: sha256 of the topic and payload (MQTT has no message id; QoS 1, a persistent session
  and manual acknowledgement, so what is not acknowledged comes again on reconnect);
- NATS JetStream: the stream sequence number (a durable pull consumer, explicit acks);
- RabbitMQ: the ``message_id`` property, else sha256 of the payload (manual acks; a dropped
  connection requeues what was not acknowledged);
- Redis Streams: the entry id (a consumer group; the consumer's pending entries are read
  again first after a start or a reconnect).

A broker URL may carry credentials; they are used to connect and never kept elsewhere:
:func:`describe` gives the URL without them, and ``Broker.stream`` names what the keys are
unique within (``redis:events``), which is all the server sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qsl, unquote, urlsplit

from shamal.datasets._batcher import Message, fit_key, stream_name
from shamal.errors import InvalidParameter, NotImplementedFeature, ServiceUnavailable

__all__ = ["SCHEMES", "Broker", "BrokerUrl", "describe", "open_broker", "parse_url"]

SCHEMES = {"mqtt": 1883, "nats": 4222, "amqp": 5672, "redis": 6379}
_OPTIONS = {
    "mqtt": {"client"},
    "nats": {"stream", "durable", "ack_wait"},
    "amqp": {"vhost"},
    "redis": {"stream", "group", "consumer", "field"},
}
_CONNECT_SECONDS = 10.0


class Broker(Protocol):
    """What a consumer needs of a broker."""

    #: What the keys are unique within (``mqtt:sensors/1``); never credentials.
    stream: str

    def receive(self, limit: int, timeout: float) -> list[Message]:
        """Up to ``limit`` deliveries, waiting at most ``timeout`` seconds for the first."""
        ...

    def ack(self, messages: Sequence[Message]) -> None:
        """Acknowledge ``messages`` (after their batch is committed)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class BrokerUrl:
    """A parsed broker URL: ``scheme://[user:password@]host[:port]/name?options``."""

    scheme: str
    host: str
    port: int
    name: str
    user: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    options: dict[str, str] = field(default_factory=dict)

    def option(self, key: str, default: str) -> str:
        return self.options.get(key) or default


def parse_url(url: str) -> BrokerUrl:
    """Parse a broker URL; the error never repeats it (it may hold a password).

    Raises:
        InvalidParameter: an unknown scheme, no host or name, an unknown option.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise InvalidParameter("the broker URL does not parse; see --help for its form") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise InvalidParameter(f"a broker URL starts with one of {', '.join(sorted(SCHEMES))}://")
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(options) - _OPTIONS[scheme])
    if unknown:
        raise InvalidParameter(
            f"unknown option(s) {', '.join(unknown)} in the {scheme} URL; "
            f"known: {', '.join(sorted(_OPTIONS[scheme])) or 'none'}"
        )
    name = unquote(parts.path.lstrip("/"))
    if scheme == "redis":
        name = options.get("stream", "")
        if not parts.path.strip("/").isdigit() and parts.path.strip("/"):
            raise InvalidParameter("a redis URL's path is the database number: redis://host/0")
    if not parts.hostname or not name or any(not c.isprintable() for c in name):
        what = {"mqtt": "topic", "nats": "subject", "amqp": "queue", "redis": "?stream= key"}
        raise InvalidParameter(f"the {scheme} URL names no host or no {what[scheme]}")
    return BrokerUrl(
        scheme,
        parts.hostname,
        port or SCHEMES[scheme],
        name,
        unquote(parts.username) if parts.username else None,
        unquote(parts.password) if parts.password else None,
        options,
    )


def describe(url: BrokerUrl) -> str:
    """The URL without credentials (what may be printed)."""
    path = url.options.get("stream", "") if url.scheme == "redis" else url.name
    return f"{url.scheme}://{url.host}:{url.port}/{path}"


def _digest_key(*parts: bytes) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(len(part).to_bytes(8, "big"))
        hasher.update(part)
    return "sha256:" + hasher.hexdigest()


# ---------------------------------------------------------------------- MQTT
class MqttBroker:
    """A QoS 1 subscription in a persistent session (``?client=ID``, default derived from
    the topic), acknowledged by hand. A batch is bounded by the broker's in-flight window
    (Mosquitto's ``max_inflight_messages``, 20 by default): beyond it, the age closes it."""

    def __init__(self, url: BrokerUrl) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.stream = stream_name("mqtt", url.name)
        self._topic = url.name
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._connected = threading.Event()
        # Set once the broker acknowledged the subscription (SUBACK): only from then on
        # does it keep what is published for us, so the constructor waits for it.
        self._subscribed = threading.Event()
        self._refused = False
        client_id = url.option(
            "client", "shamal-" + hashlib.sha256(url.name.encode()).hexdigest()[:16]
        )
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=False,
            protocol=mqtt.MQTTv311,
            manual_ack=True,
        )
        if url.user is not None:
            client.username_pw_set(url.user, url.password)
        client.on_connect = self._on_connect
        client.on_subscribe = self._on_subscribe
        client.on_disconnect = lambda *_args: self._connected.clear()
        client.on_message = lambda _client, _data, message: self._inbox.put(message)
        self._client = client
        try:
            client.connect(url.host, url.port, keepalive=30)
        except OSError:
            raise ServiceUnavailable(f"cannot reach the MQTT broker at {describe(url)}") from None
        client.loop_start()
        if not self._connected.wait(_CONNECT_SECONDS):
            self.close()
            raise ServiceUnavailable(f"the MQTT broker at {describe(url)} did not accept us")
        if not self._subscribed.wait(_CONNECT_SECONDS) or self._refused:
            self.close()
            raise ServiceUnavailable(
                f"the MQTT broker at {describe(url)} did not accept the subscription to "
                f"{self._topic!r}: check the topic and the account's access to it"
            )

    def _on_connect(self, client: Any, _data: Any, _flags: Any, code: Any, _props: Any) -> None:
        if not code.is_failure:
            client.subscribe(self._topic, qos=1)  # again on every reconnect
            self._connected.set()

    def _on_subscribe(
        self, _client: Any, _data: Any, _mid: Any, codes: Sequence[Any], _props: Any
    ) -> None:
        self._refused = any(code.is_failure for code in codes)
        self._subscribed.set()

    def receive(self, limit: int, timeout: float) -> list[Message]:
        out: list[Message] = []
        try:
            first = self._inbox.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return out
        for message in (first, *_drain(self._inbox, limit - 1)):
            key = _digest_key(message.topic.encode(), message.payload)
            out.append(Message(key, bytes(message.payload), (message.mid, message.qos)))
        return out

    def ack(self, messages: Sequence[Message]) -> None:
        for message in messages:
            mid, qos = message.token
            self._client.ack(mid, qos)

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def _drain(inbox: queue.Queue[Any], limit: int) -> list[Any]:
    got: list[Any] = []
    while len(got) < limit:
        try:
            got.append(inbox.get_nowait())
        except queue.Empty:
            break
    return got


# ---------------------------------------------------------------------- NATS JetStream
class NatsBroker:
    """A durable pull consumer (``?durable=``, default from the subject) of a JetStream
    stream (``?stream=``), explicit acks; what is not acknowledged within ``?ack_wait=``
    seconds (30) is delivered again."""

    def __init__(self, url: BrokerUrl) -> None:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig

        self._loop = asyncio.new_event_loop()
        durable = url.option(
            "durable", "shamal-" + hashlib.sha256(url.name.encode()).hexdigest()[:16]
        )
        try:
            ack_wait = float(url.option("ack_wait", "30"))
        except ValueError:
            raise InvalidParameter("ack_wait is a number of seconds") from None
        stream = url.options.get("stream") or None
        self.stream = stream_name("nats", stream or url.name)
        try:
            self._nc = self._run(
                nats.connect(
                    servers=[f"nats://{url.host}:{url.port}"],
                    user=url.user,
                    password=url.password,
                    connect_timeout=_CONNECT_SECONDS,
                    max_reconnect_attempts=-1,
                )
            )
            config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait)
            self._sub = self._run(
                self._nc.jetstream().pull_subscribe(
                    url.name, durable=durable, stream=stream, config=config
                )
            )
        except Exception as exc:
            self._loop.close()
            raise ServiceUnavailable(
                f"cannot consume {url.name!r} from NATS at {describe(url)} "
                f"({type(exc).__name__}); check the stream and subject"
            ) from None

    def _run(self, work: Any) -> Any:
        return self._loop.run_until_complete(work)

    def receive(self, limit: int, timeout: float) -> list[Message]:
        from nats.errors import TimeoutError as NatsTimeout

        try:
            got = self._run(self._sub.fetch(max(1, limit), timeout=max(timeout, 0.05)))
        except (TimeoutError, NatsTimeout):
            return []
        return [Message(str(m.metadata.sequence.stream), m.data, m) for m in got]

    def ack(self, messages: Sequence[Message]) -> None:
        for message in messages:
            self._run(message.token.ack())
        self._run(self._nc.flush())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._run(self._nc.close())
        self._loop.close()


# ---------------------------------------------------------------------- RabbitMQ
class RabbitBroker:
    """Manual acks on a queue that exists (``amqp://user:password@host/queue``); the
    prefetch window is the batch size. After a dropped connection the broker requeues what
    was not acknowledged, and the consumer reconnects; an acknowledgement of a delivery from
    the dropped connection is not sent (the delivery comes again, and is skipped)."""

    def __init__(self, url: BrokerUrl, prefetch: int) -> None:
        import pika

        self.stream = stream_name("amqp", url.name)
        self._queue = url.name
        self._prefetch = max(1, min(prefetch, 65_535))
        credentials = pika.PlainCredentials(url.user or "guest", url.password or "guest")
        self._params = pika.ConnectionParameters(
            host=url.host,
            port=url.port,
            virtual_host=url.option("vhost", "/"),
            credentials=credentials,
            heartbeat=30,
            blocked_connection_timeout=30,
            connection_attempts=1,
        )
        self._where = describe(url)
        self._inbox: list[Message] = []
        self._generation = 0
        self._connection: Any = None
        self._channel: Any = None
        self._connect()

    def _connect(self) -> None:
        import pika
        import pika.exceptions

        self._generation += 1
        self._inbox = []
        try:
            self._connection = pika.BlockingConnection(self._params)
            channel = self._connection.channel()
            channel.queue_declare(self._queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker:
            self._connection.close()
            raise InvalidParameter(
                f"the queue {self._queue!r} does not exist at {self._where}; declare it first"
            ) from None
        except pika.exceptions.AMQPError as exc:
            raise ServiceUnavailable(
                f"cannot reach RabbitMQ at {self._where} ({type(exc).__name__})"
            ) from None
        channel.basic_qos(prefetch_count=self._prefetch)
        channel.basic_consume(self._queue, self._on_message, auto_ack=False)
        self._channel = channel

    def _on_message(self, _channel: Any, method: Any, properties: Any, body: bytes) -> None:
        message_id = properties.message_id
        key = fit_key(str(message_id)) if message_id else _digest_key(body)
        self._inbox.append(Message(key, body, (self._generation, method.delivery_tag)))

    def _reconnect(self) -> None:
        with contextlib.suppress(Exception):
            self._connection.close()
        self._connect()

    def receive(self, limit: int, timeout: float) -> list[Message]:
        import pika.exceptions

        if not self._inbox:
            try:
                self._connection.process_data_events(time_limit=max(timeout, 0.0))
            except pika.exceptions.AMQPError:
                self._reconnect()
        out, self._inbox = self._inbox[:limit], self._inbox[limit:]
        return out

    def ack(self, messages: Sequence[Message]) -> None:
        import pika.exceptions

        try:
            for message in messages:
                generation, tag = message.token
                if generation == self._generation:
                    self._channel.basic_ack(tag)
        except pika.exceptions.AMQPError:
            self._reconnect()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._connection.close()


# ---------------------------------------------------------------------- Redis Streams
class RedisBroker:
    """A consumer group (``?group=``, created if missing; ``?consumer=`` names this
    consumer) on a stream key (``?stream=``); each entry's JSON is its ``?field=`` (data).
    On start and after a reconnect, the consumer's pending entries (delivered, never
    acknowledged) are read again first."""

    def __init__(self, url: BrokerUrl) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._key = url.name
        self.stream = stream_name("redis", url.name)
        self._group = url.option("group", "shamal")
        self._consumer = url.option("consumer", "shamal")
        self._field = url.option("field", "data").encode()
        self._backlog: str | None = "0"
        self._client = redis.Redis(
            host=url.host,
            port=url.port,
            password=url.password,
            username=url.user,
            socket_connect_timeout=_CONNECT_SECONDS,
            socket_timeout=60,
            retry=Retry(NoBackoff(), 0),  # a drop must surface: what was read is read again
        )
        self._where = describe(url)
        try:
            self._client.xgroup_create(self._key, self._group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise InvalidParameter(f"cannot use the stream {self._key!r}: {exc}") from None
        except redis.RedisError as exc:
            raise ServiceUnavailable(
                f"cannot reach Redis at {describe(url)} ({type(exc).__name__})"
            ) from None

    def _read(self, start: str, limit: int, block: int | None) -> list[Message]:
        got: Any = self._client.xreadgroup(
            self._group, self._consumer, {self._key: start}, count=limit, block=block
        )
        entries = got[0][1] if got else []
        return [
            Message(entry_id.decode(), (fields or {}).get(self._field, b""), entry_id)
            for entry_id, fields in entries
        ]

    def receive(self, limit: int, timeout: float) -> list[Message]:
        import redis

        try:
            if self._backlog is not None:
                pending = self._read(self._backlog, limit, None)
                if pending:
                    self._backlog = pending[-1].key
                    return pending
                self._backlog = None
            return self._read(">", limit, max(1, int(timeout * 1000)))
        except redis.ConnectionError:
            self._backlog = "0"  # read what was delivered before the drop again
            self._reconnect()
            return []

    def _reconnect(self) -> None:
        import redis

        try:
            self._client.ping()
        except redis.RedisError:
            raise ServiceUnavailable(
                f"lost Redis at {self._where}; start the consumer again once it is back "
                "(nothing unacknowledged is lost)"
            ) from None

    def ack(self, messages: Sequence[Message]) -> None:
        import redis

        if messages:
            try:
                self._client.xack(self._key, self._group, *[m.token for m in messages])
            except redis.ConnectionError:
                self._backlog = "0"  # they come again from the pending list, and are skipped

    def close(self) -> None:
        self._client.close()


def open_broker(url: str, *, batch: int = 1000) -> Broker:
    """Connect to the broker ``url`` names, ready to receive.

    Raises:
        InvalidParameter: a malformed URL, a queue that does not exist.
        ServiceUnavailable: the broker cannot be reached.
    """
    parsed = parse_url(url)
    try:
        if parsed.scheme == "mqtt":
            return MqttBroker(parsed)
        if parsed.scheme == "nats":
            return NatsBroker(parsed)
        if parsed.scheme == "amqp":
            return RabbitBroker(parsed, batch)
        return RedisBroker(parsed)
    except ModuleNotFoundError as exc:
        raise NotImplementedFeature(
            f"consuming {parsed.scheme} needs {exc.name}, which this install lacks: "
            "pip install 'shamal[streams]'"
        ) from None
