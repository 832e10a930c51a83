"""The webhook sender against a real HTTP server on 127.0.0.1 (a thread of this test).

Loopback is private, so these sends need ``allow_private=True``; with it off, the same
sends are refused before any connection (the server counts the connections it accepts).
"""

from __future__ import annotations

import dataclasses
import socket
import ssl
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given
from hypothesis import strategies as st

from shamal.errors import InvalidParameter
from shamal.events._sender import MAX_ANSWER_BYTES, SendResult, WebhookSender, backoff_s
from shamal.events._signing import DELIVERY_ID_HEADER, verify

NOW = 1_790_000_000
SECRET = "s3cret-value"
BODY = b'{"id": 7, "kind": "job_finished"}'
ENDLESS_LIMIT = 256 * 1024 * 1024


class _Handler(BaseHTTPRequestHandler):
    server: _Receiver

    def log_message(self, format: str, *args: Any) -> None:
        del format, args  # quiet: pytest would show it as noise

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        self.server.seen.append((self.path, dict(self.headers.items()), body))
        route = getattr(self, "_" + self.path.strip("/").split("?")[0], None)
        if route is None:
            self.send_response(404)
            self.end_headers()
            return
        route()

    def _ok(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def _accepted(self) -> None:
        self.send_response(204)
        self.end_headers()

    def _fail(self) -> None:
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _slow(self) -> None:
        self.server.release.wait(30)
        self._ok()

    def _redirect(self) -> None:
        self.send_response(302)
        self.send_header("Location", f"http://127.0.0.1:{self.server.port}/ok")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _endless(self) -> None:
        # No length, no end: only a reader that stops can get away.
        self.send_response(200)
        self.send_header("Connection", "close")
        self.end_headers()
        self._pour()

    def _huge(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(ENDLESS_LIMIT))
        self.end_headers()
        self._pour()

    def _stalled(self) -> None:
        # The status and a little of the body, then nothing more for as long as we like.
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        self.wfile.write(b"x" * 10)
        self.wfile.flush()
        self.server.release.wait(30)

    def _cut(self) -> None:
        self.send_response(201)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        self.wfile.write(b"x" * 10)
        self.close_connection = True

    def _pour(self) -> None:
        chunk = b"x" * 65536
        try:
            while self.server.poured < ENDLESS_LIMIT and not self.server.release.is_set():
                self.wfile.write(chunk)
                self.server.poured += len(chunk)
        except OSError:
            self.server.hung_up.set()
        self.close_connection = True


class _Receiver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.port = self.server_address[1]
        self.seen: list[tuple[str, dict[str, str], bytes]] = []
        self.connections = 0
        self.poured = 0
        self.release = threading.Event()
        self.hung_up = threading.Event()

    def get_request(self) -> tuple[socket.socket, Any]:
        got = super().get_request()
        self.connections += 1
        return got

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    server = _Receiver()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def sender() -> Iterator[WebhookSender]:
    made = WebhookSender(allow_private=True, timeout_s=5.0, clock=lambda: NOW)
    yield made
    made.close()


def test_ok_is_signed_and_verifiable(receiver: _Receiver, sender: WebhookSender) -> None:
    result = sender.send(receiver.url("ok"), SECRET, BODY, "delivery-1")
    assert result == SendResult(ok=True, status=200, error="")
    [(path, headers, body)] = receiver.seen
    assert (path, body) == ("/ok", BODY)
    assert headers["Host"] == f"127.0.0.1:{receiver.port}"
    assert headers["User-Agent"] == "shamal-webhooks"
    assert headers["Content-Type"] == "application/json"
    assert headers[DELIVERY_ID_HEADER] == "delivery-1"
    assert verify(SECRET, headers, body, now=NOW)
    assert not verify("another", headers, body, now=NOW)


def test_any_2xx_is_ok(receiver: _Receiver, sender: WebhookSender) -> None:
    assert sender.send(receiver.url("accepted"), SECRET, BODY, "d") == SendResult(True, 204, "")


def test_500_is_a_failure_with_its_status(receiver: _Receiver, sender: WebhookSender) -> None:
    result = sender.send(receiver.url("fail"), SECRET, BODY, "d")
    assert (result.ok, result.status) == (False, 500)
    assert "500" in result.error


def test_timeout(receiver: _Receiver) -> None:
    quick = WebhookSender(allow_private=True, timeout_s=0.3)
    try:
        result = quick.send(receiver.url("slow"), SECRET, BODY, "d")
    finally:
        quick.close()
    assert result == SendResult(ok=False, status=None, error="timed out waiting for the receiver")


def test_2xx_with_a_stalled_body_is_ok(receiver: _Receiver) -> None:
    quick = WebhookSender(allow_private=True, timeout_s=0.3)
    try:
        result = quick.send(receiver.url("stalled"), SECRET, BODY, "d")
    finally:
        quick.close()
    assert result == SendResult(ok=True, status=200, error="")


def test_2xx_with_a_cut_body_is_ok(receiver: _Receiver, sender: WebhookSender) -> None:
    assert sender.send(receiver.url("cut"), SECRET, BODY, "d") == SendResult(True, 201, "")


def test_redirect_not_followed(receiver: _Receiver, sender: WebhookSender) -> None:
    result = sender.send(receiver.url("redirect"), SECRET, BODY, "d")
    assert (result.ok, result.status) == (False, 302)
    assert "redirect" in result.error
    assert [path for path, _, _ in receiver.seen] == ["/redirect"]


def test_redirect_not_followed_even_by_a_client_that_would(receiver: _Receiver) -> None:
    with httpx.Client(follow_redirects=True) as client:
        mine = WebhookSender(allow_private=True, client=client)
        result = mine.send(receiver.url("redirect"), SECRET, BODY, "d")
        mine.close()  # leaves the caller's client open
        assert not client.is_closed
    assert result.status == 302
    assert [path for path, _, _ in receiver.seen] == ["/redirect"]


@pytest.mark.parametrize("path", ["endless", "huge"])
def test_answer_read_is_capped(receiver: _Receiver, sender: WebhookSender, path: str) -> None:
    result = sender.send(receiver.url(path), SECRET, BODY, "d")
    assert result == SendResult(ok=True, status=200, error="")
    # We hung up long before the server could pour 256 MiB (socket buffers hold a few MiB).
    assert receiver.hung_up.wait(10)
    assert MAX_ANSWER_BYTES <= receiver.poured < ENDLESS_LIMIT


@pytest.mark.parametrize("path", ["ok", "fail", "endless"])
def test_private_target_refused_without_connecting(receiver: _Receiver, path: str) -> None:
    strict = WebhookSender(allow_private=False)
    try:
        result = strict.send(receiver.url(path), SECRET, BODY, "d")
    finally:
        strict.close()
    assert (result.ok, result.status) == (False, None)
    assert "SHAMAL_EVENTS__ALLOW_PRIVATE_WEBHOOKS" in result.error
    assert receiver.connections == 0


def test_connects_to_the_address_it_checked(
    receiver: _Receiver, sender: WebhookSender, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name resolves once; the request goes to that answer with the name as ``Host``.
    A second lookup would answer an unroutable address, so a client that resolved again
    would time out instead of reaching the receiver."""
    real = socket.getaddrinfo
    answers = iter(["127.0.0.1", "10.255.255.1"])
    asked: list[str] = []

    def rebinding(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "hook.test":
            return real(host, port, *args, **kwargs)
        asked.append(host)
        return real(next(answers), port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    result = sender.send(f"http://hook.test:{receiver.port}/ok", SECRET, BODY, "d")
    assert result == SendResult(ok=True, status=200, error="")
    assert asked == ["hook.test"]
    [(_, headers, _)] = receiver.seen
    assert headers["Host"] == f"hook.test:{receiver.port}"


def test_name_resolving_to_loopback_refused(
    receiver: _Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = socket.getaddrinfo

    def to_loopback(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        return real("127.0.0.1" if host == "hook.test" else host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", to_loopback)
    strict = WebhookSender(allow_private=False)
    try:
        result = strict.send(f"http://hook.test:{receiver.port}/ok", SECRET, BODY, "d")
    finally:
        strict.close()
    assert (result.ok, result.status) == (False, None)
    assert "127.0.0.1" not in result.error
    assert receiver.connections == 0


def _certificate(name: str, folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for ``name`` (its own CA): cert and key files."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


@pytest.fixture
def tls_receiver(
    receiver: _Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[_Receiver, list[str], httpx.Client]]:
    """The receiver behind TLS for ``hook.test``; ``hook.test`` and ``other.test`` both
    resolve to 127.0.0.1; yields the server names clients asked for (SNI) and a client
    that trusts the certificate."""
    cert_file, key_file = _certificate("hook.test", tmp_path)
    names: list[str] = []
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert_file, key_file)
    server_side.sni_callback = lambda _sock, name, _ctx: names.append(name or "")
    receiver.socket = server_side.wrap_socket(receiver.socket, server_side=True)
    real = socket.getaddrinfo

    def both_local(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        local = host in {"hook.test", "other.test"}
        return real("127.0.0.1" if local else host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", both_local)
    trusting = ssl.create_default_context(cafile=str(cert_file))
    with httpx.Client(verify=trusting, trust_env=False) as client:
        yield receiver, names, client


def test_https_pinned_keeps_the_name_for_sni_and_certificate(
    tls_receiver: tuple[_Receiver, list[str], httpx.Client],
) -> None:
    receiver, names, client = tls_receiver
    sender = WebhookSender(allow_private=True, client=client, clock=lambda: NOW)
    result = sender.send(f"https://hook.test:{receiver.port}/ok", SECRET, BODY, "d")
    assert result == SendResult(ok=True, status=200, error="")
    assert names == ["hook.test"]
    [(_, headers, body)] = receiver.seen
    assert headers["Host"] == f"hook.test:{receiver.port}"
    assert verify(SECRET, headers, body, now=NOW)


def test_https_certificate_for_another_name_refused(
    tls_receiver: tuple[_Receiver, list[str], httpx.Client],
) -> None:
    receiver, names, client = tls_receiver
    sender = WebhookSender(allow_private=True, client=client)
    result = sender.send(f"https://other.test:{receiver.port}/ok", SECRET, BODY, "d")
    assert result == SendResult(
        ok=False, status=None, error="TLS handshake failed (certificate or protocol)"
    )
    assert names == ["other.test"]
    assert receiver.seen == []


def test_nothing_listening(sender: WebhookSender) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = sender.send(f"http://127.0.0.1:{port}/ok", SECRET, BODY, "d")
    assert result == SendResult(ok=False, status=None, error="could not connect to the receiver")


@pytest.mark.parametrize(
    "url",
    ["file:///etc/passwd", "http://user:s3cret-value@127.0.0.1/", "gopher://127.0.0.1:6379/_SET"],
)
def test_bad_urls_fail_without_leaking(sender: WebhookSender, url: str) -> None:
    result = sender.send(url, SECRET, BODY, "d")
    assert (result.ok, result.status) == (False, None)
    assert SECRET not in result.error
    assert url not in result.error


def test_bad_delivery_id_is_a_result_not_an_exception(
    receiver: _Receiver, sender: WebhookSender
) -> None:
    result = sender.send(receiver.url("ok"), SECRET, BODY, "a\r\nX-Injected: 1")
    assert (result.ok, result.status) == (False, None)
    assert receiver.connections == 0


def test_send_result_shape() -> None:
    assert [f.name for f in dataclasses.fields(SendResult)] == ["ok", "status", "error"]
    result = SendResult(ok=True, status=200, error="")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.ok = False  # type: ignore[misc]


# ---------------------------------------------------------------- backoff
def test_backoff_doubles_to_the_cap() -> None:
    assert [backoff_s(n) for n in range(1, 6)] == [5.0, 10.0, 20.0, 40.0, 80.0]
    assert backoff_s(11) == 3600.0
    assert backoff_s(10_000) == 3600.0
    assert backoff_s(3, base_s=1.0, cap_s=3.0) == 3.0


def test_backoff_jitter_stays_in_the_upper_half() -> None:
    assert backoff_s(2, jitter=lambda: 0.0) == 5.0
    assert backoff_s(2, jitter=lambda: 0.5) == 7.5
    assert backoff_s(2, jitter=lambda: 7.0) == 10.0  # a bad source cannot go past the delay


@pytest.mark.parametrize(
    "kwargs",
    [{"attempt": 0}, {"attempt": -3}, {"attempt": 1, "base_s": 0.0}, {"attempt": 1, "cap_s": -1.0}],
)
def test_backoff_refuses_nonsense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidParameter):
        backoff_s(**kwargs)


@given(attempt=st.integers(1, 10_000), draw=st.floats(0.0, 1.0, exclude_max=True))
def test_backoff_grows_and_is_bounded(attempt: int, draw: float) -> None:
    plain = backoff_s(attempt)
    assert 5.0 <= plain <= 3600.0
    assert backoff_s(attempt + 1) >= plain
    assert plain / 2 <= backoff_s(attempt, jitter=lambda: draw) <= plain
