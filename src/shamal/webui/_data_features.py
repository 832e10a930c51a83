"""The feature store's pages: the feature views and services, one view (its features,
source, transformation, versions and materializations) and one service (its features).

The catalog is read as the API reads it: every signed-in account sees the definitions (the
data behind them stays behind each dataset's own access).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from fastapi import Path, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from shamal.errors import NotFound
from shamal.features import FeatureObject, FeatureStoreService, Materialization
from shamal.webui._common import Route, context, service_of
from shamal.webui._render import page
from shamal.webui._session import SessionPrincipal

#: Materializations a view's page lists, newest first.
MATERIALIZATIONS_SHOWN = 20
#: Versions of a definition its page lists, newest first.
VERSIONS_SHOWN = 50

FeatureName = Annotated[str, Path(pattern=r"^[a-z][a-z0-9_]{0,62}$", max_length=63)]
#: A view's dataset source as the definitions keep it: ``data:NAME``, ``data:NAME/3``,
#: ``data:NAME@alias``.
_DATA_SOURCE = re.compile(
    r"^data:(?P<name>[a-z0-9][a-z0-9._-]{0,127})(?:/(?P<number>[1-9][0-9]{0,8})|@[A-Za-z0-9_-]+)?$"
)
_VIEW_SOURCE = re.compile(r"^view:(?P<name>[a-z][a-z0-9_]{0,62})$")


def _features(request: Request) -> FeatureStoreService:
    return service_of(request, "features", FeatureStoreService)


def at(moment: datetime | None) -> str:
    return "" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


def source_href(source: Any) -> str:
    """The UI page of a view's source: the dataset (or its version), or the other view."""
    text = str(source)
    data = _DATA_SOURCE.match(text)
    if data:
        base = f"/ui/datasets/{data['name']}"
        return f"{base}/versions/{data['number']}" if data["number"] else base
    view = _VIEW_SOURCE.match(text)
    return f"/ui/features/views/{view['name']}" if view else ""


def ttl(seconds: Any) -> str:
    """A view's time to live, in the largest whole unit (empty: for ever)."""
    if not isinstance(seconds, int) or isinstance(seconds, bool) or seconds <= 0:
        return ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _live(svc: FeatureStoreService, kind: str, name: str) -> FeatureObject:
    """The live version of one definition.

    Raises:
        NotFound: there is none (never applied, or deleted).
    """
    found = next((o for o in svc.objects(kind) if o.name == name), None)
    if found is None or found.deleted:
        title = kind.replace("_", " ")
        raise NotFound(f"no {title} {name!r}")
    return found


async def features_page(request: Request, principal: SessionPrincipal) -> Response:
    """Every live feature view and feature service, by name."""
    svc = _features(request)
    found = await run_in_threadpool(svc.objects)
    values = context(
        request,
        principal,
        "Features",
        views=[o for o in found if o.kind == "feature_view" and not o.deleted],
        services=[o for o in found if o.kind == "feature_service" and not o.deleted],
        entities=[o for o in found if o.kind == "entity" and not o.deleted],
        source_href=source_href,
        ttl=ttl,
    )
    return page("features.html", values)


@dataclass(frozen=True)
class ViewState:
    """A view's page: its live definition, its versions and its materializations."""

    view: FeatureObject
    versions: list[FeatureObject]
    materializations: list[Materialization]
    join_keys: dict[str, list[str]]


async def view_page(request: Request, principal: SessionPrincipal, name: FeatureName) -> Response:
    """One feature view: features and types, entities, source, SQL, tags, versions and the
    state of its materializations into the online store."""
    svc = _features(request)

    def read() -> ViewState:
        view = _live(svc, "feature_view", name)
        entities = {
            o.name: [str(k) for k in o.definition.get("join_keys", [])]
            for o in svc.objects("entity")
        }
        return ViewState(
            view,
            svc.history("feature_view", name)[:VERSIONS_SHOWN],
            svc.materializations(name, limit=MATERIALIZATIONS_SHOWN),
            entities,
        )

    state = await run_in_threadpool(read)
    values = context(
        request,
        principal,
        f"Feature view {name}",
        view=state.view,
        definition=state.view.definition,
        versions=state.versions,
        materializations=state.materializations,
        join_keys=state.join_keys,
        source_href=source_href,
        ttl=ttl,
        at=at,
    )
    return page("features_view.html", values)


def _service_rows(
    service: FeatureObject, views: dict[str, FeatureObject]
) -> list[tuple[str, str, str]]:
    """(view, feature, type) of each feature the service reads, ``view:*`` spelled out."""
    rows: list[tuple[str, str, str]] = []
    for entry in service.definition.get("features", []):
        view_name, _, feature = str(entry).partition(":")
        view = views.get(view_name)
        declared = view.definition.get("features", []) if view is not None else []
        types = {str(f.get("name")): str(f.get("dtype", "")) for f in declared}
        if feature == "*":
            rows += [(view_name, f, t) for f, t in types.items()]
        else:
            rows.append((view_name, feature, types.get(feature, "")))
    return rows


async def service_page(
    request: Request, principal: SessionPrincipal, name: FeatureName
) -> Response:
    """One feature service: the features it reads, each with its view and type."""
    svc = _features(request)

    def read() -> tuple[FeatureObject, dict[str, FeatureObject], list[FeatureObject]]:
        found = _live(svc, "feature_service", name)
        views = {o.name: o for o in svc.objects("feature_view") if not o.deleted}
        return found, views, svc.history("feature_service", name)[:VERSIONS_SHOWN]

    found, views, versions = await run_in_threadpool(read)
    values = context(
        request,
        principal,
        f"Feature service {name}",
        service=found,
        definition=found.definition,
        rows=_service_rows(found, views),
        known_views=set(views),
        versions=versions,
        at=at,
    )
    return page("features_service.html", values)


ROUTES = [
    Route("/ui/features", features_page),
    Route("/ui/features/views/{name}", view_page),
    Route("/ui/features/services/{name}", service_page),
]
