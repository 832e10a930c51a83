"""Experiments, runs, params, tags, metrics, datasets and logged models (the MLflow model).

Times are epoch milliseconds (BigInteger), as the MLflow protocol speaks them.
Metrics are append-only in ``metrics`` (primary key = the whole point, so an
identical re-log is a no-op and history reads walk the key in (run, key, step)
order); ``latest_metrics`` keeps one row per (run, key) for searches.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    text,
    true,
)
from sqlalchemy.orm import Mapped, mapped_column

from shamal.db.models._base import Base

_BIGINT = BigInteger().with_variant(Integer, "sqlite")
_DOUBLE = Float(precision=53)


class ExperimentRow(Base):
    __tablename__ = "experiments"

    experiment_id: Mapped[int] = mapped_column(_BIGINT, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(256), unique=True)
    artifact_location: Mapped[str] = mapped_column(String(1024))
    lifecycle_stage: Mapped[str] = mapped_column(String(16), default="active")
    creation_time: Mapped[int] = mapped_column(BigInteger)
    last_update_time: Mapped[int] = mapped_column(BigInteger)
    team_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("teams.id", ondelete="RESTRICT"), nullable=True, index=True
    )


class ExperimentTagRow(Base):
    __tablename__ = "experiment_tags"

    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.experiment_id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class RunRow(Base):
    __tablename__ = "runs"
    __table_args__ = (Index("ix_runs_experiment_start", "experiment_id", "start_time"),)

    run_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.experiment_id", ondelete="CASCADE")
    )
    name: Mapped[str] = mapped_column(String(250), default="")
    user_id: Mapped[str] = mapped_column(String(256), default="")
    status: Mapped[str] = mapped_column(String(16))
    start_time: Mapped[int] = mapped_column(BigInteger)
    end_time: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    lifecycle_stage: Mapped[str] = mapped_column(String(16), default="active")
    artifact_uri: Mapped[str] = mapped_column(String(1024))
    deleted_time: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class ParamRow(Base):
    __tablename__ = "run_params"

    run_id: Mapped[str] = mapped_column(
        ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class RunTagRow(Base):
    __tablename__ = "run_tags"

    run_id: Mapped[str] = mapped_column(
        ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class MetricRow(Base):
    __tablename__ = "metrics"
    # Logged-model metric filters look metrics up by model (MLflow 3 log_model); only the
    # points of a model are indexed (migration 0008), not the many that have none.
    __table_args__ = (
        Index(
            "ix_metrics_model_key",
            "model_id",
            "key",
            sqlite_where=text("model_id IS NOT NULL"),
            postgresql_where=text("model_id IS NOT NULL"),
        ),
        # The primary key is nearly the whole row: on SQLite the table is that index alone
        # (migration 0010), not a table plus an index holding every point again.
        {"sqlite_with_rowid": False},
    )

    run_id: Mapped[str] = mapped_column(
        ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    timestamp: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    value: Mapped[float] = mapped_column(_DOUBLE, primary_key=True)
    is_nan: Mapped[bool] = mapped_column(Boolean, primary_key=True)
    model_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    dataset_name: Mapped[str | None] = mapped_column(String(500), nullable=True)
    dataset_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)


class LatestMetricRow(Base):
    __tablename__ = "latest_metrics"
    __table_args__ = (Index("ix_latest_metrics_key_value", "key", "value"),)

    run_id: Mapped[str] = mapped_column(
        ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger)
    timestamp: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[float] = mapped_column(_DOUBLE)
    is_nan: Mapped[bool] = mapped_column(Boolean)


class DatasetRow(Base):
    __tablename__ = "datasets"
    __table_args__ = (
        Index("uq_datasets_exp_name_digest", "experiment_id", "name", "digest", unique=True),
    )

    dataset_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.experiment_id", ondelete="CASCADE")
    )
    name: Mapped[str] = mapped_column(String(500))
    digest: Mapped[str] = mapped_column(String(64))
    source_type: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(Text)
    schema: Mapped[str | None] = mapped_column(Text, nullable=True)
    profile: Mapped[str | None] = mapped_column(Text, nullable=True)


class RunInputRow(Base):
    __tablename__ = "run_inputs"

    run_id: Mapped[str] = mapped_column(
        ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True
    )
    dataset_id: Mapped[str] = mapped_column(
        ForeignKey("datasets.dataset_id", ondelete="CASCADE"), primary_key=True, index=True
    )
    tags: Mapped[str] = mapped_column(Text, default="[]")  # JSON [{key, value}]


class LoggedModelRow(Base):
    __tablename__ = "logged_models"

    model_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.experiment_id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(500))
    artifact_location: Mapped[str] = mapped_column(String(1024))
    creation_timestamp_ms: Mapped[int] = mapped_column(BigInteger)
    last_updated_timestamp_ms: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(32))
    lifecycle_stage: Mapped[str] = mapped_column(String(16), default="active")
    model_type: Mapped[str | None] = mapped_column(String(500), nullable=True)
    source_run_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    # False: the creator could not read that run; the link is a claim lineage does not follow.
    source_run_verified: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    status_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    creator_id: Mapped[str | None] = mapped_column(String(256), nullable=True)


class LoggedModelTagRow(Base):
    __tablename__ = "logged_model_tags"

    model_id: Mapped[str] = mapped_column(
        ForeignKey("logged_models.model_id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class LoggedModelParamRow(Base):
    __tablename__ = "logged_model_params"

    model_id: Mapped[str] = mapped_column(
        ForeignKey("logged_models.model_id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class RunModelLinkRow(Base):
    """A run's model inputs (direction 'input') and outputs ('output', with a step)."""

    __tablename__ = "run_model_links"

    run_id: Mapped[str] = mapped_column(
        ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True
    )
    model_id: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)
    direction: Mapped[str] = mapped_column(String(8), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, default=0)
