"""Experiment tracking: experiments, runs, params, metrics, tags, datasets, logged models."""

from __future__ import annotations

from shamal.tracking._access import RunAccess, UnknownExperiments
from shamal.tracking._entities import (
    Dataset,
    DatasetInput,
    Experiment,
    HistoryRow,
    LoggedModel,
    LoggedModelSpec,
    Metric,
    Run,
    RunInfo,
)
from shamal.tracking._filters import (
    EXPERIMENTS,
    LOGGED_MODELS,
    MAX_PAGE_OFFSET,
    MODEL_VERSIONS,
    REGISTERED_MODELS,
    RUNS,
    TRACES,
    Comparison,
    Grammar,
    OrderBy,
    decode_page_token,
    encode_page_token,
    parse_filter,
    parse_order_by,
)
from shamal.tracking._model_service import DEFAULT_LOGGED_MODEL_RESULTS, MAX_LOGGED_MODEL_RESULTS
from shamal.tracking._paging import check_page_size, resume_token
from shamal.tracking._sampling import MAX_SAMPLED_POINTS
from shamal.tracking._search import compare, sort_key
from shamal.tracking._service import MAX_SEARCH, LoggedData, TrackingService, view_type

__all__ = [
    "MAX_SAMPLED_POINTS",
    "DEFAULT_LOGGED_MODEL_RESULTS",
    "EXPERIMENTS",
    "LOGGED_MODELS",
    "MAX_LOGGED_MODEL_RESULTS",
    "MAX_PAGE_OFFSET",
    "MAX_SEARCH",
    "MODEL_VERSIONS",
    "REGISTERED_MODELS",
    "RUNS",
    "TRACES",
    "Comparison",
    "Dataset",
    "DatasetInput",
    "Experiment",
    "Grammar",
    "HistoryRow",
    "LoggedData",
    "LoggedModel",
    "LoggedModelSpec",
    "Metric",
    "OrderBy",
    "Run",
    "RunAccess",
    "RunInfo",
    "TrackingService",
    "UnknownExperiments",
    "check_page_size",
    "compare",
    "decode_page_token",
    "encode_page_token",
    "parse_filter",
    "parse_order_by",
    "resume_token",
    "sort_key",
    "view_type",
]
