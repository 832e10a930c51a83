"""AES-256-GCM envelope encryption of blobs, streaming and chunked.

Design (format version 1):

* Every blob gets a fresh random 256-bit **data key** and a random 8-byte
  **nonce prefix**. The stored object is a 16-byte header (``MAGIC`` + nonce
  prefix) followed by frames: the plaintext is cut into ``chunk_size`` pieces
  (1 MiB), each sealed with AES-GCM under the data key, nonce = prefix + 32-bit
  big-endian chunk counter, and AAD = header + 64-bit chunk index + a final-chunk
  flag. Reordered, dropped, duplicated, appended or flipped frames fail their tag;
  a stream cut at a frame boundary fails because its last frame was not sealed
  as final.
* The blob's sha256 (its address) is only known once the plaintext has been
  read, so it cannot be in the frames' AAD without a second pass. It is bound
  where it is known: the data key is wrapped (AES-GCM) by a master key with
  AAD = digest + master key id + nonce prefix + chunk size, and the wrapped key
  lives in the blob's sidecar (:class:`KeyEnvelope`, JSON). A sidecar copied to
  another blob does not unwrap; a ciphertext copied under another blob is read
  with that blob's (different) data key and fails its tags.
* Rotating the master key re-wraps sidecars only; blob objects never change.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from shamal.errors import IntegrityCheckFailed, PayloadTooLarge

__all__ = [
    "CHUNK_SIZE",
    "HEADER_SIZE",
    "MAGIC",
    "KeyEnvelope",
    "decrypt_chunks",
    "encrypt_chunks",
    "header_nonce_prefix",
    "new_data_key",
    "new_nonce_prefix",
    "plaintext_size",
    "unwrap_data_key",
    "wrap_data_key",
]

logger = logging.getLogger(__name__)

MAGIC = b"SHMLENC1"
NONCE_PREFIX_SIZE = 8
HEADER_SIZE = len(MAGIC) + NONCE_PREFIX_SIZE
CHUNK_SIZE = 1024 * 1024
MAX_CHUNK_SIZE = 64 * 1024 * 1024
KEY_SIZE = 32
TAG_SIZE = 16
_WRAP_NONCE_SIZE = 12
_MAX_CHUNKS = 2**32  # the counter is the last 4 bytes of the nonce
_ALGORITHM = "AES-256-GCM"
_KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_CHUNK_AAD = b"shamal.blob-chunk.v1\x00"
_WRAP_AAD = b"shamal.blob-key.v1\x00"


def _fail(reason: str) -> IntegrityCheckFailed:
    return IntegrityCheckFailed(f"Encrypted blob failed verification: {reason}")


def new_data_key() -> bytes:
    """A fresh random 256-bit data key."""
    return AESGCM.generate_key(bit_length=256)


def new_nonce_prefix() -> bytes:
    """A fresh random nonce prefix for one blob."""
    return os.urandom(NONCE_PREFIX_SIZE)


@dataclass(frozen=True)
class KeyEnvelope:
    """The sidecar of an encrypted blob: its data key, wrapped by a master key.

    Attributes:
        key_id: id of the master key in the :class:`~shamal.artifacts.Keyring`.
        nonce_prefix: the blob's nonce prefix (also in the blob's header).
        wrap_nonce: the nonce used to wrap the data key.
        wrapped_key: data key + GCM tag, sealed by the master key.
        chunk_size: plaintext bytes per frame.
    """

    key_id: str
    nonce_prefix: bytes
    wrap_nonce: bytes
    wrapped_key: bytes
    chunk_size: int = CHUNK_SIZE

    def to_json(self) -> bytes:
        """The sidecar's stored form."""
        doc = {
            "version": 1,
            "algorithm": _ALGORITHM,
            "key_id": self.key_id,
            "nonce_prefix": base64.b64encode(self.nonce_prefix).decode(),
            "wrap_nonce": base64.b64encode(self.wrap_nonce).decode(),
            "wrapped_key": base64.b64encode(self.wrapped_key).decode(),
            "chunk_size": self.chunk_size,
        }
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> KeyEnvelope:
        """Parse a stored sidecar.

        Raises:
            IntegrityCheckFailed: it is not a well-formed version 1 sidecar.
        """
        try:
            doc: Any = json.loads(data)
            fields = {
                "key_id": doc["key_id"],
                "nonce_prefix": _b64(doc["nonce_prefix"], NONCE_PREFIX_SIZE),
                "wrap_nonce": _b64(doc["wrap_nonce"], _WRAP_NONCE_SIZE),
                "wrapped_key": _b64(doc["wrapped_key"], KEY_SIZE + TAG_SIZE),
                "chunk_size": doc["chunk_size"],
            }
            valid = (
                type(doc["version"]) is int
                and doc["version"] == 1
                and doc["algorithm"] == _ALGORITHM
                and len(doc) == 7
                and isinstance(fields["key_id"], str)
                and _KEY_ID.match(fields["key_id"]) is not None
                and type(fields["chunk_size"]) is int
                and 0 < fields["chunk_size"] <= MAX_CHUNK_SIZE
            )
        except (ValueError, TypeError, KeyError, binascii.Error):
            valid = False
        if not valid:
            raise _fail("malformed key sidecar")
        return cls(**fields)


def _b64(value: Any, size: int) -> bytes:
    if not isinstance(value, str):
        raise TypeError("not a string")
    raw = base64.b64decode(value.encode("ascii"), validate=True)
    if len(raw) != size:
        raise ValueError("wrong length")
    return raw


def _wrap_aad(digest: str, key_id: str, nonce_prefix: bytes, chunk_size: int) -> bytes:
    return b"\x00".join(
        (_WRAP_AAD, digest.encode(), key_id.encode(), nonce_prefix, chunk_size.to_bytes(8, "big"))
    )


def wrap_data_key(
    master_key: bytes,
    key_id: str,
    data_key: bytes,
    *,
    digest: str,
    nonce_prefix: bytes,
    chunk_size: int = CHUNK_SIZE,
) -> KeyEnvelope:
    """Seal ``data_key`` under ``master_key``, bound to the blob ``digest``."""
    wrap_nonce = os.urandom(_WRAP_NONCE_SIZE)
    aad = _wrap_aad(digest, key_id, nonce_prefix, chunk_size)
    wrapped = AESGCM(master_key).encrypt(wrap_nonce, data_key, aad)
    return KeyEnvelope(key_id, nonce_prefix, wrap_nonce, wrapped, chunk_size)


def unwrap_data_key(master_key: bytes, envelope: KeyEnvelope, *, digest: str) -> bytes:
    """Recover the data key of the blob ``digest``.

    Raises:
        IntegrityCheckFailed: wrong master key, tampered sidecar, or a sidecar
            that belongs to another blob.
    """
    aad = _wrap_aad(digest, envelope.key_id, envelope.nonce_prefix, envelope.chunk_size)
    try:
        return AESGCM(master_key).decrypt(envelope.wrap_nonce, envelope.wrapped_key, aad)
    except InvalidTag:
        raise _fail("the key sidecar does not belong to this blob or was altered") from None


def _chunk_aad(header: bytes, index: int, final: bool) -> bytes:
    return _CHUNK_AAD + header + index.to_bytes(8, "big") + (b"\x01" if final else b"\x00")


def _nonce(nonce_prefix: bytes, index: int) -> bytes:
    if index >= _MAX_CHUNKS:
        raise PayloadTooLarge("The blob is too large to encrypt")
    return nonce_prefix + index.to_bytes(4, "big")


def _take(held: list[memoryview], size: int) -> memoryview | bytes:
    """Remove the first ``size`` bytes from ``held``; no copy when one piece has them all."""
    if held and len(held[0]) >= size:
        piece = held[0][:size]
        held[0] = held[0][size:]
        if not held[0]:
            held.pop(0)
        return piece
    joined = bytearray()
    while len(joined) < size:
        need = size - len(joined)
        joined += held[0][:need]
        held[0] = held[0][need:]
        if not held[0]:
            held.pop(0)
    return bytes(joined)


def encrypt_chunks(
    chunks: Iterable[bytes],
    data_key: bytes,
    nonce_prefix: bytes,
    chunk_size: int = CHUNK_SIZE,
) -> Iterator[bytes]:
    """Stream the stored form (header, then sealed frames) of a plaintext stream.

    Holds about one frame of input and one sealed frame in memory; input chunks
    are sliced, not copied, where they line up with frames.
    """
    aead = AESGCM(data_key)
    header = MAGIC + nonce_prefix
    yield header
    held: list[memoryview] = []
    held_size = 0
    index = 0
    for chunk in chunks:
        # Held across iterations, so a buffer the producer may reuse is copied.
        data = chunk if isinstance(chunk, bytes) else bytes(chunk)
        if data:
            held.append(memoryview(data))
            held_size += len(data)
        # Keep the last piece back until the input ends: only then is it known to be final.
        while held_size > chunk_size:
            piece = _take(held, chunk_size)
            held_size -= chunk_size
            yield aead.encrypt(_nonce(nonce_prefix, index), piece, _chunk_aad(header, index, False))
            index += 1
    last = _take(held, held_size)
    yield aead.encrypt(_nonce(nonce_prefix, index), last, _chunk_aad(header, index, True))


def decrypt_chunks(
    chunks: Iterable[bytes],
    data_key: bytes,
    nonce_prefix: bytes,
    chunk_size: int = CHUNK_SIZE,
) -> Iterator[bytes]:
    """Stream the plaintext of a stored form; each frame is verified before it is released.

    Raises:
        IntegrityCheckFailed: (while iterating) a wrong header, a frame that
            fails authentication, or a stream that was cut or extended.
    """
    aead = AESGCM(data_key)
    header = MAGIC + nonce_prefix
    frame = chunk_size + TAG_SIZE
    pending = bytearray()
    header_seen = False
    index = 0
    for chunk in chunks:
        pending += chunk
        if not header_seen:
            if len(pending) < HEADER_SIZE:
                continue
            if pending[:HEADER_SIZE] != header:
                raise _fail("the header does not match the key sidecar")
            del pending[:HEADER_SIZE]
            header_seen = True
        start = 0
        while len(pending) - start > frame:
            yield _open(aead, header, index, pending[start : start + frame], final=False)
            start += frame
            index += 1
        del pending[:start]
    if not header_seen or len(pending) < TAG_SIZE:
        raise _fail("the stored object is truncated")
    yield _open(aead, header, index, pending, final=True)


def _open(aead: AESGCM, header: bytes, index: int, sealed: bytearray, *, final: bool) -> bytes:
    try:
        return aead.decrypt(
            _nonce(header[len(MAGIC) :], index), sealed, _chunk_aad(header, index, final)
        )
    except InvalidTag:
        raise _fail("a chunk failed authentication") from None


def header_nonce_prefix(head: bytes) -> bytes | None:
    """The nonce prefix in the first bytes of a stored object, or None if it has no header."""
    if len(head) < HEADER_SIZE or head[: len(MAGIC)] != MAGIC:
        return None
    return bytes(head[len(MAGIC) : HEADER_SIZE])


def plaintext_size(stored_size: int, chunk_size: int = CHUNK_SIZE) -> int:
    """Plaintext size of a stored object of ``stored_size`` bytes.

    Raises:
        IntegrityCheckFailed: the size is impossible for the format.
    """
    body = stored_size - HEADER_SIZE
    if body < TAG_SIZE:
        raise _fail("the stored object is truncated")
    frame = chunk_size + TAG_SIZE
    frames = max(1, -(-body // frame))
    if body - frame * (frames - 1) < TAG_SIZE:
        raise _fail("the stored object has an impossible size")
    return body - TAG_SIZE * frames
