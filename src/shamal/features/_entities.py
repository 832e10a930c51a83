"""What the feature store's service hands out: frozen, free of the database."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

__all__ = [
    "KINDS",
    "Applied",
    "EntityRows",
    "FeatureObject",
    "MaterializeState",
    "Materialization",
    "OnlineFeatures",
    "TrainingSet",
]

#: The kinds of definitions, as the registry names them.
KINDS = ("entity", "feature_view", "feature_service")


@dataclass(frozen=True, slots=True)
class FeatureObject:
    """One version of one definition (``definition`` as its JSON form)."""

    kind: str
    name: str
    version: int
    owner: str
    definition: dict[str, Any]
    digest: str
    deleted: bool
    apply_number: int
    created_by: str
    created_at: datetime

    @property
    def uri(self) -> str:
        """How lineage names it: ``features:/feature_view/NAME/3``."""
        return f"features:/{self.kind}/{self.name}/{self.version}"


@dataclass(frozen=True, slots=True)
class Applied:
    """What one apply did: its registry number (None when nothing changed) and the versions
    it wrote."""

    number: int | None
    changes: tuple[dict[str, Any], ...]
    written: tuple[FeatureObject, ...] = ()


class MaterializeState(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Materialization:
    """A materialization of one feature view version into the online store."""

    id: str
    view: str
    view_version: int
    source: str
    store: str
    start: datetime | None
    end: datetime
    state: MaterializeState
    chunks_done: int
    chunks_total: int
    rows: int
    error: str | None
    created_by: str
    started_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class EntityRows:
    """The rows a training set is built for: an Arrow table, or a dataset reference
    (``orders@prod``) whose version holds them, optionally through ``sql`` (one SELECT over it,
    named ``source``); ``timestamp`` names their time column."""

    rows: Any  # pyarrow.Table | str
    timestamp: str = "event_timestamp"
    sql: str | None = None


@dataclass(frozen=True, slots=True)
class TrainingSet:
    """A point-in-time join's result: a Parquet file (or, asked for in memory, an Arrow
    table), and what it was built from (the view versions and the dataset versions they
    read)."""

    path: Any  # pathlib.Path or None; Any keeps this module free of I/O types
    rows: int
    columns: tuple[str, ...]
    views: tuple[dict[str, Any], ...]
    saved_as: str | None = None
    table: Any = None  # pyarrow.Table when asked for in memory
    method: str = "spill"


@dataclass(frozen=True, slots=True)
class OnlineFeatures:
    """Online values, column by column: ``values[name][i]`` is entity ``i``'s value of the
    feature ``name``, read from view ``views[name]``; per view, ``status[view][i]`` is one of
    ``present``, ``not_found`` or ``expired`` (older than the view's TTL: its values are None)
    and ``event_timestamps[view][i]`` the time of the row read."""

    entities: dict[str, list[Any]]
    values: dict[str, list[Any]] = field(default_factory=dict)
    views: dict[str, str] = field(default_factory=dict)
    status: dict[str, list[str]] = field(default_factory=dict)
    event_timestamps: dict[str, list[datetime | None]] = field(default_factory=dict)
