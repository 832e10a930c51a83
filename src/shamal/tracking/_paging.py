"""Offset pages with opaque tokens, shared by every search of the domain."""

from __future__ import annotations

from typing import TypeVar

from shamal.tracking._entities import Page
from shamal.tracking._filters import encode_page_token

T = TypeVar("T")


def page_of(items: list[T], offset: int, limit: int) -> Page[T]:
    """``items`` was fetched with ``limit + 1`` rows: one more means there is a next page."""
    more = len(items) > limit
    return Page(items[:limit], encode_page_token(offset + limit) if more else None)
