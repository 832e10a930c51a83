"""API token secrets: 256 random bits, shown once, stored as SHA-256."""

from __future__ import annotations

import hashlib
import re
import secrets

TOKEN_PREFIX = "shm_"
_TOKEN_RE = re.compile(r"^shm_[A-Za-z0-9_-]{43}$")


def new_secret() -> str:
    """A fresh token secret: ``shm_`` + 32 random bytes in URL-safe base64."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def looks_like_token(value: str) -> bool:
    return bool(_TOKEN_RE.fullmatch(value))


def display_prefix(secret: str) -> str:
    """The part of a secret that may be shown in listings to tell tokens apart."""
    return secret[: len(TOKEN_PREFIX) + 6]
