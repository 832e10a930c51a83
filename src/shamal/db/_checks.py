"""Settings of the database server that an operator should hear about at start-up."""

from __future__ import annotations

from sqlalchemy import text

from shamal.db._uow import Database

AUTOVACUUM_OFF = (
    "PostgreSQL's autovacuum is off on this server, so table statistics are never refreshed: "
    "as runs and metrics are added, the planner keeps estimating from empty tables and picks "
    "slow plans (the query behind a 1,000-run search page ran 3x slower on never-analyzed "
    "tables). Turn it on (autovacuum = on in postgresql.conf, then reload), or run ANALYZE on "
    "this database regularly."
)


def server_warnings(db: Database) -> list[str]:
    """What in the database server's own settings will hurt Shamal: for PostgreSQL, an
    autovacuum that is off (or cannot run because ``track_counts`` is off). Nothing for
    SQLite, which keeps no statistics unless asked."""
    if db.dialect != "postgresql":
        return []
    with db.engine.connect() as connection:
        autovacuum = connection.execute(text("SHOW autovacuum")).scalar_one()
        track_counts = connection.execute(text("SHOW track_counts")).scalar_one()
    if autovacuum != "on" or track_counts != "on":
        return [AUTOVACUUM_OFF]
    return []
