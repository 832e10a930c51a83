"""traces: MLflow 3 trace infos, their tags, metadata, spans and links to runs

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | None = None
depends_on: str | None = None

_BIGINT = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _keyed(table: str) -> None:
    """A trace's (key, value) table: tags or metadata."""
    op.create_table(
        table,
        sa.Column("trace_id", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=250), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["trace_id"],
            ["traces.trace_id"],
            name=op.f(f"fk_{table}_trace_id_traces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("trace_id", "key", name=op.f(f"pk_{table}")),
    )


def upgrade() -> None:
    op.create_table(
        "traces",
        sa.Column("trace_id", sa.String(length=64), nullable=False),
        sa.Column("experiment_id", _BIGINT, nullable=False),
        sa.Column("client_request_id", sa.String(length=250), nullable=True),
        sa.Column("request_time", sa.BigInteger(), nullable=False),
        sa.Column("execution_duration", sa.BigInteger(), nullable=True),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("request_preview", sa.Text(), nullable=True),
        sa.Column("response_preview", sa.Text(), nullable=True),
        sa.Column("span_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("span_bytes", sa.BigInteger(), server_default="0", nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.experiment_id"],
            name=op.f("fk_traces_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("trace_id", name=op.f("pk_traces")),
    )
    op.create_index(
        "ix_traces_experiment_time", "traces", ["experiment_id", "request_time"], unique=False
    )
    _keyed("trace_tags")
    _keyed("trace_metadata")
    op.create_table(
        "trace_spans",
        sa.Column("trace_id", sa.String(length=64), nullable=False),
        sa.Column("span_id", sa.String(length=16), nullable=False),
        sa.Column("parent_span_id", sa.String(length=16), nullable=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("span_type", sa.String(length=250), nullable=True),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("start_time_ns", sa.BigInteger(), nullable=False),
        sa.Column("end_time_ns", sa.BigInteger(), nullable=True),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["trace_id"],
            ["traces.trace_id"],
            name=op.f("fk_trace_spans_trace_id_traces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("trace_id", "span_id", name=op.f("pk_trace_spans")),
    )
    op.create_table(
        "trace_run_links",
        sa.Column("trace_id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.ForeignKeyConstraint(
            ["trace_id"],
            ["traces.trace_id"],
            name=op.f("fk_trace_run_links_trace_id_traces"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.run_id"],
            name=op.f("fk_trace_run_links_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("trace_id", "run_id", name=op.f("pk_trace_run_links")),
    )
    op.create_index(op.f("ix_trace_run_links_run_id"), "trace_run_links", ["run_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_trace_run_links_run_id"), table_name="trace_run_links")
    op.drop_table("trace_run_links")
    op.drop_table("trace_spans")
    op.drop_table("trace_metadata")
    op.drop_table("trace_tags")
    op.drop_index("ix_traces_experiment_time", table_name="traces")
    op.drop_table("traces")
