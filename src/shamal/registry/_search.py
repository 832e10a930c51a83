"""Compile parsed registry searches (``tracking._filters``) into SQLAlchemy selects.

The comparison semantics are those of ``tracking._search`` (bound parameters only,
case-sensitive ``=`` and ``LIKE``, case-insensitive ``ILIKE``, a tag clause needs
the tag). The caller applies offset and limit; every order ends with a unique
tie-break so offset pages are stable.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from sqlalchemy import Select, SQLColumnExpression, select

from shamal.db.models import (
    ModelVersionRow,
    ModelVersionTagRow,
    RegisteredModelRow,
    RegisteredModelTagRow,
)
from shamal.tracking import Comparison, OrderBy, compare, sort_key

__all__ = ["model_versions_query", "registered_models_query"]

logger = logging.getLogger(__name__)

_MODEL_SORTS: Final[dict[str, SQLColumnExpression[Any]]] = {
    "name": RegisteredModelRow.name,
    "creation_timestamp": RegisteredModelRow.creation_timestamp,
    "last_updated_timestamp": RegisteredModelRow.last_updated_timestamp,
}


def _model_condition(c: Comparison) -> SQLColumnExpression[bool]:
    if c.entity == "tag":
        return (
            select(RegisteredModelTagRow.key)
            .where(
                RegisteredModelTagRow.model_id == RegisteredModelRow.id,
                RegisteredModelTagRow.key == c.key,
                compare(RegisteredModelTagRow.value, c.op, c.value, numeric=False),
            )
            .exists()
        )
    return compare(RegisteredModelRow.name, c.op, c.value, numeric=False)


def registered_models_query(
    filters: list[Comparison], order_by: list[OrderBy]
) -> Select[RegisteredModelRow]:
    """The registered models that match every filter (``name``, ``tags.<key>``).

    Default order ``name ASC``; every order ends with ``name ASC`` (names are unique).
    """
    stmt = select(RegisteredModelRow).where(*(_model_condition(c) for c in filters))
    terms = [sort_key(_MODEL_SORTS[o.key], o.ascending, nullable=False) for o in order_by]
    if all(o.key != "name" for o in order_by):
        terms.append(RegisteredModelRow.name.asc())
    return stmt.order_by(*terms)


_VERSION_ATTRIBUTES: Final[dict[str, tuple[SQLColumnExpression[Any], bool]]] = {
    # key: (column, numeric)
    "name": (RegisteredModelRow.name, False),
    "version_number": (ModelVersionRow.version, True),
    "run_id": (ModelVersionRow.run_id, False),
    "source_path": (ModelVersionRow.source, False),
    "creation_timestamp": (ModelVersionRow.creation_timestamp, True),
    "last_updated_timestamp": (ModelVersionRow.last_updated_timestamp, True),
}


def _version_condition(c: Comparison) -> SQLColumnExpression[bool]:
    if c.entity == "tag":
        return (
            select(ModelVersionTagRow.key)
            .where(
                ModelVersionTagRow.model_id == ModelVersionRow.model_id,
                ModelVersionTagRow.version == ModelVersionRow.version,
                ModelVersionTagRow.key == c.key,
                compare(ModelVersionTagRow.value, c.op, c.value, numeric=False),
            )
            .exists()
        )
    col, numeric = _VERSION_ATTRIBUTES[c.key]
    return compare(col, c.op, c.value, numeric=numeric)


def model_versions_query(
    filters: list[Comparison], order_by: list[OrderBy]
) -> Select[ModelVersionRow]:
    """The model versions that match every filter, joined to their registered model.

    Filters: ``name`` (the registered model's), ``version_number``, ``run_id``,
    ``source_path`` (the version's ``source``) and ``tags.<key>``. Default order, as on
    a stock server, ``last_updated_timestamp DESC`` (the version changed last comes
    first); every order ends with ``name ASC, version DESC`` (unique together).
    """
    stmt = (
        select(ModelVersionRow)
        .join(RegisteredModelRow, RegisteredModelRow.id == ModelVersionRow.model_id)
        .where(*(_version_condition(c) for c in filters))
    )
    items = order_by or [OrderBy("attribute", "last_updated_timestamp", ascending=False)]
    terms = [sort_key(_VERSION_ATTRIBUTES[o.key][0], o.ascending, nullable=False) for o in items]
    sorted_on = {o.key for o in items}
    if "name" not in sorted_on:
        terms.append(RegisteredModelRow.name.asc())
    if "version_number" not in sorted_on:
        terms.append(ModelVersionRow.version.desc())
    return stmt.order_by(*terms)
