"""Hand a request body, chunk by chunk, to blocking code in a worker thread."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import anyio.from_thread
import anyio.to_thread
from starlette.requests import Request

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
