"""What every domain's HTTP API shares: the error body, the documented statuses, paging.

Domains build their routers (``<domain>/api.py``) on these; the MLflow dialect
(:mod:`shamal.mlflow`) writes its search pages with :func:`gather_page` too.
"""

from __future__ import annotations

from shamal.api._errors import BINARY_BODY, ERROR_RESPONSES, ErrorBody
from shamal.api._paging import (
    NEXT_PAGE_HEADER,
    PAGE_BATCH,
    PAGE_FIRST_BATCH,
    ListPage,
    PageBytes,
    PageOf,
    PageToken,
    bounded_list,
    bounded_listing,
    decode_cursor,
    encode_cursor,
    gather_page,
    keyset_page,
    model_json,
    special_value,
)

__all__ = [
    "BINARY_BODY",
    "ERROR_RESPONSES",
    "NEXT_PAGE_HEADER",
    "PAGE_BATCH",
    "PAGE_FIRST_BATCH",
    "ErrorBody",
    "ListPage",
    "PageBytes",
    "PageOf",
    "PageToken",
    "bounded_list",
    "bounded_listing",
    "decode_cursor",
    "encode_cursor",
    "gather_page",
    "keyset_page",
    "model_json",
    "special_value",
]
