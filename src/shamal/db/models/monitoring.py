"""Monitoring: reference profiles of model versions, monitors on deployments, and what
each run of a monitor found.

A reference profile keeps per-column sketches (bounded summaries, never rows) of a model
version's training data and of its predictions on it. A monitor reads its deployment's
sample log past ``cursor`` when ``next_run_at`` comes; one server at a time runs it under a
lease (``lease_owner``, ``lease_until``), and a run's result, its points (one per column,
the time series ``shamal monitor show`` draws) and the moved cursor commit together.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from shamal.db.models._base import Base, UTCDateTime


class MonitorReferenceRow(Base):
    """The reference profile of one registered model version."""

    __tablename__ = "monitor_references"
    __table_args__ = (UniqueConstraint("model", "version"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    model: Mapped[str] = mapped_column(String(256))
    version: Mapped[int] = mapped_column(Integer)
    dataset: Mapped[str | None] = mapped_column(String(64), nullable=True)
    dataset_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rows: Mapped[int] = mapped_column(BigInteger)
    #: column -> {"role": feature | prediction | label, "sketch": ColumnSketch JSON}
    columns: Mapped[dict[str, Any]] = mapped_column(JSON)
    #: Optional drift statistics of reference chunks (the bands of chunked monitoring).
    chunks: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_by: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class MonitorRow(Base):
    """A monitor on a deployment: its spec, schedule, cursor in the sample log and lease."""

    __tablename__ = "monitors"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    deployment: Mapped[str] = mapped_column(String(64), index=True)
    team_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("teams.id", ondelete="RESTRICT"), nullable=True
    )
    team_name: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    schedule_s: Mapped[int] = mapped_column(Integer)
    paused: Mapped[bool] = mapped_column(Boolean)
    cursor: Mapped[int] = mapped_column(BigInteger)
    #: The newest label (by its id) a run has scored: labels arrive after their samples.
    label_cursor: Mapped[int] = mapped_column(BigInteger, server_default="0")
    next_run_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_run_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    webhook_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created_by: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class MonitorResultRow(Base):
    """One run of a monitor that found samples: the drift report, quality issues, actions."""

    __tablename__ = "monitor_results"
    __table_args__ = (Index("ix_monitor_results_monitor_at", "monitor_id", "at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    monitor_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("monitors.id", ondelete="CASCADE")
    )
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    first_sample: Mapped[int] = mapped_column(BigInteger)
    last_sample: Mapped[int] = mapped_column(BigInteger)
    samples: Mapped[int] = mapped_column(Integer)
    rows: Mapped[int] = mapped_column(Integer)
    drifted: Mapped[bool] = mapped_column(Boolean)
    share: Mapped[float] = mapped_column(Float)
    report: Mapped[dict[str, Any]] = mapped_column(JSON)
    actions: Mapped[list[dict[str, Any]]] = mapped_column(JSON)


class MonitorPointRow(Base):
    """One column's drift in one result: a point of that column's time series."""

    __tablename__ = "monitor_points"
    __table_args__ = (Index("ix_monitor_points_series", "monitor_id", "column", "at"),)

    result_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("monitor_results.id", ondelete="CASCADE"), primary_key=True
    )
    column: Mapped[str] = mapped_column(String(256), primary_key=True)
    monitor_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("monitors.id", ondelete="CASCADE")
    )
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    test: Mapped[str] = mapped_column(String(32))
    #: None: not a number (a test that could not be computed); +-inf kept as +-1e308.
    statistic: Mapped[float | None] = mapped_column(Float, nullable=True)
    p_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    threshold: Mapped[float] = mapped_column(Float)
    drifted: Mapped[bool] = mapped_column(Boolean)
