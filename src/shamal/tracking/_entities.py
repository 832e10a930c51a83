"""What the tracking domain hands to callers: frozen values, never ORM rows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeAlias, TypeVar

T = TypeVar("T")

RUN_STATUSES = ("RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED")
LOGGED_MODEL_STATUSES = (
    "LOGGED_MODEL_PENDING",
    "LOGGED_MODEL_READY",
    "LOGGED_MODEL_UPLOAD_FAILED",
    # The proto enum's zero value: a stock server lets a finalize set it too.
    "LOGGED_MODEL_STATUS_UNSPECIFIED",
)


@dataclass(frozen=True, slots=True)
class Experiment:
    experiment_id: str
    name: str
    artifact_location: str
    lifecycle_stage: str
    creation_time: int
    last_update_time: int
    tags: Mapping[str, str]
    team_id: str | None


class Metric(NamedTuple):
    """One point of a metric. A named tuple, not a frozen dataclass like the other
    entities: a log-batch builds 1,000 of them and a history page 25,000, and a tuple is
    made several times faster (a frozen dataclass sets each field through ``object``)."""

    key: str
    value: float
    timestamp: int
    step: int = 0
    run_id: str | None = None
    model_id: str | None = None
    dataset_name: str | None = None
    dataset_digest: str | None = None


HistoryRow: TypeAlias = tuple[int, int, float, Any]
"""A stored point of one key: (step, timestamp, value, is_nan), as the driver gives it.

A NaN is stored as 0.0 with ``is_nan`` set (0/1 on SQLite, a bool on PostgreSQL), and the
infinities as themselves. Pages keep these tuples: a page is up to 25,000 points, and
building an object per point costs more than the query.
"""


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    digest: str
    source_type: str
    source: str
    schema: str | None = None
    profile: str | None = None


@dataclass(frozen=True, slots=True)
class DatasetInput:
    dataset: Dataset
    tags: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class RunInfo:
    run_id: str
    experiment_id: str
    run_name: str
    user_id: str
    status: str
    start_time: int
    end_time: int | None
    artifact_uri: str
    lifecycle_stage: str


@dataclass(frozen=True, slots=True)
class Run:
    info: RunInfo
    metrics: tuple[Metric, ...] = ()
    params: Mapping[str, str] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    dataset_inputs: tuple[DatasetInput, ...] = ()
    model_inputs: tuple[str, ...] = ()
    model_outputs: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class LoggedModel:
    model_id: str
    experiment_id: str
    name: str
    artifact_location: str
    creation_timestamp_ms: int
    last_updated_timestamp_ms: int
    status: str
    model_type: str | None
    source_run_id: str | None
    status_message: str | None
    creator_id: str | None
    tags: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, str] = field(default_factory=dict)
    metrics: tuple[Metric, ...] = ()
    #: False: ``source_run_id`` named a run the creator could not read (kept as given, as a
    #: stock server keeps it; lineage does not follow it).
    source_run_verified: bool = True


@dataclass(frozen=True, slots=True)
class LoggedModelSpec:
    """What a client sends to create a logged model."""

    name: str
    model_type: str | None = None
    source_run_id: str | None = None
    params: Mapping[str, str] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    source_run_verified: bool = True


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a search; ``next_page_token`` is None on the last page."""

    items: list[T]
    next_page_token: str | None = None
