"""Tracking in the MLflow REST dialect: `/api/2.0/mlflow/...` (and the UI's `/ajax-api/...`).

Every handler reads its fields the MLflow way (query for GET, JSON object body
otherwise), calls the tracking service, and answers protobuf-style JSON. The
routes stay out of /openapi.json: MLflow's protos define this API, and the stock
mlflow client is the judge of it in the tests.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse

from shamal.api import PageBytes
from shamal.artifacts import download_headers, safe_relpath, search_slot
from shamal.errors import InvalidParameter
from shamal.mlflow import _tracking_json as _proto
from shamal.mlflow._fields import (
    Fields,
    ProtoJSONResponse,
    bounded_page,
    proto_json,
    proto_json_encoded,
    read_fields,
)
from shamal.mlflow.artifacts_api import DOWNLOAD_SLOT, artifacts_router
from shamal.security import AuditContext, Principal
from shamal.security.api import (
    CurrentPrincipal,
    ReadAudit,
    audited,
    audited_read,
    data_plane_write,
    read_only_post,
)
from shamal.tracking import (
    DEFAULT_LOGGED_MODEL_RESULTS,
    MAX_LOGGED_MODEL_RESULTS,
    MAX_SAMPLED_POINTS,
    MAX_SEARCH,
    LoggedData,
    LoggedModelSpec,
    TrackingService,
    check_page_size,
    resume_token,
    view_type,
)


async def _fields(request: Request) -> Fields:
    return await read_fields(request)


async def get_tracking(request: Request) -> TrackingService:
    # async: FastAPI runs a plain-def dependency in a worker thread, a round trip per request.
    service: TrackingService = request.app.state.tracking
    return service


F = Annotated[Fields, Depends(_fields)]
Tracking = Annotated[TrackingService, Depends(get_tracking)]
Writer = Annotated[Principal, Depends(data_plane_write)]
Searcher = Annotated[Principal, Depends(read_only_post)]


#: Searches hold one of the caller's ``max_searches_per_principal`` slots while they run.
SEARCH_SLOT = [Depends(search_slot)]


mlflow = APIRouter(include_in_schema=False, default_response_class=ProtoJSONResponse)

#: The page size of experiment and run searches that name none; 0 is refused (stock).
DEFAULT_SEARCH_RESULTS = 1000


def _page_size(f: Fields) -> int:
    size = f.integer("max_results")
    return DEFAULT_SEARCH_RESULTS if size is None else size


# ---------------------------------------------------------------------- logging to runs
_ANY_LENGTH = 2**63 - 1


# First in the router: routing tries routes in order, and these carry the volume.
def _run_id(f: Fields) -> str:
    run_id = f.text("run_id") or f.text("run_uuid")
    if not run_id:
        return f.required("run_id")
    return run_id


@mlflow.post("/runs/log-batch")
def log_batch(f: F, svc: Tracking, p: Writer) -> ProtoJSONResponse:
    run_id = _run_id(f)  # checked first, as a stock server does
    data = LoggedData(
        metrics=_proto.metrics_of(f.objects("metrics"), None, batch=True),
        params=_proto.pairs_of(f.objects("params"), "param"),
        tags=_proto.pairs_of(f.objects("tags"), "tag"),
    )
    svc.log(p, run_id, data)
    return proto_json()


@mlflow.post("/runs/log-metric")
def log_metric(f: F, svc: Tracking, p: Writer) -> ProtoJSONResponse:
    run_id = _run_id(f)  # checked first, as a stock server does
    fields = ("key", "value", "timestamp", "step", "model_id", "dataset_name", "dataset_digest")
    item = {k: v for k in fields if (v := f.raw(k)) is not None}  # unset is absent
    metrics = _proto.metrics_of([item], svc.now_ms())
    if f.raw("value") is None:
        f.required("value")
    svc.log(p, run_id, LoggedData(metrics=metrics))
    return proto_json()


@mlflow.post("/runs/log-parameter")
def log_param(f: F, svc: Tracking, p: Writer) -> ProtoJSONResponse:
    # Any length: the service keeps the first MAX_PARAM_VALUE characters, as stock does.
    run_id, key = _run_id(f), f.required("key")  # in a stock server's order
    value = f.text("value", max_len=_ANY_LENGTH)
    if value is None:
        f.required("value")
    svc.log(p, run_id, LoggedData(params=[(key, value or "")]))
    return proto_json()


@mlflow.post("/runs/set-tag")
def set_tag(f: F, svc: Tracking, p: Writer) -> ProtoJSONResponse:
    # Any length: the service keeps the first MAX_TAG_VALUE characters, as stock does;
    # the request body limit bounds what arrives.
    run_id, key = _run_id(f), f.required("key")  # in a stock server's order
    value = f.text("value", max_len=_ANY_LENGTH) or ""
    svc.log(p, run_id, LoggedData(tags=[(key, value)]))
    return proto_json()


# ---------------------------------------------------------------------- experiments
@mlflow.post("/experiments/create")
def create_experiment(
    f: F, svc: Tracking, ctx: Annotated[AuditContext, Depends(audited("experiment.create"))]
) -> ProtoJSONResponse:
    name, location = f.required("name"), f.text("artifact_location")  # a stock server's order
    tags = dict(_proto.pairs_of(f.objects("tags"), "tag"))
    exp = svc.create_experiment(ctx, name, tags, location)
    return proto_json({"experiment_id": exp.experiment_id})


@mlflow.get("/experiments/get")
def get_experiment(f: F, svc: Tracking, p: CurrentPrincipal) -> ProtoJSONResponse:
    exp = svc.experiment(p, f.required("experiment_id"))
    return proto_json({"experiment": _proto.experiment_json(exp)})


@mlflow.get("/experiments/get-by-name")
def get_experiment_by_name(f: F, svc: Tracking, p: CurrentPrincipal) -> ProtoJSONResponse:
    exp = svc.experiment_by_name(p, f.required("experiment_name"))
    return proto_json({"experiment": _proto.experiment_json(exp)})


@mlflow.get("/experiments/search", dependencies=SEARCH_SLOT)
def search_experiments_get(
    f: F, svc: Tracking, p: CurrentPrincipal, page_bytes: PageBytes
) -> Response:
    return _search_experiments(f, svc, p, page_bytes)


@mlflow.post("/experiments/search", dependencies=SEARCH_SLOT)
def search_experiments_post(f: F, svc: Tracking, p: Searcher, page_bytes: PageBytes) -> Response:
    return _search_experiments(f, svc, p, page_bytes)


def _search_experiments(f: Fields, svc: TrackingService, p: Principal, page_bytes: int) -> Response:
    max_results = check_page_size(_page_size(f), MAX_SEARCH["experiments"])
    filter_string, order_by = f.text("filter"), f.many("order_by")
    view = view_type(f.text("view_type"))
    return bounded_page(
        "experiments",
        lambda limit, token: svc.search_experiments(
            p,
            filter_string=filter_string,
            order_by=order_by,
            view=view,
            max_results=limit,
            page_token=token,
        ),
        _proto.experiment_json,
        max_results=max_results,
        page_token=f.text("page_token"),
        max_bytes=page_bytes,
        resume_at=resume_token,
    )


@mlflow.post("/experiments/update")
def update_experiment(
    f: F, svc: Tracking, ctx: Annotated[AuditContext, Depends(audited("experiment.update"))]
) -> ProtoJSONResponse:
    svc.update_experiment(ctx, f.required("experiment_id"), f.required("new_name"))
    return proto_json()


@mlflow.post("/experiments/delete")
def delete_experiment(
    f: F, svc: Tracking, ctx: Annotated[AuditContext, Depends(audited("experiment.delete"))]
) -> ProtoJSONResponse:
    svc.set_experiment_lifecycle(ctx, f.required("experiment_id"), "deleted")
    return proto_json()


@mlflow.post("/experiments/restore")
def restore_experiment(
    f: F, svc: Tracking, ctx: Annotated[AuditContext, Depends(audited("experiment.restore"))]
) -> ProtoJSONResponse:
    svc.set_experiment_lifecycle(ctx, f.required("experiment_id"), "active")
    return proto_json()


@mlflow.post("/experiments/set-experiment-tag")
def set_experiment_tag(
    f: F, svc: Tracking, ctx: Annotated[AuditContext, Depends(audited("experiment.tag.set"))]
) -> ProtoJSONResponse:
    svc.set_experiment_tag(
        ctx, f.required("experiment_id"), f.required("key"), f.text("value") or ""
    )
    return proto_json()


@mlflow.post("/experiments/delete-experiment-tag")
def delete_experiment_tag(
    f: F, svc: Tracking, ctx: Annotated[AuditContext, Depends(audited("experiment.tag.delete"))]
) -> ProtoJSONResponse:
    svc.set_experiment_tag(ctx, f.required("experiment_id"), f.required("key"), None)
    return proto_json()


# ---------------------------------------------------------------------- runs
@mlflow.post("/runs/create")
def create_run(
    f: F, svc: Tracking, ctx: Annotated[AuditContext, Depends(audited("run.create"))]
) -> ProtoJSONResponse:
    tags = dict(_proto.pairs_of(f.objects("tags"), "tag"))
    run = svc.create_run(
        ctx, f.text("experiment_id") or "0", f.text("run_name"), f.integer("start_time"), tags
    )
    return proto_json({"run": _proto.run_json(run)})


@mlflow.get("/runs/get")
def get_run(f: F, svc: Tracking, p: CurrentPrincipal) -> ProtoJSONResponse:
    return proto_json({"run": _proto.run_json(svc.get_run(p, _run_id(f)))})


@mlflow.post("/runs/update")
def update_run(
    f: F, svc: Tracking, ctx: Annotated[AuditContext, Depends(audited("run.update"))]
) -> ProtoJSONResponse:
    info = svc.update_run(
        ctx,
        _run_id(f),
        status=f.text("status"),
        end_time=f.integer("end_time"),
        run_name=f.text("run_name"),
    )
    return proto_json({"run_info": _proto.run_info_json(info)})


@mlflow.post("/runs/delete")
def delete_run(
    f: F, svc: Tracking, ctx: Annotated[AuditContext, Depends(audited("run.delete"))]
) -> ProtoJSONResponse:
    svc.set_run_lifecycle(ctx, _run_id(f), "deleted")
    return proto_json()


@mlflow.post("/runs/restore")
def restore_run(
    f: F, svc: Tracking, ctx: Annotated[AuditContext, Depends(audited("run.restore"))]
) -> ProtoJSONResponse:
    svc.set_run_lifecycle(ctx, _run_id(f), "active")
    return proto_json()


@mlflow.post("/runs/delete-tag")
def delete_tag(f: F, svc: Tracking, p: Writer) -> ProtoJSONResponse:
    svc.delete_tag(p, _run_id(f), f.required("key"))
    return proto_json()


@mlflow.post("/runs/log-inputs")
def log_inputs(f: F, svc: Tracking, p: Writer) -> ProtoJSONResponse:
    models = [Fields(m).required("model_id", max_len=64) for m in f.objects("models")]
    svc.log_inputs(p, _run_id(f), _proto.dataset_inputs_of(f.objects("datasets")), models)
    return proto_json()


@mlflow.post("/runs/outputs")
def log_outputs(f: F, svc: Tracking, p: Writer) -> ProtoJSONResponse:
    outputs = [
        (Fields(m).required("model_id", max_len=64), Fields(m).integer("step") or 0)
        for m in f.objects("models")
    ]
    svc.log_outputs(p, _run_id(f), outputs)
    return proto_json()


@mlflow.post("/runs/search", dependencies=SEARCH_SLOT)
def search_runs(f: F, svc: Tracking, p: Searcher, page_bytes: PageBytes) -> Response:
    max_results = check_page_size(_page_size(f), MAX_SEARCH["runs"])
    experiment_ids = [str(e) for e in f.many("experiment_ids")]
    filter_string, order_by = f.text("filter"), f.many("order_by")
    view = view_type(f.text("run_view_type"))
    return bounded_page(
        "runs",
        lambda limit, token: svc.search_runs(
            p,
            experiment_ids=experiment_ids,
            filter_string=filter_string,
            view=view,
            max_results=limit,
            order_by=order_by,
            page_token=token,
            unknown_experiments="skip",
        ),
        _proto.run_json,
        max_results=max_results,
        page_token=f.text("page_token"),
        max_bytes=page_bytes,
        resume_at=resume_token,
    )


# A history page is a search's worth of work (25,000 points): it holds a search slot.
@mlflow.get("/metrics/get-history", dependencies=SEARCH_SLOT)
def get_metric_history(f: F, svc: Tracking, p: CurrentPrincipal) -> Response:
    key = f.required("metric_key")
    page = svc.metric_history(p, _run_id(f), key, f.text("page_token"), f.integer("max_results"))
    # Each point as the stock server sends it (key, value, timestamp, step): the run is
    # the request's, and the client parses every field of up to 25,000 points a page.
    return proto_json_encoded(_proto.history_page_json(key, page.items, page.next_page_token))


@mlflow.get("/metrics/get-history-bulk-interval", dependencies=SEARCH_SLOT)
def get_metric_history_bulk(f: F, svc: Tracking, p: CurrentPrincipal) -> ProtoJSONResponse:
    metrics = svc.metric_history_sampled(
        p,
        [str(r) for r in f.many("run_ids")],
        f.required("metric_key"),
        (f.integer("start_step"), f.integer("end_step")),
        f.integer("max_results", default=MAX_SAMPLED_POINTS) or 0,
    )
    return proto_json({"metrics": [_proto.metric_json(m) for m in metrics]})


@mlflow.get("/artifacts/list")
def list_run_artifacts(f: F, svc: Tracking, p: CurrentPrincipal) -> ProtoJSONResponse:
    run_id = _run_id(f)
    try:
        root, files = svc.files.list_run(p, run_id, f.text("path") or "")
    except InvalidParameter as exc:
        if exc.message.startswith("Invalid artifact path"):
            raise InvalidParameter("Invalid path") from None  # a stock server's words
        raise
    return proto_json(
        {
            "root_uri": root,
            "files": [
                {"path": x.path, "is_dir": x.is_dir, "file_size": x.file_size} for x in files
            ],
        }
    )


# ---------------------------------------------------------------------- logged models
@mlflow.post("/logged-models")
def create_logged_model(
    f: F, svc: Tracking, ctx: Annotated[AuditContext, Depends(audited("logged_model.create"))]
) -> ProtoJSONResponse:
    spec = LoggedModelSpec(
        name=f.text("name") or "",
        model_type=f.text("model_type"),
        source_run_id=f.text("source_run_id"),
        params=dict(_proto.pairs_of(f.objects("params"), "param")),
        tags=dict(_proto.pairs_of(f.objects("tags"), "tag")),
    )
    model = svc.models.create(ctx, f.required("experiment_id"), spec)
    return proto_json({"model": _proto.logged_model_json(model)})


@mlflow.get("/logged-models/{model_id}")
def get_logged_model(model_id: str, svc: Tracking, p: CurrentPrincipal) -> ProtoJSONResponse:
    return proto_json({"model": _proto.logged_model_json(svc.models.get(p, model_id))})


@mlflow.patch("/logged-models/{model_id}")
def finalize_logged_model(
    model_id: str,
    f: F,
    svc: Tracking,
    ctx: Annotated[AuditContext, Depends(audited("logged_model.finalize"))],
) -> ProtoJSONResponse:
    model = svc.models.finalize(ctx, model_id, f.required("status"))
    return proto_json({"model": _proto.logged_model_json(model)})


@mlflow.delete("/logged-models/{model_id}")
def delete_logged_model(
    model_id: str,
    svc: Tracking,
    ctx: Annotated[AuditContext, Depends(audited("logged_model.delete"))],
) -> ProtoJSONResponse:
    svc.models.delete(ctx, model_id)
    return proto_json()


@mlflow.post("/logged-models/search", dependencies=SEARCH_SLOT)
def search_logged_models(f: F, svc: Tracking, p: Searcher, page_bytes: PageBytes) -> Response:
    # As on a stock server, 0 is "not given".
    max_results = check_page_size(
        f.integer("max_results") or DEFAULT_LOGGED_MODEL_RESULTS, MAX_LOGGED_MODEL_RESULTS
    )
    experiment_ids = [str(e) for e in f.many("experiment_ids")]
    filter_string, order_by, datasets = f.text("filter"), f.many("order_by"), f.raw("datasets")
    return bounded_page(
        "models",
        lambda limit, token: svc.models.search(
            p,
            experiment_ids=experiment_ids,
            filter_string=filter_string,
            order_by=order_by,
            max_results=limit,
            page_token=token,
            datasets=datasets,
            unknown_experiments="skip",
        ),
        _proto.logged_model_json,
        max_results=max_results,
        page_token=f.text("page_token"),
        max_bytes=page_bytes,
        resume_at=resume_token,
    )


@mlflow.patch("/logged-models/{model_id}/tags")
def set_logged_model_tags(model_id: str, f: F, svc: Tracking, p: Writer) -> ProtoJSONResponse:
    tags = dict(_proto.pairs_of(f.objects("tags"), "tag"))
    return proto_json({"model": _proto.logged_model_json(svc.models.set_tags(p, model_id, tags))})


@mlflow.delete("/logged-models/{model_id}/tags/{tag_key}")
def delete_logged_model_tag(
    model_id: str, tag_key: str, svc: Tracking, p: Writer
) -> ProtoJSONResponse:
    svc.models.delete_tag(p, model_id, tag_key)
    return proto_json()


@mlflow.post("/logged-models/{model_id}/params")
def log_logged_model_params(model_id: str, f: F, svc: Tracking, p: Writer) -> ProtoJSONResponse:
    svc.models.log_params(p, model_id, dict(_proto.pairs_of(f.objects("params"), "param")))
    return proto_json()


@mlflow.get("/logged-models/{model_id}/artifacts/directories")
def list_logged_model_artifacts(
    model_id: str, f: F, svc: Tracking, p: CurrentPrincipal
) -> ProtoJSONResponse:
    model = svc.models.get(p, model_id)
    root = model.artifact_location.removeprefix("mlflow-artifacts:/")
    path = (f.text("artifact_directory_path") or "").strip("/")
    files = svc.files.listing(p, f"{root}/{path}" if path else root, file_itself=False)
    return proto_json(
        {
            "root_uri": model.artifact_location,
            "files": [
                {
                    "path": f"{path}/{x.path}" if path else x.path,
                    "is_dir": x.is_dir,
                    "file_size": x.file_size,
                }
                for x in files
            ],
        }
    )


@mlflow.get("/logged-models/{model_id}/artifacts/files", dependencies=DOWNLOAD_SLOT)
def get_logged_model_artifact(
    model_id: str,
    f: F,
    svc: Tracking,
    p: CurrentPrincipal,
    reads: Annotated[ReadAudit, Depends(audited_read("artifact.read"))],
) -> StreamingResponse:
    """One file of a logged model (``artifact_file_path`` below its root), as a stock server
    sends it to its UI: the bytes, with the read audited as any artifact download."""
    model = svc.models.get(p, model_id)
    root = model.artifact_location.removeprefix("mlflow-artifacts:/")
    path = f"{root}/{safe_relpath(f.required('artifact_file_path'))}"
    found, data = svc.files.download(p, path)
    reads.granted(f"mlflow-artifacts:{path}", digest=found.digest, size=found.size)
    return StreamingResponse(
        data, media_type="application/octet-stream", headers=download_headers(found)
    )


# ---------------------------------------------------------------------- assembly
router = APIRouter()
for _prefix in ("/api/2.0/mlflow", "/ajax-api/2.0/mlflow"):
    router.include_router(mlflow, prefix=_prefix)
router.include_router(artifacts_router)


@router.get("/api/3.0/mlflow/server-info", include_in_schema=False)
@router.get("/ajax-api/3.0/mlflow/server-info", include_in_schema=False)
def server_info() -> ProtoJSONResponse:
    """Probed by 3.13+ clients with a 3 s timeout and no retries: answer at once, no auth."""
    return proto_json({"store_type": "SqlStore", "workspaces_enabled": False})
