"""What carries events out of the platform, run from the scheduler loop: signed webhooks
and, when the operator names one, a message broker (NATS JetStream or RabbitMQ) for the
company's other systems.

The broker is an ordinary consumer of the stream (``events.broker``): a batch is published
before the consumer's position moves, so a broker that is down gets the same events again
once it is back (at least once; each message carries the event id for deduplication).
"""

from __future__ import annotations

import logging

from shamal.config import EventSettings
from shamal.errors import ShamalError
from shamal.events._brokers import EventPublisher, open_publisher
from shamal.events._entities import Event, SendResult
from shamal.events._sender import WebhookSender
from shamal.events._service import EventService
from shamal.security import AuditContext

logger = logging.getLogger(__name__)

#: The stream's consumer that publishes to the broker.
BROKER_CONSUMER = "events.broker"


class EventOutlets:
    """The platform's webhook senders and broker publisher, and one round of each."""

    def __init__(self, events: EventService, settings: EventSettings) -> None:
        self._events = events
        self._sender = WebhookSender(
            allow_private=settings.allow_private_webhooks, timeout_s=settings.webhook_timeout_s
        )
        self._private = WebhookSender(allow_private=True, timeout_s=settings.webhook_timeout_s)
        self._settings = settings
        self._publisher: EventPublisher | None = None

    def _open_publisher(self) -> EventPublisher | None:
        """The broker's publisher, opened on first use (a broker that is down when the
        server starts must not keep it from starting: the next round tries again)."""
        settings = self._settings
        if self._publisher is None and settings.broker is not None and settings.broker_url:
            options = (
                {"stream": settings.broker_stream, "subject_prefix": settings.broker_subject_prefix}
                if settings.broker == "nats"
                else {"exchange": settings.broker_exchange}
            )
            self._publisher = open_publisher(settings.broker, settings.broker_url, **options)
        return self._publisher

    def deliver(self) -> int:
        """One round of webhook deliveries; how many attempts were made."""
        return self._events.deliver_webhooks(self._sender, private_sender=self._private)

    def test_webhook(self, ctx: AuditContext, webhook_id: str, event: Event) -> SendResult:
        """Send ``event`` (made up for a test) to the webhook once, through the platform's
        senders; see :meth:`EventService.test_webhook`."""
        return self._events.test_webhook(
            ctx, webhook_id, self._sender, event, private_sender=self._private
        )

    def publish(self) -> int:
        """Publish the events since the last round to the broker; how many (0: no broker,
        or the broker is down: the same events go next round)."""
        try:
            publisher = self._open_publisher()
            if publisher is None:
                return 0
            return self._events.consume(BROKER_CONSUMER, publisher.publish)
        except ShamalError as exc:
            logger.warning("events not published to the broker (retried next round): %s", exc)
            return 0

    def run_once(self) -> int:
        return self.deliver() + self.publish()

    def close(self) -> None:
        self._sender.close()
        self._private.close()
        if self._publisher is not None:
            self._publisher.close()
