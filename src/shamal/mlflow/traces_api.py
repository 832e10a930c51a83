"""MLflow 3 traces in the dialect (`/api/{2.0,3.0}/mlflow/traces/...`, and the UI's
`/ajax-api/...`), and OTLP/HTTP span ingestion (`POST /v1/traces`).

The stock client logs a trace in two steps: each span, as it ends, to `/v1/traces` (an
OTLP ``ExportTraceServiceRequest`` whose ``x-mlflow-experiment-id`` header names the
experiment), then the trace's info, when the trace ends, to `StartTraceV3`. Any
OpenTelemetry exporter pointed at `/v1/traces` with that header (and a bearer token)
records traces the same way. Beside MLflow 3's calls: MLflow 2's StartTrace, EndTrace and
GetTraceInfo, filter correlations (NPMI) and ``get-trace-artifact`` (the spans as the
``traces.json`` the stock UI reads). Assessments, evaluation datasets, scorers and trace
metrics have no route: they answer ``ENDPOINT_NOT_FOUND``, as a server without them does.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from shamal.api import PageBytes
from shamal.errors import InvalidParameter
from shamal.mlflow._fields import (
    Fields,
    ProtoJSONResponse,
    bounded_page,
    proto_json,
    read_fields,
)
from shamal.mlflow._otlp import decode_export_request, inflate
from shamal.mlflow._trace_json import (
    legacy_status,
    legacy_trace_info_json,
    trace_data_json,
    trace_info_json,
    trace_info_of,
    trace_json,
)
from shamal.mlflow._tracking_json import pairs_of
from shamal.mlflow.tracking_api import SEARCH_SLOT
from shamal.security import AuditContext, Principal
from shamal.security.api import CurrentPrincipal, audited, data_plane_write, read_only_post
from shamal.traces import DEFAULT_SEARCH_RESULTS, MAX_SEARCH_RESULTS, TraceInfo, TraceService
from shamal.tracking import check_page_size, resume_token

__all__ = ["EXPERIMENT_ID_HEADER", "OTLP_TRACES_PATH", "router"]

#: Where OTLP/HTTP exporters send spans, and the header that names their experiment (as
#: MLflow's own exporter and a stock server spell them).
OTLP_TRACES_PATH = "/v1/traces"
EXPERIMENT_ID_HEADER = "x-mlflow-experiment-id"


async def _fields(request: Request) -> Fields:
    return await read_fields(request)


async def get_traces(request: Request) -> TraceService:
    service: TraceService = request.app.state.traces
    return service


async def _body(request: Request) -> bytes:
    return await request.body()


F = Annotated[Fields, Depends(_fields)]
Traces = Annotated[TraceService, Depends(get_traces)]
Writer = Annotated[Principal, Depends(data_plane_write)]
Searcher = Annotated[Principal, Depends(read_only_post)]

traces = APIRouter(include_in_schema=False, default_response_class=ProtoJSONResponse)


def _strings(f: Fields, name: str) -> list[str]:
    values = f.many(name)
    if not all(isinstance(v, str) for v in values):
        raise InvalidParameter(f"Parameter '{name}' must be a list of strings.")
    return values


def _locations(f: Fields) -> list[str]:
    """The experiments a search covers: its ``locations`` (v3) or ``experiment_ids``."""
    ids = _strings(f, "experiment_ids")
    for location in f.objects("locations"):
        where = location.get("mlflow_experiment")
        experiment_id = where.get("experiment_id") if isinstance(where, dict) else None
        if not isinstance(experiment_id, str):
            raise InvalidParameter(
                "A search location must be an MLflow experiment (mlflow_experiment.experiment_id)."
            )
        ids.append(experiment_id)
    if not ids:
        raise InvalidParameter("At least one location (an experiment) must be specified.")
    return ids


# The fixed paths first: `/traces/{trace_id}` would take `get` and `batchGet` as ids.
@traces.post("/traces")
def start_trace(f: F, svc: Traces, p: Writer) -> ProtoJSONResponse:
    """StartTraceV3 (the client sends it when the trace ends, after its spans); a body
    without ``trace`` is MLflow 2's StartTrace, which opens a trace to end later."""
    if f.raw("trace") is None and f.raw("experiment_id") is not None:
        return _start_legacy_trace(f, svc, p)
    saved = svc.start(p, trace_info_of(f.raw("trace")))
    return proto_json({"trace": {"trace_info": trace_info_json(saved)}})


def _start_legacy_trace(f: Fields, svc: TraceService, p: Principal) -> ProtoJSONResponse:
    info = TraceInfo(
        trace_id=f"tr-{uuid.uuid4().hex}",
        experiment_id=f.required("experiment_id"),
        request_time=f.integer("timestamp_ms", default=svc.now_ms()) or 0,
        state="IN_PROGRESS",
        metadata=dict(pairs_of(f.objects("request_metadata"), "request_metadata")),
        tags=dict(pairs_of(f.objects("tags"), "tag")),
    )
    return proto_json({"trace_info": legacy_trace_info_json(svc.start(p, info))})


@traces.patch("/traces/{trace_id}")
def end_trace(trace_id: str, f: F, svc: Traces, p: Writer) -> ProtoJSONResponse:
    """MLflow 2's EndTrace."""
    info = svc.end(
        p,
        trace_id,
        end_ms=f.integer("timestamp_ms", default=svc.now_ms()) or 0,
        state=legacy_status(f.raw("status")),
        metadata=dict(pairs_of(f.objects("request_metadata"), "request_metadata")),
        tags=dict(pairs_of(f.objects("tags"), "tag")),
    )
    return proto_json({"trace_info": legacy_trace_info_json(info)})


@traces.get("/get-trace-artifact")
def get_trace_artifact(f: F, svc: Traces, p: CurrentPrincipal) -> Response:
    """The trace's spans as MLflow's ``traces.json`` (the stock UI reads a trace so)."""
    trace = svc.trace(p, f.required("request_id"), allow_partial=True)
    return Response(
        trace_data_json(trace),
        media_type="application/octet-stream",
        headers={"Content-Disposition": "attachment; filename=traces.json"},
    )


@traces.get("/traces/{trace_id}/info")
def get_legacy_trace_info(trace_id: str, svc: Traces, p: CurrentPrincipal) -> ProtoJSONResponse:
    """MLflow 2's GetTraceInfo."""
    return proto_json({"trace_info": legacy_trace_info_json(svc.info(p, trace_id))})


@traces.post("/traces/calculate-filter-correlation")
def calculate_filter_correlation(f: F, svc: Traces, p: Searcher) -> ProtoJSONResponse:
    """How two filters' traces go together (NPMI), as a stock server's trace insights."""
    found = svc.correlation(
        p,
        _strings(f, "experiment_ids"),
        f.required("filter_string1"),
        f.required("filter_string2"),
        f.text("base_filter"),
    )
    return proto_json(
        {
            "npmi": found.npmi,
            "npmi_smoothed": found.npmi_smoothed,
            "filter1_count": found.filter1_count,
            "filter2_count": found.filter2_count,
            "joint_count": found.joint_count,
            "total_count": found.total_count,
        }
    )


@traces.get("/traces/get")
def get_trace(f: F, svc: Traces, p: CurrentPrincipal) -> ProtoJSONResponse:
    trace = svc.trace(p, f.required("trace_id"), allow_partial=f.flag("allow_partial"))
    return proto_json({"trace": trace_json(trace)})


@traces.get("/traces/batchGet")
def batch_get_traces(f: F, svc: Traces, p: CurrentPrincipal) -> ProtoJSONResponse:
    found = svc.traces(p, _strings(f, "trace_ids"), _strings(f, "experiment_ids"))
    return proto_json({"traces": [trace_json(t) for t in found]})


@traces.post("/traces/batchGetInfos")
def batch_get_trace_infos(f: F, svc: Traces, p: Searcher) -> ProtoJSONResponse:
    found = svc.infos(p, _strings(f, "trace_ids"), _strings(f, "experiment_ids"))
    return proto_json({"trace_infos": [trace_info_json(i) for i in found]})


@traces.post("/traces/search", dependencies=SEARCH_SLOT)
def search_traces(f: F, svc: Traces, p: Searcher, page_bytes: PageBytes) -> Response:
    locations, filter_string = _locations(f), f.text("filter")
    order_by = _strings(f, "order_by")
    size = check_page_size(
        f.integer("max_results", default=DEFAULT_SEARCH_RESULTS) or 0, MAX_SEARCH_RESULTS
    )
    return bounded_page(
        "traces",
        lambda limit, token: svc.search(
            p,
            locations,
            filter_string=filter_string,
            order_by=order_by,
            max_results=limit,
            page_token=token,
        ),
        trace_info_json,
        max_results=size,
        page_token=f.text("page_token"),
        max_bytes=page_bytes,
        resume_at=resume_token,
    )


@traces.post("/traces/delete-traces")
def delete_traces(
    f: F, svc: Traces, ctx: Annotated[AuditContext, Depends(audited("trace.delete"))]
) -> ProtoJSONResponse:
    deleted = svc.delete(
        ctx,
        f.required("experiment_id"),
        max_timestamp_millis=f.integer("max_timestamp_millis"),
        max_traces=f.integer("max_traces"),
        trace_ids=_strings(f, "request_ids") + _strings(f, "trace_ids"),
    )
    return proto_json({"traces_deleted": deleted})


@traces.post("/traces/link-to-run")
def link_traces_to_run(f: F, svc: Traces, p: Writer) -> ProtoJSONResponse:
    svc.link_to_run(p, _strings(f, "trace_ids"), f.required("run_id"))
    return proto_json()


@traces.patch("/traces/{trace_id}/tags")
def set_trace_tag(trace_id: str, f: F, svc: Traces, p: Writer) -> ProtoJSONResponse:
    # Any length: the service keeps the first MAX_VALUE characters, as run tags do.
    value = f.text("value", max_len=2**63 - 1) or ""
    svc.set_tag(p, trace_id, f.required("key"), value)
    return proto_json()


@traces.delete("/traces/{trace_id}/tags")
def delete_trace_tag(trace_id: str, f: F, svc: Traces, p: Writer) -> ProtoJSONResponse:
    svc.delete_tag(p, trace_id, f.required("key"))
    return proto_json()


@traces.get("/traces/{trace_id}")
def get_trace_info(trace_id: str, svc: Traces, p: CurrentPrincipal) -> ProtoJSONResponse:
    """GetTraceInfoV3."""
    return proto_json({"trace": {"trace_info": trace_info_json(svc.info(p, trace_id))}})


# ---------------------------------------------------------------------- OTLP/HTTP
otlp = APIRouter(include_in_schema=False)


@otlp.post(OTLP_TRACES_PATH)
def export_traces(
    request: Request, body: Annotated[bytes, Depends(_body)], svc: Traces, p: Writer
) -> Response:
    """An OTLP ``ExportTraceServiceRequest`` (binary protobuf or OTLP JSON, optionally
    gzip): all of its spans are stored, or none. Answers an empty
    ``ExportTraceServiceResponse`` in the request's encoding."""
    experiment_id = request.headers.get(EXPERIMENT_ID_HEADER)
    if not experiment_id:
        raise InvalidParameter(
            f"The {EXPERIMENT_ID_HEADER} header must name the experiment the spans belong to."
        )
    content_type = request.headers.get("content-type", "")
    raw = inflate(body, request.headers.get("content-encoding", ""))
    svc.log_spans(p, experiment_id, decode_export_request(raw, content_type))
    if content_type.split(";")[0].strip().lower() == "application/json":
        return Response(b"{}", media_type="application/json")
    return Response(b"", media_type="application/x-protobuf")


# ---------------------------------------------------------------------- assembly
router = APIRouter()
for _prefix in (
    "/api/2.0/mlflow",
    "/api/3.0/mlflow",
    "/ajax-api/2.0/mlflow",
    "/ajax-api/3.0/mlflow",
):
    router.include_router(traces, prefix=_prefix)
router.include_router(otlp)
