"""Experiment tracking: experiments, runs, params, metrics, tags, datasets, logged models."""

from __future__ import annotations

from shamal.tracking._entities import Run
from shamal.tracking._filters import (
    EXPERIMENTS,
    LOGGED_MODELS,
    MAX_PAGE_OFFSET,
    MODEL_VERSIONS,
    REGISTERED_MODELS,
    RUNS,
    Comparison,
    Grammar,
    OrderBy,
    decode_page_token,
    encode_page_token,
    parse_filter,
    parse_order_by,
)
from shamal.tracking._paging import resume_token
from shamal.tracking._search import compare, sort_key
from shamal.tracking._service import TrackingService

__all__ = [
    "EXPERIMENTS",
    "LOGGED_MODELS",
    "MAX_PAGE_OFFSET",
    "MODEL_VERSIONS",
    "REGISTERED_MODELS",
    "RUNS",
    "Comparison",
    "Grammar",
    "OrderBy",
    "Run",
    "TrackingService",
    "compare",
    "decode_page_token",
    "encode_page_token",
    "parse_filter",
    "parse_order_by",
    "resume_token",
    "sort_key",
]
