"""Paging every HTTP API shares: pages bounded in items and in bytes, keyset tokens.

A page holds at most ``max_results`` items and, past its first item, ``max_page_bytes`` bytes
of JSON; the store is read in batches and items are written as they come, so a server holds
one batch and one page whatever a client asks for. The MLflow dialect writes its search pages
with :func:`gather_page`; the native API's lists are JSON arrays (:func:`bounded_list`) or
listing objects (:func:`bounded_listing`) whose next page token travels in
:data:`NEXT_PAGE_HEADER` or the body.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Generic, Protocol, TypeVar

import orjson
from fastapi import Depends, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel

from shamal.errors import InvalidParameter

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

#: Items a bounded page reads from its store at a time, at most: what it holds besides the
#: JSON. The first read takes ``PAGE_FIRST_BATCH``; the next ones as many as the bytes left
#: would hold at the average size so far.
PAGE_BATCH = 1000
PAGE_FIRST_BATCH = 100


class PageOf(Protocol[T_co]):
    """A page as the domain services return it."""

    @property
    def items(self) -> Sequence[T_co]: ...

    @property
    def next_page_token(self) -> str | None: ...


def gather_page(
    fetch: Callable[[int, str | None], PageOf[T]],
    encode: Callable[[T], bytes],
    *,
    max_results: int,
    page_token: str | None,
    max_bytes: int,
    resume_at: Callable[[str | None, int], str] | None = None,
    cursor_of: Callable[[T], str] | None = None,
) -> tuple[list[bytes], str | None]:
    """The encoded items of one page and the token of the next (None: none), as
    :func:`bounded_page` describes; the domain's APIs write them in their own shapes.

    A page cut short for its size resumes at ``resume_at(token of the batch, index in it)``
    (offset tokens) or, for keyset tokens, at ``cursor_of(the last item it holds)``; one of
    the two is given.
    """
    if (resume_at is None) == (cursor_of is None):
        raise ValueError("give resume_at or cursor_of")
    parts: list[bytes] = []
    size = 0
    token = page_token
    left = max_results
    batch = PAGE_FIRST_BATCH
    last: T | None = None
    while True:
        page = fetch(min(left, batch), token)
        for index, item in enumerate(page.items):
            part = encode(item)
            if parts and size + len(part) > max_bytes:
                if cursor_of is not None:
                    assert last is not None  # the first item always goes in
                    return parts, cursor_of(last)
                assert resume_at is not None
                return parts, resume_at(token, index)
            parts.append(part)
            size += len(part) + 1
            last = item
        left -= len(page.items)
        if page.next_page_token is None or left <= 0 or not page.items:
            return parts, page.next_page_token
        token = page.next_page_token
        average = max(size // max(len(parts), 1), 1)
        batch = max(1, min(PAGE_BATCH, (max_bytes - size) // average + 1))


# ---------------------------------------------------------------- the native API's lists

#: The header of a native list answer (a JSON array) that stops before the end: the
#: ``page_token`` of the next page. Absent on the last page.
NEXT_PAGE_HEADER = "X-Shamal-Next-Page-Token"


@dataclass(frozen=True)
class ListPage(Generic[T]):
    """A batch of items read for a bounded list, and the token of the batch after it."""

    items: Sequence[T]
    next_page_token: str | None = None


def keyset_page(items: Sequence[T], limit: int, cursor_of: Callable[[T], str]) -> ListPage[T]:
    """``items``, read with ``limit``, as a page: a full batch may have more after it, which
    starts after its last item."""
    more = bool(items) and len(items) >= limit
    return ListPage(items, cursor_of(items[-1]) if more else None)


def encode_cursor(*key: str | int) -> str:
    """An opaque page token for the keyset ``key`` (the sort key of the last item a page
    holds): url-safe base64 of its JSON."""
    return base64.urlsafe_b64encode(orjson.dumps(list(key))).rstrip(b"=").decode("ascii")


def decode_cursor(token: str | None, *kinds: type[str] | type[int]) -> tuple[Any, ...] | None:
    """The key a token of :func:`encode_cursor` stands for, each part of type ``kinds[i]``;
    None or "" is None.

    Raises:
        InvalidParameter: a token this server did not make, or one of another listing.
    """
    if not token:
        return None
    try:
        key = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, binascii.Error):
        raise InvalidParameter("Invalid page token.") from None
    if not isinstance(key, list) or len(key) != len(kinds):
        raise InvalidParameter("Invalid page token.")
    for part, kind in zip(key, kinds, strict=True):
        # bool is an int to Python, never to a token.
        if type(part) is not kind:
            raise InvalidParameter("Invalid page token.")
    return tuple(key)


def bounded_list(
    fetch: Callable[[int, str | None], PageOf[T]],
    encode: Callable[[T], bytes],
    *,
    max_results: int,
    page_token: str | None,
    max_bytes: int,
    cursor_of: Callable[[T], str],
) -> Response:
    """A native list answer: a JSON array of at most ``max_results`` items and, past the
    first, ``max_bytes`` bytes; when more follow, :data:`NEXT_PAGE_HEADER` holds the keyset
    token that resumes after its last item (see :func:`gather_page`)."""
    parts, token = gather_page(
        fetch,
        encode,
        max_results=max_results,
        page_token=page_token,
        max_bytes=max_bytes,
        cursor_of=cursor_of,
    )
    headers = None if token is None else {NEXT_PAGE_HEADER: token}
    return Response(b"[" + b",".join(parts) + b"]", media_type="application/json", headers=headers)


def bounded_listing(
    fetch: Callable[[int, str | None], PageOf[T]],
    encode: Callable[[T], bytes],
    *,
    max_results: int,
    page_token: str | None,
    max_bytes: int,
    resume_at: Callable[[str | None, int], str] | None = None,
    cursor_of: Callable[[T], str] | None = None,
) -> Response:
    """A native listing object, ``{"items": [...], "next_page_token": ...}`` (null on the
    last page), bounded as :func:`gather_page` says."""
    parts, token = gather_page(
        fetch,
        encode,
        max_results=max_results,
        page_token=page_token,
        max_bytes=max_bytes,
        resume_at=resume_at,
        cursor_of=cursor_of,
    )
    body = b'{"items":[' + b",".join(parts) + b'],"next_page_token":' + orjson.dumps(token) + b"}"
    return Response(body, media_type="application/json")


async def _page_bytes(request: Request) -> int:
    return int(request.app.state.settings.max_page_bytes)


#: A dependency: the most bytes of JSON a list or search page holds past its first item
#: (``max_page_bytes``).
PageBytes = Annotated[int, Depends(_page_bytes)]
#: A list route's ``page_token`` query parameter.
PageToken = Annotated[
    str | None,
    Query(
        max_length=65_536, description=f"Where to resume: the {NEXT_PAGE_HEADER} of the page before"
    ),
]


def model_json(model: BaseModel) -> bytes:
    """A pydantic answer model as FastAPI writes it."""
    return model.__pydantic_serializer__.to_json(model, by_alias=True)


def special_value(value: float, nan: Any) -> str:
    """Protobuf's JSON spelling of a stored NaN (flag set) or an infinity."""
    if nan or math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"
