"""`shamal db`: the metadata database's schema."""

from __future__ import annotations

import typer

from shamal.cli._common import console, handle_errors
from shamal.config import Settings

app = typer.Typer(
    help="The metadata database (SHAMAL_DATABASE_URL, default SQLite under SHAMAL_HOME).",
    no_args_is_help=True,
)


@app.command("upgrade")
@handle_errors
def upgrade_cmd() -> None:
    """Apply the migrations shipped with this version (the server also does on start)."""
    from shamal.db import open_database, upgrade

    settings = Settings()
    db = open_database(settings.resolved_database_url)
    try:
        before, after = upgrade(db)
    finally:
        db.dispose()
    if before == after:
        console.print(f"schema already current ({after})")
    else:
        console.print(f"[green]migrated[/] {before or 'empty database'} -> {after}")


@app.command("current")
@handle_errors
def current() -> None:
    """Show the schema revision of the database and of this version of Shamal."""
    from shamal.db import current_revision, head_revision, open_database

    settings = Settings()
    db = open_database(settings.resolved_database_url)
    try:
        revision = current_revision(db)
    finally:
        db.dispose()
    head = head_revision()
    state = "[green]current[/]" if revision == head else "[yellow]needs `shamal db upgrade`[/]"
    console.print(f"database: {revision or 'empty'}   shipped: {head}   {state}")
