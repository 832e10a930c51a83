"""Secrets out of access logs: a logging filter for uvicorn's access lines.

uvicorn writes the request's path *and query string* as received. Clients put tokens there
(``?token=``, ``?access_token=``, a pre-signed URL's signature, a token pasted into a path), and
a log is read by more people, kept longer and shipped further than the token was meant to be.
Headers are never logged, so ``Authorization`` needs nothing here.

Two rules, both on the text as logged: anything shaped like a Shamal token (``shm_`` and its
random part, ``_`` possibly percent-encoded) becomes ``shm_***`` wherever it stands; the value of
a query parameter whose name says it is a credential becomes ``***``.
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Any
from urllib.parse import unquote_plus

from uvicorn.config import LOGGING_CONFIG

__all__ = ["RedactSecrets", "access_log_config", "redact_target"]

_TOKEN = re.compile(r"shm(?:_|%5f)[A-Za-z0-9_%-]{8,}", re.IGNORECASE)
#: Query parameter names (lower case, ``-`` as ``_``) whose values are credentials.
SECRET_PARAMETERS = frozenset(
    {
        "token",
        "access_token",
        "id_token",
        "refresh_token",
        "auth",
        "authorization",
        "api_key",
        "apikey",
        "key",
        "secret",
        "client_secret",
        "password",
        "passwd",
        "code",
        "sig",
        "signature",
        "x_amz_signature",
        "x_amz_credential",
        "x_amz_security_token",
        "jwt",
        "session",
    }
)
MASK = "***"


def _redact_query(query: str) -> str:
    parts = re.split(r"([&;])", query)
    for i in range(0, len(parts), 2):
        name, equals, _ = parts[i].partition("=")
        if equals and unquote_plus(name).strip().lower().replace("-", "_") in SECRET_PARAMETERS:
            parts[i] = f"{name}={MASK}"
    return "".join(parts)


def redact_target(target: str) -> str:
    """``target`` (a path with its query string, as uvicorn logs it) without credentials."""
    target = _TOKEN.sub("shm_" + MASK, target)
    path, mark, query = target.partition("?")
    if not mark:
        return path
    return f"{path}?{_redact_query(query)}"


class RedactSecrets(logging.Filter):
    """Redacts every string argument of a record (uvicorn's access line passes the request
    target as one); the record always passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and args:
            record.args = tuple(redact_target(a) if isinstance(a, str) else a for a in args)
        if isinstance(record.msg, str) and not args:
            record.msg = redact_target(record.msg)
        return True


def access_log_config() -> dict[str, Any]:
    """uvicorn's logging configuration with :class:`RedactSecrets` on its access logger
    (a dictionary, so worker processes apply it too)."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["redact_secrets"] = {"()": RedactSecrets}
    config["loggers"]["uvicorn.access"]["filters"] = ["redact_secrets"]
    return config
