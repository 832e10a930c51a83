"""The registry's pages: the registered models, one model, one version, and the alias form.

Each page calls the registry service as the API's routes do (``/api/v1/models`` for reads,
the MLflow dialect's ``registered-models/alias`` for the form), with the signed-in principal:
another team's model answers 404 here as there, and an alias moves only for a member or
more of the model's team, audited by the service as the API's call is.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Form, Path, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from shamal.errors import NotFound, ShamalError
from shamal.registry import ModelVersion, RegisteredModel, RegistryService, parse_version
from shamal.security import AuditContext, AuditLog, Principal, Role
from shamal.tracking import TrackingService
from shamal.webui._common import Route, context, may_write, service_of
from shamal.webui._render import page, redirect
from shamal.webui._session import CsrfChecked, SessionPrincipal

logger = logging.getLogger(__name__)

MODELS_PER_PAGE = 50
#: The versions a model's page lists, newest first (the API's own model answer holds as many).
VERSIONS_SHOWN = 100
#: What the alias API asks of a team's member to set or remove an alias.
ALIAS_ROLE = Role.MEMBER
#: Registered model names: at most 256 characters, never ``/`` (the registry's rule).
ModelName = Annotated[str, Path(min_length=1, max_length=256, pattern=r"^[^/]+$")]
VersionNumber = Annotated[int, Path(ge=1, le=2**31 - 1)]
AliasField = Annotated[str, Form(min_length=1, max_length=255)]


def model_path(name: str) -> str:
    """The page of the model ``name``: the name percent-encoded as one path segment (it
    may hold spaces, ``?``, ``#``, ``%`` or markup, never ``/``)."""
    return f"/ui/models/{quote(name, safe='')}"


def _registry(request: Request) -> RegistryService:
    return service_of(request, "registry", RegistryService)


def _tracking(request: Request) -> TrackingService:
    return service_of(request, "tracking", TrackingService)


# ---------------------------------------------------------------------------- the list
@dataclass(frozen=True)
class ModelRow:
    """One line of the models list."""

    model: RegisteredModel
    latest: int | None
    aliases: list[tuple[str, int]]


def _row(model: RegisteredModel) -> ModelRow:
    latest = max((v.version for v in model.latest_versions), default=None)
    aliases = sorted((a.alias, a.version) for a in model.aliases)
    return ModelRow(model, latest, aliases)


async def models_list(
    request: Request,
    principal: SessionPrincipal,
    search: Annotated[str, Query(max_length=256)] = "",
    after: Annotated[str, Query(max_length=256)] = "",
) -> Response:
    """The registered models the principal may read, by name, 50 a page; ``search`` keeps
    those whose name holds it (any case); ``after``: the page after that name."""
    registry = _registry(request)
    found = await run_in_threadpool(
        lambda: registry.list_registered_models(
            principal, search=search, limit=MODELS_PER_PAGE + 1, after=after or None
        )
    )
    shown = found[:MODELS_PER_PAGE]
    next_after = shown[-1].name if len(found) > MODELS_PER_PAGE else ""
    values = context(
        request,
        principal,
        "Models",
        rows=[_row(m) for m in shown],
        search=search,
        after=after,
        next_after=next_after,
        model_path=model_path,
    )
    return page("models.html", values)


# ---------------------------------------------------------------------------- a model
def _run_experiments(
    tracking: TrackingService, principal: Principal, run_ids: Iterable[str]
) -> dict[str, str]:
    """The experiment of each run the principal may see (a run they cannot see, or one
    deleted, is left out: its version shows the id without a link)."""
    found: dict[str, str] = {}
    for run_id in set(run_ids):
        try:
            found[run_id] = tracking.run_info(principal, run_id).experiment_id
        except NotFound:
            continue
    return found


def _card_of(versions: list[ModelVersion]) -> ModelVersion | None:
    """The newest version whose ``MLmodel`` declared formats or a signature."""
    return next((v for v in versions if v.formats or v.signature), None)


async def model_page(request: Request, principal: SessionPrincipal, name: ModelName) -> Response:
    """A model: description, tags, aliases (with the alias form for those who may move
    them), its newest versions and the card (formats, signature) of the newest that has one."""
    registry, tracking = _registry(request), _tracking(request)

    def read() -> tuple[RegisteredModel, list[ModelVersion], dict[str, str]]:
        model = registry.get_registered_model(principal, name)
        versions = registry.list_model_versions(principal, name, limit=VERSIONS_SHOWN + 1)
        runs = _run_experiments(tracking, principal, (v.run_id for v in versions if v.run_id))
        return model, versions, runs

    model, versions, runs = await run_in_threadpool(read)
    values = context(
        request,
        principal,
        model.name,
        model=model,
        base=model_path(model.name),
        tags=sorted((k, v) for k, v in model.tags.items()),
        aliases=sorted((a.alias, a.version) for a in model.aliases),
        versions=versions[:VERSIONS_SHOWN],
        more_versions=len(versions) > VERSIONS_SHOWN,
        runs=runs,
        card=_card_of(versions),
        signature_rows=signature_rows,
        may_alias=may_write(principal, model.team, ALIAS_ROLE),
    )
    return page("model.html", values)


# ---------------------------------------------------------------------------- a version
SignatureRow = tuple[str, str, str]


def signature_rows(schema: Any) -> list[SignatureRow]:
    """(name, type, the rest as JSON) for each column or tensor of one signature part."""
    rows: list[SignatureRow] = []
    for item in schema if isinstance(schema, list) else []:
        if not isinstance(item, dict):
            rows.append(("", "", json.dumps(item, sort_keys=True)))
            continue
        rest = {k: v for k, v in item.items() if k not in ("name", "type")}
        extra = json.dumps(rest, sort_keys=True) if rest else ""
        rows.append((str(item.get("name", "")), str(item.get("type", "")), extra))
    return rows


async def version_page(
    request: Request, principal: SessionPrincipal, name: ModelName, version: VersionNumber
) -> Response:
    """A version: its facts, signature, aliases, the latest metrics of its run (when the
    principal may see that run) and a link to its lineage."""
    registry, tracking = _registry(request), _tracking(request)

    def read() -> tuple[Any, list[tuple[str, float, int]]]:
        found = registry.version_lineage(principal, name, version)
        metrics: list[tuple[str, float, int]] = []
        if found.run_visible and found.run_id:
            run = tracking.get_run(principal, found.run_id)
            metrics = sorted((m.key, m.value, m.step) for m in run.metrics)
        return found, metrics

    lineage, metrics = await run_in_threadpool(read)
    found: ModelVersion = lineage.version
    uri = f"models:/{found.name}/{found.version}"
    values = context(
        request,
        principal,
        f"{found.name} v{found.version}",
        lineage=lineage,
        version=found,
        base=model_path(found.name),
        tags=sorted(found.tags.items()),
        metrics=metrics,
        signature_rows=signature_rows,
        lineage_uri=uri,
    )
    return page("model_version.html", values)


# ---------------------------------------------------------------------------- the alias form
async def _audited(
    request: Request, principal: Principal, action: str, work: Callable[[AuditContext], None]
) -> None:
    """Run ``work`` as the API's ``audited`` dependency does: the service records what it
    did in its transaction; a refusal it did not record is recorded here with its code."""
    ctx = AuditContext(action=action, actor=principal.name, principal=principal)
    try:
        await run_in_threadpool(work, ctx)
    except ShamalError as exc:
        if not ctx.recorded:
            audit = service_of(request, "audit", AuditLog)
            await run_in_threadpool(audit.record_outcome, ctx, exc.code.lower())
        raise


async def set_alias(
    request: Request,
    principal: CsrfChecked,
    name: ModelName,
    alias: AliasField,
    version: Annotated[str, Form(min_length=1, max_length=12)],
) -> Response:
    """Point ``alias`` at ``version`` (creating or moving it), as ``POST
    registered-models/alias`` does: a member or more of the model's team, audited."""
    registry = _registry(request)
    await _audited(
        request,
        principal,
        "registered_model.alias.set",
        lambda ctx: registry.set_registered_model_alias(ctx, name, alias, parse_version(version)),
    )
    return redirect(model_path(name))


async def delete_alias(
    request: Request, principal: CsrfChecked, name: ModelName, alias: AliasField
) -> Response:
    """Remove ``alias``, as ``DELETE registered-models/alias`` does (member, audited)."""
    registry = _registry(request)
    await _audited(
        request,
        principal,
        "registered_model.alias.delete",
        lambda ctx: registry.delete_registered_model_alias(ctx, name, alias),
    )
    return redirect(model_path(name))


ROUTES = [
    Route("/ui/models", models_list),
    Route("/ui/models/{name}", model_page),
    Route("/ui/models/{name}/versions/{version}", version_page),
    Route("/ui/models/{name}/aliases", set_alias, ("POST",)),
    Route("/ui/models/{name}/aliases/delete", delete_alias, ("POST",)),
]
