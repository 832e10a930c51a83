"""Registry entities in MLflow's protobuf JSON (``model_registry.proto``), and back for tags.

Shapes: a version number is a *string*; timestamps are integer milliseconds;
a registered model lists ``aliases`` as ``[{alias, version}]`` and a version as
``[alias]``; unset fields are left out (``proto_json`` drops the ``None`` values), except a
version's description, which a stock server always sends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shamal.errors import InvalidParameter
from shamal.mlflow._fields import Fields
from shamal.registry import ModelVersion, RegisteredModel


def _tags(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"key": key, "value": value} for key, value in tags.items()]


def model_version_json(version: ModelVersion) -> dict[str, Any]:
    """A ``ModelVersion`` message."""
    return {
        "name": version.name,
        "version": str(version.version),
        "creation_timestamp": version.creation_timestamp,
        "last_updated_timestamp": version.last_updated_timestamp,
        "user_id": version.user_id or None,
        "current_stage": version.current_stage.value,
        # Always sent, as a stock server sends it: the client reads an absent one as None,
        # where scripts written against a stock server expect "" (``mv.description.strip()``).
        "description": version.description,
        "source": version.source,
        "run_id": version.run_id,
        "status": version.status.value,
        "status_message": version.status_message or None,
        "tags": _tags(version.tags),
        "run_link": version.run_link or None,
        "aliases": list(version.aliases),
        "model_id": version.model_id,
    }


def registered_model_json(model: RegisteredModel) -> dict[str, Any]:
    """A ``RegisteredModel`` message, with the latest version of each stage."""
    return {
        "name": model.name,
        "creation_timestamp": model.creation_timestamp,
        "last_updated_timestamp": model.last_updated_timestamp,
        "user_id": model.user_id or None,
        "description": model.description or None,
        "latest_versions": [model_version_json(v) for v in model.latest_versions],
        "tags": _tags(model.tags),
        "aliases": [{"alias": a.alias, "version": str(a.version)} for a in model.aliases],
    }


def tags_of(fields: Fields) -> list[tuple[str, str]]:
    """The ``tags`` field of a create request: ``[{key, value}]`` in request order.

    Raises:
        InvalidParameter: not a list of objects, or a tag without a string key.
    """
    pairs: list[tuple[str, str]] = []
    for tag in fields.objects("tags"):
        key, value = tag.get("key"), tag.get("value", "")
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidParameter("Each tag needs a string 'key' and a string 'value'.")
        pairs.append((key, value))
    return pairs
