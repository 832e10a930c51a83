"""Delivering events to one webhook: in order, each attempt logged, failures retried with
exponential backoff until they are dead.

One process works a webhook at a time (its lease, taken by compare-and-set and renewed with
every attempt it records). An attempt is recorded after the sender returns: a process that
dies in between sends that attempt again later, under the same delivery id, which is what
receivers dedupe on (at least once).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from shamal.clock import Clock
from shamal.db import Database
from shamal.errors import AlreadyExists
from shamal.events import _store
from shamal.events._entities import Delivery, Event, SendResult, Webhook, WebhookSender, delivery_id
from shamal.events._filters import EventFilter
from shamal.events._mlflow import mlflow_body
from shamal.events._sealing import SecretBox

logger = logging.getLogger(__name__)

MAX_ERROR = 200
_READ = 100


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempt ``n`` of a failed delivery waits ``base_s * 2**(n-1)`` seconds (at most
    ``cap_s``) after the one before; after ``max_attempts`` failures it is dead."""

    base_s: float = 10.0
    cap_s: float = 3600.0
    max_attempts: int = 8

    def __post_init__(self) -> None:
        if not (0 < self.base_s <= self.cap_s) or self.max_attempts < 1:
            raise ValueError("a retry policy needs 0 < base_s <= cap_s and max_attempts >= 1")

    def delay(self, attempt: int) -> timedelta:
        """How long after failed attempt ``attempt`` the next one is due."""
        return timedelta(seconds=min(self.cap_s, self.base_s * 2 ** min(attempt - 1, 62)))


class _LeaseLost(Exception):
    """Another process took the webhook's lease: this round stops."""


SHAMAL_FORMAT = "shamal"
MLFLOW_FORMAT = "mlflow"


def body_of(hook: Webhook, event: Event) -> bytes | None:
    """What is POSTed to ``hook`` for ``event``: in Shamal's format the event's JSON,
    compact, keys sorted; in MLflow's its MLflow 3 payload, or None when MLflow has no
    such event (the webhook's filter keeps those away; one that slips by is skipped)."""
    if hook.format == MLFLOW_FORMAT:
        return mlflow_body(event)
    return json.dumps(event.to_json(), separators=(",", ":"), sort_keys=True).encode()


def clean_error(error: str, url: str, secret: str) -> str:
    """A sender's error as the log keeps it: short, one line, without the secret or URL."""
    text = error.replace(secret, "[secret]").replace(url, "[url]") if secret else error
    text = "".join(c if c.isprintable() else " " for c in text)
    return text[:MAX_ERROR]


def _send(sender: WebhookSender, url: str, secret: str, body: bytes, ident: str) -> SendResult:
    try:
        return sender.send(url, secret, body, ident)
    except Exception as exc:  # a sender must not raise; one that does fails this attempt
        logger.exception("webhook sender raised")
        return SendResult(False, None, f"the sender failed ({type(exc).__name__})")


class Courier:
    """One round of deliveries for one webhook at a time (see :meth:`deliver`)."""

    def __init__(
        self,
        db: Database,
        box: SecretBox,
        sender: WebhookSender,
        retry: RetryPolicy,
        lease: timedelta,
        clock: Clock,
        private_sender: WebhookSender | None = None,
    ) -> None:
        self._db = db
        self._box = box
        self._sender = sender
        #: What carries a webhook an admin allowed to reach private addresses.
        self._private_sender = private_sender or sender
        self._retry = retry
        self._lease = lease
        self._clock = clock

    def deliver(self, webhook_id: str, now: datetime, budget: int) -> int:
        """Offer the webhook its next events at time ``now``, at most ``budget`` attempts;
        returns the attempts made (0 when another process holds the webhook)."""
        owner = uuid.uuid4().hex

        def claim(s: Session) -> _store.WebhookRecord | None:
            leased = self._clock()
            if not _store.claim_webhook(s, webhook_id, owner, leased, leased + self._lease):
                return None
            return _store.find_webhook(s, webhook_id)

        record = self._db.run(claim)
        if record is None:
            return 0
        hook = record.webhook
        position, made = hook.position, 0
        try:
            secret = self._box.open(hook.id, record.sealed_secret)
            position, made = self._round(hook, secret, owner, now, budget)
        except (_LeaseLost, AlreadyExists):
            logger.warning("webhook %s was taken over by another process", hook.id)
            return made
        finally:
            self._db.run(lambda s: _store.advance_webhook(s, hook.id, owner, position, None))
        return made

    def _round(
        self, hook: Webhook, secret: str, owner: str, now: datetime, budget: int
    ) -> tuple[int, int]:
        wanted = EventFilter.parse(hook.filter)
        teams = None if hook.team is None else frozenset({hook.team})
        visible = _store.Visibility(teams, platform=hook.team is None)
        position, made = hook.position, 0
        while made < budget:
            with self._db.unit_of_work(write=False) as s:
                events = _store.events_after(
                    s, position, limit=_READ, kinds=wanted.kind_set or (), visible=visible
                )
            for event in events:
                if not wanted.matches(event) or body_of(hook, event) is None:
                    position = event.id
                    continue
                if made >= budget:
                    return position, made
                attempted, resolved = self._offer(hook, secret, owner, event, now, position)
                made += attempted
                if not resolved:
                    return position, made
                position = event.id
            if len(events) < _READ:
                break
        return position, made

    def _offer(
        self, hook: Webhook, secret: str, owner: str, event: Event, now: datetime, position: int
    ) -> tuple[int, bool]:
        """Try ``event`` once unless its backoff is still running: (attempts made, whether
        the webhook is done with it)."""
        with self._db.unit_of_work(write=False) as s:
            last = _store.last_attempt(s, hook.id, event.id)
        if last is not None and (last.ok or last.dead):
            return 0, True  # recorded before a crash kept the position from moving
        if last is not None and last.next_attempt_at is not None and last.next_attempt_at > now:
            return 0, False
        attempt = 1 if last is None else last.attempt + 1
        ident = delivery_id(hook.id, event.id)
        sender = self._private_sender if hook.allow_private else self._sender
        body = body_of(hook, event)
        assert body is not None  # _round passes over events without a body
        result = _send(sender, hook.url, secret, body, ident)
        record = self._logged(hook, secret, event.id, attempt, result, now)
        resolved = record.ok or record.dead
        if record.dead:
            logger.warning(
                "webhook %s gave up on event %d after %d attempts", hook.id, event.id, attempt
            )

        def work(s: Session) -> None:
            renewed = self._clock() + self._lease
            if not _store.advance_webhook(
                s, hook.id, owner, event.id if resolved else position, renewed
            ):
                raise _LeaseLost
            _store.add_delivery(s, record)

        self._db.run(work)
        return 1, resolved

    def _logged(
        self,
        hook: Webhook,
        secret: str,
        event_id: int,
        attempt: int,
        result: SendResult,
        now: datetime,
    ) -> Delivery:
        """The delivery log's row of one attempt: dead when it failed and was the last."""
        dead = not result.ok and attempt >= self._retry.max_attempts
        return Delivery(
            id=0,
            webhook_id=hook.id,
            event_id=event_id,
            attempt=attempt,
            status_code=result.status,
            ok=result.ok,
            dead=dead,
            error="" if result.ok else clean_error(result.error or "failed", hook.url, secret),
            next_attempt_at=None if result.ok or dead else now + self._retry.delay(attempt),
            delivered_at=now if result.ok else None,
            created_at=now,
        )
