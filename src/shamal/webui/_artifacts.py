"""A run's artifacts: its folders and files, a preview of one file, and its bytes.

The pages call the tracking service's run files (``TrackingService.files``) as the MLflow
artifact routes do, with the signed-in principal: the run's experiment decides who reads,
and every path passes the artifact store's one validator (``..`` or an absolute path is
refused with 400). A preview reads a bounded head of the file. Only images are served
inline, from their own route, with their type, ``nosniff`` and a sandboxing CSP: an SVG or
HTML artifact is shown as text, never rendered. Everything else downloads as an attachment.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
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
from shamal.webui._common import Route, context, service_of
from shamal.webui._render import page, redirect
from shamal.webui._session import SessionPrincipal

logger = logging.getLogger(__name__)

#: What a text preview shows: the file's first 64 KiB.
TEXT_BYTES = 64 * 1024
#: What a CSV, TSV or JSON-lines preview reads to find its first rows.
TABLE_BYTES = 1024 * 1024
#: Parquet is read whole (its footer is at the end): only files up to this size.
PARQUET_BYTES = 16 * 1024 * 1024
#: Images larger than this are offered for download, not shown.
IMAGE_BYTES = 16 * 1024 * 1024
TABLE_ROWS = 100
#: The entries of a folder the page lists.
LISTED = 1000
#: Only these are ever served inline; SVG (which can hold script) is not among them.
IMAGE_TYPES = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "gif": "image/gif",
    "webp": "image/webp",
}
_DELIMITED = {"csv": ",", "tsv": "\t"}
_JSON_LINES = frozenset({"jsonl", "ndjson"})
#: The raw route's answer may be shown as an image and nothing else.
RAW_POLICY = "default-src 'none'; sandbox"
_ARTIFACTS_URI = "mlflow-artifacts:/"

ArtifactPath = Annotated[str, Query(max_length=1024)]
ExperimentId = Annotated[str, Path(pattern=r"^[0-9]{1,18}$")]
RunId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")]


def _tracking(request: Request) -> TrackingService:
    return service_of(request, "tracking", TrackingService)


def _suffix(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return name.rsplit(".", 1)[-1].lower() if "." in name else ""


def human_size(size: int | None) -> str:
    """``size`` bytes as people read it (``1.5 MiB``); empty for a folder."""
    if size is None:
        return ""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # pragma: no cover - the loop always answers


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


def _head(chunks: Iterator[bytes], limit: int) -> tuple[bytes, bool]:
    """The first ``limit`` bytes of ``chunks`` and whether there were more; the stream is
    closed either way."""
    data = bytearray()
    try:
        for chunk in chunks:
            data += chunk
            if len(data) > limit:
                return bytes(data[:limit]), True
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return bytes(data), False


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
@dataclass
class Preview:
    """What the preview page shows of one file: ``kind`` is ``image``, ``table``, ``text``
    or ``binary`` (size and a download link only)."""

    kind: str
    size: int
    text: str = ""
    truncated: bool = False
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)


def _cell(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str, sort_keys=True)


def _delimited(data: bytes, delimiter: str, truncated: bool) -> tuple[list[str], list[list[str]]]:
    text = data.decode("utf-8", errors="replace")
    if truncated:  # the last line may be cut
        text = text.rsplit("\n", 1)[0]
    reader = csv.reader(io.StringIO(text), delimiter=delimiter)
    lines = [row for _, row in zip(range(TABLE_ROWS + 1), reader, strict=False)]
    if not lines:
        raise ValueError("no whole line in the head of the file")
    return lines[0], lines[1:]


def _json_lines(data: bytes, truncated: bool) -> tuple[list[str], list[list[str]]]:
    lines = data.decode("utf-8", errors="replace").splitlines()
    if truncated:
        lines = lines[:-1]
    records: list[dict[str, object]] = []
    for line in lines:
        if len(records) == TABLE_ROWS:
            break
        if not line.strip():
            continue
        parsed = json.loads(line)
        records.append(parsed if isinstance(parsed, dict) else {"value": parsed})
    if not records:
        raise ValueError("no whole line in the head of the file")
    columns = list(dict.fromkeys(str(k) for r in records for k in r))
    return columns, [[_cell(r.get(c, "")) for c in columns] for r in records]


def _parquet(data: bytes) -> tuple[list[str], list[list[str]]]:
    import pyarrow.parquet as pq  # optional: only a Parquet preview needs it

    table = pq.read_table(io.BytesIO(data)).slice(0, TABLE_ROWS)
    columns = [str(c) for c in table.column_names]
    return columns, [[_cell(r.get(c)) for c in columns] for r in table.to_pylist()]


def _table(data: bytes, suffix: str, truncated: bool) -> tuple[list[str], list[list[str]]]:
    """(columns, the first rows) of a table file.

    Raises:
        ValueError: it does not parse as its kind (the page then shows it as text).
    """
    if suffix in _DELIMITED:
        try:
            return _delimited(data, _DELIMITED[suffix], truncated)
        except csv.Error as exc:
            raise ValueError(str(exc)) from exc
    if suffix in _JSON_LINES:
        try:
            return _json_lines(data, truncated)
        except RecursionError as exc:
            raise ValueError("nested too deeply") from exc
    try:
        return _parquet(data)
    except Exception as exc:  # pyarrow's own errors are many; any means "not readable"
        raise ValueError("not a Parquet file this server can read") from exc


def _table_bytes(suffix: str, size: int) -> int | None:
    """How much of a table file to read; None when it is not a table or too large."""
    if suffix in _DELIMITED or suffix in _JSON_LINES:
        return TABLE_BYTES
    if suffix == "parquet" and size <= PARQUET_BYTES:
        return PARQUET_BYTES
    return None


def preview_of(found: ArtifactFile, chunks: Iterator[bytes]) -> Preview:
    """What to show of the file ``found`` whose bytes are ``chunks`` (read only as far as
    the kind needs; the stream is closed)."""
    suffix = _suffix(found.path)
    if suffix in IMAGE_TYPES and found.size <= IMAGE_BYTES:
        _head(chunks, 0)
        return Preview("image", found.size)
    limit = _table_bytes(suffix, found.size)
    data, truncated = _head(chunks, limit if limit is not None else TEXT_BYTES)
    if limit is not None:
        try:
            columns, rows = _table(data, suffix, truncated)
            return Preview("table", found.size, columns=columns, rows=rows)
        except ValueError:
            logger.debug("%s does not parse as a table; shown as text", found.path)
        data, truncated = data[:TEXT_BYTES], truncated or len(data) > TEXT_BYTES
    if b"\x00" in data[:8192]:
        return Preview("binary", found.size)
    return Preview("text", found.size, data.decode("utf-8", errors="replace"), truncated)


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
        return info, preview_of(found, chunks), safe_relpath(path)

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
    media_type = IMAGE_TYPES.get(_suffix(path))
    if media_type is None:
        raise InvalidParameter("Only PNG, JPEG, GIF and WebP images are shown inline.")

    def read() -> bytes:
        found, chunks = open_file(request, principal, run_id, path)
        if found.size > IMAGE_BYTES:
            _head(chunks, 0)
            raise InvalidParameter("This image is too large to show; download it.")
        return _head(chunks, IMAGE_BYTES)[0]

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
