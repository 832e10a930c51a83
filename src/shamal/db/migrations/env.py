"""Alembic environment: always driven programmatically by ``shamal.db.migrate``."""

from __future__ import annotations

from alembic import context

from shamal.db.models import Base

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only reachable through the alembic CLI
    raise RuntimeError("run migrations with `shamal db upgrade`, not the alembic CLI")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
