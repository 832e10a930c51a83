"""Traces: MLflow 3's tracing and OpenTelemetry spans, kept in the metadata database.

A trace (its info, tags, metadata, spans and links to runs) belongs to an experiment and
follows that experiment's team roles, as its runs do. The MLflow dialect
(:mod:`shamal.mlflow`) speaks the wire formats: MLflow's trace API and OTLP span ingestion.
"""

from __future__ import annotations

from shamal.traces._entities import (
    SPAN_STATUSES,
    TRACE_STATES,
    Span,
    Trace,
    TraceInfo,
)
from shamal.traces._npmi import Correlation
from shamal.traces._service import (
    DEFAULT_SEARCH_RESULTS,
    MAX_BATCH_FULL_TRACES,
    MAX_BATCH_TRACES,
    MAX_SEARCH_RESULTS,
    MAX_SPAN_BYTES,
    MAX_SPANS_PER_REQUEST,
    MAX_SPANS_PER_TRACE,
    MAX_TRACE_BYTES,
    TracePage,
    TraceService,
    check_trace_id,
)

__all__ = [
    "DEFAULT_SEARCH_RESULTS",
    "MAX_BATCH_FULL_TRACES",
    "MAX_BATCH_TRACES",
    "MAX_SEARCH_RESULTS",
    "MAX_SPANS_PER_REQUEST",
    "MAX_SPANS_PER_TRACE",
    "MAX_SPAN_BYTES",
    "MAX_TRACE_BYTES",
    "SPAN_STATUSES",
    "TRACE_STATES",
    "Correlation",
    "Span",
    "Trace",
    "TraceInfo",
    "TracePage",
    "TraceService",
    "check_trace_id",
]
