"""Native HTTP API of the feature store under ``/api/v1/features`` (the CLI, the SDK, models).

Definitions travel as the registry's JSON (the CLI reads the user's YAML and Python and sends
that); unknown keys are refused. Entity rows for a training set stream in as an Arrow IPC
stream under ``/api/v1/feature-uploads/`` (held to the upload limit), and the training set
streams back as an Arrow IPC stream. Online reads are small JSON both ways.
"""

from __future__ import annotations

import io
import shutil
import tempfile
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path as FilePath
from typing import Annotated, Any

import orjson
import pyarrow as pa
import pyarrow.ipc as paipc
import pyarrow.parquet as pq
from fastapi import APIRouter, Depends, Path, Query, Request, Response, status
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from shamal.api import BINARY_BODY, ERROR_RESPONSES
from shamal.artifacts import consume_body
from shamal.errors import InvalidParameter
from shamal.features._definitions import Definitions
from shamal.features._entities import (
    KINDS,
    EntityRows,
    FeatureObject,
    Materialization,
    TrainingSet,
)
from shamal.features._service import MAX_ONLINE_ENTITIES, FeatureStoreService
from shamal.security import AuditContext, Principal
from shamal.security.api import CurrentPrincipal, audited, read_only_post

#: Where entity rows stream in (the server's upload limits cover this prefix).
UPLOAD_PREFIX = "/api/v1/feature-uploads/"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
_NAME = r"^[a-z][a-z0-9_]{0,62}$"
#: Entity rows one upload may hold.
MAX_ENTITY_ROWS = 50_000_000

router = APIRouter(prefix="/api/v1", tags=["features"], responses=ERROR_RESPONSES)
#: The online read alone: the server routes it before any other (models call it per request).
online_router = APIRouter(prefix="/api/v1", tags=["features"], responses=ERROR_RESPONSES)


def get_features(request: Request) -> FeatureStoreService:
    service: FeatureStoreService = request.app.state.features
    return service


Features = Annotated[FeatureStoreService, Depends(get_features)]
#: A POST that changes nothing (a plan, an online read): not audited.
ReadOnlyPost = Annotated[Principal, Depends(read_only_post)]
Kind = Annotated[str, Path(pattern="^(entity|feature_view|feature_service)$")]
Name = Annotated[str, Path(pattern=_NAME, max_length=63)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DefinitionsIn(_Model):
    definitions: dict[str, Any] = Field(
        description="entities, feature_views and feature_services, each a list"
    )
    prune: bool = Field(
        default=False, description="delete what the registry holds and this set leaves out"
    )

    def parsed(self) -> Definitions:
        return Definitions.from_json(self.definitions)


class FeatureObjectOut(BaseModel):
    kind: str
    name: str
    version: int
    owner: str
    uri: str
    definition: dict[str, Any]
    digest: str
    deleted: bool
    apply_number: int
    created_by: str
    created_at: datetime

    @classmethod
    def of(cls, found: FeatureObject) -> FeatureObjectOut:
        return cls(
            kind=found.kind,
            name=found.name,
            version=found.version,
            owner=found.owner,
            uri=found.uri,
            definition=found.definition,
            digest=found.digest,
            deleted=found.deleted,
            apply_number=found.apply_number,
            created_by=found.created_by,
            created_at=found.created_at,
        )


class RegistryOut(BaseModel):
    number: int
    definitions: dict[str, Any]


class AppliedOut(BaseModel):
    number: int | None
    changes: list[dict[str, Any]]
    written: list[FeatureObjectOut]


class MaterializeIn(_Model):
    views: list[Annotated[str, Field(pattern=_NAME, max_length=63)]] | None = Field(
        default=None, max_length=1000, description="default: every online view"
    )
    end: datetime | None = Field(default=None, description="default: now")
    incremental: bool = False


class MaterializationOut(BaseModel):
    id: str
    view: str
    view_version: int
    source: str
    store: str
    start: datetime | None
    end: datetime
    state: str
    chunks_done: int
    chunks_total: int
    rows: int
    error: str | None
    created_by: str
    started_at: datetime
    finished_at: datetime | None

    @classmethod
    def of(cls, found: Materialization) -> MaterializationOut:
        return cls(
            id=found.id,
            view=found.view,
            view_version=found.view_version,
            source=found.source,
            store=found.store,
            start=found.start,
            end=found.end,
            state=found.state.value,
            chunks_done=found.chunks_done,
            chunks_total=found.chunks_total,
            rows=found.rows,
            error=found.error,
            created_by=found.created_by,
            started_at=found.started_at,
            finished_at=found.finished_at,
        )


_Feature = Annotated[
    str, Field(max_length=130, pattern=r"^[a-z][a-z0-9_]{0,62}:(\*|[a-z][a-z0-9_]{0,62})$")
]
_Value = str | int | float | bool | None


class OnlineIn(_Model):
    features: list[_Feature] | None = Field(default=None, max_length=10_000)
    feature_service: str | None = Field(default=None, pattern=_NAME, max_length=63)
    entities: dict[Annotated[str, Field(max_length=128)], list[_Value]] = Field(
        max_length=64,
        description=f"join key -> one value per entity (at most {MAX_ONLINE_ENTITIES:,})",
    )
    full_names: bool = False


class HistoricalIn(_Model):
    dataset: str = Field(
        max_length=300, description="the entity rows' dataset (NAME, NAME/3, NAME@alias)"
    )
    sql: str | None = Field(default=None, max_length=65_536)
    timestamp: str = Field(default="event_timestamp", max_length=128)
    features: list[_Feature] | None = Field(default=None, max_length=10_000)
    feature_service: str | None = Field(default=None, pattern=_NAME, max_length=63)
    full_names: bool = False
    save_as: str | None = Field(default=None, max_length=128)


class PushIn(_Model):
    rows: list[dict[Annotated[str, Field(max_length=128)], _Value]] = Field(max_length=100_000)
    offline: bool = True


# ---------------------------------------------------------------------- registry
@router.get("/features/registry", summary="The live definitions and the registry's number")
def get_registry(svc: Features, principal: CurrentPrincipal) -> RegistryOut:
    del principal
    number, definitions = svc.definitions()
    return RegistryOut(number=number, definitions=definitions.to_json())


@router.post("/features/plan", summary="What an apply of these definitions would change")
def post_plan(body: DefinitionsIn, svc: Features, principal: ReadOnlyPost) -> dict[str, Any]:
    return svc.plan(principal, body.parsed(), prune=body.prune).to_json()


@router.post("/features/apply", summary="Apply definitions: a new version of each changed object")
def post_apply(
    body: DefinitionsIn,
    svc: Features,
    ctx: Annotated[AuditContext, Depends(audited("features.apply"))],
) -> AppliedOut:
    done = svc.apply(ctx, body.parsed(), prune=body.prune)
    return AppliedOut(
        number=done.number,
        changes=list(done.changes),
        written=[FeatureObjectOut.of(o) for o in done.written],
    )


@router.get("/features/objects", summary="The live definitions, one row each")
def list_objects(
    svc: Features,
    principal: CurrentPrincipal,
    kind: Annotated[str | None, Query(pattern="^(entity|feature_view|feature_service)$")] = None,
) -> list[FeatureObjectOut]:
    del principal
    return [FeatureObjectOut.of(o) for o in svc.objects(kind)]


@router.get("/features/objects/{kind}/{name}/versions", summary="Every version of a definition")
def object_versions(
    kind: Kind, name: Name, svc: Features, principal: CurrentPrincipal
) -> list[FeatureObjectOut]:
    del principal
    assert kind in KINDS
    return [FeatureObjectOut.of(o) for o in svc.history(kind, name)]


# ---------------------------------------------------------------------- offline
def _arrow_table(chunks: Iterator[bytes], folder: FilePath) -> pa.Table:
    path = folder / "entities.arrows"
    with path.open("wb") as out:
        for chunk in chunks:
            out.write(chunk)
    try:
        with paipc.open_stream(pa.memory_map(str(path))) as reader:
            table = reader.read_all()
    except (pa.ArrowInvalid, OSError, ValueError):
        raise InvalidParameter(f"the body is not an Arrow IPC stream ({ARROW_STREAM})") from None
    if table.num_rows > MAX_ENTITY_ROWS:
        raise InvalidParameter(f"at most {MAX_ENTITY_ROWS:,} entity rows in one request")
    return table


class _Collected(io.RawIOBase):
    """A write-only file that keeps what is written until :meth:`take`."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


def _arrow_file_stream(path: FilePath, folder: FilePath) -> Iterator[bytes]:
    """A Parquet file's rows as an Arrow IPC stream, batch by batch; ``folder`` goes after."""
    try:
        source = pq.ParquetFile(path)
        collected = _Collected()
        with paipc.new_stream(pa.PythonFile(collected, mode="w"), source.schema_arrow) as writer:
            for batch in source.iter_batches(batch_size=65_536):
                writer.write_batch(batch)
                yield collected.take()
        yield collected.take()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _training_response(run: Callable[[FilePath], TrainingSet]) -> Response:
    folder = FilePath(tempfile.mkdtemp(prefix="training-"))
    try:
        found = run(folder / "training.parquet")
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    headers = {
        "X-Shamal-Rows": str(found.rows),
        "X-Shamal-Views": ",".join(v["view"] for v in found.views),
    }
    if found.saved_as is not None:
        headers["X-Shamal-Saved-As"] = found.saved_as
    return StreamingResponse(
        _arrow_file_stream(found.path, folder), media_type=ARROW_STREAM, headers=headers
    )


_FEATURES_QUERY = Query(max_length=10_000, description="VIEW:FEATURE or VIEW:*, repeated")


@router.post(
    "/feature-uploads/historical",
    summary="A point-in-time-correct training set for uploaded entity rows (Arrow IPC both ways)",
    openapi_extra=BINARY_BODY,
    response_class=StreamingResponse,
)
async def historical_upload(
    request: Request,
    svc: Features,
    ctx: Annotated[AuditContext, Depends(audited("features.historical"))],
    features: Annotated[list[str] | None, _FEATURES_QUERY] = None,
    feature_service: Annotated[str | None, Query(pattern=_NAME, max_length=63)] = None,
    timestamp: Annotated[str, Query(max_length=128)] = "event_timestamp",
    full_names: bool = False,
    save_as: Annotated[str | None, Query(max_length=128)] = None,
) -> Response:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != ARROW_STREAM:
        raise InvalidParameter(f"send the entity rows as {ARROW_STREAM}; set Content-Type")

    def work(chunks: Iterator[bytes]) -> Response:
        with tempfile.TemporaryDirectory(prefix="entities-") as spool:
            table = _arrow_table(chunks, FilePath(spool))
            return _training_response(
                lambda out: svc.historical(
                    ctx,
                    EntityRows(table, timestamp),
                    features=features,
                    service=feature_service,
                    full_names=full_names,
                    out=out,
                    save_as=save_as,
                )
            )

    return await consume_body(request, work)


@router.post(
    "/features/historical",
    summary="A point-in-time-correct training set for a dataset's rows (Arrow IPC back)",
    response_class=StreamingResponse,
)
def historical_dataset(
    body: HistoricalIn,
    svc: Features,
    ctx: Annotated[AuditContext, Depends(audited("features.historical"))],
) -> Response:
    return _training_response(
        lambda out: svc.historical(
            ctx,
            EntityRows(body.dataset, body.timestamp, body.sql),
            features=body.features,
            service=body.feature_service,
            full_names=body.full_names,
            out=out,
            save_as=body.save_as,
        )
    )


# ---------------------------------------------------------------------- online
@router.post("/features/materializations", summary="Materialize views into the online store")
def post_materialize(
    body: MaterializeIn,
    svc: Features,
    ctx: Annotated[AuditContext, Depends(audited("features.materialize"))],
) -> list[MaterializationOut]:
    done = svc.materialize(ctx, body.views, end=body.end, incremental=body.incremental)
    return [MaterializationOut.of(m) for m in done]


@router.get("/features/materializations", summary="Materializations, newest first")
def list_materializations(
    svc: Features,
    principal: CurrentPrincipal,
    view: Annotated[str | None, Query(pattern=_NAME, max_length=63)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[MaterializationOut]:
    del principal
    return [MaterializationOut.of(m) for m in svc.materializations(view, limit=limit)]


@online_router.post(
    "/features/online", summary="Online feature values of entities, in one round trip"
)
def post_online(body: OnlineIn, svc: Features, principal: ReadOnlyPost) -> Response:
    found = svc.online(
        principal,
        body.entities,
        features=body.features,
        service=body.feature_service,
        full_names=body.full_names,
    )
    payload = {
        "entities": found.entities,
        "features": found.values,
        "views": found.views,
        "status": found.status,
        "event_timestamps": found.event_timestamps,
    }
    return Response(
        orjson.dumps(payload, option=orjson.OPT_NAIVE_UTC), media_type="application/json"
    )


@router.post(
    "/features/views/{name}/push",
    status_code=status.HTTP_201_CREATED,
    summary="Write fresh rows of a view online and (by default) offline at once",
)
def push_rows(
    name: Name,
    body: PushIn,
    svc: Features,
    ctx: Annotated[AuditContext, Depends(audited("features.push"))],
) -> dict[str, int]:
    if not body.rows:
        raise InvalidParameter("no rows to push")
    try:
        table = pa.Table.from_pylist(body.rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        raise InvalidParameter("the rows' values do not make columns of one type each") from None
    return {"written": svc.push(ctx, name, table, offline=body.offline)}
