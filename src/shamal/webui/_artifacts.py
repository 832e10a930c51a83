"""A run's artifacts: its folders and files, a preview of one file, and its bytes.

The pages call the tracking service's run files (``TrackingService.files``) as the MLflow
artifact routes do, with the signed-in principal: the run's experiment decides who reads,
and every path passes the artifact store's one validator (``..`` or an absolute path is
refused with 400). A preview reads a bounded head of the file. Only images are served
inline, from their own route, with their type, ``nosniff`` and a sandboxing CSP: an SVG or
HTML artifact is shown as text, never rendered. Everything else downloads as an attachment.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import Depends, Path, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response, StreamingResponse

from shamal.artifacts import ArtifactFile, PrincipalSlots, download_headers, safe_relpath
from shamal.errors import InvalidParameter, NotFound, ShamalError
from shamal.security import AuditContext, AuditLog, Principal
from shamal.security.api import ReadAudit
from shamal.tracking import TrackingService
from shamal.webui._artifact_preview import (
    IMAGE_BYTES,
    IMAGE_TYPES,
    TEXT_BYTES,
    Preview,
    head,
    human_size,
    preview_of,
    suffix,
)
from shamal.webui._common import Route, context, service_of
from shamal.webui._render import page, redirect
from shamal.webui._session import SessionPrincipal

logger = logging.getLogger(__name__)

#: The entries of a folder the page lists.
LISTED = 1000
#: The raw route's answer may be shown as an image and nothing else.
RAW_POLICY = "default-src 'none'; sandbox"
_ARTIFACTS_URI = "mlflow-artifacts:/"

ArtifactPath = Annotated[str, Query(max_length=1024)]
ExperimentId = Annotated[str, Path(pattern=r"^[0-9]{1,18}$")]
RunId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")]


def _tracking(request: Request) -> TrackingService:
    return service_of(request, "tracking", TrackingService)


def _proxy_path(tracking: TrackingService, principal: Principal, run_id: str, path: str) -> str:
    """The artifact proxy path (``<experiment>/<run>/artifacts/<path>``) of a run's file.

    Raises:
        InvalidParameter: a path the artifact store refuses (``..``, absolute, ...).
        NotFound: no such run, or one the principal may not read.
    """
    info = tracking.run_info(principal, run_id)
    clean = safe_relpath(path)
    if not info.artifact_uri.startswith(_ARTIFACTS_URI):
        raise NotFound("Artifact not found.")
    return f"{info.artifact_uri.removeprefix(_ARTIFACTS_URI).rstrip('/')}/{clean}"


def open_file(
    request: Request, principal: Principal, run_id: str, path: str
) -> tuple[ArtifactFile, Iterator[bytes]]:
    """(file info, its chunks) of the run's artifact ``path``, read as the MLflow artifact
    download route reads it; where reads are audited (``audit_reads``), the read is
    recorded as that route records it: granted, or refused with the error's code.

    Raises:
        InvalidParameter: a path the artifact store refuses (``..``, absolute, ...).
        NotFound: no such run or file, or one the principal may not read.
    """
    enabled = bool(getattr(request.app.state.settings, "audit_reads", False))
    audit = service_of(request, "audit", AuditLog) if enabled else None
    ctx = AuditContext(action="artifact.read", actor=principal.name, principal=principal)
    tracking = _tracking(request)
    try:
        proxy = _proxy_path(tracking, principal, run_id, path)
        found, chunks = tracking.files.download(principal, proxy)
    except ShamalError as exc:
        if audit is not None:
            ctx.target = request.url.path
            audit.record_outcome(ctx, exc.code.lower())
        raise
    reads = ReadAudit(audit, ctx)
    reads.granted(f"mlflow-artifacts:{proxy}", digest=found.digest, size=found.size)
    return found, chunks


# ---------------------------------------------------------------------------- a folder
@dataclass(frozen=True)
class Entry:
    """One line of a folder: its name, its path from the run's artifact root, its size."""

    name: str
    path: str
    is_dir: bool
    size: int | None


def crumbs(path: str) -> list[tuple[str, str]]:
    """(name, path) of each folder from the root down to ``path``."""
    parts = [p for p in path.split("/") if p]
    return [(part, "/".join(parts[: i + 1])) for i, part in enumerate(parts)]


async def artifacts_page(
    request: Request,
    principal: SessionPrincipal,
    experiment_id: ExperimentId,
    run_id: RunId,
    path: ArtifactPath = "",
) -> Response:
    """A folder of a run's artifacts (the root without ``path``): its folders, then its files
    with their sizes, under breadcrumbs."""
    tracking = _tracking(request)

    def read() -> tuple[Any, str, list[Entry]]:
        info = tracking.run_info(principal, run_id)
        clean = safe_relpath(path) if path.strip("/") else ""
        _root, listed = tracking.files.list_run(principal, run_id, clean)
        entries = [Entry(f.path.rsplit("/", 1)[-1], f.path, f.is_dir, f.file_size) for f in listed]
        entries.sort(key=lambda e: (not e.is_dir, e.name))
        return info, clean, entries

    info, clean, entries = await run_in_threadpool(read)
    if info.experiment_id != experiment_id:
        where = f"/ui/experiments/{info.experiment_id}/runs/{run_id}/artifacts"
        return redirect(where + ("?" + _encoded_path(clean) if clean else ""))
    experiment = await run_in_threadpool(tracking.experiment, principal, info.experiment_id)
    values = context(
        request,
        principal,
        f"Artifacts of {info.run_name or run_id}",
        info=info,
        experiment=experiment,
        base=f"/ui/experiments/{info.experiment_id}/runs/{run_id}",
        path=clean,
        crumbs=crumbs(clean),
        entries=entries[:LISTED],
        more=max(0, len(entries) - LISTED),
        human_size=human_size,
    )
    return page("artifacts.html", values)


def _encoded_path(path: str) -> str:
    return urlencode({"path": path})


# ---------------------------------------------------------------------------- a preview
async def preview_page(
    request: Request,
    principal: SessionPrincipal,
    experiment_id: ExperimentId,
    run_id: RunId,
    path: ArtifactPath,
) -> Response:
    """One file of a run: text (its first 64 KiB, escaped), an image, a table's first 100
    rows, or its size and a download link."""
    tracking = _tracking(request)

    def read() -> tuple[Any, Preview, str]:
        info = tracking.run_info(principal, run_id)
        found, chunks = open_file(request, principal, run_id, path)
        return info, preview_of(found.path, found.size, chunks), safe_relpath(path)

    info, preview, clean = await run_in_threadpool(read)
    if info.experiment_id != experiment_id:
        where = f"/ui/experiments/{info.experiment_id}/runs/{run_id}/artifacts/preview"
        return redirect(f"{where}?{_encoded_path(clean)}")
    folder = clean.rsplit("/", 1)[0] if "/" in clean else ""
    experiment = await run_in_threadpool(tracking.experiment, principal, info.experiment_id)
    values = context(
        request,
        principal,
        clean.rsplit("/", 1)[-1],
        info=info,
        experiment=experiment,
        base=f"/ui/experiments/{info.experiment_id}/runs/{run_id}",
        path=clean,
        folder=folder,
        crumbs=crumbs(folder),
        preview=preview,
        human_size=human_size,
        text_bytes=TEXT_BYTES,
    )
    return page("artifact_preview.html", values)


# ---------------------------------------------------------------------------- the bytes
async def artifact_raw(
    request: Request, principal: SessionPrincipal, run_id: RunId, path: ArtifactPath
) -> Response:
    """An image artifact's bytes, typed by its name (PNG, JPEG, GIF, WebP only), never
    sniffed and sandboxed; any other file answers 400."""
    media_type = IMAGE_TYPES.get(suffix(path))
    if media_type is None:
        raise InvalidParameter("Only PNG, JPEG, GIF and WebP images are shown inline.")

    def read() -> bytes:
        found, chunks = open_file(request, principal, run_id, path)
        if found.size > IMAGE_BYTES:
            head(chunks, 0)
            raise InvalidParameter("This image is too large to show; download it.")
        return head(chunks, IMAGE_BYTES)[0]

    body = await run_in_threadpool(read)
    headers = {
        "Content-Security-Policy": RAW_POLICY,
        "X-Content-Type-Options": "nosniff",
        "Content-Disposition": "inline",
        "Cache-Control": "private, no-store",
    }
    return Response(body, media_type=media_type, headers=headers)


async def download_slot(request: Request, principal: SessionPrincipal) -> AsyncIterator[None]:
    """Hold one of the account's download slots until the answer is sent in full (a
    dependency with ``scope="request"``, as the API's downloads hold theirs).

    Raises:
        TooManyRequests: the account streams as many downloads as it may already.
    """
    slots = service_of(request, "download_slots", PrincipalSlots)
    with slots.hold(f"user:{principal.user.id}"):
        yield


async def artifact_download(
    request: Request,
    principal: SessionPrincipal,
    run_id: RunId,
    path: ArtifactPath,
    _slot: Annotated[None, Depends(download_slot, scope="request")],
) -> Response:
    """A file's bytes as an attachment (``application/octet-stream``), streamed while one of
    the account's download slots is held."""
    found, chunks = await run_in_threadpool(open_file, request, principal, run_id, path)
    headers = {**download_headers(found), "Content-Security-Policy": RAW_POLICY}
    return StreamingResponse(chunks, media_type="application/octet-stream", headers=headers)


ROUTES = [
    Route("/ui/experiments/{experiment_id}/runs/{run_id}/artifacts", artifacts_page),
    Route("/ui/experiments/{experiment_id}/runs/{run_id}/artifacts/preview", preview_page),
    Route("/ui/runs/{run_id}/artifact-raw", artifact_raw),
    Route("/ui/runs/{run_id}/artifact-download", artifact_download),
]
