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
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from shamal.errors import InvalidParameter
from shamal.events._entities import Event, EventKind

__all__ = [
    "MLFLOW_EVENTS",
    "example_event",
    "mlflow_body",
    "mlflow_event_of",
    "mlflow_filter",
    "parse_mlflow_event",
]

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


#: What each MLflow event is in the stream: its kind and the filter condition (None: every
#: event of the kind) that picks it out.
_SOURCES: dict[tuple[str, str], tuple[EventKind, str | None]] = {
    MODEL_VERSION_CREATED: (EventKind.MODEL_VERSION_REGISTERED, None),
    ALIAS_CREATED: (EventKind.MODEL_ALIAS_MOVED, "version != null"),
    ALIAS_DELETED: (EventKind.MODEL_ALIAS_MOVED, "version = null"),
}

#: The names of :data:`MLFLOW_EVENTS` as MLflow writes them ("model_version.created").
SUPPORTED = tuple(sorted(f"{entity}.{action}" for entity, action in MLFLOW_EVENTS))


def parse_mlflow_event(entity: str, action: str) -> str:
    """``"entity.action"`` for an MLflow event Shamal can send, from either spelling of
    MLflow's (``MODEL_VERSION``/``model_version``, ``CREATED``/``created``).

    Raises:
        InvalidParameter: an event MLflow does not define or Shamal has no source of;
            the message lists the supported ones.
    """
    pair = (str(entity).lower()[:64], str(action).lower()[:64])
    if pair not in MLFLOW_EVENTS:
        raise InvalidParameter(
            f"the webhook event {pair[0]}.{pair[1]} is not supported here; "
            f"supported events: {', '.join(SUPPORTED)}"
        )
    return f"{pair[0]}.{pair[1]}"


def mlflow_filter(events: Iterable[str]) -> str:
    """The event filter that passes exactly the Shamal events sent as ``events`` (names of
    :func:`parse_mlflow_event`, at least one).

    Raises:
        InvalidParameter: no events, or one not supported.
    """
    sources = []
    for name in dict.fromkeys(events):
        entity, _, action = name.partition(".")
        sources.append(_SOURCES[(entity, parse_mlflow_event(entity, action).split(".")[1])])
    if not sources:
        raise InvalidParameter("a webhook needs at least one event")
    kinds = sorted({kind.value for kind, _ in sources})
    if all(test is None for _, test in sources):
        return ", ".join(kinds)
    # Every kind wanted without a condition passes whole; the others need theirs.
    whole = {kind for kind, test in sources if test is None}
    clauses = [f"kind = '{kind.value}'" for kind in sorted(whole)]
    for kind, test in sources:
        if kind not in whole:
            clauses.append(f"(kind = '{kind.value}' and {test})")
    return f"{', '.join(kinds)} where {' or '.join(clauses)}"


def example_event(name: str, at: datetime) -> Event:
    """A made-up event that is sent as the MLflow event ``name`` (``"entity.action"``), for
    a webhook's test delivery: MLflow's example values, id 0 (no such event exists).

    Raises:
        InvalidParameter: an event not supported.
    """
    entity, _, action = name.partition(".")
    kind, test = _SOURCES[(entity, parse_mlflow_event(entity, action).split(".")[1])]
    payload: dict[str, Any] = {"name": "example_model"}
    if kind is EventKind.MODEL_VERSION_REGISTERED:
        payload |= {
            "version": "1",
            "source": "models:/123",
            "run_id": "abcd1234abcd5678",
            "tags": {"example_key": "example_value"},
            "description": "An example model version",
        }
    else:
        payload |= {"alias": "example_alias", "version": "1" if test == "version != null" else None}
    return Event(0, kind, "models:/example_model/1", None, "webhook-test", payload, at)
