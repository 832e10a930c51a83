"""Shamal's events in MLflow 3's webhook format, for receivers written against MLflow.

MLflow 3 names a webhook event by ``(entity, action)`` (``mlflow/entities/webhook.py``)
and sends ``{"entity", "action", "timestamp", "data"}`` where ``data`` has a shape per event
(``mlflow/webhooks/types.py``). Of MLflow's events, these exist on both sides:

===========================================  ===================================================
MLflow ``(entity, action)``                  Shamal event
===========================================  ===================================================
``("model_version", "created")``             ``model_version_registered``
``("model_version_alias", "created")``       ``model_alias_moved`` with a ``version``
``("model_version_alias", "deleted")``       ``model_alias_moved`` with ``version`` None
===========================================  ===================================================

Shamal records no event for a registered model's creation or for tags, so MLflow's
``registered_model.created``, ``model_version_tag.*`` and the prompt and budget events have
no source here; every other Shamal event has no MLflow form (None).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from shamal.events._entities import Event, EventKind

__all__ = ["MLFLOW_EVENTS", "mlflow_body", "mlflow_event_of"]

logger = logging.getLogger(__name__)

MODEL_VERSION_CREATED = ("model_version", "created")
ALIAS_CREATED = ("model_version_alias", "created")
ALIAS_DELETED = ("model_version_alias", "deleted")

#: The MLflow ``(entity, action)`` pairs a Shamal event can be sent as.
MLFLOW_EVENTS: frozenset[tuple[str, str]] = frozenset(
    {MODEL_VERSION_CREATED, ALIAS_CREATED, ALIAS_DELETED}
)


def _text(value: Any) -> str:
    # MLflow's versions are strings ("1"); ours may be ints in a payload.
    return "" if value is None else str(value)


def _tags(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(key): _text(item) for key, item in value.items()}


def _model_version_created(payload: Mapping[str, Any]) -> dict[str, Any]:
    run_id = payload.get("run_id")
    description = payload.get("description")
    return {
        "name": _text(payload.get("name")),
        "version": _text(payload.get("version")),
        "source": _text(payload.get("source")),
        "run_id": None if run_id in (None, "") else str(run_id),
        "tags": _tags(payload.get("tags")),
        "description": None if description is None else str(description),
    }


def mlflow_event_of(event: Event) -> tuple[str, str, dict[str, Any]] | None:
    """The MLflow webhook form of ``event``: ``(entity, action, data)``, or None when
    MLflow defines no such event.

    ``data`` has exactly the keys of MLflow's payload type for that event
    (``ModelVersionCreatedPayload``, ``ModelVersionAliasCreatedPayload``,
    ``ModelVersionAliasDeletedPayload``), versions as strings.
    """
    payload = event.payload
    if event.kind is EventKind.MODEL_VERSION_REGISTERED:
        return (*MODEL_VERSION_CREATED, _model_version_created(payload))
    if event.kind is EventKind.MODEL_ALIAS_MOVED:
        name, alias = _text(payload.get("name")), _text(payload.get("alias"))
        version = payload.get("version")
        if version is None:
            return (*ALIAS_DELETED, {"name": name, "alias": alias})
        return (*ALIAS_CREATED, {"name": name, "alias": alias, "version": _text(version)})
    return None


def mlflow_body(event: Event) -> bytes | None:
    """The request body MLflow 3 would send for ``event``, or None (no MLflow form).

    ``{"entity", "action", "timestamp", "data"}``; the timestamp is when the event was
    recorded (ISO 8601), so a retried delivery sends the same bytes.
    """
    form = mlflow_event_of(event)
    if form is None:
        return None
    entity, action, data = form
    envelope = {
        "entity": entity,
        "action": action,
        "timestamp": event.created_at.isoformat(),
        "data": data,
    }
    return json.dumps(envelope).encode()
