"""MLflow 3's webhooks API (``webhooks.proto``) over Shamal's event stream.

An MLflow webhook is a Shamal webhook in MLflow's format: its filter is built from its
``(entity, action)`` events (those of :data:`shamal.events._mlflow.MLFLOW_EVENTS`; MLflow's
others have no source here and are refused, naming the supported ones) and each delivery is
MLflow's payload with MLflow's signed headers. The routes answer under ``/api/2.0/mlflow/``
and ``/ajax-api/2.0/mlflow/``, outside the OpenAPI document (the stock client is their
conformance test); access is the native webhooks API's (team maintainers, admins).

Protocol details: entities, actions and statuses are enum names (``MODEL_VERSION``,
``CREATED``, ``ACTIVE``/``DISABLED``), timestamps int64 milliseconds; the secret is never
returned. A webhook has no team field in MLflow: it belongs to the caller's only team (an
admin in no team makes a platform webhook); a body may add ``"team"`` to choose one.
Native-format webhooks are not MLflow webhooks: this API neither lists nor shows them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from shamal.errors import InvalidParameter, NotFound
from shamal.events import (
    MAX_LIST,
    MAX_URL,
    MLFLOW_FORMAT,
    EventOutlets,
    EventService,
    Webhook,
    WebhookChange,
    WebhookShape,
    example_event,
    mlflow_filter,
    parse_mlflow_event,
)
from shamal.mlflow._fields import Fields, proto_json, read_fields
from shamal.security import AuditContext
from shamal.security.api import CurrentPrincipal, audited

logger = logging.getLogger(__name__)

PREFIXES = ("/api/2.0/mlflow", "/ajax-api/2.0/mlflow")
PAGE_DEFAULT, PAGE_MAX = 100, 1000
#: An MLflow webhook has at most this many events (MLflow defines 15).
MAX_EVENTS = 32
_STATUSES = {"ACTIVE": True, "DISABLED": False}

router = APIRouter()


async def get_events(request: Request) -> EventService:
    service: EventService = request.app.state.events
    return service


async def get_outlets(request: Request) -> EventOutlets:
    outlets: EventOutlets = request.app.state.platform.event_outlets
    return outlets


Events = Annotated[EventService, Depends(get_events)]
Outlets = Annotated[EventOutlets, Depends(get_outlets)]
Body = Annotated[Fields, Depends(read_fields)]
CreateHook = Annotated[AuditContext, Depends(audited("webhook.create"))]
UpdateHook = Annotated[AuditContext, Depends(audited("webhook.update"))]
DeleteHook = Annotated[AuditContext, Depends(audited("webhook.delete"))]
TestHook = Annotated[AuditContext, Depends(audited("webhook.test"))]
Handler = Callable[..., Response]


def _route(path: str, method: str) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        for prefix in PREFIXES:
            router.add_api_route(
                prefix + path,
                handler,
                methods=[method],
                include_in_schema=False,
                response_class=JSONResponse,
            )
        return handler

    return register


# ---------------------------------------------------------------------- translation
def _millis(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def webhook_json(hook: Webhook) -> dict[str, Any]:
    """The webhook as MLflow's ``Webhook`` message (no secret)."""
    events = []
    for name in hook.mlflow_events:
        entity, _, action = name.partition(".")
        events.append({"entity": entity.upper(), "action": action.upper()})
    return {
        "webhook_id": hook.id,
        "name": hook.name,
        "description": hook.description or None,
        "url": hook.url,
        "events": events,
        "status": "ACTIVE" if hook.active else "DISABLED",
        "creation_timestamp": _millis(hook.created_at),
        "last_updated_timestamp": _millis(hook.updated_at),
    }


def _event_name(item: Any) -> str:
    if not isinstance(item, dict):
        raise InvalidParameter("Parameter 'events' must be a list of {entity, action} objects.")
    entity, action = item.get("entity"), item.get("action")
    if not isinstance(entity, str) or not isinstance(action, str):
        raise InvalidParameter("A webhook event needs an 'entity' and an 'action' (strings).")
    return parse_mlflow_event(entity, action)


def _events(fields: Fields) -> tuple[str, ...]:
    """The body's events as ``"entity.action"``, in order, without repeats."""
    items = fields.many("events")
    if len(items) > MAX_EVENTS:
        raise InvalidParameter(f"A webhook has at most {MAX_EVENTS} events.")
    return tuple(dict.fromkeys(_event_name(item) for item in items))


def _status(fields: Fields) -> bool | None:
    value = fields.raw("status")
    if value is None:
        return None
    if value not in _STATUSES:
        raise InvalidParameter("Parameter 'status' must be ACTIVE or DISABLED.")
    return _STATUSES[value]


def _mlflow_hook(svc: EventService, principal: Any, webhook_id: str) -> Webhook:
    hook = svc.get_webhook(principal, webhook_id)
    if hook.format != MLFLOW_FORMAT:
        # A native webhook has no MLflow events to show: to this API it does not exist.
        raise NotFound(f"webhook {webhook_id[:40]!r} does not exist")
    return hook


def _page_token(fields: Fields) -> int:
    token = fields.text("page_token", max_len=20)
    if not token:
        return 0
    if not token.isascii() or not token.isdigit():
        raise InvalidParameter("Invalid page token.")
    return int(token)


# ---------------------------------------------------------------------- routes
@_route("/webhooks", "POST")
def create_webhook(svc: Events, ctx: CreateHook, fields: Body) -> JSONResponse:
    events = _events(fields)
    if not events:
        raise InvalidParameter("Missing value for required parameter 'events'.")
    status = _status(fields)
    hook, _ = svc.create_webhook(
        ctx,
        fields.required("name", max_len=64),
        fields.required("url", max_len=MAX_URL),
        mlflow_filter(events),
        team=fields.text("team", max_len=64),
        secret=fields.text("secret", max_len=1000) or None,
        shape=WebhookShape(
            format=MLFLOW_FORMAT,
            description=fields.text("description", max_len=5000) or None,
            mlflow_events=events,
            active=True if status is None else status,
        ),
    )
    return proto_json({"webhook": webhook_json(hook)})


def _list_query(max_results: str | None = None, page_token: str | None = None) -> Fields:
    return Fields({"max_results": max_results, "page_token": page_token})


@_route("/webhooks", "GET")
def list_webhooks(
    svc: Events,
    principal: CurrentPrincipal,
    fields: Annotated[Fields, Depends(_list_query)],
) -> JSONResponse:
    limit = fields.integer("max_results", default=PAGE_DEFAULT)
    assert limit is not None
    if not 1 <= limit <= PAGE_MAX:
        raise InvalidParameter(f"Parameter 'max_results' must be 1 to {PAGE_MAX}.")
    offset = _page_token(fields)
    # One more than asked says whether there is a next page (a full page of the most the
    # service lists gets a token either way: the next page may then be empty).
    probe = min(limit + 1, MAX_LIST)
    found = svc.list_webhooks(principal, limit=probe, format=MLFLOW_FORMAT, offset=offset)
    answer: dict[str, Any] = {"webhooks": [webhook_json(h) for h in found[:limit]]}
    if len(found) > limit or len(found) == limit == probe:
        answer["next_page_token"] = str(offset + limit)
    return proto_json(answer)


@_route("/webhooks/{webhook_id}", "GET")
def get_webhook(webhook_id: str, svc: Events, principal: CurrentPrincipal) -> JSONResponse:
    return proto_json({"webhook": webhook_json(_mlflow_hook(svc, principal, webhook_id))})


def _change(fields: Fields) -> WebhookChange:
    events = _events(fields) or None
    return WebhookChange(
        name=fields.text("name", max_len=64) or None,
        url=fields.text("url", max_len=MAX_URL) or None,
        filter=None if events is None else mlflow_filter(events),
        description=fields.text("description", max_len=5000),
        mlflow_events=events,
        secret=fields.text("secret", max_len=1000) or None,
    )


@_route("/webhooks/{webhook_id}", "PATCH")
def update_webhook(webhook_id: str, svc: Events, ctx: UpdateHook, fields: Body) -> JSONResponse:
    principal = ctx.require_principal()
    hook = _mlflow_hook(svc, principal, webhook_id)
    change, status = _change(fields), _status(fields)
    if change != WebhookChange():
        hook = svc.update_webhook(ctx, hook.id, change)
    if status is not None and status != hook.active:
        if ctx.recorded:
            # One request, one audit context: the pause is recorded under its own action.
            ctx = AuditContext(action="webhook.active", actor=ctx.actor, principal=principal)
        hook = svc.set_webhook_active(ctx, hook.id, status)
    return proto_json({"webhook": webhook_json(hook)})


@_route("/webhooks/{webhook_id}", "DELETE")
def delete_webhook(webhook_id: str, svc: Events, ctx: DeleteHook) -> JSONResponse:
    hook = _mlflow_hook(svc, ctx.require_principal(), webhook_id)
    svc.delete_webhook(ctx, hook.id)
    return proto_json()


@_route("/webhooks/{webhook_id}/test", "POST")
def test_webhook(
    webhook_id: str, svc: Events, outlets: Outlets, ctx: TestHook, fields: Body
) -> JSONResponse:
    hook = _mlflow_hook(svc, ctx.require_principal(), webhook_id)
    wanted = fields.raw("event")
    name = _event_name(wanted) if wanted is not None else hook.mlflow_events[0]
    result = outlets.test_webhook(ctx, hook.id, example_event(name, datetime.now(UTC)))
    answer: dict[str, Any] = {"success": result.ok}
    if result.status is not None:
        answer["response_status"] = result.status
    if not result.ok:
        answer["error_message"] = result.error or "the delivery failed"
    return proto_json({"result": answer})
