"""Master keys for artifact encryption, kept in a JSON file of mode 0600.

The file holds every master key that may still wrap a blob's data key, each
with a key check value (a truncated HMAC of a fixed label under the key), so a
corrupted or edited key is reported when the file is loaded instead of as a
stream of failed blob reads. Exactly one key is *active*: new blobs are
wrapped with it. Rotation = :meth:`Keyring.add_key`, save, re-wrap the
sidecars (:meth:`~shamal.artifacts.BlobStore.rotate_master_key`), then
:meth:`Keyring.retire` the old key and save again.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import threading
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shamal.artifacts._crypto import KEY_SIZE
from shamal.errors import IntegrityCheckFailed, InvalidParameter, NotFound

__all__ = ["Keyring"]

logger = logging.getLogger(__name__)

_VERSION = 1
_MAX_FILE_BYTES = 1024 * 1024
_KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_CHECK_LABEL = b"shamal.keyring.check.v1"
_DIR_MODE = 0o700
_FILE_MODE = 0o600


def _check_value(key: bytes) -> str:
    return hmac.new(key, _CHECK_LABEL, hashlib.sha256).hexdigest()[:16]


def _malformed(reason: str) -> IntegrityCheckFailed:
    return IntegrityCheckFailed(f"The master keyring is malformed: {reason}")


def _make_private_dirs(directory: Path) -> None:
    missing = [p for p in (directory, *directory.parents) if not p.exists()]
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=_DIR_MODE)


def _parse_key(entry: Any) -> tuple[str, bytes]:
    if not isinstance(entry, dict) or set(entry) != {"id", "key", "check", "created"}:
        raise _malformed("a key entry has the wrong fields")
    key_id, encoded, check = entry["id"], entry["key"], entry["check"]
    if not isinstance(key_id, str) or not _KEY_ID.match(key_id):
        raise _malformed("a key id is invalid")
    if not isinstance(encoded, str) or not isinstance(check, str):
        raise _malformed("a key entry has the wrong types")
    try:
        key = base64.b64decode(encoded.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise _malformed("a key is not valid base64") from None
    if len(key) != KEY_SIZE:
        raise _malformed("a key is not 256 bits long")
    if not hmac.compare_digest(_check_value(key), check):
        raise _malformed("a key does not match its check value (altered or corrupted)")
    return key_id, key


class Keyring:
    """Master keys (256-bit) by id, one of them active. Thread-safe.

    The keys never appear in ``repr`` or in error messages.
    """

    def __init__(self, keys: Mapping[str, bytes], active_id: str) -> None:
        """Build a keyring from keys in memory.

        Raises:
            InvalidParameter: a key is not 32 bytes, an id is invalid, or
                ``active_id`` is not one of the keys.
        """
        for key_id, key in keys.items():
            if not _KEY_ID.match(key_id) or len(key) != KEY_SIZE:
                raise InvalidParameter("Master keys must be 32 bytes under a simple id")
        if active_id not in keys:
            raise InvalidParameter("The active master key is not in the keyring")
        self._keys = dict(keys)
        self._created = dict.fromkeys(keys, datetime.now(UTC).isoformat())
        self._active = active_id
        self._lock = threading.RLock()

    @classmethod
    def generate(cls) -> Keyring:
        """A new keyring with one fresh active key."""
        key_id = secrets.token_hex(8)
        return cls({key_id: secrets.token_bytes(KEY_SIZE)}, key_id)

    # ------------------------------------------------------------------ files
    @classmethod
    def load(cls, path: Path) -> Keyring:
        """Read a keyring file.

        Raises:
            NotFound: the file does not exist.
            IntegrityCheckFailed: the file is not a valid keyring, or a key
                fails its check value.
        """
        try:
            with open(path, "rb") as f:
                mode = os.fstat(f.fileno()).st_mode
                data = f.read(_MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            raise NotFound("The master keyring does not exist") from None
        if mode & 0o077:
            logger.warning("master keyring %s is readable by others (mode %o)", path, mode & 0o777)
        try:
            return cls._from_document(data)
        except IntegrityCheckFailed:
            logger.error("master keyring %s failed to load", path)
            raise

    @classmethod
    def _from_document(cls, data: bytes) -> Keyring:
        if len(data) > _MAX_FILE_BYTES:
            raise _malformed("the file is too large")
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise _malformed("the file is not JSON") from None
        if not isinstance(doc, dict) or set(doc) != {"version", "active", "keys"}:
            raise _malformed("the document has the wrong fields")
        if doc["version"] != _VERSION or not isinstance(doc["keys"], list) or not doc["keys"]:
            raise _malformed("unsupported version or no keys")
        parsed = [_parse_key(entry) for entry in doc["keys"]]
        keys = dict(parsed)
        if len(keys) != len(parsed):
            raise _malformed("a key id appears twice")
        if not isinstance(doc["active"], str) or doc["active"] not in keys:
            raise _malformed("the active key is not in the keyring")
        ring = cls(keys, doc["active"])
        ring._created = {entry["id"]: str(entry["created"]) for entry in doc["keys"]}
        return ring

    def _document(self) -> bytes:
        with self._lock:
            doc = {
                "version": _VERSION,
                "active": self._active,
                "keys": [
                    {
                        "id": key_id,
                        "key": base64.b64encode(key).decode(),
                        "check": _check_value(key),
                        "created": self._created[key_id],
                    }
                    for key_id, key in self._keys.items()
                ],
            }
        return json.dumps(doc, indent=2).encode()

    def _write_temp(self, path: Path) -> Path:
        _make_private_dirs(path.parent)
        tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(tmp, flags, _FILE_MODE)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(self._document())
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def save(self, path: Path) -> None:
        """Write the keyring atomically (temp file + rename), mode 0600, directory 0700."""
        tmp = self._write_temp(path)
        try:
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @classmethod
    def load_or_create(cls, path: Path) -> Keyring:
        """Load the keyring at ``path``, creating it with one fresh key if it is missing.

        Creation never replaces a file that another process created meanwhile
        (the new file is linked into place, which fails if one exists).

        Raises:
            IntegrityCheckFailed: an existing file is not a valid keyring.
        """
        with contextlib.suppress(NotFound):
            return cls.load(path)
        ring = cls.generate()
        tmp = ring._write_temp(path)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return cls.load(path)
        finally:
            tmp.unlink(missing_ok=True)
        logger.info("created master keyring %s", path)
        return ring

    # ------------------------------------------------------------------ keys
    @property
    def active_id(self) -> str:
        """Id of the key that wraps new data keys."""
        with self._lock:
            return self._active

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Ids of every key in the ring."""
        with self._lock:
            return tuple(self._keys)

    def active_key(self) -> tuple[str, bytes]:
        """The active key and its id."""
        with self._lock:
            return self._active, self._keys[self._active]

    def key(self, key_id: str) -> bytes:
        """The key ``key_id``.

        Raises:
            NotFound: no such key (e.g. it was retired).
        """
        with self._lock:
            try:
                return self._keys[key_id]
            except KeyError:
                raise NotFound("The master key is not in the keyring") from None

    def add_key(self) -> str:
        """Generate a new key, make it active and return its id. Call :meth:`save` after."""
        key_id = secrets.token_hex(8)
        with self._lock:
            self._keys[key_id] = secrets.token_bytes(KEY_SIZE)
            self._created[key_id] = datetime.now(UTC).isoformat()
            self._active = key_id
        return key_id

    def retire(self, key_id: str) -> None:
        """Remove a key that no sidecar uses any more. Call :meth:`save` after.

        Raises:
            InvalidParameter: ``key_id`` is the active key.
            NotFound: no such key.
        """
        with self._lock:
            if key_id == self._active:
                raise InvalidParameter("The active master key cannot be retired")
            if self._keys.pop(key_id, None) is None:
                raise NotFound("The master key is not in the keyring")
            self._created.pop(key_id, None)

    def __repr__(self) -> str:
        with self._lock:
            return f"Keyring(active={self._active!r}, keys={len(self._keys)})"
