"""The `mlflow-artifacts` proxy: how the stock client uploads and downloads run artifacts."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from shamal.artifacts import consume_body, download_headers, download_slot
from shamal.errors import NotImplementedFeature
from shamal.mlflow._fields import ProtoJSONResponse, proto_json
from shamal.security import AuditContext
from shamal.security.api import CurrentPrincipal, ReadAudit, audited, audited_read
from shamal.tracking import TrackingService

PREFIX = "/api/2.0/mlflow-artifacts"


def _tracking(request: Request) -> TrackingService:
    service: TrackingService = request.app.state.tracking
    return service


Tracking = Annotated[TrackingService, Depends(_tracking)]
artifacts_router = APIRouter(prefix=PREFIX, include_in_schema=False)
#: A download holds one of the caller's ``max_downloads_per_principal`` slots until its
#: last byte is sent (429 beyond).
DOWNLOAD_SLOT = [Depends(download_slot, scope="request")]


@artifacts_router.get("/artifacts")
def list_artifacts(svc: Tracking, p: CurrentPrincipal, path: str = "") -> ProtoJSONResponse:
    files = svc.files.listing(p, path)
    return proto_json(
        {"files": [{"path": f.path, "is_dir": f.is_dir, "file_size": f.file_size} for f in files]}
    )


@artifacts_router.get("/artifacts/{path:path}", dependencies=DOWNLOAD_SLOT)
def download_artifact(
    path: str,
    svc: Tracking,
    p: CurrentPrincipal,
    reads: Annotated[ReadAudit, Depends(audited_read("artifact.read"))],
) -> StreamingResponse:
    found, data = svc.files.download(p, path)
    reads.granted(f"mlflow-artifacts:{path}", digest=found.digest, size=found.size)
    return StreamingResponse(
        data, media_type="application/octet-stream", headers=download_headers(found)
    )


@artifacts_router.put("/artifacts/{path:path}")
async def upload_artifact(
    path: str,
    request: Request,
    svc: Tracking,
    ctx: Annotated[AuditContext, Depends(audited("artifact.put"))],
) -> ProtoJSONResponse:
    await consume_body(request, lambda chunks: svc.files.upload(ctx, path, chunks))
    return proto_json()


@artifacts_router.delete("/artifacts/{path:path}")
def delete_artifact(
    path: str, svc: Tracking, ctx: Annotated[AuditContext, Depends(audited("artifact.delete"))]
) -> ProtoJSONResponse:
    svc.files.delete(ctx, path)
    return proto_json()


@artifacts_router.post("/mpu/{step}/{path:path}")
def multipart_upload(
    step: str, path: str, ctx: Annotated[AuditContext, Depends(audited("artifact.mpu"))]
) -> ProtoJSONResponse:
    """Multipart uploads are off (the client's default); it then falls back to a single PUT."""
    raise NotImplementedFeature("Multipart upload is not supported; uploads stream in one PUT.")
