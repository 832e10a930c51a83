"""What the traces domain hands to callers: frozen values, never ORM rows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: A trace's states, as MLflow's ``TraceInfoV3.State`` names them.
TRACE_STATES = ("STATE_UNSPECIFIED", "OK", "ERROR", "IN_PROGRESS")
#: A span's status codes, as a stock server stores them (``span.status`` searches these).
SPAN_STATUSES = ("UNSET", "OK", "ERROR")

#: The tag that says where a trace's spans are: Shamal keeps every span in its database.
SPANS_LOCATION_TAG = "mlflow.trace.spansLocation"
SPANS_IN_TRACKING_STORE = "TRACKING_STORE"
#: The tag that names a trace (searched as ``name``), and where its attachments go.
TRACE_NAME_TAG = "mlflow.traceName"
ARTIFACT_LOCATION_TAG = "mlflow.artifactLocation"
#: The metadata that names the run a trace was made in (searched as ``run_id``).
SOURCE_RUN_METADATA = "mlflow.sourceRun"


@dataclass(frozen=True, slots=True)
class TraceInfo:
    """A trace's info (MLflow's ``TraceInfoV3``); times in epoch milliseconds."""

    trace_id: str
    experiment_id: str
    request_time: int
    state: str
    client_request_id: str | None = None
    execution_duration: int | None = None
    request_preview: str | None = None
    response_preview: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Span:
    """One span as stored: its searchable fields, the whole span as OTLP protobuf JSON and
    the text full-text searches read.

    ``trace_id`` is the MLflow trace id (``tr-`` and the OpenTelemetry trace id in hex);
    span ids are 16 hex digits; times are epoch nanoseconds.
    """

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    span_type: str | None
    status: str
    start_time_ns: int
    end_time_ns: int | None
    content: str
    #: What ``trace.text`` searches: the span as the client's own form spells it (MLflow's
    #: span dict as JSON), so that a search matches what it matches on a stock server and
    #: not OTLP's own key names. Left out (None) when read back; ``content`` when not given.
    search_text: str | None = None
    #: The span's inputs and outputs (JSON text) when it carries them: a root span's give
    #: the trace's request and response previews.
    inputs: str | None = None
    outputs: str | None = None


@dataclass(frozen=True, slots=True)
class Trace:
    """A trace's info and its spans (by start time)."""

    info: TraceInfo
    spans: tuple[Span, ...]
