"""HTTP bodies of artifacts: a request body handed chunk by chunk to blocking code in a
worker thread, and the headers of a download."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar
from urllib.parse import quote

import anyio.from_thread
import anyio.to_thread
from starlette.requests import Request

from shamal.artifacts._entities import ArtifactFile

T = TypeVar("T")


async def consume_body(request: Request, work: Callable[[Iterator[bytes]], T]) -> T:
    """Run ``work(chunks)`` in a worker thread while the body streams in.

    ``chunks`` pulls each piece from the event loop as it arrives: the body is
    never buffered whole, and the request guard's size limit still applies.
    """
    body = request.stream().__aiter__()

    async def next_chunk() -> bytes | None:
        try:
            return await body.__anext__()
        except StopAsyncIteration:
            return None

    def chunks() -> Iterator[bytes]:
        while (chunk := anyio.from_thread.run(next_chunk)) is not None:
            if chunk:
                yield chunk

    return await anyio.to_thread.run_sync(lambda: work(chunks()))


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
