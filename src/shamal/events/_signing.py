"""Webhook signatures, in MLflow 3's scheme so that one receiver verifies both.

MLflow 3 (``mlflow/webhooks/delivery.py``, after Standard Webhooks) sends three headers:

- ``X-MLflow-Delivery-Id``: a unique id per delivery (we send the outbox delivery's id, so a
  retried delivery carries the same one and a receiver can drop the repeat);
- ``X-MLflow-Timestamp``: Unix seconds when the request was signed;
- ``X-MLflow-Signature``: ``v1,<base64 of HMAC-SHA256(secret, "<id>.<timestamp>.<body>")>``.

The secret is used as its UTF-8 bytes; the body is the exact bytes sent. A receiver checks
the timestamp is recent (replays of an old request are refused) and compares in constant
time. Nothing here logs or returns the secret.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
from collections.abc import Mapping

from shamal.errors import InvalidParameter

__all__ = [
    "DELIVERY_ID_HEADER",
    "SIGNATURE_HEADER",
    "SIGNATURE_VERSION",
    "TIMESTAMP_HEADER",
    "USER_AGENT",
    "signature_headers",
    "sign",
    "verify",
]

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-MLflow-Signature"
TIMESTAMP_HEADER = "X-MLflow-Timestamp"
DELIVERY_ID_HEADER = "X-MLflow-Delivery-Id"
SIGNATURE_VERSION = "v1"
USER_AGENT = "shamal-webhooks"

# A delivery id goes into a header: printable ASCII without spaces keeps it from splitting
# the header block (CR/LF injection) and from being read differently by the receiver.
_MAX_ID = 200


def _check_delivery_id(delivery_id: str) -> None:
    if not (
        0 < len(delivery_id) <= _MAX_ID
        and delivery_id.isascii()
        and delivery_id.isprintable()
        and " " not in delivery_id
    ):
        raise InvalidParameter("a delivery id is 1-200 printable ASCII characters, no spaces")


def _mac(secret: str, delivery_id: str, timestamp: str, body: bytes) -> bytes:
    # The signed content is "<id>.<timestamp>.<body>"; building it from bytes signs exactly
    # what goes on the wire (MLflow signs the JSON text, whose UTF-8 bytes are the body).
    prefix = f"{delivery_id}.{timestamp}.".encode()
    return hmac.new(secret.encode(), prefix + body, hashlib.sha256).digest()


def sign(secret: str, delivery_id: str, timestamp: int, body: bytes) -> str:
    """The ``X-MLflow-Signature`` value for one request.

    Args:
        secret: the webhook's shared secret (non-empty).
        delivery_id: the ``X-MLflow-Delivery-Id`` value.
        timestamp: Unix seconds, the ``X-MLflow-Timestamp`` value.
        body: the exact request body.

    Returns:
        ``"v1,<base64 HMAC-SHA256>"``.

    Raises:
        InvalidParameter: an empty secret, a delivery id unfit for a header, a negative
            timestamp.
    """
    if not secret:
        raise InvalidParameter("a webhook signature needs a non-empty secret")
    _check_delivery_id(delivery_id)
    if timestamp < 0:
        raise InvalidParameter("a webhook timestamp is Unix seconds, not negative")
    digest = _mac(secret, delivery_id, str(timestamp), body)
    return f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode('ascii')}"


def signature_headers(secret: str, delivery_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """Every header a webhook request carries besides ``Host`` and ``Content-Length``.

    Like MLflow, a webhook without a secret (``secret == ""``) is sent unsigned: the
    delivery id and timestamp headers are there, the signature header is not.

    Raises:
        InvalidParameter: as :func:`sign`.
    """
    _check_delivery_id(delivery_id)
    if timestamp < 0:
        raise InvalidParameter("a webhook timestamp is Unix seconds, not negative")
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        DELIVERY_ID_HEADER: delivery_id,
        TIMESTAMP_HEADER: str(timestamp),
    }
    if secret:
        headers[SIGNATURE_HEADER] = sign(secret, delivery_id, timestamp, body)
    return headers


def _header(headers: Mapping[str, str], name: str) -> str | None:
    # HTTP header names are case-insensitive; a plain dict from a framework may not be.
    wanted = name.lower()
    for key, value in headers.items():
        if key.lower() == wanted:
            return value
    return None


def _candidates(value: str) -> list[bytes]:
    # Standard Webhooks allows several space-separated signatures (a key rotation); only
    # the versions we know count, and a malformed entry is skipped, never an error.
    out: list[bytes] = []
    for entry in value.split():
        version, _, encoded = entry.partition(",")
        if version != SIGNATURE_VERSION:
            continue
        try:
            out.append(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            continue
    return out


def verify(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: int,
    tolerance_s: int = 300,
) -> bool:
    """Whether ``headers`` carry a valid, fresh signature of ``body`` under ``secret``.

    Args:
        secret: the shared secret; an empty one verifies nothing.
        headers: the request's headers (names in any case).
        body: the exact request body received.
        now: the receiver's clock, Unix seconds (injected so tests need no sleeps).
        tolerance_s: how far the timestamp may be from ``now``, either way.

    Returns:
        True only if the delivery id, timestamp and signature headers are all present, the
        timestamp is within ``tolerance_s`` of ``now``, and one ``v1`` signature matches
        (compared in constant time).
    """
    delivery_id = _header(headers, DELIVERY_ID_HEADER)
    stamp = _header(headers, TIMESTAMP_HEADER)
    signature = _header(headers, SIGNATURE_HEADER)
    if not secret or delivery_id is None or stamp is None or signature is None:
        return False
    # Digits only: int() would also take " 12", "+12" or "1_2", which the signer never sent.
    if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 12):
        return False
    if abs(now - int(stamp)) > tolerance_s:
        return False
    # The header's own text is what was signed (a sender may pad it; we never do).
    expected = _mac(secret, delivery_id, stamp, body)
    # Compare against every candidate (no early exit) so timing says nothing about which.
    matched = False
    for candidate in _candidates(signature):
        matched |= hmac.compare_digest(expected, candidate)
    return matched
