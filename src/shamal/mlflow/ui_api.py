"""The calls MLflow's own UI makes beyond the client's REST API, as a stock server answers
them: GraphQL, bulk metric histories, dataset summaries, artifact files for its viewers,
and the few probes it makes of the server (who is signed in, its assistant).

Every route takes the bearer token as the REST routes do (the UI's calls arrive through
``/mlflow/``, which hands them the session's token: ``shamal.webui``) and reads through the
same service methods with the caller's principal, so roles and team scopes are the same.
The routes stay out of /openapi.json: MLflow's UI and its server define them.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from shamal.artifacts import download_headers, download_slot, safe_relpath, search_slot
from shamal.errors import InvalidParameter, NotFound
from shamal.mlflow._fields import Fields, ProtoJSONResponse, proto_json, read_fields
from shamal.registry import RegistryService, parse_version
from shamal.security import Principal
from shamal.security.api import (
    CurrentPrincipal,
    ReadAudit,
    audited_read,
    read_only_post,
)
from shamal.tracking import TrackingService

AJAX = "/ajax-api/2.0/mlflow"
AJAX_3 = "/ajax-api/3.0/mlflow"
#: ``get-history-bulk``: runs one call names, and points per run (stock).
MAX_BULK_RUNS = 100
MAX_BULK_POINTS = 25_000
_ARTIFACT_SCHEME = "mlflow-artifacts:/"

router = APIRouter(include_in_schema=False, default_response_class=ProtoJSONResponse)
F = Annotated[Fields, Depends(read_fields)]
Searcher = Annotated[Principal, Depends(read_only_post)]
Reads = Annotated[ReadAudit, Depends(audited_read("artifact.read"))]
SEARCH_SLOT = [Depends(search_slot)]
DOWNLOAD_SLOT = [Depends(download_slot, scope="request")]


async def _tracking(request: Request) -> TrackingService:
    service: TrackingService = request.app.state.tracking
    return service


async def _registry(request: Request) -> RegistryService:
    service: RegistryService = request.app.state.registry
    return service


Tracking = Annotated[TrackingService, Depends(_tracking)]
Registry = Annotated[RegistryService, Depends(_registry)]


# ---------------------------------------------------------------------- GraphQL
@router.post("/graphql", dependencies=SEARCH_SLOT)
def graphql(f: F, tracking: Tracking, registry: Registry, p: Searcher) -> JSONResponse:
    """MLflow's GraphQL: ``{"query", "variables", "operationName"}`` in, ``{"data",
    "errors"}`` out (see :mod:`shamal.mlflow._graphql`). It only reads: its one mutation
    is a search, so a read-only token may call it."""
    from shamal.mlflow import _graphql  # graphql-core (0.3 s) loads on the UI's first query

    services = _graphql.Services(p, tracking, registry)
    answer = _graphql.run_query(
        services, f.raw("query"), f.raw("variables"), f.raw("operationName")
    )
    # Plain JSON: GraphQL's answer keeps its nulls (a field the query selected is present).
    return JSONResponse(answer)


# ---------------------------------------------------------------------- metrics, datasets
@router.get(f"{AJAX}/metrics/get-history-bulk", dependencies=SEARCH_SLOT)
def get_metric_history_bulk(f: F, svc: Tracking, p: CurrentPrincipal) -> ProtoJSONResponse:
    """Each run's history of one metric (up to 25,000 points a run), runs in id order, a
    run's points by time."""
    run_ids = sorted({str(r) for r in f.many("run_id")})
    if not run_ids:
        raise InvalidParameter("GetMetricHistoryBulk request must specify at least one run_id.")
    if len(run_ids) > MAX_BULK_RUNS:
        raise InvalidParameter(
            f"GetMetricHistoryBulk request cannot specify more than {MAX_BULK_RUNS} run_ids. "
            f"Received {len(run_ids)} run_ids."
        )
    key = f.text("metric_key")
    if key is None:
        raise InvalidParameter("GetMetricHistoryBulk request must specify a metric_key.")
    limit = min(
        f.integer("max_results", default=MAX_BULK_POINTS) or MAX_BULK_POINTS, MAX_BULK_POINTS
    )
    points: list[dict[str, Any]] = []
    for run_id in run_ids:
        rows = svc.metric_history(p, run_id, key, None, limit).items
        ordered = sorted(rows, key=lambda r: (r[1], r[0], r[2]))
        points.extend(
            {"key": key, "value": _value(v, nan), "timestamp": t, "step": step, "run_id": run_id}
            for step, t, v, nan in ordered
        )
    return proto_json({"metrics": points})


def _value(value: float, nan: Any) -> float:
    return float("nan") if nan else value


@router.post(f"{AJAX}/experiments/search-datasets")
def search_datasets(f: F, svc: Tracking, p: Searcher) -> ProtoJSONResponse:
    found = svc.dataset_summaries(p, [str(e) for e in f.many("experiment_ids")])
    return proto_json(
        {
            "dataset_summaries": [
                {"experiment_id": e, "name": n, "digest": d, "context": c} for e, n, d, c in found
            ]
        }
    )


# ---------------------------------------------------------------------- artifact files
def _stream(svc: TrackingService, p: Principal, uri: str, reads: ReadAudit) -> StreamingResponse:
    """The file at ``uri`` (a ``mlflow-artifacts:/`` address), streamed with its headers."""
    if not uri.startswith(_ARTIFACT_SCHEME):
        raise NotFound("Artifact not found.")
    path = uri.removeprefix(_ARTIFACT_SCHEME)
    found, data = svc.files.download(p, path)
    reads.granted(uri, digest=found.digest, size=found.size)
    return StreamingResponse(
        data, media_type="application/octet-stream", headers=download_headers(found)
    )


def _file_path(path: str | None, name: str) -> str:
    if not path:
        raise InvalidParameter(f"Missing value for required parameter '{name}'.")
    try:
        return safe_relpath(path)
    except InvalidParameter:
        raise InvalidParameter("Invalid path") from None  # a stock server's words


_Q = Annotated[str | None, Query(max_length=4096)]


@router.get("/get-artifact", dependencies=DOWNLOAD_SLOT)
@router.get(f"{AJAX}/get-artifact", dependencies=DOWNLOAD_SLOT)
def get_run_artifact(
    svc: Tracking,
    p: CurrentPrincipal,
    reads: Reads,
    path: _Q = None,
    run_id: _Q = None,
    run_uuid: _Q = None,
) -> StreamingResponse:
    """A file of a run's artifacts (``run_id`` or ``run_uuid``, ``path``): the UI's file
    viewer, images and charts."""
    run = run_id or run_uuid
    if not run:
        raise InvalidParameter("Missing value for required parameter 'run_id'.")
    uri = svc.run_artifact_uri(p, run, _file_path(path, "path"))
    return _stream(svc, p, uri, reads)


@router.get("/model-versions/get-artifact", dependencies=DOWNLOAD_SLOT)
def get_model_version_artifact(
    svc: Tracking,
    registry: Registry,
    p: CurrentPrincipal,
    reads: Reads,
    path: _Q = None,
    name: _Q = None,
    version: _Q = None,
) -> StreamingResponse:
    """A file of a model version (``name``, ``version``, ``path``): the UI reads its
    ``MLmodel`` for the version's page."""
    if not name or not version:
        missing = "name" if not name else "version"
        raise InvalidParameter(f"Missing value for required parameter '{missing}'.")
    file_path = _file_path(path, "path")
    root = registry.get_model_version_download_uri(p, name, parse_version(version[:32]))
    return _stream(svc, p, f"{root.rstrip('/')}/{file_path}", reads)


@router.get(f"{AJAX}/logged-models/{{model_id}}/artifacts/files", dependencies=DOWNLOAD_SLOT)
def get_logged_model_artifact(
    model_id: str, f: F, svc: Tracking, p: CurrentPrincipal, reads: Reads
) -> StreamingResponse:
    """A file of a logged model (``artifact_file_path``)."""
    model = svc.models.get(p, model_id)
    path = _file_path(f.text("artifact_file_path", max_len=4096), "artifact_file_path")
    return _stream(svc, p, f"{model.artifact_location.rstrip('/')}/{path}", reads)


# ---------------------------------------------------------------------- what the UI probes
@router.get(f"{AJAX}/users/current")
def current_user(p: CurrentPrincipal) -> ProtoJSONResponse:
    """Who is signed in, as a stock server with authentication answers it (Shamal signs
    people in with its own tokens, never HTTP Basic)."""
    user = {"id": p.user.id, "username": p.name, "is_admin": p.user.is_admin}
    return proto_json({"user": user, "is_basic_auth": False})


@router.get(f"{AJAX_3}/assistant/config")
def assistant_config(p: CurrentPrincipal) -> JSONResponse:
    """MLflow's AI assistant is not part of Shamal: no provider is set up, none is offered."""
    return JSONResponse({"providers": {}, "projects": {}, "remote_access_allowed": False})


@router.get(f"{AJAX_3}/assistant/providers")
def assistant_providers(p: CurrentPrincipal) -> JSONResponse:
    return JSONResponse({"providers": [], "resolved": None, "gateway_vendor_options": {}})


#: What the UI asks MLflow's AI gateway through the server: the endpoints it may call.
_GATEWAY_ENDPOINTS = "api/2.0/endpoints/"


@router.get(f"{AJAX}/gateway-proxy")
def gateway_proxy(p: CurrentPrincipal, f: F) -> ProtoJSONResponse:
    """Shamal runs no AI gateway: the list of its endpoints is empty, and nothing else is
    answered through it."""
    if (f.text("gateway_path") or "").strip("/") + "/" != _GATEWAY_ENDPOINTS:
        raise NotFound("Shamal runs no AI gateway: nothing answers at this gateway path.")
    return proto_json({"endpoints": []})
