"""Webhook secrets at rest: sealed with AES-256-GCM under a key of the platform's ring.

The sender needs a webhook's secret in the clear to sign each delivery, so it cannot be
stored hashed; it is stored sealed instead: ``v1:<key id>:<base64(nonce | ciphertext)>``,
the key derived (HKDF, purpose ``webhook-secrets``) from the ring's secret ``key id``, the
webhook's id bound in as associated data (a sealed secret copied onto another webhook's
row does not open). A rotation of the ring leaves older secrets openable.
"""

from __future__ import annotations

import base64
import logging
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from shamal.errors import InternalError, NotFound
from shamal.security import PseudonymKeys

logger = logging.getLogger(__name__)

PURPOSE = "webhook-secrets"
_NONCE = 12


class SecretBox:
    """Seals and opens webhook secrets. Thread-safe.

    Args:
        keys: the platform's key ring. None (a test platform, an embedded one without a
            ring) stores secrets unsealed, marked ``plain:``, and says so in the log once.
    """

    def __init__(self, keys: PseudonymKeys | None) -> None:
        self._keys = keys
        if keys is None:
            logger.warning("no key ring for webhook secrets: they are stored unsealed")

    def seal(self, webhook_id: str, secret: str) -> str:
        if self._keys is None:
            return "plain:" + secret
        key = self._keys.active("hmac", PURPOSE)
        nonce = os.urandom(_NONCE)
        sealed = AESGCM(key.secret).encrypt(nonce, secret.encode(), webhook_id.encode())
        return f"v1:{key.key_id}:{base64.b64encode(nonce + sealed).decode()}"

    def open(self, webhook_id: str, sealed: str) -> str:
        """The secret; raises InternalError (detail logged, not raised) when it does not
        open: a ring that lost its key, or a row edited by hand."""
        if sealed.startswith("plain:"):
            return sealed.removeprefix("plain:")
        try:
            version, key_id, blob = sealed.split(":", 2)
            if version != "v1" or self._keys is None:
                raise ValueError(version)
            raw = base64.b64decode(blob, validate=True)
            key = self._keys.by_id(key_id, "hmac", PURPOSE)
            return (
                AESGCM(key.secret).decrypt(raw[:_NONCE], raw[_NONCE:], webhook_id.encode()).decode()
            )
        except (ValueError, InvalidTag, UnicodeDecodeError, NotFound) as exc:
            logger.error(
                "the secret of webhook %s does not open (%s)", webhook_id, type(exc).__name__
            )
            raise InternalError("a webhook's secret could not be read") from None
