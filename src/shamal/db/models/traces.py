"""Traces (MLflow 3 tracing, OpenTelemetry spans): a trace's info, tags, metadata, spans and
the runs it is linked to.

A trace belongs to an experiment and follows its access rules (``shamal.traces``). Times are
epoch milliseconds for a trace (as MLflow's trace info speaks them) and nanoseconds for a
span (as OpenTelemetry's). A span keeps its searchable fields in columns and the whole span,
as OTLP's protobuf JSON, in ``content``, and the text full-text searches read in
``search_text``; deleting a trace deletes all of it (cascade).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from shamal.db.models._base import Base

_BIGINT = BigInteger().with_variant(Integer, "sqlite")


class TraceRow(Base):
    """A trace's info: where it belongs, when it ran, how it ended."""

    __tablename__ = "traces"
    __table_args__ = (Index("ix_traces_experiment_time", "experiment_id", "request_time"),)

    trace_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        _BIGINT, ForeignKey("experiments.experiment_id", ondelete="CASCADE")
    )
    client_request_id: Mapped[str | None] = mapped_column(String(250), nullable=True)
    request_time: Mapped[int] = mapped_column(BigInteger)
    execution_duration: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    state: Mapped[str] = mapped_column(String(32))
    request_preview: Mapped[str | None] = mapped_column(Text, nullable=True)
    response_preview: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: How many spans the trace holds and their size (UTF-8 bytes of their JSON): the
    #: limits of one trace, checked as spans arrive, and what a read of it will cost.
    span_count: Mapped[int] = mapped_column(Integer, server_default="0")
    span_bytes: Mapped[int] = mapped_column(BigInteger, server_default="0")


class TraceTagRow(Base):
    __tablename__ = "trace_tags"

    trace_id: Mapped[str] = mapped_column(
        ForeignKey("traces.trace_id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class TraceMetadataRow(Base):
    __tablename__ = "trace_metadata"

    trace_id: Mapped[str] = mapped_column(
        ForeignKey("traces.trace_id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class TraceSpanRow(Base):
    """One span: searchable fields, and the span itself as OTLP protobuf JSON."""

    __tablename__ = "trace_spans"

    trace_id: Mapped[str] = mapped_column(
        ForeignKey("traces.trace_id", ondelete="CASCADE"), primary_key=True
    )
    span_id: Mapped[str] = mapped_column(String(16), primary_key=True)
    parent_span_id: Mapped[str | None] = mapped_column(String(16), nullable=True)
    name: Mapped[str] = mapped_column(Text)
    span_type: Mapped[str | None] = mapped_column(String(250), nullable=True)
    status: Mapped[str] = mapped_column(String(32))
    start_time_ns: Mapped[int] = mapped_column(BigInteger)
    end_time_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: UTF-8 bytes of ``content``.
    size: Mapped[int] = mapped_column(Integer)
    content: Mapped[str] = mapped_column(Text)
    #: What ``trace.text`` searches: the span as MLflow's span dict in JSON (a stock
    #: server's stored form), so OTLP's own key names (``value``...) never match.
    search_text: Mapped[str] = mapped_column(Text)


class TraceRunLinkRow(Base):
    """A trace linked to a run (``link-to-run``): ``run_id`` searches find it."""

    __tablename__ = "trace_run_links"

    trace_id: Mapped[str] = mapped_column(
        ForeignKey("traces.trace_id", ondelete="CASCADE"), primary_key=True
    )
    run_id: Mapped[str] = mapped_column(
        ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True, index=True
    )
