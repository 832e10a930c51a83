"""Shamal's events in MLflow's webhook form: the installed MLflow client's own types judge
the entity/action pairs and the payload shapes."""

from __future__ import annotations

import json
import types
import typing
from datetime import UTC, datetime
from typing import Any

import pytest

from shamal.events._entities import Event, EventKind
from shamal.events._mlflow import MLFLOW_EVENTS, mlflow_body, mlflow_event_of
from tests import needs

mlflow_types = needs.module("mlflow.webhooks.types")
mlflow_webhook = needs.module("mlflow.entities.webhook")

AT = datetime(2026, 11, 27, 9, 30, tzinfo=UTC)


def _event(kind: EventKind, payload: dict[str, Any], id: int = 1) -> Event:
    return Event(id, kind, "models:/churn/3", None, "ana", payload, AT)


def _payload_class(entity: str, action: str) -> Any:
    event = mlflow_webhook.WebhookEvent(entity, action)  # raises for a pair MLflow lacks
    return mlflow_types.get_payload_class_for_event(event)


def _assert_mlflow_shape(entity: str, action: str, data: dict[str, Any]) -> None:
    cls = _payload_class(entity, action)
    hints = typing.get_type_hints(cls)
    assert set(data) == set(hints)
    for key, value in data.items():
        assert _fits(value, hints[key]), (key, value, hints[key])


def _fits(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is dict:
        key_type, value_type = typing.get_args(hint)
        return isinstance(value, dict) and all(
            isinstance(k, key_type) and isinstance(v, value_type) for k, v in value.items()
        )
    return isinstance(value, hint)


def test_supported_pairs_are_mlflow_events() -> None:
    assert {
        ("model_version", "created"),
        ("model_version_alias", "created"),
        ("model_version_alias", "deleted"),
    } == MLFLOW_EVENTS
    for entity, action in MLFLOW_EVENTS:
        assert _payload_class(entity, action) is not None


def test_model_version_registered() -> None:
    event = _event(
        EventKind.MODEL_VERSION_REGISTERED,
        {"name": "churn", "version": 3, "run_id": "abc123", "source": "runs:/abc123/model"},
    )
    entity, action, data = mlflow_event_of(event) or ("", "", {})
    assert (entity, action) == ("model_version", "created")
    assert data == {
        "name": "churn",
        "version": "3",
        "source": "runs:/abc123/model",
        "run_id": "abc123",
        "tags": {},
        "description": None,
    }
    _assert_mlflow_shape(entity, action, data)


def test_model_version_without_run() -> None:
    event = _event(
        EventKind.MODEL_VERSION_REGISTERED,
        {"name": "m", "version": 1, "run_id": None, "source": "s3://b/m"},
    )
    form = mlflow_event_of(event)
    assert form is not None
    assert form[2]["run_id"] is None
    _assert_mlflow_shape(*form)


def test_alias_set_and_deleted() -> None:
    moved = _event(
        EventKind.MODEL_ALIAS_MOVED, {"name": "churn", "alias": "prod", "version": 4, "previous": 3}
    )
    assert mlflow_event_of(moved) == (
        "model_version_alias",
        "created",
        {"name": "churn", "alias": "prod", "version": "4"},
    )
    deleted = _event(
        EventKind.MODEL_ALIAS_MOVED,
        {"name": "churn", "alias": "prod", "version": None, "previous": 4},
    )
    assert mlflow_event_of(deleted) == (
        "model_version_alias",
        "deleted",
        {"name": "churn", "alias": "prod"},
    )
    for event in (moved, deleted):
        form = mlflow_event_of(event)
        assert form is not None
        _assert_mlflow_shape(*form)


@pytest.mark.parametrize(
    "kind",
    [
        k
        for k in EventKind
        if k not in {EventKind.MODEL_VERSION_REGISTERED, EventKind.MODEL_ALIAS_MOVED}
    ],
)
def test_events_mlflow_lacks_have_no_form(kind: EventKind) -> None:
    event = _event(kind, {"name": "x"})
    assert mlflow_event_of(event) is None
    assert mlflow_body(event) is None


def test_body_is_mlflows_envelope_and_stable() -> None:
    event = _event(
        EventKind.MODEL_ALIAS_MOVED, {"name": "churn", "alias": "prod", "version": 4, "previous": 3}
    )
    body = mlflow_body(event)
    assert body is not None
    assert body == mlflow_body(event)  # a retry signs and sends the same bytes
    envelope = json.loads(body)
    assert envelope == {
        "entity": "model_version_alias",
        "action": "created",
        "timestamp": AT.isoformat(),
        "data": {"name": "churn", "alias": "prod", "version": "4"},
    }
    # What MLflow's own example payload for the event carries, we carry.
    example = mlflow_types.get_example_payload_for_event(
        mlflow_webhook.WebhookEvent("model_version_alias", "created")
    )
    assert set(example) == set(envelope["data"])
