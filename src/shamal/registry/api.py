"""Native HTTP API of the registry: list and read registered models (what the CLI uses).

Changes go through the MLflow-dialect routes (``mlflow_api``), which every
MLflow client already speaks; this router only reads.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from shamal.api import (
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
from shamal.registry._entities import ModelVersion, RegisteredModel
from shamal.registry._rules import MAX_NAME_LENGTH
from shamal.registry._service import MODELS_PAGE_MAX, RegistryService, VersionLineage
from shamal.security.api import CurrentPrincipal

logger = logging.getLogger(__name__)


def get_registry(request: Request) -> RegistryService:
    service: RegistryService = request.app.state.registry
    return service


Registry = Annotated[RegistryService, Depends(get_registry)]
ModelName = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH)]


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


class VersionOut(BaseModel):
    """One version of a registered model."""

    model_config = ConfigDict(extra="forbid")

    version: int
    stage: str = Field(examples=["None", "Staging", "Production", "Archived"])
    status: str
    source: str
    run_id: str | None
    model_id: str | None
    description: str
    user_id: str
    created_at: datetime
    updated_at: datetime
    tags: dict[str, str]
    aliases: list[str]
    formats: list[str] = Field(
        description="The MLflow flavours its MLmodel declared", examples=[["python_function"]]
    )
    signature: dict[str, Any] | None = Field(
        description="Input, output and parameter schemas from its MLmodel, if it has one"
    )

    @classmethod
    def of(cls, version: ModelVersion) -> VersionOut:
        return cls(
            version=version.version,
            stage=version.current_stage.value,
            status=version.status.value,
            source=version.source,
            run_id=version.run_id,
            model_id=version.model_id,
            description=version.description,
            user_id=version.user_id,
            created_at=_time(version.creation_timestamp),
            updated_at=_time(version.last_updated_timestamp),
            tags=dict(version.tags),
            aliases=list(version.aliases),
            formats=list(version.formats),
            signature=None if version.signature is None else dict(version.signature),
        )


class ModelOut(BaseModel):
    """A registered model: its aliases (alias -> version) and latest version per stage."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    team: str | None
    user_id: str
    created_at: datetime
    updated_at: datetime
    tags: dict[str, str]
    aliases: dict[str, int]
    latest_versions: list[VersionOut]

    @classmethod
    def fields_of(cls, model: RegisteredModel) -> dict[str, object]:
        return {
            "name": model.name,
            "description": model.description,
            "team": model.team,
            "user_id": model.user_id,
            "created_at": _time(model.creation_timestamp),
            "updated_at": _time(model.last_updated_timestamp),
            "tags": dict(model.tags),
            "aliases": {a.alias: a.version for a in model.aliases},
            "latest_versions": [VersionOut.of(v) for v in model.latest_versions],
        }

    @classmethod
    def of(cls, model: RegisteredModel) -> ModelOut:
        return cls.model_validate(cls.fields_of(model))


class DatasetUseOut(BaseModel):
    """A dataset the version's run read, and in what role (``mlflow.data.context``)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    digest: str
    source_type: str
    source: str
    context: str | None = Field(examples=["training", "eval"])


class LineageOut(BaseModel):
    """Where a version came from: dataset -> run -> logged model -> this version.

    ``run_visible`` is false when the run was deleted or belongs to a team you cannot see;
    the chain stops there. ``run_verified`` is false when the run was only claimed: its
    creator could not read it when the version was made (it did not exist, or was another
    team's), so ``run_id`` is kept as sent and the chain stops there too."""

    model_config = ConfigDict(extra="forbid")

    run_id: str | None
    run_name: str | None
    experiment_id: str | None
    run_visible: bool
    run_verified: bool
    logged_model_id: str | None
    datasets: list[DatasetUseOut]


class VersionDetailOut(VersionOut):
    """One version with its lineage."""

    model: str
    lineage: LineageOut

    @classmethod
    def of_lineage(cls, found: VersionLineage) -> VersionDetailOut:
        version = found.version
        return cls.model_validate(
            {
                **VersionOut.of(version).model_dump(),
                "model": version.name,
                "lineage": {
                    "run_id": found.run_id,
                    "run_name": found.run_name,
                    "experiment_id": found.experiment_id,
                    "run_visible": found.run_visible,
                    "run_verified": found.run_verified,
                    "logged_model_id": version.model_id,
                    "datasets": [asdict(d) for d in found.datasets],
                },
            }
        )


class ModelDetailOut(ModelOut):
    """A registered model with its newest versions (at most :data:`EMBEDDED_VERSIONS`),
    newest first; ``more_versions`` says that older ones follow at ``/versions``."""

    versions: list[VersionOut]
    more_versions: bool = False


EMBEDDED_VERSIONS = 100
"""The most versions a model's own answer holds; its ``/versions`` list pages through all."""


router = APIRouter(prefix="/api/v1/models", tags=["models"], responses=ERROR_RESPONSES)


def _model_cursor(model: ModelOut) -> str:
    return encode_cursor(model.name)


@router.get(
    "",
    summary="List the registered models you can see, by name (a page stops early past "
    "max_page_bytes)",
    response_model=list[ModelOut],
)
def list_models(
    svc: Registry,
    principal: CurrentPrincipal,
    page_bytes: PageBytes,
    search: Annotated[
        str, Query(max_length=MAX_NAME_LENGTH, description="Part of the name (any case)")
    ] = "",
    limit: Annotated[int, Query(ge=1, le=MODELS_PAGE_MAX)] = 100,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
    page_token: PageToken = None,
) -> Response:
    def fetch(count: int, token: str | None) -> ListPage[ModelOut]:
        after = decode_cursor(token, str)
        models = svc.list_registered_models(
            principal,
            search=search,
            # The offset places the first page; the tokens of the next ones say where.
            offset=offset if token is None else 0,
            limit=count,
            after=None if after is None else after[0],
        )
        return keyset_page([ModelOut.of(m) for m in models], count, _model_cursor)

    return bounded_list(
        fetch,
        model_json,
        max_results=limit,
        page_token=page_token,
        max_bytes=page_bytes,
        cursor_of=_model_cursor,
    )


@router.get(
    "/{name}",
    summary="A registered model with its aliases and newest versions (viewer); every version "
    "is at /versions",
)
def get_model(name: ModelName, svc: Registry, principal: CurrentPrincipal) -> ModelDetailOut:
    model = svc.get_registered_model(principal, name)
    versions = svc.list_model_versions(principal, name, limit=EMBEDDED_VERSIONS + 1)
    return ModelDetailOut.model_validate(
        {
            **ModelOut.fields_of(model),
            "versions": [VersionOut.of(v) for v in versions[:EMBEDDED_VERSIONS]],
            "more_versions": len(versions) > EMBEDDED_VERSIONS,
        }
    )


def _version_cursor(version: VersionOut) -> str:
    return encode_cursor(int(version.version))


@router.get(
    "/{name}/versions",
    summary="A model's versions, newest first (viewer; a page stops early past max_page_bytes)",
    response_model=list[VersionOut],
)
def list_versions(
    name: ModelName,
    svc: Registry,
    principal: CurrentPrincipal,
    page_bytes: PageBytes,
    limit: Annotated[int, Query(ge=1, le=MODELS_PAGE_MAX)] = 100,
    page_token: PageToken = None,
) -> Response:
    def fetch(count: int, token: str | None) -> ListPage[VersionOut]:
        before = decode_cursor(token, int)
        found = svc.list_model_versions(
            principal, name, limit=count, before=None if before is None else before[0]
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


@router.get(
    "/{name}/versions/{version}",
    summary="One version: its formats, signature and lineage (viewer)",
)
def get_version(
    name: ModelName,
    version: Annotated[int, Path(ge=1, le=2**31 - 1)],
    svc: Registry,
    principal: CurrentPrincipal,
) -> VersionDetailOut:
    return VersionDetailOut.of_lineage(svc.version_lineage(principal, name, version))
