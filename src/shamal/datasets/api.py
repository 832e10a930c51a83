"""Native HTTP API of datasets under ``/api/v1/datasets`` (the CLI, the SDK).

A source file streams to disk under its own prefix, ``/api/v1/dataset-uploads/NAME``, held to
the upload limit; every other route takes small JSON bodies, whose fields are stated (unknown
keys are refused). Version parts download as the Parquet files they are.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request, Response, status
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from shamal.api import (
    BINARY_BODY,
    ERROR_RESPONSES,
    ListPage,
    PageBytes,
    PageToken,
    bounded_list,
    decode_cursor,
    encode_cursor,
    keyset_page,
    model_json,
)
from shamal.artifacts import consume_body, download_slot
from shamal.config import STORE_NAME_PATTERN
from shamal.datasets._batcher import STREAM_PATTERN
from shamal.datasets._diff import VersionDiff
from shamal.datasets._entities import (
    DataSet,
    DataVersion,
    DeadLetter,
    Erasure,
    Residency,
    StagedPart,
    WriteMode,
)
from shamal.datasets._expectations import MAX_SUITE_BYTES
from shamal.datasets._ingest import FORMATS
from shamal.datasets._privacy import PrivacyPolicy
from shamal.datasets._rules import MAX_PARTITIONS
from shamal.datasets._service import MAX_LIST, MAX_REVEAL, MAX_SUBJECT_CHARS, DatasetService
from shamal.datasets._sources import MAX_QUERY, MAX_SOURCE, SourceIngestion
from shamal.datasets._streams import MAX_RECORDS, StreamService, StreamWrite
from shamal.errors import InvalidParameter
from shamal.security import NAME_PATTERN, AuditContext
from shamal.security.api import CurrentPrincipal, audited

#: Where sources stream in (the server's upload limits cover this prefix).
UPLOAD_PREFIX = "/api/v1/dataset-uploads/"

router = APIRouter(prefix="/api/v1", tags=["datasets"], responses=ERROR_RESPONSES)

_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,127}$"
_ALIAS_PATTERN = r"^[a-z][a-z0-9_-]{0,63}$"


def get_datasets(request: Request) -> DatasetService:
    service: DatasetService = request.app.state.datasets
    return service


Datasets = Annotated[DatasetService, Depends(get_datasets)]


def get_sources(request: Request) -> SourceIngestion:
    sources: SourceIngestion = request.app.state.dataset_sources
    return sources


Sources = Annotated[SourceIngestion, Depends(get_sources)]
Name = Annotated[str, Path(pattern=_NAME_PATTERN, max_length=128)]
Alias = Annotated[str, Path(pattern=_ALIAS_PATTERN, max_length=64)]
Number = Annotated[int, Path(ge=1, le=999_999_999)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataSetIn(_Model):
    name: str = Field(pattern=_NAME_PATTERN, max_length=128, examples=["customers"])
    team: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=64)
    description: str = Field(default="", max_length=5000)


class DataSetOut(BaseModel):
    name: str
    team: str
    description: str
    created_by: str
    created_at: datetime
    updated_at: datetime
    latest_version: int | None
    aliases: dict[str, int]

    @classmethod
    def of(cls, found: DataSet) -> DataSetOut:
        return cls(
            name=found.name,
            team=found.team,
            description=found.description,
            created_by=found.created_by,
            created_at=found.created_at,
            updated_at=found.updated_at,
            latest_version=found.latest_version,
            aliases=found.aliases,
        )


class PartOut(BaseModel):
    digest: str
    rows: int
    size: int


class VersionOut(BaseModel):
    dataset: str
    version: int
    uri: str
    digest: str
    status: str
    row_count: int
    size_bytes: int
    columns: list[dict[str, Any]]
    parts: list[PartOut]
    source: dict[str, Any]
    mode: str
    profile: dict[str, Any]
    validation: dict[str, Any] | None
    transformations: list[dict[str, Any]]
    tags: dict[str, str]
    created_by: str
    created_at: datetime

    @classmethod
    def of(cls, found: DataVersion) -> VersionOut:
        return cls(
            dataset=found.dataset,
            version=found.version,
            uri=found.uri,
            digest=found.digest,
            status=found.status.value,
            row_count=found.row_count,
            size_bytes=found.size_bytes,
            columns=list(found.schema),
            parts=[PartOut(digest=p.digest, rows=p.rows, size=p.size) for p in found.parts],
            source=found.source,
            mode=found.mode.value,
            profile=found.profile,
            validation=found.validation,
            transformations=list(found.transformations),
            tags=found.tags,
            created_by=found.created_by,
            created_at=found.created_at,
        )


class AliasIn(_Model):
    version: int = Field(ge=1, le=999_999_999)


class TagIn(_Model):
    value: str = Field(max_length=5000, pattern=r"^[^\x00]*$")


@router.post("/datasets", status_code=status.HTTP_201_CREATED, summary="Create a dataset")
def create_dataset(
    body: DataSetIn,
    svc: Datasets,
    ctx: Annotated[AuditContext, Depends(audited("dataset.create"))],
) -> DataSetOut:
    return DataSetOut.of(svc.create(ctx, body.name, body.team, body.description))


def _dataset_cursor(found: DataSetOut) -> str:
    return encode_cursor(found.name)


@router.get(
    "/datasets",
    summary="Datasets you can see, by name (a page stops early past max_page_bytes)",
    response_model=list[DataSetOut],
)
def list_datasets(
    svc: Datasets,
    principal: CurrentPrincipal,
    page_bytes: PageBytes,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 100,
    page_token: PageToken = None,
) -> Response:
    def fetch(count: int, token: str | None) -> ListPage[DataSetOut]:
        after = decode_cursor(token, str)
        found = svc.list_datasets(principal, after=None if after is None else after[0], limit=count)
        return keyset_page([DataSetOut.of(d) for d in found], count, _dataset_cursor)

    return bounded_list(
        fetch,
        model_json,
        max_results=limit,
        page_token=page_token,
        max_bytes=page_bytes,
        cursor_of=_dataset_cursor,
    )


@router.get("/datasets/{name}", summary="One dataset, with its latest valid version and aliases")
def get_dataset(name: Name, svc: Datasets, principal: CurrentPrincipal) -> DataSetOut:
    return DataSetOut.of(svc.get(principal, name))


def _version_cursor(found: VersionOut) -> str:
    return encode_cursor(found.version)


@router.get(
    "/datasets/{name}/versions",
    summary="A dataset's versions, newest first (a page stops early past max_page_bytes)",
    response_model=list[VersionOut],
)
def list_versions(
    name: Name,
    svc: Datasets,
    principal: CurrentPrincipal,
    page_bytes: PageBytes,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 100,
    page_token: PageToken = None,
) -> Response:
    def fetch(count: int, token: str | None) -> ListPage[VersionOut]:
        before = decode_cursor(token, int)
        found = svc.versions(
            principal, name, before=None if before is None else before[0], limit=count
        )
        return keyset_page([VersionOut.of(v) for v in found], count, _version_cursor)

    return bounded_list(
        fetch,
        model_json,
        max_results=limit,
        page_token=page_token,
        max_bytes=page_bytes,
        cursor_of=_version_cursor,
    )


@router.get("/datasets/{name}/latest", summary="The dataset's latest valid version")
def latest_version(name: Name, svc: Datasets, principal: CurrentPrincipal) -> VersionOut:
    return VersionOut.of(svc.version(principal, name))


@router.get("/datasets/{name}/versions/{version}", summary="One version")
def get_version(
    name: Name, version: Number, svc: Datasets, principal: CurrentPrincipal
) -> VersionOut:
    return VersionOut.of(svc.version(principal, f"{name}/{version}"))


@router.get(
    "/datasets/{name}/versions/{version}/parts/{index}",
    summary="One Parquet part of a version",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/vnd.apache.parquet": {}}}},
    dependencies=[Depends(download_slot, scope="request")],
)
def download_part(
    name: Name,
    version: Number,
    index: Annotated[int, Path(ge=0, le=1_000_000)],
    svc: Datasets,
    principal: CurrentPrincipal,
) -> StreamingResponse:
    chunks = svc.open_part(principal, f"{name}/{version}", index)
    return StreamingResponse(chunks, media_type="application/vnd.apache.parquet")


@router.get("/datasets/{name}/aliases/{alias}", summary="The version an alias names")
def get_alias(name: Name, alias: Alias, svc: Datasets, principal: CurrentPrincipal) -> VersionOut:
    return VersionOut.of(svc.version(principal, f"{name}@{alias}"))


@router.put("/datasets/{name}/aliases/{alias}", summary="Point an alias at a version")
def set_alias(
    name: Name,
    alias: Alias,
    body: AliasIn,
    svc: Datasets,
    ctx: Annotated[AuditContext, Depends(audited("dataset.alias"))],
) -> VersionOut:
    return VersionOut.of(svc.set_alias(ctx, name, alias, body.version))


@router.delete(
    "/datasets/{name}/aliases/{alias}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Remove an alias",
)
def delete_alias(
    name: Name,
    alias: Alias,
    svc: Datasets,
    ctx: Annotated[AuditContext, Depends(audited("dataset.alias.delete"))],
) -> Response:
    svc.delete_alias(ctx, name, alias)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.put(
    "/datasets/{name}/versions/{version}/tags/{key}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Set a tag on a version",
)
def set_tag(
    name: Name,
    version: Number,
    key: Annotated[str, Path(min_length=1, max_length=250)],
    body: TagIn,
    svc: Datasets,
    ctx: Annotated[AuditContext, Depends(audited("dataset.tag"))],
) -> Response:
    svc.set_tag(ctx, name, version, key, body.value)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


class SuiteIn(_Model):
    yaml: str = Field(max_length=MAX_SUITE_BYTES, description="The expectation suite, as YAML")


class SuiteOut(BaseModel):
    yaml: str | None


@router.get("/datasets/{name}/suite", summary="The suite new versions are validated against")
def get_suite(name: Name, svc: Datasets, principal: CurrentPrincipal) -> SuiteOut:
    found = svc.suite(principal, name)
    return SuiteOut(yaml=None if found is None else found.to_yaml())


@router.put("/datasets/{name}/suite", summary="Validate every new version against a suite")
def set_suite(
    name: Name,
    body: SuiteIn,
    svc: Datasets,
    ctx: Annotated[AuditContext, Depends(audited("dataset.suite"))],
) -> SuiteOut:
    found = svc.set_suite(ctx, name, body.yaml)
    return SuiteOut(yaml=None if found is None else found.to_yaml())


@router.delete(
    "/datasets/{name}/suite", status_code=status.HTTP_204_NO_CONTENT, summary="Remove the suite"
)
def delete_suite(
    name: Name,
    svc: Datasets,
    ctx: Annotated[AuditContext, Depends(audited("dataset.suite"))],
) -> Response:
    svc.set_suite(ctx, name, None)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/dataset-uploads/{name}",
    status_code=status.HTTP_201_CREATED,
    summary="Write a version from a source file (the request body)",
    openapi_extra=BINARY_BODY,
)
async def upload_version(
    name: Name,
    request: Request,
    svc: Datasets,
    ctx: Annotated[AuditContext, Depends(audited("dataset.ingest"))],
    fmt: Annotated[str, Query(alias="format", pattern="^(" + "|".join(FORMATS) + ")$")],
    mode: WriteMode = WriteMode.APPEND,
    store: Annotated[str | None, Query(pattern=STORE_NAME_PATTERN, max_length=64)] = None,
) -> VersionOut:
    version = await consume_body(
        request, lambda chunks: svc.ingest(ctx, name, chunks, fmt, mode=mode, store=store)
    )
    return VersionOut.of(version)


# ---------------------------------------------------------------------- residency
_REGION_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
Region = Annotated[str, Field(pattern=_REGION_PATTERN, max_length=64)]


class ResidencyIn(_Model):
    regions: list[Region] | None = Field(
        min_length=1,
        max_length=64,
        description="the regions the data may be stored and processed in (null: anywhere)",
        examples=[["ae-dubai", "ae-abudhabi"]],
    )


class StoreOut(BaseModel):
    name: str
    region: str | None
    allowed: bool = Field(description="whether the dataset's policy lets the store hold its data")
    parts: int = Field(description="how many of the dataset's parts the store holds")


class ResidencyOut(BaseModel):
    dataset: str
    regions: list[str] | None
    stores: list[StoreOut]

    @classmethod
    def of(cls, found: Residency) -> ResidencyOut:
        return cls(
            dataset=found.dataset,
            regions=None if found.regions is None else list(found.regions),
            stores=[
                StoreOut(name=s.name, region=s.region, allowed=s.allowed, parts=s.parts)
                for s in found.stores
            ],
        )


class CopyIn(_Model):
    store: str = Field(pattern=STORE_NAME_PATTERN, max_length=64, examples=["dubai"])


class VersionStoresOut(BaseModel):
    uri: str
    stores: list[str] = Field(description="the stores that hold every part of the version")


@router.get(
    "/datasets/{name}/residency",
    summary="The dataset's residency policy, and the stores judged by it",
)
def get_residency(name: Name, svc: Datasets, principal: CurrentPrincipal) -> ResidencyOut:
    return ResidencyOut.of(svc.residency(principal, name))


@router.put(
    "/datasets/{name}/residency",
    summary="Allow the dataset's data only in these regions (maintainers; null: anywhere)",
)
def set_residency(
    name: Name,
    body: ResidencyIn,
    svc: Datasets,
    ctx: Annotated[AuditContext, Depends(audited("dataset.residency"))],
) -> ResidencyOut:
    return ResidencyOut.of(svc.set_residency(ctx, name, body.regions))


@router.get(
    "/datasets/{name}/versions/{version}/stores",
    summary="The stores that hold the whole version",
)
def version_stores(
    name: Name, version: Number, svc: Datasets, principal: CurrentPrincipal
) -> VersionStoresOut:
    reference = f"{name}/{version}"
    return VersionStoresOut(
        uri=f"data:/{reference}", stores=list(svc.version_stores(principal, reference))
    )


@router.post(
    "/datasets/{name}/versions/{version}/copies",
    summary="Copy a version into another store (maintainers; refused outside the policy)",
)
def copy_version(
    name: Name,
    version: Number,
    body: CopyIn,
    svc: Datasets,
    ctx: Annotated[AuditContext, Depends(audited("dataset.copy"))],
) -> VersionStoresOut:
    reference = f"{name}/{version}"
    stores = svc.copy_version(ctx, reference, body.store)
    return VersionStoresOut(uri=f"data:/{reference}", stores=list(stores))


#: A version within a dataset: its number, an alias, or ``latest`` (the latest valid one).
_WITHIN_PATTERN = r"^([1-9][0-9]{0,8}|[a-z][a-z0-9_-]{0,63})$"
_WITHIN_HELP = "A version number, an alias, or latest (the latest valid version)"


def _within(name: str, ref: str) -> str:
    if ref.isdigit():
        return f"{name}/{ref}"
    return name if ref == "latest" else f"{name}@{ref}"


class TypeChangeOut(BaseModel):
    name: str
    before: str
    after: str


class ColumnShiftOut(BaseModel):
    name: str
    null_rate_change: float
    mean_change: float | str | None = Field(description="A number, or 'NaN' / 'Infinity'")
    distinct_change: int | None
    ks: float | None = Field(description="Kolmogorov-Smirnov statistic between the profiles")
    psi: float | None = Field(description="Population stability index (> 0.25: a major shift)")


class DiffOut(BaseModel):
    before: str
    after: str
    same_content: bool
    rows_before: int
    rows_after: int
    row_change: int
    schema_changed: bool
    added: list[dict[str, Any]]
    removed: list[dict[str, Any]]
    type_changes: list[TypeChangeOut]
    nullability_changes: list[str]
    profile_scopes: list[str]
    columns: list[ColumnShiftOut]

    @classmethod
    def of(cls, found: VersionDiff) -> DiffOut:
        return cls.model_validate(found.to_json())


@router.get(
    "/datasets/{name}/diff",
    summary="How one version differs from another: schema, rows, profile shift per column",
)
def diff_versions(
    name: Name,
    svc: Datasets,
    principal: CurrentPrincipal,
    before: Annotated[
        str, Query(alias="from", pattern=_WITHIN_PATTERN, max_length=64, description=_WITHIN_HELP)
    ],
    after: Annotated[
        str, Query(alias="to", pattern=_WITHIN_PATTERN, max_length=64, description=_WITHIN_HELP)
    ],
) -> DiffOut:
    return DiffOut.of(svc.diff(principal, _within(name, before), _within(name, after)))


# ---------------------------------------------------------------------- streams
_KEY_PATTERN = r"^[^\x00-\x1f\x7f]{1,256}$"
_ARROW_STREAM = "application/vnd.apache.arrow.stream"


def get_streams(request: Request) -> StreamService:
    """The stream writer, made once per app beside the dataset service."""
    state = request.app.state
    found: StreamService | None = getattr(state, "dataset_streams", None)
    if found is None:
        spool = state.settings.resolved_upload_spool_dir / "dataset-streams"
        found = StreamService(state.db, state.audit, state.datasets, spool)
        state.dataset_streams = found
    return found


Streams = Annotated[StreamService, Depends(get_streams)]


class RecordIn(_Model):
    key: str = Field(pattern=_KEY_PATTERN, description="The record's idempotency key")
    row: dict[str, Any] = Field(description="The row: column name to value")


class DeadIn(_Model):
    key: str = Field(pattern=_KEY_PATTERN)
    reason: str = Field(max_length=500, pattern=r"^[^\x00]*$")
    digest: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the payload")
    size: int = Field(ge=0, le=1 << 40)


class StreamBatchIn(_Model):
    stream: str = Field(
        max_length=255,
        pattern=STREAM_PATTERN,
        examples=["redis:events"],
        description="What the keys are unique within ('scheme:name'); never credentials",
    )
    records: list[RecordIn] = Field(max_length=MAX_RECORDS)
    dead: list[DeadIn] = Field(default_factory=list, max_length=MAX_RECORDS)


class StreamWriteOut(BaseModel):
    version: VersionOut | None
    written: int
    skipped: int
    parked: int
    replayed: bool

    @classmethod
    def of(cls, done: StreamWrite) -> StreamWriteOut:
        return cls(
            version=None if done.version is None else VersionOut.of(done.version),
            written=done.written,
            skipped=done.skipped,
            parked=done.parked,
            replayed=done.replayed,
        )


class DeadLetterOut(BaseModel):
    stream: str
    key: str
    reason: str
    digest: str
    size: int
    created_at: datetime | None


@router.post(
    "/datasets/{name}/stream-batches",
    summary="Append a consumer's micro-batch of keyed records, exactly once by key",
)
def write_stream_batch(
    name: Name,
    body: StreamBatchIn,
    svc: Streams,
    ctx: Annotated[AuditContext, Depends(audited("dataset.stream"))],
) -> StreamWriteOut:
    records = [(record.key, record.row) for record in body.records]
    dead = [DeadLetter(d.key, d.reason, d.digest, d.size) for d in body.dead]
    return StreamWriteOut.of(svc.write_records(ctx, name, body.stream, records, dead))


def _json_rows(chunks: Iterator[bytes]) -> list[Any]:
    try:
        value = json.loads(b"".join(chunks))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise InvalidParameter("the push is not JSON; send an array of row objects") from None
    rows = value.get("rows") if isinstance(value, dict) else value
    if not isinstance(rows, list):
        raise InvalidParameter('send an array of row objects, or {"rows": [...]}')
    return rows


@router.post(
    "/datasets/{name}/push",
    status_code=status.HTTP_201_CREATED,
    summary="Push rows (JSON array or Arrow IPC stream), written once per Idempotency-Key",
    openapi_extra=BINARY_BODY,
    responses={200: {"description": "A replay: the version the first push with the key wrote"}},
)
async def push_rows(
    name: Name,
    request: Request,
    response: Response,
    svc: Streams,
    ctx: Annotated[AuditContext, Depends(audited("dataset.push"))],
    key: Annotated[str, Header(alias="Idempotency-Key", pattern=_KEY_PATTERN)],
) -> StreamWriteOut:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == _ARROW_STREAM:
        done = await consume_body(request, lambda chunks: svc.push_arrow(ctx, name, key, chunks))
    elif kind == "application/json":
        done = await consume_body(
            request, lambda chunks: svc.push_rows(ctx, name, key, _json_rows(chunks))
        )
    else:
        raise InvalidParameter(f"a push is application/json or {_ARROW_STREAM}; set Content-Type")
    if done.replayed:
        response.status_code = status.HTTP_200_OK
    return StreamWriteOut.of(done)


@router.get("/datasets/{name}/dead-letters", summary="A dataset's parked stream records")
def list_dead_letters(
    name: Name,
    svc: Streams,
    principal: CurrentPrincipal,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[DeadLetterOut]:
    return [
        DeadLetterOut(
            stream=d.stream,
            key=d.key,
            reason=d.reason,
            digest=d.digest,
            size=d.size,
            created_at=d.created_at,
        )
        for d in svc.dead_letters(principal, name, limit)
    ]


# ---------------------------------------------------------------------- privacy


class PrivacyOut(BaseModel):
    policy: dict[str, Any] | None = Field(description="The policy as JSON (version, columns)")
    yaml: str | None = Field(description="The same, as YAML")


def _privacy_out(found: PrivacyPolicy | None) -> PrivacyOut:
    if found is None:
        return PrivacyOut(policy=None, yaml=None)
    return PrivacyOut(policy=found.to_json(), yaml=found.to_yaml())


@router.get("/datasets/{name}/privacy", summary="The privacy policy new versions are written under")
def get_privacy(name: Name, svc: Datasets, principal: CurrentPrincipal) -> PrivacyOut:
    return _privacy_out(svc.privacy(principal, name))


@router.put(
    "/datasets/{name}/privacy",
    summary="Pseudonymize the personal columns of every new version (maintainers)",
    description='The body is the policy as JSON (`{"version": 1, "columns": {...}}`), or '
    '`{"yaml": "..."}` holding it as YAML; an unknown key anywhere is a 400.',
)
def set_privacy(
    name: Name,
    body: Annotated[dict[str, Any], Body()],
    svc: Datasets,
    ctx: Annotated[AuditContext, Depends(audited("dataset.privacy"))],
) -> PrivacyOut:
    if set(body) == {"yaml"}:
        if not isinstance(body["yaml"], str):
            raise InvalidParameter("'yaml' holds the policy as YAML text")
        text = body["yaml"]
    else:
        text = json.dumps(body)
    return _privacy_out(svc.set_privacy(ctx, name, text))


@router.delete(
    "/datasets/{name}/privacy",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Remove the privacy policy (versions already written keep what they hold)",
)
def delete_privacy(
    name: Name,
    svc: Datasets,
    ctx: Annotated[AuditContext, Depends(audited("dataset.privacy"))],
) -> Response:
    svc.set_privacy(ctx, name, None)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


_COLUMN = Field(min_length=1, max_length=256, pattern=r"^[^\x00]+$")


class RevealIn(_Model):
    column: str = _COLUMN
    tokens: list[str] = Field(min_length=1, max_length=MAX_REVEAL)


class RevealOut(BaseModel):
    values: list[str | None] = Field(
        description="The value behind each token, in order; null where it is not a token of "
        "this column"
    )


@router.post(
    "/datasets/{name}/reveal",
    summary="The values behind tokenized values of a column (privacy officers; audited)",
    response_model=RevealOut,
)
def reveal_tokens(
    name: Name,
    body: RevealIn,
    svc: Datasets,
    ctx: Annotated[AuditContext, Depends(audited("dataset.reveal"))],
) -> JSONResponse:
    values = svc.reveal(ctx, name, body.column, body.tokens)
    # Personal values: never kept by a cache on the way.
    return JSONResponse(
        RevealOut(values=values).model_dump(), headers={"Cache-Control": "no-store"}
    )


class ErasureIn(_Model):
    column: str = _COLUMN
    subject: str = Field(
        min_length=1,
        max_length=MAX_SUBJECT_CHARS,
        description="The data subject's value in that column, as the source held it",
    )


class ErasureOut(BaseModel):
    id: str
    dataset: str
    column: str
    subject_hash: str
    rows_removed: int
    versions: list[dict[str, Any]]
    created_by: str
    created_at: datetime

    @classmethod
    def of(cls, found: Erasure) -> ErasureOut:
        return cls(
            id=found.id,
            dataset=found.dataset,
            column=found.column,
            subject_hash=found.subject_hash,
            rows_removed=found.rows_removed,
            versions=list(found.versions),
            created_by=found.created_by,
            created_at=found.created_at,
        )


@router.post(
    "/datasets/{name}/erasures",
    status_code=status.HTTP_201_CREATED,
    summary="Erase a data subject's rows from every version (maintainers, privacy officers)",
)
def erase_subject(
    name: Name,
    body: ErasureIn,
    svc: Datasets,
    ctx: Annotated[AuditContext, Depends(audited("dataset.erase"))],
) -> ErasureOut:
    return ErasureOut.of(svc.erase(ctx, name, body.column, body.subject))


@router.get(
    "/datasets/{name}/erasures",
    summary="The erasures made in a dataset (maintainers, privacy officers)",
    response_model=list[ErasureOut],
)
def list_erasures(name: Name, svc: Datasets, principal: CurrentPrincipal) -> list[ErasureOut]:
    return [ErasureOut.of(e) for e in svc.erasures(principal, name)]


class KeyOut(BaseModel):
    key: str = Field(description="The id of the new active pseudonymization key")


@router.post(
    "/privacy/keys",
    status_code=status.HTTP_201_CREATED,
    tags=["privacy"],
    summary="Rotate the pseudonymization keys: a new secret is active (platform admins)",
)
def rotate_privacy_key(
    svc: Datasets, ctx: Annotated[AuditContext, Depends(audited("privacy.key.rotate"))]
) -> KeyOut:
    return KeyOut(key=svc.rotate_privacy_key(ctx))


class IngestionIn(_Model):
    """A source the server reads itself: an S3 object of an allowed bucket, or a query on an
    allowed PostgreSQL or MariaDB/MySQL host (its password, if any, is used to connect and
    never stored)."""

    source: str = Field(
        min_length=1,
        max_length=MAX_SOURCE,
        examples=["s3://raw/customers.csv.gz", "postgresql://reader@db:5432/shop"],
    )
    query: str | None = Field(default=None, max_length=MAX_QUERY, examples=["SELECT * FROM t"])
    format: str | None = Field(default=None, pattern="^(" + "|".join(FORMATS) + ")$")
    mode: WriteMode = WriteMode.APPEND


@router.post(
    "/datasets/{name}/ingestions",
    status_code=status.HTTP_201_CREATED,
    summary="Write a version from a source the server reads (S3, PostgreSQL, MariaDB/MySQL)",
)
def ingest_source(
    name: Name,
    body: IngestionIn,
    sources: Sources,
    ctx: Annotated[AuditContext, Depends(audited("dataset.ingest"))],
) -> VersionOut:
    version = sources.ingest(
        ctx, name, body.source, query=body.query, fmt=body.format, mode=body.mode
    )
    return VersionOut.of(version)


_BATCH_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_COLUMN_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"


class StageIn(_Model):
    """One partition of a source for the server to read and stage (a worker of a gang job
    sends its own): an S3 prefix's objects ``partition``, ``partition + partitions``, ...,
    or the rows of a query whose ``partition_by`` column hashes to ``partition``."""

    source: str = Field(
        min_length=1,
        max_length=MAX_SOURCE,
        examples=["s3://raw/events/", "postgresql://reader@db:5432/shop"],
    )
    query: str | None = Field(default=None, max_length=MAX_QUERY, examples=["SELECT * FROM t"])
    format: str | None = Field(default=None, pattern="^(" + "|".join(FORMATS) + ")$")
    partition_by: str | None = Field(default=None, pattern=_COLUMN_PATTERN, examples=["id"])
    batch: str = Field(pattern=_BATCH_PATTERN, examples=["job-3f2a"])
    partition: int = Field(ge=0, lt=MAX_PARTITIONS)
    partitions: int = Field(ge=1, le=MAX_PARTITIONS)


class StagedOut(BaseModel):
    batch: str
    partition: int
    partitions: int
    digest: str
    rows: int
    size: int
    store: str
    columns: list[dict[str, Any]]
    profile: dict[str, Any]
    source: dict[str, Any]
    staged_by: str
    staged_at: datetime

    @classmethod
    def of(cls, found: StagedPart) -> StagedOut:
        return cls(
            batch=found.batch,
            partition=found.partition,
            partitions=found.partitions,
            digest=found.part.digest,
            rows=found.part.rows,
            size=found.part.size,
            store=found.store,
            columns=list(found.schema),
            profile=found.profile,
            source=found.source,
            staged_by=found.staged_by,
            staged_at=found.staged_at,
        )


class CommitIn(_Model):
    """Commit the caller's ``partitions`` staged parts of ``batch`` as one version."""

    batch: str = Field(pattern=_BATCH_PATTERN, examples=["job-3f2a"])
    partitions: int = Field(ge=1, le=MAX_PARTITIONS)
    mode: WriteMode = WriteMode.APPEND


@router.post(
    "/datasets/{name}/ingestions/parts",
    status_code=status.HTTP_201_CREATED,
    summary="Read and stage one partition of a source (a part of a partitioned write)",
)
def stage_part(
    name: Name,
    body: StageIn,
    sources: Sources,
    ctx: Annotated[AuditContext, Depends(audited("dataset.stage"))],
) -> StagedOut:
    staged = sources.stage(
        ctx,
        name,
        body.source,
        (body.batch, body.partition, body.partitions),
        query=body.query,
        fmt=body.format,
        partition_by=body.partition_by,
    )
    return StagedOut.of(staged)


@router.get(
    "/datasets/{name}/ingestions/parts",
    summary="The caller's staged parts of a batch, by partition",
)
def staged_parts(
    name: Name,
    svc: Datasets,
    principal: CurrentPrincipal,
    batch: Annotated[str, Query(pattern=_BATCH_PATTERN)],
) -> list[StagedOut]:
    return [StagedOut.of(p) for p in svc.staged_parts(principal, name, batch)]


@router.post(
    "/datasets/{name}/ingestions/commits",
    status_code=status.HTTP_201_CREATED,
    summary="Commit the caller's staged parts of a batch as one version",
)
def commit_parts(
    name: Name,
    body: CommitIn,
    svc: Datasets,
    ctx: Annotated[AuditContext, Depends(audited("dataset.ingest"))],
) -> VersionOut:
    version = svc.commit_parts(ctx, name, body.batch, body.partitions, mode=body.mode)
    return VersionOut.of(version)
