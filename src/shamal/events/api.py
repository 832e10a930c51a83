"""Native HTTP API of the event stream: ``/api/v1/events`` (read the stream) and
``/api/v1/webhooks`` (subscriptions and their delivery log).

A webhook's secret is in the answer to its creation and nowhere else.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field

from shamal.api import ERROR_RESPONSES
from shamal.events._entities import Delivery, Event, EventKind, Webhook
from shamal.events._filters import MAX_FILTER_LENGTH
from shamal.events._service import MAX_LIST, MAX_SECRET, MAX_URL, MIN_SECRET, EventService
from shamal.security import NAME_PATTERN, AuditContext
from shamal.security.api import CurrentPrincipal, audited

logger = logging.getLogger(__name__)


def get_events(request: Request) -> EventService:
    service: EventService = request.app.state.events
    return service


Events = Annotated[EventService, Depends(get_events)]
WebhookId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", max_length=32)]

router = APIRouter(prefix="/api/v1", tags=["events"], responses=ERROR_RESPONSES)


class EventOut(BaseModel):
    id: int
    kind: str
    subject: str
    team: str | None
    actor: str
    payload: dict[str, Any]
    created_at: str

    @classmethod
    def of(cls, event: Event) -> EventOut:
        return cls(**event.to_json())


class EventPageOut(BaseModel):
    events: list[EventOut]
    next_after: int = Field(description="Read on from here: ?after=next_after")


@router.get("/events", summary="Events after a position, oldest first")
def list_events(
    svc: Events,
    principal: CurrentPrincipal,
    after: Annotated[int, Query(ge=0, le=2**62)] = 0,
    kind: Annotated[list[EventKind] | None, Query(max_length=20)] = None,
    where: Annotated[str | None, Query(max_length=MAX_FILTER_LENGTH)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 100,
) -> EventPageOut:
    kinds = [k.value for k in kind or ()]
    page = svc.list_events(principal, after=after, kinds=kinds, where=where, limit=limit)
    return EventPageOut(events=[EventOut.of(e) for e in page.events], next_after=page.next_after)


class WebhookIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, max_length=64)
    url: str = Field(
        min_length=1,
        max_length=MAX_URL,
        pattern=r"^https?://[^\s#@/?]+[^\s#]*$",
        examples=["https://hooks.example.com/shamal"],
    )
    filter: str = Field(
        min_length=1,
        max_length=MAX_FILTER_LENGTH,
        examples=["job_finished where state in ('failed', 'lost')"],
    )
    team: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=64)
    secret: str | None = Field(
        default=None, pattern=r"^[\x21-\x7e]+$", min_length=MIN_SECRET, max_length=MAX_SECRET
    )
    allow_private: bool = False


class WebhookOut(BaseModel):
    id: str
    name: str
    team: str | None
    url: str
    filter: str
    active: bool
    allow_private: bool
    position: int
    created_by: str
    created_at: str
    updated_at: str
    format: Literal["shamal", "mlflow"] = Field(
        default="shamal",
        description="The body of a delivery: the event's JSON, or MLflow 3's payload "
        "(a webhook made through MLflow's webhooks API)",
    )
    description: str | None = None

    @classmethod
    def of(cls, hook: Webhook) -> WebhookOut:
        return cls(**hook.to_json())


class CreatedWebhookOut(WebhookOut):
    secret: str = Field(description="Shown this once: the key deliveries are signed with")


class WebhookListOut(BaseModel):
    webhooks: list[WebhookOut]


class ActiveIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    active: bool


class DeliveryOut(BaseModel):
    id: int
    delivery_id: str
    webhook_id: str
    event_id: int
    attempt: int
    status_code: int | None
    ok: bool
    dead: bool
    error: str
    next_attempt_at: str | None
    delivered_at: str | None
    created_at: str

    @classmethod
    def of(cls, delivery: Delivery) -> DeliveryOut:
        return cls(**delivery.to_json())


class DeliveryListOut(BaseModel):
    deliveries: list[DeliveryOut]


@router.post(
    "/webhooks",
    status_code=status.HTTP_201_CREATED,
    summary="Make a webhook (team maintainer); its secret is shown this once",
)
def create_webhook(
    body: WebhookIn,
    svc: Events,
    ctx: Annotated[AuditContext, Depends(audited("webhook.create"))],
) -> CreatedWebhookOut:
    hook, secret = svc.create_webhook(
        ctx,
        body.name,
        body.url,
        body.filter,
        team=body.team,
        secret=body.secret,
        allow_private=body.allow_private,
    )
    return CreatedWebhookOut(**hook.to_json(), secret=secret)


@router.get("/webhooks", summary="The webhooks of the teams you maintain")
def list_webhooks(
    svc: Events,
    principal: CurrentPrincipal,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = MAX_LIST,
) -> WebhookListOut:
    return WebhookListOut(
        webhooks=[WebhookOut.of(h) for h in svc.list_webhooks(principal, limit=limit)]
    )


@router.get("/webhooks/{webhook_id}", summary="One webhook")
def get_webhook(webhook_id: WebhookId, svc: Events, principal: CurrentPrincipal) -> WebhookOut:
    return WebhookOut.of(svc.get_webhook(principal, webhook_id))


@router.put("/webhooks/{webhook_id}/active", summary="Pause or resume a webhook")
def set_webhook_active(
    webhook_id: WebhookId,
    body: ActiveIn,
    svc: Events,
    ctx: Annotated[AuditContext, Depends(audited("webhook.active"))],
) -> WebhookOut:
    return WebhookOut.of(svc.set_webhook_active(ctx, webhook_id, body.active))


@router.delete(
    "/webhooks/{webhook_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    summary="Delete a webhook and its delivery log",
)
def delete_webhook(
    webhook_id: WebhookId,
    svc: Events,
    ctx: Annotated[AuditContext, Depends(audited("webhook.delete"))],
) -> Response:
    svc.delete_webhook(ctx, webhook_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/webhooks/{webhook_id}/deliveries", summary="A webhook's delivery log, newest first")
def list_deliveries(
    webhook_id: WebhookId,
    svc: Events,
    principal: CurrentPrincipal,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 100,
) -> DeliveryListOut:
    found = svc.deliveries(principal, webhook_id, limit=limit)
    return DeliveryListOut(deliveries=[DeliveryOut.of(d) for d in found])
