"""API token secrets: 256 random bits, shown once, stored as SHA-256; and the names of the
tokens the scheduler issues to job attempts."""

from __future__ import annotations

import hashlib
import re
import secrets

TOKEN_PREFIX = "shm_"
_TOKEN_RE = re.compile(r"^shm_[A-Za-z0-9_-]{43}$")
#: How many leading characters of a job's id its tokens' names carry.
JOB_PREFIX_CHARS = 12
_JOB_TOKEN_NAME_RE = re.compile(rf"^job-([0-9a-f]{{{JOB_PREFIX_CHARS}}})-[0-9]+$")


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


def job_token_name(job_id: str, attempt: int) -> str:
    """The name of the token the scheduler issues to attempt ``attempt`` of job ``job_id``:
    ``job-<first 12 characters of the id>-<attempt>``."""
    return f"job-{job_id[:JOB_PREFIX_CHARS]}-{attempt}"


def job_of_token_name(name: str) -> str | None:
    """The job id prefix (12 lower-case hex digits) a name made by :func:`job_token_name`
    carries, else None. Only meaningful for a token of scope ``job``: a person may give
    their own token any name."""
    found = _JOB_TOKEN_NAME_RE.fullmatch(name)
    return None if found is None else found.group(1)
