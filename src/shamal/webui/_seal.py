"""The session cookie's seal and the forms' synchronizer tokens.

The cookie holds the API token the person signed in with, encrypted and authenticated
(Fernet: AES-CBC with an HMAC-SHA256 over it) with a key only the server reads, so the
cookie is opaque to the browser and to anyone who copies it from a disk cache, and a
changed cookie is refused. Every request still authenticates the token it holds: revoking
the token signs every session made with it out.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from shamal.security import load_or_create_key

#: The key file, beside the server's other keys (0600 in a 0700 folder, made on first use).
KEY_FILE = "ui-session.key"
#: A session lasts at most this long, however active: then the person signs in again.
SESSION_MAX_AGE_S = 12 * 3600
_CSRF_PURPOSE = b"shamal.webui.csrf\x00"


class SessionSeal:
    """Seals tokens into cookie values and opens them; makes and checks CSRF tokens.

    Thread-safe: it holds only its keys.
    """

    def __init__(
        self,
        key: bytes,
        max_age_s: int = SESSION_MAX_AGE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if len(key) < 32:
            raise ValueError("the session key must hold at least 32 bytes")
        digest = hashlib.sha256(b"shamal.webui.seal\x00" + key).digest()
        self._fernet = Fernet(base64.urlsafe_b64encode(digest))
        self._mac_key = hashlib.sha256(_CSRF_PURPOSE + key).digest()
        self._max_age_s = max_age_s
        self._clock = clock

    @classmethod
    def from_keys_dir(cls, keys_dir: Path) -> SessionSeal:
        """The seal of the key file in ``keys_dir`` (made on first use, shared by every
        worker process of the server)."""
        return cls(load_or_create_key(keys_dir / KEY_FILE, None))

    def seal(self, token: str) -> str:
        """The cookie value for ``token``: a new one on every call (random IV)."""
        sealed = self._fernet.encrypt_at_time(token.encode("utf-8"), int(self._clock()))
        return sealed.decode("ascii")

    def open(self, cookie: str) -> str | None:
        """The token sealed in ``cookie``; None when it was not made by this key, was
        changed, or is older than the session's maximum age."""
        if not cookie or len(cookie) > 4096:
            return None
        try:
            opened = self._fernet.decrypt_at_time(
                cookie.encode("ascii"), ttl=self._max_age_s, current_time=int(self._clock())
            )
            return opened.decode("utf-8")
        except (InvalidToken, UnicodeError):
            return None

    def csrf_token(self, session: str) -> str:
        """The synchronizer token of the forms of ``session`` (the cookie's value, or the
        sign-in form's nonce): an HMAC the server can recompute, never stored."""
        mac = hmac.new(self._mac_key, session.encode("utf-8"), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")

    def csrf_valid(self, session: str, token: str) -> bool:
        """Whether ``token`` is ``session``'s synchronizer token (in constant time)."""
        if not session or not token:
            return False
        return hmac.compare_digest(self.csrf_token(session), token)


def new_nonce() -> str:
    """A random value for the sign-in form's pre-session cookie."""
    return secrets.token_urlsafe(24)
