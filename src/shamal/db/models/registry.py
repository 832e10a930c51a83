"""Registered models, their versions, tags and aliases (the MLflow registry model).

Version numbers come from a per-model counter (``next_version``) advanced with
an UPDATE in the creating transaction: unique and gapless under concurrency.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    ForeignKeyConstraint,
    Integer,
    String,
    Text,
    true,
)
from sqlalchemy.orm import Mapped, mapped_column

from shamal.db.models._base import Base


class RegisteredModelRow(Base):
    __tablename__ = "registered_models"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(256), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    creation_timestamp: Mapped[int] = mapped_column(BigInteger)
    last_updated_timestamp: Mapped[int] = mapped_column(BigInteger)
    user_id: Mapped[str] = mapped_column(String(256), default="")
    next_version: Mapped[int] = mapped_column(Integer, default=1)
    team_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("teams.id", ondelete="RESTRICT"), nullable=True, index=True
    )


class RegisteredModelTagRow(Base):
    __tablename__ = "registered_model_tags"

    model_id: Mapped[str] = mapped_column(
        ForeignKey("registered_models.id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class ModelVersionRow(Base):
    __tablename__ = "model_versions"

    model_id: Mapped[str] = mapped_column(
        ForeignKey("registered_models.id", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    creation_timestamp: Mapped[int] = mapped_column(BigInteger)
    last_updated_timestamp: Mapped[int] = mapped_column(BigInteger)
    user_id: Mapped[str] = mapped_column(String(256), default="")
    current_stage: Mapped[str] = mapped_column(String(20), default="None")
    description: Mapped[str] = mapped_column(Text, default="")
    source: Mapped[str] = mapped_column(String(1024))
    storage_location: Mapped[str] = mapped_column(String(1024), default="")
    run_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    # False: the run was unknown or unreadable to the creator when the version was made, so
    # the link is the caller's claim alone and lineage does not follow it.
    run_verified: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    run_link: Mapped[str] = mapped_column(String(1024), default="")
    status: Mapped[str] = mapped_column(String(32), default="READY")
    status_message: Mapped[str] = mapped_column(Text, default="")
    logged_model_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    # The version's card, read from its MLmodel: flavours (comma-separated) and signature (JSON).
    formats: Mapped[str] = mapped_column(String(2048), default="", server_default="")
    signature: Mapped[str | None] = mapped_column(Text, nullable=True)


class ModelVersionTagRow(Base):
    __tablename__ = "model_version_tags"
    __table_args__ = (
        ForeignKeyConstraint(
            ["model_id", "version"],
            ["model_versions.model_id", "model_versions.version"],
            ondelete="CASCADE",
        ),
    )

    model_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class ModelAliasRow(Base):
    __tablename__ = "registered_model_aliases"
    __table_args__ = (
        ForeignKeyConstraint(
            ["model_id", "version"],
            ["model_versions.model_id", "model_versions.version"],
            ondelete="CASCADE",
        ),
    )

    model_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    alias: Mapped[str] = mapped_column(String(256), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
