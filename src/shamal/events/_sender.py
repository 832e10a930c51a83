"""One webhook request: checked, resolved, pinned to the checked address, signed, sent.

:class:`WebhookSender` does one attempt and reports it as a :class:`SendResult`; retrying,
and when (:func:`backoff_s`), is the delivery loop's business. What a send guarantees:

- the URL passes :func:`~shamal.events._targets.check_webhook_url` and its host is
  resolved once by :func:`~shamal.events._targets.resolve_public`; the TCP connection goes
  to an address that check accepted (the URL's host is swapped for it; ``Host`` and, for
  https, TLS's server name and certificate check keep the real name), so a DNS answer that
  changes between the check and the connect cannot redirect it;
- redirects are never followed (a 3xx is a failure), environment proxies are ignored (a
  proxy would be the peer instead of the checked address), connections are not kept alive
  (a pooled connection is keyed by address, and must not carry another host's request);
- at most 64 KiB of the answer are read, for at most ``timeout_s``; the status decides;
- every failure is a short, fixed reason: no secret, URL or stack trace.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable

import httpx

from shamal.errors import InvalidParameter, ShamalError
from shamal.events._entities import SendResult
from shamal.events._signing import signature_headers
from shamal.events._targets import check_webhook_url, resolve_public

__all__ = ["MAX_ANSWER_BYTES", "SendResult", "WebhookSender", "backoff_s"]

logger = logging.getLogger(__name__)

MAX_ANSWER_BYTES = 64 * 1024


def backoff_s(
    attempt: int,
    *,
    base_s: float = 5.0,
    cap_s: float = 3600.0,
    jitter: Callable[[], float] | None = None,
) -> float:
    """How long to wait after the ``attempt``-th failed attempt before the next one.

    ``base_s * 2 ** (attempt - 1)``, capped at ``cap_s``: 5 s, 10 s, 20 s ... one hour.
    Deterministic by default (the delivery loop's tests can state exact times; failures of
    different webhooks are spread by when they happened). With ``jitter`` (a function
    returning a float in [0, 1), e.g. ``random.random``, injectable for tests), the delay
    is drawn from [delay / 2, delay): "equal jitter", never less than half the delay.

    Raises:
        InvalidParameter: ``attempt`` < 1, or a non-positive ``base_s`` or ``cap_s``.
    """
    if attempt < 1:
        raise InvalidParameter("backoff counts attempts from 1")
    if base_s <= 0 or cap_s <= 0:
        raise InvalidParameter("backoff's base and cap are positive seconds")
    # 2**64 * base is past any cap; stopping the exponent there avoids huge integers.
    delay = min(cap_s, base_s * 2.0 ** min(attempt - 1, 64))
    if jitter is None:
        return delay
    return delay / 2 + delay / 2 * min(max(jitter(), 0.0), 1.0)


# Fixed phrases, most specific first: an exception's own text can carry the URL or the
# peer's words, so it is never passed on.
_REASONS: tuple[tuple[type[httpx.HTTPError], str], ...] = (
    (httpx.ConnectTimeout, "connect timed out"),
    (httpx.TimeoutException, "timed out waiting for the receiver"),
    (httpx.ConnectError, "could not connect to the receiver"),
    (httpx.RemoteProtocolError, "the receiver broke the HTTP protocol or closed the connection"),
    (httpx.TransportError, "network error talking to the receiver"),
)


def _caused_by_tls(exc: BaseException) -> bool:
    # httpx wraps httpcore's error, which wraps the ssl module's: walk a few links.
    link: BaseException | None = exc
    for _ in range(5):
        if link is None:
            return False
        if isinstance(link, ssl.SSLError):
            return True
        link = link.__cause__ or link.__context__
    return False


def _network_reason(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError) and _caused_by_tls(exc):
        return "TLS handshake failed (certificate or protocol)"
    for kind, reason in _REASONS:
        if isinstance(exc, kind):
            return reason
    return f"request failed ({type(exc).__name__})"


class WebhookSender:
    """Sends signed webhook requests, one attempt per :meth:`send`.

    Thread-safe as far as the underlying ``httpx.Client`` is (it is).

    Args:
        allow_private: the operator's ``SHAMAL_EVENTS__ALLOW_PRIVATE_WEBHOOKS``.
        timeout_s: the limit on connecting, on each read and write, and on reading the
            answer's body (which is read only to be discarded).
        client: an ``httpx.Client`` to use (e.g. with a private CA bundle); it is not
            closed by :meth:`close`. Redirects are turned off per request either way, but
            its proxy and keep-alive settings are the caller's: the default client trusts
            no environment proxy and keeps no connection alive.
        clock: Unix time for the timestamp header (injectable for tests).
    """

    def __init__(
        self,
        *,
        allow_private: bool = False,
        timeout_s: float = 10.0,
        client: httpx.Client | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._allow_private = allow_private
        self._timeout_s = timeout_s
        self._clock = clock
        self._owns_client = client is None
        self._client = client or httpx.Client(
            timeout=httpx.Timeout(timeout_s),
            follow_redirects=False,
            trust_env=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    def send(self, url: str, secret: str, body: bytes, delivery_id: str) -> SendResult:
        """POST ``body`` to ``url``, signed with ``secret``; never raises for the target's
        or the network's faults.

        Args:
            url: the webhook's URL (checked again here: stored rows may predate a rule).
            secret: the webhook's secret; empty sends the request unsigned.
            body: the JSON body, exactly as it is to be signed and sent.
            delivery_id: the ``X-MLflow-Delivery-Id`` (the same on every retry).

        Returns:
            ``SendResult(ok=True, status=2xx, error="")`` on success; else ``ok=False`` with
            the status when an answer came, and a short reason.
        """
        try:
            target = httpx.URL(check_webhook_url(url, allow_private=self._allow_private))
            addresses = resolve_public(
                target.host, target.port or _default_port(target), allow_private=self._allow_private
            )
            headers = signature_headers(secret, delivery_id, int(self._clock()), body)
        except ShamalError as exc:
            return SendResult(ok=False, status=None, error=exc.message)
        except httpx.InvalidURL:
            return SendResult(ok=False, status=None, error="the webhook URL does not parse")
        headers["Accept-Encoding"] = "identity"  # no decompression bombs in the answer
        last = SendResult(ok=False, status=None, error="could not connect to the receiver")
        for address in addresses:
            try:
                return self._post(target, address, headers, body)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                # Nothing was sent on this address: the next one may answer.
                last = SendResult(ok=False, status=None, error=_network_reason(exc))
            except httpx.HTTPError as exc:
                return SendResult(ok=False, status=None, error=_network_reason(exc))
        return last

    def _post(
        self, target: httpx.URL, address: str, headers: dict[str, str], body: bytes
    ) -> SendResult:
        pinned = target.copy_with(host=address)
        headers = {**headers, "Host": _host_header(target)}
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        request = self._client.build_request(
            "POST", pinned, content=body, headers=headers, extensions=extensions
        )
        response = self._client.send(request, stream=True, follow_redirects=False)
        try:
            _read_capped(response, time.monotonic() + self._timeout_s)
        except httpx.HTTPError:
            pass  # the status line is the answer; a body that breaks off changes nothing
        finally:
            response.close()
        status = response.status_code
        if 200 <= status < 300:
            return SendResult(ok=True, status=status, error="")
        if 300 <= status < 400:
            reason = f"redirect not followed (HTTP {status})"
            return SendResult(ok=False, status=status, error=reason)
        return SendResult(ok=False, status=status, error=f"the receiver answered HTTP {status}")

    def close(self) -> None:
        """Close the HTTP client this sender made (not one it was given)."""
        if self._owns_client:
            self._client.close()


def _default_port(url: httpx.URL) -> int:
    return 443 if url.scheme == "https" else 80


def _host_header(url: httpx.URL) -> str:
    host = f"[{url.host}]" if ":" in url.host else url.host
    return host if url.port is None else f"{host}:{url.port}"


def _read_capped(response: httpx.Response, deadline: float) -> int:
    # Raw bytes (no decoding); stop at the cap or the deadline: an endless or a
    # slowly dripping answer must not hold the delivery loop.
    read = 0
    for chunk in response.iter_raw(chunk_size=16 * 1024):
        read += len(chunk)
        if read >= MAX_ANSWER_BYTES or time.monotonic() > deadline:
            break
    return read
