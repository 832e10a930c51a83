"""The path index of the artifact store: (namespace, path) -> content-addressed blob."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, String
from sqlalchemy.orm import Mapped, mapped_column

from shamal.db.models._base import Base, UTCDateTime


class ArtifactFileRow(Base):
    __tablename__ = "artifact_files"

    namespace: Mapped[str] = mapped_column(String(128), primary_key=True)
    # Paths compare as code points on every database (SQLite's BINARY already does): under a
    # language's collation a folder's range ("a/" up to "a/" + the last code point) would
    # also hold "A/x" or "ab", and listing or deleting the folder would reach them.
    path: Mapped[str] = mapped_column(
        String(1024).with_variant(String(1024, collation="C"), "postgresql"), primary_key=True
    )
    digest: Mapped[str] = mapped_column(String(64), index=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    created_by: Mapped[str] = mapped_column(String(64))
