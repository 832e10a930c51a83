"""Page tokens: offset pages for searches, keyset pages for metric histories.

Both are opaque to clients (url-safe base64) and checked when they come back: a token this
server did not make is a 400, never a query.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from typing import TypeVar

from shamal.errors import InvalidParameter
from shamal.tracking._entities import HistoryRow, Page
from shamal.tracking._filters import decode_page_token, encode_page_token

T = TypeVar("T")

# A history token is the last point a page held: step, timestamp (int64), value (double),
# is_nan, packed little-endian.
_HISTORY_POINT = struct.Struct("<qqd?")
_HISTORY_TOKEN_LENGTH = len(base64.urlsafe_b64encode(bytes(_HISTORY_POINT.size)).rstrip(b"="))


def check_page_size(max_results: int, cap: int) -> int:
    """``max_results`` when it is 1 to ``cap``; the stock server's 400 otherwise.

    Raises:
        InvalidParameter: 0, a negative number or more than ``cap``.
    """
    if max_results < 1:
        raise InvalidParameter(
            f"Invalid value {max_results} for parameter 'max_results' supplied. "
            "It must be a positive integer."
        )
    if max_results > cap:
        raise InvalidParameter(
            f"Invalid value {max_results} for parameter 'max_results' supplied. "
            f"It must be at most {cap}."
        )
    return max_results


def page_of(items: list[T], offset: int, limit: int) -> Page[T]:
    """``items`` was fetched with ``limit + 1`` rows: one more means there is a next page."""
    more = len(items) > limit
    return Page(items[:limit], encode_page_token(offset + limit) if more else None)


def resume_token(token: str | None, index: int) -> str:
    """The offset token of the item ``index`` places after where ``token`` starts: where a
    page cut short for its size resumes."""
    return encode_page_token(decode_page_token(token) + index)


def history_page(rows: list[HistoryRow], limit: int) -> Page[HistoryRow]:
    """``rows`` was fetched with ``limit + 1`` points: one more means there is a next page,
    which starts after the last point kept."""
    if len(rows) <= limit:
        return Page(rows)
    del rows[limit:]
    return Page(rows, encode_history_token(rows[-1]))


def encode_history_token(point: HistoryRow) -> str:
    """The token for the page after ``point`` (step, timestamp, value, is_nan)."""
    step, timestamp, value, nan = point
    packed = _HISTORY_POINT.pack(step, timestamp, value, bool(nan))
    return base64.urlsafe_b64encode(packed).rstrip(b"=").decode("ascii")


def decode_history_token(token: str | None) -> tuple[int, int, float, bool] | None:
    """The point a token from :func:`encode_history_token` stands for; None or "" is None.

    Raises:
        InvalidParameter: a token this server did not make (wrong length, bad base64, a
            NaN value, which no stored point has).
    """
    if token is None or token == "":
        return None
    if not isinstance(token, str) or len(token) != _HISTORY_TOKEN_LENGTH:
        raise InvalidParameter("Invalid page_token: malformed token.")
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
        step, timestamp, value, nan = _HISTORY_POINT.unpack(raw)
    except (binascii.Error, ValueError, struct.error):
        raise InvalidParameter("Invalid page_token: malformed token.") from None
    if math.isnan(value):
        raise InvalidParameter("Invalid page_token: malformed token.")
    return step, timestamp, value, nan
