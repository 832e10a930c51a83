"""The feature store's registry: every version of every definition, each apply, and the
materializations into the online store.

A definition (an entity, a feature view, a feature service) is never updated in place: an
apply that changes it writes its next version, and a deletion writes a version marked
``deleted``, so any training set can name the exact view versions it was built from. An apply
row records the whole change set under one registry number.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from shamal.db.models._base import Base, UTCDateTime


class FeatureApplyRow(Base):
    """One ``shamal features apply``: its registry number and what it changed."""

    __tablename__ = "feature_applies"

    number: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    digest: Mapped[str] = mapped_column(String(64))
    changes: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    created_by: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class FeatureObjectRow(Base):
    """One version of one definition; the newest version of a (kind, name) is the live one
    unless it is marked deleted."""

    __tablename__ = "feature_objects"

    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    #: The apply that wrote it.
    apply_number: Mapped[int] = mapped_column(
        Integer, ForeignKey("feature_applies.number", ondelete="CASCADE"), index=True
    )
    team_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("teams.id", ondelete="RESTRICT"), nullable=True
    )
    team_name: Mapped[str] = mapped_column(String(64))
    definition: Mapped[dict[str, Any]] = mapped_column(JSON)
    digest: Mapped[str] = mapped_column(String(64))
    deleted: Mapped[bool] = mapped_column(Boolean, default=False)
    created_by: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class FeatureMaterializationRow(Base):
    """A materialization of one feature view version into the online store: the event-time
    window it covers, how far it got (chunks done of chunks in all), and its state. A run
    killed part way is resumed from ``chunks_done``: every chunk is written idempotently."""

    __tablename__ = "feature_materializations"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    view: Mapped[str] = mapped_column(String(64), index=True)
    view_version: Mapped[int] = mapped_column(Integer)
    #: The dataset version read (``data:/NAME/N``).
    source: Mapped[str] = mapped_column(String(300))
    store: Mapped[str] = mapped_column(String(64))
    #: Event times covered: (start, end]; start None for a full materialization.
    start_ts: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    end_ts: Mapped[datetime] = mapped_column(UTCDateTime)
    state: Mapped[str] = mapped_column(String(16))
    chunks_done: Mapped[int] = mapped_column(Integer)
    chunks_total: Mapped[int] = mapped_column(Integer)
    rows: Mapped[int] = mapped_column(BigInteger)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_by: Mapped[str] = mapped_column(String(256))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
