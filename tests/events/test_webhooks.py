"""Webhooks: who manages them, and delivery to a real HTTP receiver (in order, retried with
backoff, then dead), through a small real sender (httpx) written here."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from sqlalchemy import select

from shamal.db.models import WebhookRow
from shamal.errors import AlreadyExists, InvalidParameter, NotFound, PermissionDenied
from shamal.events import EventKind, EventService, SendResult, delivery_id
from shamal.server import Platform
from tests.events.conftest import ManualClock, People, record


# ------------------------------------------------------------------ a real receiver
@dataclass
class Received:
    path: str
    delivery: str
    signature: str
    body: bytes


@dataclass
class Receiver:
    """An HTTP server in a thread: records each POST, answers the next status queued
    (200 when none is)."""

    url: str
    got: list[Received] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            length = int(self.headers.get("content-length", "0"))
            body = self.rfile.read(length)
            state.got.append(
                Received(
                    self.path,
                    self.headers.get("x-shamal-delivery", ""),
                    self.headers.get("x-shamal-signature", ""),
                    body,
                )
            )
            status = state.answers.pop(0) if state.answers else 200
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            del format, args

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook?token=receiver-token"
    yield state
    server.shutdown()
    server.server_close()
    thread.join()


class HttpxSender:
    """A real sender: POSTs the body, signed with HMAC-SHA256 of the secret."""

    def __init__(self) -> None:
        self.client = httpx.Client(timeout=5.0, follow_redirects=False)

    def send(self, url: str, secret: str, body: bytes, delivery_id: str) -> SendResult:
        signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        headers = {
            "content-type": "application/json",
            "x-shamal-delivery": delivery_id,
            "x-shamal-signature": f"sha256={signature}",
        }
        try:
            answer = self.client.post(url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return SendResult(False, None, f"{type(exc).__name__} posting to {url}: {secret}")
        if answer.is_success:
            return SendResult(True, answer.status_code)
        return SendResult(False, answer.status_code, f"HTTP {answer.status_code}")


@pytest.fixture
def sender() -> Iterator[HttpxSender]:
    made = HttpxSender()
    yield made
    made.client.close()


def _signed(secret: str, got: Received) -> bool:
    wanted = hmac.new(secret.encode(), got.body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(got.signature, f"sha256={wanted}")


# ------------------------------------------------------------------------- managing
def test_a_team_webhook_gets_its_teams_matching_events_signed(
    platform: Platform,
    events: EventService,
    people: People,
    receiver: Receiver,
    sender: HttpxSender,
) -> None:
    record(platform, state="failed")  # before the webhook: never offered
    hook, secret = events.create_webhook(
        people.ctx("rita"), "failures", receiver.url, "job_finished where state = 'failed'"
    )
    assert hook.team == "red"
    assert "secret" not in hook.to_json()
    assert len(secret) >= 32
    record(platform, state="succeeded")
    wanted = record(platform, state="failed", job_id="j1")
    record(platform, team="blue", state="failed")
    record(platform, team=None, state="failed")
    assert events.deliver_webhooks(sender) == 1
    (got,) = receiver.got
    assert _signed(secret, got)
    assert got.delivery == delivery_id(hook.id, wanted)
    body = json.loads(got.body)
    assert (body["id"], body["payload"]["job_id"], body["team"]) == (wanted, "j1", "red")
    (attempt,) = events.deliveries(people.principals["rita"], hook.id)
    assert (attempt.ok, attempt.attempt, attempt.status_code) == (True, 1, 200)
    assert events.get_webhook(people.principals["rita"], hook.id).position == wanted
    assert events.deliver_webhooks(sender) == 0  # nothing new


def test_the_secret_is_sealed_at_rest(
    platform: Platform, events: EventService, people: People, receiver: Receiver
) -> None:
    given = "a-secret-of-the-receiver-0123456789"
    hook, secret = events.create_webhook(people.ctx("rita"), "h", receiver.url, "*", secret=given)
    assert secret == given
    with platform.db.unit_of_work(write=False) as s:
        sealed = s.scalars(select(WebhookRow.sealed_secret).where(WebhookRow.id == hook.id)).one()
    assert given not in sealed
    assert sealed.startswith("v1:")


def test_a_platform_webhook_gets_every_event(
    platform: Platform,
    events: EventService,
    people: People,
    receiver: Receiver,
    sender: HttpxSender,
) -> None:
    hook, _ = events.create_webhook(people.ctx("admin"), "all", receiver.url, "*")
    assert hook.team is None
    made = [record(platform, team=t) for t in ("red", "blue", None)]
    assert events.deliver_webhooks(sender) == 3
    assert [json.loads(g.body)["id"] for g in receiver.got] == made


def test_who_manages_webhooks(events: EventService, people: People, receiver: Receiver) -> None:
    with pytest.raises(PermissionDenied):
        events.create_webhook(people.ctx("mo"), "h", receiver.url, "*")
    with pytest.raises(NotFound):
        events.create_webhook(people.ctx("bo"), "h", receiver.url, "*", team="red")
    with pytest.raises(PermissionDenied):
        events.create_webhook(people.ctx("rita"), "h", receiver.url, "*", allow_private=True)
    hook, _ = events.create_webhook(people.ctx("rita"), "h", receiver.url, "*")
    with pytest.raises(AlreadyExists):
        events.create_webhook(people.ctx("rita"), "h", receiver.url, "*")
    for who in ("mo", "vi", "bo", "otto"):
        with pytest.raises((NotFound, PermissionDenied)):
            events.get_webhook(people.principals[who], hook.id)
        with pytest.raises((NotFound, PermissionDenied)):
            events.delete_webhook(people.ctx(who), hook.id)
        assert events.list_webhooks(people.principals[who]) == []
    assert [h.id for h in events.list_webhooks(people.principals["rita"])] == [hook.id]
    assert [h.id for h in events.list_webhooks(people.principals["admin"])] == [hook.id]
    paused = events.set_webhook_active(people.ctx("rita"), hook.id, False)
    assert not paused.active
    events.delete_webhook(people.ctx("rita"), hook.id)
    with pytest.raises(NotFound):
        events.get_webhook(people.principals["admin"], hook.id)
    with pytest.raises(NotFound):
        events.get_webhook(people.principals["admin"], "../../etc/passwd")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("file:///etc/passwd", "http:// or https://"),
        ("gopher://127.0.0.1:6379/_SET", "http:// or https://"),
        ("http://", "needs a host"),
        ("http://user:pw@example.com/", "may not carry a user or password"),
        ("http://example.com/a b", "without spaces"),
        ("http://example.com/\r\nX-Injected: 1", "without spaces"),
        ("http://example.com:99999/", "does not parse"),
        ("http://example.com/#x", "may not contain"),
        ("http://example.com/" + "a" * 3000, "at most 2048 characters"),
    ],
)
def test_bad_urls_are_refused_and_nothing_is_made(
    events: EventService, people: People, url: str, message: str
) -> None:
    with pytest.raises(InvalidParameter, match=message.replace("(", r"\(").replace(")", r"\)")):
        events.create_webhook(people.ctx("rita"), "h", url, "*")
    assert events.list_webhooks(people.principals["admin"]) == []


@pytest.mark.parametrize(
    ("filter_text", "secret", "message"),
    [
        ("nope where x = 1", None, "unknown event kind"),
        ("* where x = '; DROP TABLE webhooks; --", None, "never ends"),
        ("*", "short", "16 to 256"),
        ("*", "a secret with spaces in it", "printable ASCII"),
    ],
)
def test_bad_filters_and_secrets_are_refused(
    events: EventService,
    people: People,
    receiver: Receiver,
    filter_text: str,
    secret: str | None,
    message: str,
) -> None:
    with pytest.raises(InvalidParameter, match=message):
        events.create_webhook(people.ctx("rita"), "h", receiver.url, filter_text, secret=secret)
    assert events.list_webhooks(people.principals["admin"]) == []


# ------------------------------------------------------------------------- delivery
def test_failures_back_off_and_later_events_wait_their_turn(
    platform: Platform,
    events: EventService,
    people: People,
    receiver: Receiver,
    sender: HttpxSender,
    clock: ManualClock,
) -> None:
    hook, secret = events.create_webhook(people.ctx("rita"), "h", receiver.url, "job_finished")
    first, second = record(platform, n=1), record(platform, n=2)
    receiver.answers[:] = [500, 503]
    t0 = clock.now
    assert events.deliver_webhooks(sender, now=t0) == 1  # attempt 1 fails: wait 10 s
    assert events.deliver_webhooks(sender, now=t0 + timedelta(seconds=9)) == 0
    assert events.deliver_webhooks(sender, now=t0 + timedelta(seconds=10)) == 1  # fails: 20 s
    assert events.deliver_webhooks(sender, now=t0 + timedelta(seconds=29)) == 0
    assert events.deliver_webhooks(sender, now=t0 + timedelta(seconds=30)) == 2  # ok, then next
    ids = [json.loads(g.body)["id"] for g in receiver.got]
    assert ids == [first, first, first, second]
    assert {g.delivery for g in receiver.got[:3]} == {delivery_id(hook.id, first)}
    assert all(_signed(secret, g) for g in receiver.got)
    log = events.deliveries(people.principals["rita"], hook.id)
    assert [(d.event_id, d.attempt, d.ok, d.status_code) for d in reversed(log)] == [
        (first, 1, False, 500),
        (first, 2, False, 503),
        (first, 3, True, 200),
        (second, 1, True, 200),
    ]
    assert log[-1].next_attempt_at == t0 + timedelta(seconds=10)
    assert log[-1].error == "HTTP 500"


def test_a_delivery_that_keeps_failing_dies_and_the_webhook_moves_on(
    platform: Platform,
    events: EventService,
    people: People,
    receiver: Receiver,
    sender: HttpxSender,
    clock: ManualClock,
) -> None:
    hook, _ = events.create_webhook(people.ctx("rita"), "h", receiver.url, "*")
    doomed, fine = record(platform, n=1), record(platform, n=2)
    receiver.answers[:] = [500] * 4
    at = clock.now
    for _ in range(4):
        events.deliver_webhooks(sender, now=at)
        at += timedelta(seconds=60)  # past every backoff (capped at 60 s here)
    log = events.deliveries(people.principals["rita"], hook.id)
    assert [(d.event_id, d.attempt, d.ok, d.dead) for d in reversed(log)] == [
        (doomed, 1, False, False),
        (doomed, 2, False, False),
        (doomed, 3, False, False),
        (doomed, 4, False, True),
        (fine, 1, True, False),
    ]


def test_an_unreachable_receiver_is_logged_without_the_secret_or_url(
    platform: Platform, events: EventService, people: People, sender: HttpxSender
) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/closed?token=tok-1234567890"
    hook, secret = events.create_webhook(people.ctx("rita"), "h", url, "*")
    record(platform)
    assert events.deliver_webhooks(sender) == 1
    (attempt,) = events.deliveries(people.principals["rita"], hook.id)
    assert not attempt.ok
    assert attempt.status_code is None
    assert "ConnectError" in attempt.error
    assert secret not in attempt.error
    assert "tok-1234567890" not in attempt.error


def test_a_paused_webhook_gets_nothing_until_resumed(
    platform: Platform,
    events: EventService,
    people: People,
    receiver: Receiver,
    sender: HttpxSender,
) -> None:
    hook, _ = events.create_webhook(people.ctx("rita"), "h", receiver.url, "*")
    events.set_webhook_active(people.ctx("rita"), hook.id, False)
    made = record(platform)
    assert events.deliver_webhooks(sender) == 0
    events.set_webhook_active(people.ctx("rita"), hook.id, True)
    assert events.deliver_webhooks(sender) == 1
    assert json.loads(receiver.got[0].body)["id"] == made


def test_changes_to_webhooks_are_audited(
    platform: Platform, events: EventService, people: People, receiver: Receiver
) -> None:
    hook, _ = events.create_webhook(people.ctx("rita", "webhook.create"), "h", receiver.url, "*")
    events.set_webhook_active(people.ctx("rita", "webhook.pause"), hook.id, False)
    events.delete_webhook(people.ctx("rita", "webhook.delete"), hook.id)
    entries = platform.audit.entries(limit=10, actor="rita")
    assert [(e.action, e.target) for e in reversed(entries)] == [
        ("webhook.create", "webhook:red/h"),
        ("webhook.pause", "webhook:red/h"),
        ("webhook.delete", "webhook:red/h"),
    ]
    created = entries[-1]
    assert "receiver-token" not in json.dumps(created.detail)
    assert created.detail["url"] == "http://127.0.0.1"


def test_kinds_of_events_are_all_known() -> None:
    assert EventKind("job_finished") is EventKind.JOB_FINISHED
