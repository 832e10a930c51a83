"""What the registry hands to callers: frozen values, never ORM rows.

Timestamps are integer milliseconds since the epoch (UTC), as the MLflow
registry keeps them. Version numbers are integers here; the MLflow dialect
turns them into strings at its edge.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: The tag that makes a registered model belong to a team (set at creation only).
TEAM_TAG = "shamal.team"


class Stage(enum.StrEnum):
    """The legacy MLflow model stages; a version is in exactly one."""

    NONE = "None"
    STAGING = "Staging"
    PRODUCTION = "Production"
    ARCHIVED = "Archived"


class VersionStatus(enum.StrEnum):
    """Registration status. Shamal resolves sources synchronously: versions are born READY."""

    PENDING_REGISTRATION = "PENDING_REGISTRATION"
    FAILED_REGISTRATION = "FAILED_REGISTRATION"
    READY = "READY"


@dataclass(frozen=True, slots=True)
class ModelAlias:
    """A named pointer from a registered model to one of its versions."""

    alias: str
    version: int


@dataclass(frozen=True, slots=True)
class ModelVersion:
    """One version of a registered model.

    ``source`` is what the caller registered; ``storage_location`` is where the
    files are, as the source resolver found it (what download URIs answer).
    ``model_id`` is the logged model the version was promoted from, if any.
    ``run_verified`` is False when ``run_id`` named a run its creator could not read (or that
    did not exist, or that does not hold the version's files): the id is kept as given, as a
    stock MLflow server keeps it, but lineage does not follow it.
    ``formats`` (MLflow flavours) and ``signature`` (input, output and parameter schemas)
    are what its ``MLmodel`` declared when it was registered.
    """

    name: str
    version: int
    creation_timestamp: int
    last_updated_timestamp: int
    user_id: str
    current_stage: Stage
    description: str
    source: str
    storage_location: str
    run_id: str | None
    run_link: str
    status: VersionStatus
    status_message: str
    model_id: str | None
    tags: Mapping[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    formats: tuple[str, ...] = ()
    signature: Mapping[str, Any] | None = None
    run_verified: bool = True


@dataclass(frozen=True, slots=True)
class RegisteredModel:
    """A registered model with its tags, aliases and the latest version in each stage.

    ``team_id`` is the owning team (None: open to every account); ``team`` is
    that team's name as given at creation (the ``shamal.team`` tag).
    """

    name: str
    creation_timestamp: int
    last_updated_timestamp: int
    user_id: str
    description: str
    team_id: str | None
    tags: Mapping[str, str] = field(default_factory=dict)
    aliases: tuple[ModelAlias, ...] = ()
    latest_versions: tuple[ModelVersion, ...] = ()

    @property
    def team(self) -> str | None:
        return self.tags.get(TEAM_TAG) if self.team_id is not None else None


@dataclass(frozen=True, slots=True)
class ModelRef:
    """The identity and owner of a registered model: enough to check access.

    ``orphaned``: created for a team that has since been deleted (the team is
    gone, its tag stays). Such a model is not open to everyone: only platform
    admins reach it.
    """

    id: str
    name: str
    team_id: str | None
    orphaned: bool = False


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of search results; ``next_page_token`` is None on the last page."""

    items: tuple[T, ...]
    next_page_token: str | None = None
