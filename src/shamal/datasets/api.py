"""Native HTTP API of datasets under ``/api/v1/datasets`` (the CLI, the SDK).

A source file streams to disk under its own prefix, ``/api/v1/dataset-uploads/NAME``, held to
the upload limit; every other route takes small JSON bodies, whose fields are stated (unknown
keys are refused). Version parts download as the Parquet files they are.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status
from fastapi.responses import StreamingResponse
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
from shamal.datasets._entities import DataSet, DataVersion, WriteMode
from shamal.datasets._expectations import MAX_SUITE_BYTES
from shamal.datasets._ingest import FORMATS
from shamal.datasets._service import MAX_LIST, DatasetService
from shamal.datasets._sources import MAX_QUERY, MAX_SOURCE, SourceIngestion
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
) -> VersionOut:
    version = await consume_body(
        request, lambda chunks: svc.ingest(ctx, name, chunks, fmt, mode=mode)
    )
    return VersionOut.of(version)


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
