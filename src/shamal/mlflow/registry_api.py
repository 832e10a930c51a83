"""The model registry in the MLflow REST dialect (``model_registry.proto``).

Every route answers under ``/api/2.0/mlflow/`` (the stock client) and under
``/ajax-api/2.0/mlflow/`` (what MLflow's own UI calls). GET routes declare
the query fields they read (repeated keys for lists); the other methods read a
JSON object body, DELETE included. Answers are protobuf JSON
objects; errors take the app's one error path with MLflow's statuses.

The routes stay out of the OpenAPI document: their contract is MLflow's
protocol (the stock client is their conformance test), not a schema of ours.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response

from shamal.api import PageBytes
from shamal.artifacts import search_slot
from shamal.errors import InvalidParameter, NotFound
from shamal.mlflow._fields import Fields, bounded_page, proto_json, read_fields
from shamal.mlflow._registry_json import model_version_json, registered_model_json, tags_of
from shamal.registry import (
    LATEST_ALIAS,
    MODELS_PAGE_DEFAULT,
    MODELS_PAGE_MAX,
    VERSIONS_PAGE_DEFAULT,
    VERSIONS_PAGE_MAX,
    RegistryService,
    check_max_results,
    is_prompt,
    parse_stage,
    parse_version,
)
from shamal.security import AuditContext, Principal
from shamal.security.api import CurrentPrincipal, audited, read_only_post
from shamal.tracking import TrackingService, resume_token

logger = logging.getLogger(__name__)

PREFIXES = ("/api/2.0/mlflow", "/ajax-api/2.0/mlflow")

router = APIRouter()


async def get_registry(request: Request) -> RegistryService:
    # async: FastAPI runs a plain-def dependency in a worker thread, a round trip per request.
    service: RegistryService = request.app.state.registry
    return service


Registry = Annotated[RegistryService, Depends(get_registry)]
Body = Annotated[Fields, Depends(read_fields)]
Handler = Callable[..., Response]


def _route(path: str, method: str, *, search: bool = False) -> Callable[[Handler], Handler]:
    """Register a handler under every prefix of the dialect; a ``search`` holds one of the
    caller's search slots while it runs."""

    def register(handler: Handler) -> Handler:
        for prefix in PREFIXES:
            router.add_api_route(
                prefix + path,
                handler,
                methods=[method],
                include_in_schema=False,
                response_class=JSONResponse,
                dependencies=[Depends(search_slot)] if search else None,
            )
        return handler

    return register


# ---------------------------------------------------------------------- GET fields
_Text = Annotated[str | None, Query()]
_Texts = Annotated[list[str] | None, Query()]


def _name_query(name: _Text = None) -> Fields:
    return Fields({"name": name})


def _version_query(name: _Text = None, version: _Text = None) -> Fields:
    return Fields({"name": name, "version": version})


def _alias_query(name: _Text = None, alias: _Text = None) -> Fields:
    return Fields({"name": name, "alias": alias})


def _stages_query(name: _Text = None, stages: _Texts = None) -> Fields:
    return Fields({"name": name}, {"stages": stages or []})


def _search_query(
    filter: _Text = None,  # the protocol's field name, shadowing the builtin here only
    max_results: _Text = None,
    order_by: _Texts = None,
    page_token: _Text = None,
) -> Fields:
    return Fields(
        {"filter": filter, "max_results": max_results, "page_token": page_token},
        {"order_by": order_by or []},
    )


NameQuery = Annotated[Fields, Depends(_name_query)]
VersionQuery = Annotated[Fields, Depends(_version_query)]
AliasQuery = Annotated[Fields, Depends(_alias_query)]
StagesQuery = Annotated[Fields, Depends(_stages_query)]
SearchQuery = Annotated[Fields, Depends(_search_query)]


def _version(fields: Fields) -> int:
    return parse_version(fields.required("version", max_len=32))


def _strings(fields: Fields, name: str) -> list[str]:
    values = fields.many(name)
    if not all(isinstance(v, str) for v in values):
        raise InvalidParameter(f"Parameter '{name}' must be a list of strings.")
    return values


def _max_results(fields: Fields, default: int) -> int:
    value = fields.integer("max_results", default=default)
    assert value is not None
    return value


# ---------------------------------------------------------------------- audit actions
CreateModel = Annotated[AuditContext, Depends(audited("registered_model.create"))]
RenameModel = Annotated[AuditContext, Depends(audited("registered_model.rename"))]
UpdateModel = Annotated[AuditContext, Depends(audited("registered_model.update"))]
DeleteModel = Annotated[AuditContext, Depends(audited("registered_model.delete"))]
SetModelTag = Annotated[AuditContext, Depends(audited("registered_model.tag.set"))]
DeleteModelTag = Annotated[AuditContext, Depends(audited("registered_model.tag.delete"))]
SetAlias = Annotated[AuditContext, Depends(audited("registered_model.alias.set"))]
DeleteAlias = Annotated[AuditContext, Depends(audited("registered_model.alias.delete"))]
CreateVersion = Annotated[AuditContext, Depends(audited("model_version.create"))]
UpdateVersion = Annotated[AuditContext, Depends(audited("model_version.update"))]
TransitionVersion = Annotated[AuditContext, Depends(audited("model_version.transition_stage"))]
DeleteVersion = Annotated[AuditContext, Depends(audited("model_version.delete"))]
SetVersionTag = Annotated[AuditContext, Depends(audited("model_version.tag.set"))]
DeleteVersionTag = Annotated[AuditContext, Depends(audited("model_version.tag.delete"))]
ReadOnlyPost = Annotated[Principal, Depends(read_only_post)]


# ---------------------------------------------------------------------- registered models
@_route("/registered-models/create", "POST")
def create_registered_model(svc: Registry, ctx: CreateModel, fields: Body) -> JSONResponse:
    model = svc.create_registered_model(
        ctx,
        fields.required("name"),
        tags=tags_of(fields),
        description=fields.text("description"),
    )
    return proto_json({"registered_model": registered_model_json(model)})


@_route("/registered-models/rename", "POST")
def rename_registered_model(svc: Registry, ctx: RenameModel, fields: Body) -> JSONResponse:
    model = svc.rename_registered_model(ctx, fields.required("name"), fields.required("new_name"))
    return proto_json({"registered_model": registered_model_json(model)})


@_route("/registered-models/update", "PATCH")
def update_registered_model(svc: Registry, ctx: UpdateModel, fields: Body) -> JSONResponse:
    model = svc.update_registered_model(ctx, fields.required("name"), fields.text("description"))
    return proto_json({"registered_model": registered_model_json(model)})


@_route("/registered-models/delete", "DELETE")
def delete_registered_model(svc: Registry, ctx: DeleteModel, fields: Body) -> JSONResponse:
    svc.delete_registered_model(ctx, fields.required("name"))
    return proto_json()


@_route("/registered-models/get", "GET")
def get_registered_model(
    svc: Registry, principal: CurrentPrincipal, fields: NameQuery
) -> JSONResponse:
    model = svc.get_registered_model(principal, fields.required("name"))
    return proto_json({"registered_model": registered_model_json(model)})


@_route("/registered-models/search", "GET", search=True)
def search_registered_models(
    svc: Registry, principal: CurrentPrincipal, fields: SearchQuery, page_bytes: PageBytes
) -> Response:
    filter_string, order_by = fields.text("filter"), _strings(fields, "order_by")
    requested = _max_results(fields, MODELS_PAGE_DEFAULT)
    if requested <= 0:
        # A stock server takes it here (not for versions): an empty page, no next token,
        # once the filter, the order and the token are valid.
        page = svc.search_registered_models(
            principal,
            filter_string=filter_string,
            order_by=order_by,
            max_results=requested,
            page_token=fields.text("page_token"),
        )
        return proto_json({"registered_models": list(page.items), "next_page_token": None})
    return bounded_page(
        "registered_models",
        lambda limit, token: svc.search_registered_models(
            principal,
            filter_string=filter_string,
            order_by=order_by,
            max_results=limit,
            page_token=token,
        ),
        registered_model_json,
        max_results=check_max_results(requested, MODELS_PAGE_MAX),
        page_token=fields.text("page_token"),
        max_bytes=page_bytes,
        resume_at=resume_token,
    )


def _latest_versions(svc: RegistryService, principal: Principal, fields: Fields) -> JSONResponse:
    stages = [parse_stage(s) for s in _strings(fields, "stages")]
    versions = svc.get_latest_versions(principal, fields.required("name"), stages)
    return proto_json({"model_versions": [model_version_json(v) for v in versions]})


@_route("/registered-models/get-latest-versions", "POST")
def post_latest_versions(
    svc: Registry, principal: CurrentPrincipal, _read_only: ReadOnlyPost, fields: Body
) -> JSONResponse:
    return _latest_versions(svc, principal, fields)


@_route("/registered-models/get-latest-versions", "GET")
def get_latest_versions(
    svc: Registry, principal: CurrentPrincipal, fields: StagesQuery
) -> JSONResponse:
    return _latest_versions(svc, principal, fields)


@_route("/registered-models/set-tag", "POST")
def set_registered_model_tag(svc: Registry, ctx: SetModelTag, fields: Body) -> JSONResponse:
    key, value = fields.required("key"), fields.text("value") or ""
    svc.set_registered_model_tag(ctx, fields.required("name"), key, value)
    return proto_json()


@_route("/registered-models/delete-tag", "DELETE")
def delete_registered_model_tag(svc: Registry, ctx: DeleteModelTag, fields: Body) -> JSONResponse:
    svc.delete_registered_model_tag(ctx, fields.required("name"), fields.required("key"))
    return proto_json()


# ---------------------------------------------------------------------- aliases
@_route("/registered-models/alias", "POST")
def set_registered_model_alias(svc: Registry, ctx: SetAlias, fields: Body) -> JSONResponse:
    svc.set_registered_model_alias(
        ctx, fields.required("name"), fields.required("alias", max_len=1024), _version(fields)
    )
    return proto_json()


@_route("/registered-models/alias", "DELETE")
def delete_registered_model_alias(svc: Registry, ctx: DeleteAlias, fields: Body) -> JSONResponse:
    svc.delete_registered_model_alias(
        ctx, fields.required("name"), fields.required("alias", max_len=1024)
    )
    return proto_json()


@_route("/registered-models/alias", "GET")
def get_model_version_by_alias(
    svc: Registry, principal: CurrentPrincipal, fields: AliasQuery
) -> JSONResponse:
    """A stock server looks an alias up by (model, alias) alone: when it finds none, whether
    the model or only its alias is missing, it answers 400 ``INVALID_PARAMETER_VALUE``,
    "Registered model alias X not found." (a model the caller cannot see reads the same).
    ``latest`` names the newest version and stays a 404 when there is none."""
    name, alias = fields.required("name"), fields.required("alias", max_len=1024)
    try:
        version = svc.get_model_version_by_alias(principal, name, alias)
    except NotFound:
        if alias.lower() == LATEST_ALIAS:
            raise
        raise InvalidParameter(f"Registered model alias {alias} not found.") from None
    return proto_json({"model_version": model_version_json(version)})


# ---------------------------------------------------------------------- model versions
@_route("/model-versions/create", "POST")
def create_model_version(
    svc: Registry, ctx: CreateVersion, fields: Body, request: Request
) -> JSONResponse:
    version = svc.create_model_version(
        ctx,
        fields.required("name"),
        fields.required("source", max_len=4096),
        run_id=fields.text("run_id", max_len=256),
        tags=tags_of(fields),
        run_link=fields.text("run_link", max_len=4096),
        description=fields.text("description"),
        model_id=fields.text("model_id", max_len=256),
    )
    if version.model_id is not None and not is_prompt(version.tags):
        # As a stock server: the logged model lists the versions registered from it.
        tracking: TrackingService = request.app.state.tracking
        tracking.models.record_model_version(
            ctx.require_principal(), version.model_id, version.name, version.version
        )
    return proto_json({"model_version": model_version_json(version)})


@_route("/model-versions/update", "PATCH")
def update_model_version(svc: Registry, ctx: UpdateVersion, fields: Body) -> JSONResponse:
    version = svc.update_model_version(
        ctx, fields.required("name"), _version(fields), fields.text("description")
    )
    return proto_json({"model_version": model_version_json(version)})


@_route("/model-versions/transition-stage", "POST")
def transition_model_version_stage(
    svc: Registry, ctx: TransitionVersion, fields: Body
) -> JSONResponse:
    version = svc.transition_model_version_stage(
        ctx,
        fields.required("name"),
        _version(fields),
        parse_stage(fields.required("stage", max_len=64)),
        fields.flag("archive_existing_versions"),
    )
    return proto_json({"model_version": model_version_json(version)})


@_route("/model-versions/delete", "DELETE")
def delete_model_version(svc: Registry, ctx: DeleteVersion, fields: Body) -> JSONResponse:
    svc.delete_model_version(ctx, fields.required("name"), _version(fields))
    return proto_json()


@_route("/model-versions/get", "GET")
def get_model_version(
    svc: Registry, principal: CurrentPrincipal, fields: VersionQuery
) -> JSONResponse:
    version = svc.get_model_version(principal, fields.required("name"), _version(fields))
    return proto_json({"model_version": model_version_json(version)})


@_route("/model-versions/search", "GET", search=True)
def search_model_versions(
    svc: Registry, principal: CurrentPrincipal, fields: SearchQuery, page_bytes: PageBytes
) -> Response:
    filter_string, order_by = fields.text("filter"), _strings(fields, "order_by")
    return bounded_page(
        "model_versions",
        lambda limit, token: svc.search_model_versions(
            principal,
            filter_string=filter_string,
            order_by=order_by,
            max_results=limit,
            page_token=token,
        ),
        model_version_json,
        max_results=check_max_results(
            _max_results(fields, VERSIONS_PAGE_DEFAULT), VERSIONS_PAGE_MAX
        ),
        page_token=fields.text("page_token"),
        max_bytes=page_bytes,
        resume_at=resume_token,
    )


@_route("/model-versions/get-download-uri", "GET")
def get_model_version_download_uri(
    svc: Registry, principal: CurrentPrincipal, fields: VersionQuery
) -> JSONResponse:
    uri = svc.get_model_version_download_uri(principal, fields.required("name"), _version(fields))
    return proto_json({"artifact_uri": uri})


@_route("/model-versions/set-tag", "POST")
def set_model_version_tag(svc: Registry, ctx: SetVersionTag, fields: Body) -> JSONResponse:
    key, value = fields.required("key"), fields.text("value") or ""
    svc.set_model_version_tag(ctx, fields.required("name"), _version(fields), key, value)
    return proto_json()


@_route("/model-versions/delete-tag", "DELETE")
def delete_model_version_tag(svc: Registry, ctx: DeleteVersionTag, fields: Body) -> JSONResponse:
    svc.delete_model_version_tag(
        ctx, fields.required("name"), _version(fields), fields.required("key")
    )
    return proto_json()
