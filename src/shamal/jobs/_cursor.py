"""The job list's page token, made and read in one place (the API's and the web UI's queue).

Kept apart from :mod:`shamal.jobs._schemas`, which the CLI imports: the cursor helpers come
from :mod:`shamal.api`, and that loads FastAPI.
"""

from __future__ import annotations

from datetime import datetime

from shamal.api import decode_cursor, encode_cursor
from shamal.errors import InvalidParameter

__all__ = ["job_cursor", "job_cursor_after"]


def job_cursor(submitted_at: datetime, job_id: str) -> str:
    """The page token after a job in the newest-first list (the API's and the web UI's)."""
    return encode_cursor(submitted_at.isoformat(), job_id)


def job_cursor_after(token: str | None) -> tuple[datetime, str] | None:
    """The (submitted_at, id) a page token of :func:`job_cursor` names; None for none.

    Raises:
        InvalidParameter: a token this server did not make.
    """
    key = decode_cursor(token, str, str)
    if key is None:
        return None
    try:
        return datetime.fromisoformat(key[0]), key[1]
    except ValueError:
        raise InvalidParameter("Invalid page token.") from None
