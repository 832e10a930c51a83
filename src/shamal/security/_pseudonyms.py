"""Pseudonymization keys: per-purpose keys derived from the secrets of a key ring.

The ring (the same :class:`~shamal.artifacts.Keyring` format as the master keys of encryption
at rest, in a file of its own: ``SHAMAL_HOME/keys/pseudonyms.json``) holds 256-bit secrets by
id, one of them active. A purpose's key is HKDF-SHA256 of a secret, with the kind of use
(``hmac`` or ``siv``) and the purpose in its ``info``: the same value under the same purpose
gives the same token, whatever the dataset; two purposes' tokens cannot be linked without
the secret. Tokens carry the id of the secret that made them, so a rotation (a new active
secret) leaves every older token revealable and matchable for erasure.

The server process owns the ring; another process that rotates it (``shamal data privacy
rotate-key`` through the API of any server of the deployment) saves the file, and each
process re-reads it when the file changes.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from shamal.errors import InvalidParameter, NotFound

__all__ = [
    "PURPOSE_PATTERN",
    "KeyUse",
    "PseudonymKeys",
    "PurposeKey",
    "SecretRing",
    "check_purpose",
]

logger = logging.getLogger(__name__)

#: A purpose names why data is pseudonymized (``marketing``, ``fraud-model``).
PURPOSE_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
_PURPOSE = re.compile(PURPOSE_PATTERN)
_SALT = b"shamal.pseudonyms.v1"
#: ``hmac``: keyed one-way tokens (32-byte keys); ``siv``: reversible deterministic
#: encryption with AES-256-SIV (64-byte keys).
KeyUse = Literal["hmac", "siv"]
_LENGTHS: dict[str, int] = {"hmac": 32, "siv": 64}


class SecretRing(Protocol):
    """What the keys need of a key ring (:class:`shamal.artifacts.Keyring` is one)."""

    @property
    def key_ids(self) -> tuple[str, ...]: ...

    def active_key(self) -> tuple[str, bytes]: ...

    def key(self, key_id: str) -> bytes: ...

    def add_key(self) -> str: ...

    def save(self, path: Path) -> None: ...


@dataclass(frozen=True, slots=True)
class PurposeKey:
    """A derived key: ``key_id`` names the ring's secret it came from (tokens carry it)."""

    key_id: str
    use: KeyUse
    purpose: str
    secret: bytes

    def __repr__(self) -> str:  # never the secret
        return f"PurposeKey({self.key_id!r}, {self.use!r}, {self.purpose!r})"


def check_purpose(purpose: str) -> str:
    if not isinstance(purpose, str) or not _PURPOSE.match(purpose):
        raise InvalidParameter(
            "a purpose is 1 to 64 lowercase letters, digits, '.', '_' or '-', starting with a "
            "letter or digit"
        )
    return purpose


class PseudonymKeys:
    """Per-purpose keys of a ring. Thread-safe; one instance per process.

    Args:
        ring: the secrets.
        path: the ring's file; when given, a changed file is read again before keys are
            handed out (another process rotated), and :meth:`rotate` saves to it.
        load: reads the ring's file (with ``path``).
    """

    def __init__(
        self,
        ring: SecretRing,
        *,
        path: Path | None = None,
        load: Callable[[Path], SecretRing] | None = None,
    ) -> None:
        self._ring = ring
        self._path = path
        self._load = load
        self._seen = self._stamp()
        self._derived: dict[tuple[str, str, str], bytes] = {}
        self._lock = threading.RLock()

    def _stamp(self) -> tuple[int, int] | None:
        if self._path is None:
            return None
        try:
            found = self._path.stat()
        except OSError:
            return None
        return (found.st_mtime_ns, found.st_size)

    def _fresh(self) -> SecretRing:
        """The ring, read again when its file changed since it was read."""
        if self._path is None or self._load is None:
            return self._ring
        stamp = self._stamp()
        with self._lock:
            if stamp is not None and stamp != self._seen:
                self._ring = self._load(self._path)
                self._seen = stamp
                logger.info("pseudonymization key ring %s changed; read it again", self._path)
            return self._ring

    def _derive(self, ring: SecretRing, key_id: str, use: KeyUse, purpose: str) -> PurposeKey:
        cache = (key_id, use, purpose)
        with self._lock:
            secret = self._derived.get(cache)
            if secret is None:
                secret = HKDF(
                    algorithm=hashes.SHA256(),
                    length=_LENGTHS[use],
                    salt=_SALT,
                    info=b"shamal/" + use.encode() + b"/" + purpose.encode(),
                ).derive(ring.key(key_id))
                self._derived[cache] = secret
        return PurposeKey(key_id, use, purpose, secret)

    @property
    def active_id(self) -> str:
        return self._fresh().active_key()[0]

    @property
    def key_ids(self) -> tuple[str, ...]:
        return self._fresh().key_ids

    def active(self, use: KeyUse, purpose: str) -> PurposeKey:
        """The key new tokens of ``purpose`` are made with."""
        ring = self._fresh()
        return self._derive(ring, ring.active_key()[0], use, check_purpose(purpose))

    def every(self, use: KeyUse, purpose: str) -> tuple[PurposeKey, ...]:
        """The keys of ``purpose`` under every secret in the ring (to match old tokens)."""
        ring = self._fresh()
        check_purpose(purpose)
        return tuple(self._derive(ring, key_id, use, purpose) for key_id in ring.key_ids)

    def by_id(self, key_id: str, use: KeyUse, purpose: str) -> PurposeKey:
        """The key of ``purpose`` under the secret ``key_id`` (a token names it).

        Raises:
            NotFound: the ring holds no such secret.
        """
        ring = self._fresh()
        if key_id not in ring.key_ids:
            raise NotFound("the pseudonymization key of this token is not in the key ring")
        return self._derive(ring, key_id, use, check_purpose(purpose))

    def rotate(self) -> str:
        """Make a new secret active (saved to the ring's file); returns its id. Older
        secrets stay: their tokens still reveal and still match for erasure."""
        with self._lock:
            ring = self._fresh()
            key_id = ring.add_key()
            if self._path is not None:
                ring.save(self._path)
                self._seen = self._stamp()
        logger.info("pseudonymization keys rotated; new active key %s", key_id)
        return key_id

    def __repr__(self) -> str:
        return f"PseudonymKeys(path={self._path!s})"
