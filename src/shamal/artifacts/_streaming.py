"""HTTP bodies of artifacts: a request body gathered on the event loop and then handed to
blocking code in a worker thread, the per-account caps on what streams at once, and the
headers of a download.

A body that trickles in holds no worker thread: it is read with ``async for`` and gathered
in memory, then (past :data:`SPOOL_IN_MEMORY` bytes) in a spool file written a batch at a
time from a worker thread, which it holds only for that write. Only once the whole body is
here does the store's blocking ``work`` run, at the disk's pace, not the client's. A body
cut off (the request guard's size, pace and stall limits, or a client that goes away)
never reaches ``work``, and its spool file is removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import IO, TypeVar
from urllib.parse import quote

import anyio.to_thread
from starlette.requests import Request

from shamal.artifacts._entities import ArtifactFile
from shamal.errors import TooManyRequests
from shamal.security.api import CurrentPrincipal

__all__ = [
    "SPOOL_IN_MEMORY",
    "PrincipalSlots",
    "consume_body",
    "download_headers",
    "download_slot",
    "principal_key",
    "search_slot",
    "sweep_spool",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: A body up to this size stays in memory; a larger one goes to a spool file, written in
#: batches of about this size.
SPOOL_IN_MEMORY = 256 * 1024
#: What ``work`` reads from a spool file at a time.
_SPOOL_READ = 1024 * 1024
_SPOOL_PREFIX = "upload-"
#: Seconds a caller turned away by :class:`PrincipalSlots` is told to wait.
_RETRY_AFTER_S = 1.0


class PrincipalSlots:
    """At most ``limit`` of one kind of request at once per account. Thread-safe.

    Args:
        what: what is counted, for the 429's message ("uploads").
        limit: how many one account may hold at once.
    """

    def __init__(self, what: str, limit: int) -> None:
        self._what = what
        self._limit = limit
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def in_use(self, key: str) -> int:
        """How many ``key`` holds now."""
        with self._lock:
            return self._held.get(key, 0)

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        """Hold one of ``key``'s slots for the ``with`` block.

        Raises:
            TooManyRequests: ``key`` holds ``limit`` already (429 with ``Retry-After``).
        """
        with self._lock:
            count = self._held.get(key, 0)
            if count >= self._limit:
                raise TooManyRequests(
                    f"At most {self._limit} {self._what} at once per account; retry later.",
                    retry_after_s=_RETRY_AFTER_S,
                )
            self._held[key] = count + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._held[key] - 1
                if left:
                    self._held[key] = left
                else:
                    del self._held[key]


def principal_key(request: Request) -> str:
    """Whom a request counts against: its authenticated account (the auth dependency has
    run by the time an endpoint reads its body), else its peer address."""
    principal = getattr(request.state, "principal", None)
    if principal is not None:
        return f"user:{principal.user.id}"
    return f"peer:{request.client.host if request.client else '-'}"


async def search_slot(request: Request, principal: CurrentPrincipal) -> AsyncIterator[None]:
    """A dependency: hold one of the caller's search slots (``max_searches_per_principal``)
    while the endpoint builds its page.

    Raises:
        TooManyRequests: the account runs as many searches as it may already.
    """
    slots: PrincipalSlots = request.app.state.search_slots
    with slots.hold(f"user:{principal.user.id}"):
        yield


async def download_slot(request: Request, principal: CurrentPrincipal) -> AsyncIterator[None]:
    """A dependency: hold one of the caller's download slots
    (``max_downloads_per_principal``) until the answer is sent in full.

    Give it ``scope="request"``: its exit then runs once the response has been sent, so a
    streamed file holds the slot until its last byte is out (or the client goes away), not
    only while the endpoint opens it. Downloads and job-log reads count here.

    Raises:
        TooManyRequests: the account streams as many downloads as it may already.
    """
    slots = _download_slots(request)
    with slots.hold(f"user:{principal.user.id}"):
        yield


_LAZY_SLOTS = threading.Lock()


def _download_slots(request: Request) -> PrincipalSlots:
    """The app's download slots, made on first use (the app may have made them already)."""
    state = request.app.state
    slots: PrincipalSlots | None = getattr(state, "download_slots", None)
    if slots is None:
        with _LAZY_SLOTS:
            slots = getattr(state, "download_slots", None)
            if slots is None:
                limit = int(request.app.state.settings.max_downloads_per_principal)
                slots = PrincipalSlots("downloads", limit)
                state.download_slots = slots
    return slots


class _Spool:
    """A body gathered in memory, then in an unnamed-on-close spool file."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._memory = bytearray()
        self._file: IO[bytes] | None = None
        self._path: Path | None = None

    def _open(self) -> IO[bytes]:
        self._folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=_SPOOL_PREFIX, dir=self._folder)  # mode 0600
        self._path = Path(name)
        return os.fdopen(fd, "w+b")

    async def add(self, chunk: bytes) -> None:
        self._memory += chunk
        if len(self._memory) < SPOOL_IN_MEMORY:
            return
        if self._file is None:
            self._file = await anyio.to_thread.run_sync(self._open)
        batch = bytes(self._memory)
        self._memory.clear()
        await anyio.to_thread.run_sync(self._file.write, batch)

    def chunks(self) -> Iterator[bytes]:
        """The whole body, in pieces (blocking: for the worker thread)."""
        if self._file is None:
            if self._memory:
                yield bytes(self._memory)
            return
        if self._memory:
            self._file.write(self._memory)
            self._memory.clear()
        self._file.flush()
        self._file.seek(0)
        while chunk := self._file.read(_SPOOL_READ):
            yield chunk

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._path.unlink()


async def consume_body(request: Request, work: Callable[[Iterator[bytes]], T]) -> T:
    """Gather the body without holding a thread, then run ``work(chunks)`` in one.

    The caller's account may stream ``max_uploads_per_principal`` bodies at once; the
    request guard's size, stall and pace limits apply while the body comes in.

    Raises:
        TooManyRequests: the account streams as many bodies as it may already.
    """
    settings = request.app.state.settings
    slots: PrincipalSlots = request.app.state.upload_slots
    with slots.hold(principal_key(request)):
        spool = _Spool(settings.resolved_upload_spool_dir)
        try:
            async for chunk in request.stream():
                if chunk:
                    await spool.add(chunk)
            return await anyio.to_thread.run_sync(lambda: work(spool.chunks()))
        finally:
            await anyio.to_thread.run_sync(spool.close)


def sweep_spool(folder: Path) -> int:
    """Remove spool files left by a server that died mid-upload; returns how many. Safe
    while other processes upload: a spool file is read through the descriptor that wrote it,
    so removing its name takes nothing from a body still in flight."""
    removed = 0
    with contextlib.suppress(FileNotFoundError):
        for path in folder.glob(f"{_SPOOL_PREFIX}*"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
    if removed:
        logger.info("removed %d spool files of interrupted uploads", removed)
    return removed


def download_headers(found: ArtifactFile) -> dict[str, str]:
    """Length, digest and an ``attachment`` disposition named after the file (RFC 6266:
    an ASCII fallback name and the exact name percent-encoded as UTF-8), so a browser saves
    the file instead of rendering it, under its own name."""
    name = found.path.rsplit("/", 1)[-1]
    fallback = "".join(c if " " <= c <= "~" and c not in '"\\' else "_" for c in name)
    return {
        "Content-Length": str(found.size),
        "ETag": f'"{found.digest}"',
        "X-Content-SHA256": found.digest,
        "Content-Disposition": (
            f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"
        ),
    }
