"""Rules of the event stream: who reads which events, consumers, webhooks and their delivery.

Access:

- Events: a caller reads the events of every team they belong to (any role); events of no
  team (the platform's) and every team's events are for platform admins only.
- Webhooks: a team's webhooks are managed and read by the team's maintainers and admins
  (their URLs often carry a token of the receiving service); a platform webhook (made by an
  admin acting for no team) is offered every event and is the admins' alone. Other
  callers get 404. Creating, deleting and (de)activating a webhook is audited.

Delivery is at least once: each event is POSTed to each webhook whose filter it passes,
in id order per webhook, with a delivery id stable across attempts (receivers dedupe on it);
failures are retried with exponential backoff up to ``max_attempts``, then the delivery is
dead and the webhook moves on. Consumers are at least once too: a batch is offered again
until its handler returns.
"""

from __future__ import annotations

import logging
import re
import secrets
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from sqlalchemy.orm import Session

from shamal.clock import Clock, utc_now
from shamal.db import Database
from shamal.errors import InvalidParameter
from shamal.events import _store
from shamal.events._delivery import (
    MLFLOW_FORMAT,
    SHAMAL_FORMAT,
    Courier,
    RetryPolicy,
    body_of,
    clean_error,
)
from shamal.events._entities import (
    Delivery,
    Event,
    EventKind,
    EventPage,
    SendResult,
    Webhook,
    WebhookSender,
)
from shamal.events._filters import EventFilter
from shamal.events._sealing import SecretBox
from shamal.events._targets import check_webhook_url
from shamal.security import (
    AuditContext,
    AuditLog,
    Principal,
    PseudonymKeys,
    Role,
    SecurityService,
    check_name,
)

logger = logging.getLogger(__name__)

MAX_LIST = 1000
MAX_BATCH = 1000
#: A page of ``list_events`` looks at no more than this many events for its filter.
MAX_SCAN = 10_000
MAX_URL = 2048
MIN_SECRET, MAX_SECRET = 16, 256
MAX_DESCRIPTION = 5000
CONSUMER_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
_CONSUMER = re.compile(CONSUMER_PATTERN)
_WEBHOOK_ID = re.compile(r"^[0-9a-f]{32}$")
_SECRET = re.compile(r"^[\x21-\x7e]+$")

Handler = Callable[[Sequence[Event]], None]


def _target(hook: Webhook) -> str:
    return f"webhook:{hook.team or '-'}/{hook.name}"


def _check_secret(secret: str) -> str:
    if not isinstance(secret, str) or not MIN_SECRET <= len(secret) <= MAX_SECRET:
        raise InvalidParameter(f"a webhook secret is {MIN_SECRET} to {MAX_SECRET} characters")
    if not _SECRET.match(secret):
        raise InvalidParameter("a webhook secret is printable ASCII without spaces")
    return secret


def _check_description(text: str | None) -> str | None:
    if text is not None and (not isinstance(text, str) or len(text) > MAX_DESCRIPTION):
        raise InvalidParameter(f"a webhook description is at most {MAX_DESCRIPTION} characters")
    return text


@dataclass(frozen=True, slots=True)
class WebhookShape:
    """What a webhook is besides its name, URL and filter: the format of its bodies
    (``"shamal"`` or ``"mlflow"``), a description, the MLflow events it was made for
    (``"entity.action"``) and whether it starts active."""

    format: str = SHAMAL_FORMAT
    description: str | None = None
    mlflow_events: tuple[str, ...] = ()
    active: bool = True

    def __post_init__(self) -> None:
        if self.format not in (SHAMAL_FORMAT, MLFLOW_FORMAT):
            raise InvalidParameter("a webhook's format is 'shamal' or 'mlflow'")


@dataclass(frozen=True, slots=True)
class WebhookChange:
    """The fields :meth:`EventService.update_webhook` changes; None keeps one as it is."""

    name: str | None = None
    url: str | None = None
    filter: str | None = None
    description: str | None = None
    mlflow_events: tuple[str, ...] | None = None
    secret: str | None = None


def _check_limit(limit: int, most: int = MAX_LIST) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= most:
        raise InvalidParameter(f"limit must be 1 to {most}")
    return limit


class EventService:
    """Read the stream, run consumers, manage webhooks and deliver to them.

    Thread-safe; one instance per process, several processes may share a database.
    Changes take the request's AuditContext; reads a Principal. Methods raise
    ``NotFound`` for a webhook that does not exist or is not visible, ``PermissionDenied``
    for a role too low and ``InvalidParameter`` for malformed input.

    Args:
        keys: the platform's key ring, to seal webhook secrets at rest (None: unsealed).
        lease_s: how long a consumer's or a webhook's lease lasts; a handler or a delivery
            round running longer may see its batch offered to another process too.
        retry: backoff and attempts of failed deliveries.
    """

    def __init__(
        self,
        db: Database,
        audit: AuditLog,
        security: SecurityService,
        *,
        clock: Clock = utc_now,
        keys: PseudonymKeys | None = None,
        lease_s: float = 60.0,
        retry: RetryPolicy | None = None,
        allow_private: bool = False,
    ) -> None:
        """``allow_private``: the operator lets every webhook reach private, loopback and
        link-local addresses (``SHAMAL_EVENTS__ALLOW_PRIVATE_WEBHOOKS``)."""
        self._db = db
        self._audit = audit
        self._security = security
        self._clock = clock
        self._box = SecretBox(keys)
        self._lease = timedelta(seconds=lease_s)
        self._retry = retry or RetryPolicy()
        self._allow_private = allow_private

    # ------------------------------------------------------------------ reading
    @staticmethod
    def _visibility(principal: Principal) -> _store.Visibility:
        if principal.user.is_admin:
            return _store.EVERYTHING
        return _store.Visibility(frozenset(principal.roles), platform=False)

    def list_events(
        self,
        principal: Principal,
        *,
        after: int = 0,
        kinds: Iterable[str] = (),
        where: str | None = None,
        limit: int = 100,
    ) -> EventPage:
        """Events after ``after`` the caller may see, ascending, of ``kinds`` (all when
        empty), passing the filter ``where`` (the filter language's condition, without the
        kinds: ``"name = 'churn'"``).

        At most ``limit`` events come back; a page looks at no more than 10,000 events, so
        with a filter that passes few it may be short or empty: read on from
        ``next_after``.

        Raises:
            InvalidParameter: an unknown kind, a malformed filter, a bad limit or position.
        """
        _check_limit(limit)
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise InvalidParameter("after is an event id (0 or more)")
        wanted = frozenset(_kind(k) for k in kinds)
        test = EventFilter.parse("* where " + where) if where else None
        visible = self._visibility(principal)
        found: list[Event] = []
        position = after
        with self._db.unit_of_work(write=False) as s:
            while len(found) < limit and position - after < MAX_SCAN:
                chunk = _store.events_after(
                    s, position, limit=min(1000, MAX_SCAN), kinds=wanted, visible=visible
                )
                for event in chunk:
                    position = event.id
                    if test is None or test.matches(event):
                        found.append(event)
                        if len(found) == limit:
                            break
                if len(chunk) < min(1000, MAX_SCAN) or test is None:
                    break
        return EventPage(tuple(found), position)

    # ---------------------------------------------------------------- consumers
    def consume(
        self,
        name: str,
        handler: Handler,
        *,
        filter: EventFilter | None = None,  # noqa: A002 - the word of the domain
        batch: int = 100,
    ) -> int:
        """Hand the consumer ``name`` its next batch: the events after its stored position
        (at most ``batch``) that pass ``filter``, in id order; then move its position past
        them. A new consumer starts at the beginning of the stream.

        At least once: the position moves only after ``handler`` returns, so a handler that
        raises (or a process that dies) gets the same batch again; make handlers
        idempotent (the event id is the key). While one call holds the consumer's lease
        (on any process), other calls return 0 at once: no batch is ever handed to two
        handlers at the same time, unless a handler outruns the lease (``lease_s``).

        Returns:
            How many events the handler was given (0: nothing new, or leased elsewhere).

        Raises:
            InvalidParameter: a malformed name or batch size.
            Whatever ``handler`` raises (the position stays).
        """
        if not isinstance(name, str) or not _CONSUMER.match(name):
            raise InvalidParameter(
                "a consumer name is 1-64 lowercase letters, digits, '.', '_' or '-'"
            )
        _check_limit(batch, MAX_BATCH)
        owner = uuid.uuid4().hex
        wanted = filter or EventFilter.everything()

        def claim(s: Session) -> tuple[int, list[Event]] | None:
            now = self._clock()
            _store.ensure_consumer(s, name, now)
            position = _store.claim_consumer(s, name, owner, now, now + self._lease)
            if position is None:
                return None
            return position, _store.events_after(
                s, position, limit=batch, kinds=wanted.kind_set or ()
            )

        claimed = self._db.run(claim, retry_unique=True)
        if claimed is None:
            return 0
        position, events = claimed
        chosen = [e for e in events if wanted.matches(e)]
        try:
            if chosen:
                handler(chosen)
        except BaseException:
            self._release(name, owner, None)
            raise
        end = events[-1].id if events else position
        if not self._release(name, owner, end):
            logger.warning("consumer %s outran its lease; its batch may be handled twice", name)
        return len(chosen)

    def _release(self, name: str, owner: str, position: int | None) -> bool:
        return self._db.run(
            lambda s: _store.release_consumer(s, name, owner, self._clock(), position)
        )

    def consumer_position(self, name: str) -> int | None:
        """The id of the last event the consumer has handled (None: no such consumer)."""
        with self._db.unit_of_work(write=False) as s:
            return _store.consumer_position(s, name)

    # ----------------------------------------------------------------- webhooks
    def create_webhook(
        self,
        ctx: AuditContext,
        name: str,
        url: str,
        events_filter: str,
        *,
        team: str | None = None,
        secret: str | None = None,
        allow_private: bool = False,
        shape: WebhookShape | None = None,
    ) -> tuple[Webhook, str]:
        """Make a webhook: events after the newest one now that pass ``events_filter`` will
        be POSTed to ``url``, signed with ``secret`` (made when None).

        Args:
            team: the owning team (default: the caller's only team; an admin in no team
                makes a platform webhook). Needs the maintainer role in it.
            allow_private: the URL may name a private or loopback address (admins only).
            shape: the body's format, a description, MLflow's events and whether it starts
                active (default: Shamal's format, active). An MLflow-format webhook made
                without a secret sends unsigned requests, as MLflow does.

        Returns:
            The webhook and its secret: the only time the secret is shown.

        Raises:
            InvalidParameter: a malformed name, URL, filter or secret.
            PermissionDenied: below maintainer, or ``allow_private`` without admin.
            AlreadyExists: the team has a webhook of this name.
        """
        principal = ctx.require_principal()
        check_name("webhook", name)
        team_name, team_id = self._security.owning_team(principal, team, "owns this webhook")
        if team_name:
            principal.require_team_role(team_name, Role.MAINTAINER)
        if allow_private:
            principal.require_admin()
        url = check_webhook_url(url, allow_private=allow_private or self._allow_private)
        parsed = EventFilter.parse(events_filter)
        shape = shape or WebhookShape()
        if secret is not None:
            secret = _check_secret(secret)
        else:
            secret = "" if shape.format == MLFLOW_FORMAT else secrets.token_urlsafe(32)
        now = self._clock()
        draft = Webhook(
            id=uuid.uuid4().hex,
            name=name,
            team=team_name or None,
            url=url,
            filter=str(parsed),
            active=shape.active,
            allow_private=allow_private,
            position=0,
            created_by=principal.name,
            created_at=now,
            updated_at=now,
            format=shape.format,
            description=_check_description(shape.description),
            mlflow_events=shape.mlflow_events,
        )
        sealed = self._box.seal(draft.id, secret)

        def work(s: Session) -> Webhook:
            hook = replace(draft, position=_store.last_event_id(s))
            _store.insert_webhook(s, hook, team_id, sealed)
            self._audit.record(s, ctx, _target(hook), url=_origin(url), filter=hook.filter)
            return hook

        return self._db.run(work), secret

    def _find(self, principal: Principal, webhook_id: str) -> _store.WebhookRecord:
        if not isinstance(webhook_id, str) or not _WEBHOOK_ID.match(webhook_id):
            raise _store.not_found(str(webhook_id))
        with self._db.unit_of_work(write=False) as s:
            found = _store.find_webhook(s, webhook_id)
        return _access(principal, found, webhook_id)

    def get_webhook(self, principal: Principal, webhook_id: str) -> Webhook:
        """The webhook (maintainers of its team, admins)."""
        return self._find(principal, webhook_id).webhook

    def list_webhooks(
        self,
        principal: Principal,
        *,
        limit: int = MAX_LIST,
        format: str | None = None,  # noqa: A002 - the column's name
        offset: int = 0,
    ) -> list[Webhook]:
        """The webhooks of the teams the caller maintains (admins: every webhook), by team
        and name: those of ``format`` (None: any), after skipping ``offset``."""
        _check_limit(limit)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidParameter("offset is 0 or more")
        team_ids = None
        if not principal.user.is_admin:
            team_ids = frozenset(
                principal.team_ids[team]
                for team, role in principal.roles.items()
                if role >= Role.MAINTAINER and team in principal.team_ids
            )
        with self._db.unit_of_work(write=False) as s:
            return _store.list_webhooks(s, team_ids, limit, fmt=format, offset=offset)

    def delete_webhook(self, ctx: AuditContext, webhook_id: str) -> None:
        """Delete the webhook and its delivery log."""
        hook = self._find(ctx.require_principal(), webhook_id).webhook

        def work(s: Session) -> None:
            _store.remove_webhook(s, hook.id)
            self._audit.record(s, ctx, _target(hook))

        self._db.run(work)

    def set_webhook_active(self, ctx: AuditContext, webhook_id: str, active: bool) -> Webhook:
        """Pause or resume the webhook. A resumed webhook goes on from its position: the
        events of the pause that pass its filter are delivered then."""
        hook = self._find(ctx.require_principal(), webhook_id).webhook

        def work(s: Session) -> Webhook:
            now = self._clock()
            _store.set_active(s, hook.id, active, now)
            self._audit.record(s, ctx, _target(hook), active=active)
            found = _store.find_webhook(s, hook.id)
            if found is None:
                raise _store.not_found(hook.id)
            return found.webhook

        return self._db.run(work)

    def update_webhook(self, ctx: AuditContext, webhook_id: str, change: WebhookChange) -> Webhook:
        """Change the webhook's name, URL, filter, description, MLflow events or secret
        (the fields of ``change`` that are not None); pausing is :meth:`set_webhook_active`.
        A new filter applies to the events after the webhook's position.

        Raises:
            InvalidParameter: a malformed field, as in :meth:`create_webhook`.
            AlreadyExists: the team has another webhook of the new name.
        """
        hook = self._find(ctx.require_principal(), webhook_id).webhook
        values: dict[str, object] = {}
        if change.name is not None:
            values["name"] = check_name("webhook", change.name)
        if change.url is not None:
            allowed = hook.allow_private or self._allow_private
            values["url"] = check_webhook_url(change.url, allow_private=allowed)
        if change.filter is not None:
            values["filter"] = str(EventFilter.parse(change.filter))
        if change.description is not None:
            values["description"] = _check_description(change.description)
        if change.mlflow_events is not None:
            values["mlflow_events"] = tuple(change.mlflow_events)
        sealed = None
        if change.secret is not None:
            sealed = self._box.seal(hook.id, _check_secret(change.secret))

        def work(s: Session) -> Webhook:
            _store.update_webhook(s, hook.id, {**values, "updated_at": self._clock()}, sealed)
            shown = {k: v for k, v in values.items() if k in ("name", "filter")}
            if "url" in values:
                shown["url"] = _origin(str(values["url"]))
            self._audit.record(s, ctx, _target(hook), secret=sealed is not None, **shown)
            found = _store.find_webhook(s, hook.id)
            if found is None:
                raise _store.not_found(hook.id)
            return found.webhook

        return self._db.run(work)

    def test_webhook(
        self,
        ctx: AuditContext,
        webhook_id: str,
        sender: WebhookSender,
        event: Event,
        *,
        private_sender: WebhookSender | None = None,
    ) -> SendResult:
        """Send ``event`` (made up for the test: it is not in the stream) to the webhook
        now, in the webhook's format and signed with its secret, paused or not; the test is
        audited, not logged as a delivery, and the webhook's position stays.

        Raises:
            InvalidParameter: the event has no form in the webhook's format.
        """
        record = self._find(ctx.require_principal(), webhook_id)
        hook = record.webhook
        body = body_of(hook, event)
        if body is None:
            raise InvalidParameter(f"a {event.kind.value} event has no form in this webhook")
        secret = self._box.open(hook.id, record.sealed_secret)
        carrier = (private_sender or sender) if hook.allow_private else sender
        ident = f"{hook.id}-test-{uuid.uuid4().hex}"
        try:
            result = carrier.send(hook.url, secret, body, ident)
        except Exception as exc:  # a sender must not raise; one that does failed the test
            logger.exception("webhook sender raised")
            result = SendResult(False, None, f"the sender failed ({type(exc).__name__})")
        result = replace(result, error=clean_error(result.error, hook.url, secret))
        self._db.run(
            lambda s: self._audit.record(
                s, ctx, _target(hook), event=event.kind.value, ok=result.ok, status=result.status
            )
        )
        return result

    def deliveries(
        self, principal: Principal, webhook_id: str, *, limit: int = 100
    ) -> list[Delivery]:
        """The webhook's delivery log, newest attempt first."""
        _check_limit(limit)
        hook = self._find(principal, webhook_id).webhook
        with self._db.unit_of_work(write=False) as s:
            return _store.deliveries(s, hook.id, limit)

    # ----------------------------------------------------------------- delivery
    def deliver_webhooks(
        self,
        sender: WebhookSender,
        *,
        private_sender: WebhookSender | None = None,
        now: datetime | None = None,
        max_events: int = 100,
    ) -> int:
        """One round of delivery: each active webhook (that no other process is working)
        is offered the events after its position, in order, at most ``max_events``
        attempts each. A failure waits out its backoff before the webhook goes on.

        Args:
            sender: carries each delivery (the platform's signs and POSTs it).
            private_sender: carries the deliveries of webhooks an admin allowed to reach
                private addresses (default: ``sender``).
            now: the time of this round (default: the service's clock).

        Returns:
            How many delivery attempts were made.
        """
        _check_limit(max_events)
        courier = Courier(
            self._db, self._box, sender, self._retry, self._lease, self._clock, private_sender
        )
        at = now or self._clock()
        with self._db.unit_of_work(write=False) as s:
            ids = _store.active_webhook_ids(s)
        return sum(courier.deliver(webhook_id, at, max_events) for webhook_id in ids)


def _kind(text: str) -> EventKind:
    try:
        return EventKind(text)
    except ValueError:
        raise InvalidParameter(f"unknown event kind {text[:64]!r}") from None


def _origin(url: str) -> str:
    """What the audit log says of a URL: its scheme and host (a path or query string may
    carry the receiver's token)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}"


def _access(
    principal: Principal, found: _store.WebhookRecord | None, webhook_id: str
) -> _store.WebhookRecord:
    if found is None:
        raise _store.not_found(webhook_id)
    if principal.user.is_admin:
        return found
    if found.team_id is None:
        raise _store.not_found(webhook_id)
    principal.require_owner_role(found.team_id, Role.MAINTAINER, "this webhook")
    return found
