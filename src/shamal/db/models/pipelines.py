"""Pipelines: their versions, their runs and each step of a run, the step cache and the
schedules' last ticks.

A run's steps are rows keyed by (run, key): the key is the step's name, or ``name[i]`` for
item ``i`` of a mapped step. Every state change of a step is a compare-and-set on its row,
so two servers (or one restarted) never both start it; a run is advanced by one server at a
time under a lease (``lease_owner``, ``lease_until``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from shamal.db.models._base import Base, UTCDateTime


class PipelineRow(Base):
    """A registered pipeline: its owner team and its newest version."""

    __tablename__ = "pipelines"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    team_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("teams.id", ondelete="RESTRICT"), nullable=True
    )
    team_name: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    #: Who registered the newest version: background runs (triggers) act as them.
    owner: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class PipelineVersionRow(Base):
    """One version of a pipeline's definition, with the code snapshot its steps run."""

    __tablename__ = "pipeline_versions"

    name: Mapped[str] = mapped_column(
        String(64), ForeignKey("pipelines.name", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    digest: Mapped[str] = mapped_column(String(64))
    snapshot: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_by: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class PipelineRunRow(Base):
    """One run of one pipeline version. ``trigger_key`` (``event:<id>``,
    ``schedule:<n>:<tick>``) is unique per pipeline: an event or a tick starts one run."""

    __tablename__ = "pipeline_runs"
    __table_args__ = (UniqueConstraint("pipeline", "trigger_key"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    pipeline: Mapped[str] = mapped_column(
        String(64), ForeignKey("pipelines.name", ondelete="CASCADE"), index=True
    )
    version: Mapped[int] = mapped_column(Integer)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), index=True)
    trigger: Mapped[str] = mapped_column(String(300))
    trigger_key: Mapped[str | None] = mapped_column(String(120), nullable=True)
    user: Mapped[str] = mapped_column(String(256))
    team_name: Mapped[str] = mapped_column(String(64))
    retry_of: Mapped[str | None] = mapped_column(String(32), nullable=True)
    experiment_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class PipelineStepRow(Base):
    """One step of a run (or one item of a mapped step)."""

    __tablename__ = "pipeline_steps"

    run_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("pipeline_runs.id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(80), primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    args: Mapped[dict[str, Any]] = mapped_column(JSON)
    job_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    cache_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    cache_parts: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    cached_from: Mapped[str | None] = mapped_column(String(120), nullable=True)
    #: Why the cache missed (what changed since the step's last result), or why it was off.
    cache_note: Mapped[str] = mapped_column(Text, default="")
    output: Mapped[Any] = mapped_column(JSON, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    fan_out: Mapped[int | None] = mapped_column(Integer, nullable=True)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    ready_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class PipelineCacheRow(Base):
    """A step's result under its cache key: the next step with that key reuses it."""

    __tablename__ = "pipeline_cache"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    pipeline: Mapped[str] = mapped_column(String(64))
    step: Mapped[str] = mapped_column(String(64))
    parts: Mapped[dict[str, Any]] = mapped_column(JSON)
    output: Mapped[Any] = mapped_column(JSON, nullable=True)
    #: ``<run id>/<step key>`` that produced it.
    source: Mapped[str] = mapped_column(String(120))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class PipelineScheduleRow(Base):
    """The last tick a pipeline's schedule fired (moved by compare-and-set: one server
    fires a tick)."""

    __tablename__ = "pipeline_schedules"

    pipeline: Mapped[str] = mapped_column(
        String(64), ForeignKey("pipelines.name", ondelete="CASCADE"), primary_key=True
    )
    trigger: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    expression: Mapped[str] = mapped_column(String(300))
    last_tick: Mapped[datetime] = mapped_column(UTCDateTime)
