"""Scheduled jobs, every state transition they went through, and each attempt's usage.

A job's state changes only by compare-and-set (``UPDATE ... WHERE state = :expected``),
so two scheduler processes can never both claim, start or finish the same job.
Attempts are the unit of cost accounting: one row per start, closed when it ends.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from shamal.db.models._base import Base, UTCDateTime


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_state_priority", "state", "priority_value"),
        Index("ix_jobs_team_name_submitted_at", "team_name", "submitted_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(256))
    team_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("teams.id", ondelete="RESTRICT"), nullable=True
    )
    team_name: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[str] = mapped_column(String(256))
    command: Mapped[list[str]] = mapped_column(JSON)
    env: Mapped[dict[str, str]] = mapped_column(JSON)
    snapshot: Mapped[str | None] = mapped_column(String(64), nullable=True)
    cpu_milli: Mapped[int] = mapped_column(Integer)
    memory_mib: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[int] = mapped_column(Integer)
    gpu_milli: Mapped[int] = mapped_column(Integer)
    mig_profile: Mapped[str | None] = mapped_column(String(32), nullable=True)
    gpu_models: Mapped[list[str]] = mapped_column(JSON)
    #: The memory each worker's device must have, in MiB (0: any).
    gpu_memory_mib: Mapped[int] = mapped_column(Integer, server_default="0", default=0)
    workers: Mapped[int] = mapped_column(Integer)
    pool: Mapped[str | None] = mapped_column(String(64), nullable=True)
    priority: Mapped[str] = mapped_column(String(32))
    priority_value: Mapped[int] = mapped_column(Integer)
    time_limit_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_retries: Mapped[int] = mapped_column(Integer)
    retries_used: Mapped[int] = mapped_column(Integer, default=0)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    submitted_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    placement: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    handle: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    claimed_by: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)
    stop_request: Mapped[str | None] = mapped_column(String(16), nullable=True)
    attained_s: Mapped[float] = mapped_column(Float, default=0.0)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    fingerprint: Mapped[str] = mapped_column(String(64))
    predicted_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: The datasets the job reads (references as given), and the regions their residency
    #: policies leave it to run in (None: anywhere).
    datasets: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    regions: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    #: The executor the job asked for (None: the scheduler's default).
    executor: Mapped[str | None] = mapped_column(String(32), nullable=True)


class JobEventRow(Base):
    """One transition; the state it left is the previous event's (ids order them)."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("jobs.id", ondelete="CASCADE"), index=True
    )
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    to_state: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer)
    actor: Mapped[str] = mapped_column(String(256))
    reason: Mapped[str] = mapped_column(Text, default="")


class JobAttemptRow(Base):
    __tablename__ = "job_attempts"
    __table_args__ = (Index("ix_job_attempts_started_at", "started_at"),)

    job_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    team_name: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[str] = mapped_column(String(256))
    pool: Mapped[str] = mapped_column(String(64))
    nodes: Mapped[str] = mapped_column(String(1024))
    cpu_milli: Mapped[int] = mapped_column(Integer)
    memory_mib: Mapped[int] = mapped_column(Integer)
    gpu_milli: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    outcome: Mapped[str | None] = mapped_column(String(16), nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)


class SchedulerRow(Base):
    """A live scheduler process: its name (what its claimed jobs carry) and its heartbeat.

    A scheduler whose heartbeat is older than the lease is presumed dead; another one adopts
    the jobs it had claimed.
    """

    __tablename__ = "schedulers"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    host: Mapped[str] = mapped_column(String(256), default="")
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime())


class SnapshotOwnerRow(Base):
    """A team that uploaded a code snapshot. The blob is content-addressed and stored once;
    the right to run it is per team: a digest no team of the caller uploaded answers 404."""

    __tablename__ = "snapshot_owners"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    team_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("teams.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
