"""Features: entities, feature views over dataset versions, feature services, point-in-time
correct training sets and an online store.

- **Definitions as code** (:class:`Entity`, :class:`FeatureView`, :class:`FeatureService`,
  gathered in :class:`Definitions`), written in Python or YAML in the user's repository
  (:func:`load_repo`), planned against the server's registry (:func:`plan`) and applied: every
  apply writes a new version of each object it changes, audited; a change that would break a
  feature service in use is refused.
- **Offline**: :func:`historical_join` joins each entity row with each view's latest feature
  row at or before its time and within the view's TTL, in DuckDB over the dataset versions'
  Parquet files, in bounded memory (it spills to disk).
- **Online**: an :class:`OnlineStore` (SQLite embedded, Redis in production) holds each
  entity's newest row per view, written by materialization and pushes, never back in time.

Everything loads on first use: the definitions are pure; DuckDB, pyarrow and the service come
with the names that need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shamal import lazy

if TYPE_CHECKING:
    from shamal.features._definitions import (
        FEATURE_TYPES,
        Definitions,
        Entity,
        Feature,
        FeatureService,
        FeatureView,
    )
    from shamal.features._entities import (
        KINDS,
        Applied,
        EntityRows,
        FeatureObject,
        Materialization,
        MaterializeState,
        OnlineFeatures,
        TrainingSet,
    )
    from shamal.features._online import OnlineRow, OnlineStore, open_online_store
    from shamal.features._pit import JoinLimits, JoinResult, ViewInput, historical_join
    from shamal.features._plan import Change, Plan, plan
    from shamal.features._repo import load_repo
    from shamal.features._service import MAX_ONLINE_ENTITIES, FeatureStoreService

_WHERE: dict[str, tuple[str, str | None]] = {
    "FEATURE_TYPES": ("_definitions", "FEATURE_TYPES"),
    "Definitions": ("_definitions", "Definitions"),
    "Entity": ("_definitions", "Entity"),
    "Feature": ("_definitions", "Feature"),
    "FeatureService": ("_definitions", "FeatureService"),
    "FeatureView": ("_definitions", "FeatureView"),
    "KINDS": ("_entities", "KINDS"),
    "Applied": ("_entities", "Applied"),
    "EntityRows": ("_entities", "EntityRows"),
    "FeatureObject": ("_entities", "FeatureObject"),
    "Materialization": ("_entities", "Materialization"),
    "MaterializeState": ("_entities", "MaterializeState"),
    "OnlineFeatures": ("_entities", "OnlineFeatures"),
    "TrainingSet": ("_entities", "TrainingSet"),
    "OnlineRow": ("_online", "OnlineRow"),
    "OnlineStore": ("_online", "OnlineStore"),
    "open_online_store": ("_online", "open_online_store"),
    "JoinLimits": ("_pit", "JoinLimits"),
    "JoinResult": ("_pit", "JoinResult"),
    "ViewInput": ("_pit", "ViewInput"),
    "historical_join": ("_pit", "historical_join"),
    "Change": ("_plan", "Change"),
    "Plan": ("_plan", "Plan"),
    "plan": ("_plan", "plan"),
    "load_repo": ("_repo", "load_repo"),
    "MAX_ONLINE_ENTITIES": ("_service", "MAX_ONLINE_ENTITIES"),
    "FeatureStoreService": ("_service", "FeatureStoreService"),
}

__all__ = [
    "Applied",
    "Change",
    "Definitions",
    "Entity",
    "EntityRows",
    "FEATURE_TYPES",
    "Feature",
    "FeatureObject",
    "FeatureService",
    "FeatureStoreService",
    "FeatureView",
    "JoinLimits",
    "JoinResult",
    "KINDS",
    "MAX_ONLINE_ENTITIES",
    "Materialization",
    "MaterializeState",
    "OnlineFeatures",
    "OnlineRow",
    "OnlineStore",
    "Plan",
    "TrainingSet",
    "ViewInput",
    "historical_join",
    "load_repo",
    "open_online_store",
    "plan",
]


def __getattr__(name: str) -> Any:
    return lazy.attribute(__name__, _WHERE, name, globals())
