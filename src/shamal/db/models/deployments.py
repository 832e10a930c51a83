"""Deployments, their change history, their window statistics and their samples.

A deployment's spec and rollout state change only by compare-and-set on ``revision``
(``UPDATE ... WHERE revision = :expected``): two writers (a person promoting, the rollout
controller rolling back) can never both apply a change made from the same revision.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from shamal.db.models._base import Base, UTCDateTime


class DeploymentRow(Base):
    __tablename__ = "deployments"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    team_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("teams.id", ondelete="RESTRICT"), nullable=True
    )
    team_name: Mapped[str] = mapped_column(String(64))
    created_by: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revision: Mapped[int] = mapped_column(Integer)
    routes: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    slo_max_error_rate: Mapped[float] = mapped_column(Float)
    slo_max_p99_ms: Mapped[float] = mapped_column(Float)
    slo_min_requests: Mapped[int] = mapped_column(Integer)
    steps: Mapped[list[int]] = mapped_column(JSON)
    interval_s: Mapped[float] = mapped_column(Float)
    sticky_header: Mapped[str] = mapped_column(String(64))
    sample_rate: Mapped[float] = mapped_column(Float)
    #: The feature service whose online features a request's entities are given (None: none).
    feature_service: Mapped[str | None] = mapped_column(String(64), nullable=True)
    phase: Mapped[str] = mapped_column(String(16))
    canary_weight: Mapped[int] = mapped_column(Integer)
    step_index: Mapped[int] = mapped_column(Integer)
    phase_since: Mapped[datetime] = mapped_column(UTCDateTime)


class DeploymentEventRow(Base):
    """One change; ``revision`` is the revision the change made."""

    __tablename__ = "deployment_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    deployment_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("deployments.id", ondelete="CASCADE"), index=True
    )
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    revision: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(256))
    reason: Mapped[str] = mapped_column(Text)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON)


class DeploymentStatsRow(Base):
    """Calls one version answered under one revision, summed over every serve process."""

    __tablename__ = "deployment_stats"

    deployment_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("deployments.id", ondelete="CASCADE"), primary_key=True
    )
    revision: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[str] = mapped_column(String(16), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    errors: Mapped[int] = mapped_column(BigInteger)
    latency_counts: Mapped[list[int]] = mapped_column(JSON)


class DeploymentStatsMinuteRow(Base):
    """Calls one version answered in one minute (UTC), summed over every serve process and
    revision: what the latency and error charts draw. Kept a week."""

    __tablename__ = "deployment_stats_minutes"

    deployment_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("deployments.id", ondelete="CASCADE"), primary_key=True
    )
    minute: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    version: Mapped[str] = mapped_column(String(16), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    errors: Mapped[int] = mapped_column(BigInteger)
    latency_counts: Mapped[list[int]] = mapped_column(JSON)


class DeploymentSampleRow(Base):
    """One sampled request; a deployment keeps a bounded number, the oldest dropped first."""

    __tablename__ = "deployment_samples"
    __table_args__ = (
        Index("ix_deployment_samples_deployment_id_id", "deployment_id", "id"),
        Index("ix_deployment_samples_deployment_id_request_id", "deployment_id", "request_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    deployment_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("deployments.id", ondelete="CASCADE")
    )
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    revision: Mapped[int] = mapped_column(Integer)
    version: Mapped[str] = mapped_column(String(16))
    shadow: Mapped[bool] = mapped_column(Boolean)
    inputs: Mapped[dict[str, Any]] = mapped_column(JSON)
    outputs: Mapped[dict[str, Any]] = mapped_column(JSON)
    request_id: Mapped[str | None] = mapped_column(String(128), nullable=True)


class DeploymentLabelRow(Base):
    """The true outcome of a served request, joined to its sample by the caller's request id.

    Labels are kept whether or not a sample of their request is (only a share of requests is
    sampled, and samples arrive every few seconds); a deployment keeps a bounded number, the
    oldest dropped first. A label posted again for the same request replaces the first.
    """

    __tablename__ = "deployment_labels"
    __table_args__ = (
        Index(
            "ix_deployment_labels_deployment_id_request_id",
            "deployment_id",
            "request_id",
            unique=True,
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    deployment_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("deployments.id", ondelete="CASCADE")
    )
    request_id: Mapped[str] = mapped_column(String(128))
    value: Mapped[Any] = mapped_column(JSON)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
