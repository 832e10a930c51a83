"""Datasets: named tables owned by a team, with immutable, content-addressed versions.

A version is a list of Parquet parts in the artifact store (so other tools read them without
Shamal, and encryption at rest, S3 and hash checks apply to data too), with its schema, row
count, source, and (ingested through :class:`DatasetService`) its profile and validation report.
Versions are numbered without gaps under concurrent writers; aliases (``customers@prod``) and
tags name them; ``NAME``, ``NAME/3`` and ``NAME@alias`` refer to them (:func:`parse_ref`).

:class:`DatasetService` loads on first use: the entities and rules import without the database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shamal import lazy
from shamal.datasets._entities import DataSet, DataVersion, Part, VersionStatus, WriteMode
from shamal.datasets._rules import DataRef, check_alias, check_name, parse_ref

if TYPE_CHECKING:
    from shamal.datasets._ingest import FORMATS
    from shamal.datasets._service import NAMESPACE, DatasetService

_WHERE: dict[str, tuple[str, str | None]] = {
    "DatasetService": ("_service", "DatasetService"),
    "FORMATS": ("_ingest", "FORMATS"),
    "NAMESPACE": ("_service", "NAMESPACE"),
}

__all__ = [
    "FORMATS",
    "NAMESPACE",
    "DataRef",
    "DataSet",
    "DataVersion",
    "DatasetService",
    "Part",
    "VersionStatus",
    "WriteMode",
    "check_alias",
    "check_name",
    "parse_ref",
]


def __getattr__(name: str) -> Any:
    return lazy.attribute(__name__, _WHERE, name, globals())
