"""Governed datasets: named tables owned by a team, their immutable versions and aliases.

Version numbers come from the dataset row's ``next_version`` (one ``UPDATE ... RETURNING`` under
the row's lock), so concurrent writers get gapless, distinct numbers on both backends. A version
is content-addressed: it lists its Parquet parts by digest, and its own digest is that of the
list; the parts live in the artifact store.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from shamal.db.models._base import Base, UTCDateTime


class DataSetRow(Base):
    __tablename__ = "data_sets"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    team_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("teams.id", ondelete="RESTRICT"), nullable=True
    )
    team_name: Mapped[str] = mapped_column(String(64))
    description: Mapped[str] = mapped_column(Text)
    #: The expectation suite every new version is validated against (YAML), if any.
    suite: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: The privacy policy: how each personal column is transformed before it is stored.
    privacy: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    #: The regions its data may be stored and processed in (None: anywhere).
    regions: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    created_by: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    next_version: Mapped[int] = mapped_column(Integer)


class DataVersionRow(Base):
    __tablename__ = "data_versions"
    __table_args__ = (UniqueConstraint("dataset_id", "version", name="uq_data_versions_number"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    dataset_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("data_sets.id", ondelete="CASCADE"), index=True
    )
    version: Mapped[int] = mapped_column(Integer)
    digest: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    row_count: Mapped[int] = mapped_column(BigInteger)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    schema: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    parts: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    source: Mapped[dict[str, Any]] = mapped_column(JSON)
    mode: Mapped[str] = mapped_column(String(16))
    profile: Mapped[dict[str, Any]] = mapped_column(JSON)
    validation: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    transformations: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    created_by: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DataAliasRow(Base):
    __tablename__ = "data_aliases"

    dataset_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("data_sets.id", ondelete="CASCADE"), primary_key=True
    )
    alias: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DataVersionTagRow(Base):
    __tablename__ = "data_version_tags"

    version_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("data_versions.id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class DataPartStoreRow(Base):
    """A store that holds a part (by digest) of a dataset: where ingestion wrote it, and
    every store it was copied to. A part with no row is in the artifact store (``default``)."""

    __tablename__ = "data_part_stores"

    dataset_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("data_sets.id", ondelete="CASCADE"), primary_key=True
    )
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    store: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DataStreamKeyRow(Base):
    """A record a stream delivered, by its idempotency key (a broker's message id or
    sequence number, a push's ``Idempotency-Key``), written in the transaction of the version
    that holds it (or of the dead letter that parked it): a redelivered record whose key is
    here is acknowledged and skipped, so each record is written exactly once."""

    __tablename__ = "data_stream_keys"

    dataset_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("data_sets.id", ondelete="CASCADE"), primary_key=True
    )
    #: The stream the key is unique within (``redis:events``, ``push``), never credentials.
    stream: Mapped[str] = mapped_column(String(256), primary_key=True)
    key: Mapped[str] = mapped_column(String(256), primary_key=True)
    #: The version that holds the record; None for a parked (dead-letter) record.
    version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DataDeadLetterRow(Base):
    """A stream record parked because it cannot be a row (unparseable, wrong columns): its
    key, the reason, and the payload's sha256 and size to find it at the producer; never the
    payload itself (it may hold personal values)."""

    __tablename__ = "data_dead_letters"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    dataset_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("data_sets.id", ondelete="CASCADE"), index=True
    )
    stream: Mapped[str] = mapped_column(String(256))
    key: Mapped[str] = mapped_column(String(256))
    reason: Mapped[str] = mapped_column(String(500))
    digest: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DataErasureRow(Base):
    """A data subject's rows removed from every version of a dataset; the subject is kept
    only as a keyed hash."""

    __tablename__ = "data_erasures"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    dataset_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("data_sets.id", ondelete="CASCADE"), index=True
    )
    column: Mapped[str] = mapped_column(String(256))
    subject_hash: Mapped[str] = mapped_column(String(160))
    rows_removed: Mapped[int] = mapped_column(BigInteger)
    versions: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    created_by: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
