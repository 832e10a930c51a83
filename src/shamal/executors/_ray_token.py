"""A Ray token made once, atomically, before a local Ray head starts.

Ray (2.5x and newer) turns token authentication on for every cluster ``ray.init()``
starts, and makes the token the first time: it writes ``~/.ray/auth_token`` with a
truncating open. Two heads started at once on one machine under one user (two servers,
or a server and a notebook) race there: one can read the file empty or replaced, and its
GCS never comes up. Creating the file with ``O_EXCL`` first, where it is missing, leaves
Ray nothing to write: every head on the machine shares the one token.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

TOKEN_BYTES = 32


def ensure_ray_token(home: Path | None = None) -> Path | None:
    """Make ``~/.ray/auth_token`` if token authentication applies and no token exists.

    Returns the token's path, or ``None`` where Ray is told where its token is
    (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``) or that there is none
    (``RAY_AUTH_MODE`` other than ``token``). An existing file is never touched.
    """
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None and mode.lower() != "token":
        return None
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return None
    folder = (home or Path.home()) / ".ray"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / "auth_token"
    if path.exists():
        return path
    partial = folder / f".auth_token.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(TOKEN_BYTES))
        with contextlib.suppress(FileExistsError):  # a token made meanwhile stays
            os.link(partial, path)  # atomic
    finally:
        partial.unlink(missing_ok=True)
    return path
