"""`shamal audit`: read and verify the tamper-evident audit log."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shamal.cli._common import JsonOption, client, console, handle_errors, print_table
from shamal.config import Settings

if TYPE_CHECKING:
    from shamal.security import WitnessFile

app = typer.Typer(
    help="The audit log: who changed what, when, with what outcome.", no_args_is_help=True
)


@app.command("list")
@handle_errors
def list_(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=1000)] = 50,
    action: Annotated[str | None, typer.Option("--action", help="e.g. team.create")] = None,
    as_json: bool = JsonOption,
) -> None:
    """Show the newest audit entries (platform admins)."""
    rows = client().audit_entries(limit=limit, action=action)
    print_table(
        "Audit log (newest first)",
        ["seq", "ts", "actor", "action", "target", "outcome"],
        rows,
        as_json=as_json,
    )


def _witness_name(local: bool) -> str:
    # Keyed by a digest of where the log lives, so no URL or password lands in the file.
    where = Settings().resolved_database_url if local else client().url
    return hashlib.sha256(where.encode()).hexdigest()[:16]


def _witness_file() -> Path:
    return Path(os.environ.get("SHAMAL_HOME") or Path.home() / ".shamal") / "audit-witness.json"


def _witnesses() -> WitnessFile:
    from shamal.security import WitnessFile  # the CLI starts without the server's imports

    return WitnessFile(_witness_file())


def _verify_locally(witness: tuple[int, str] | None) -> dict[str, Any]:
    from shamal.db import open_database
    from shamal.security import AuditLog, load_or_create_key

    settings = Settings()
    db = open_database(settings.resolved_database_url)
    try:
        key = load_or_create_key(settings.keys_dir / "audit.key", settings.audit_key)
        report = AuditLog(db, key).verify(witness)
    finally:
        db.dispose()
    return dataclasses.asdict(report)


def _verify_remotely(witness: tuple[int, str] | None) -> dict[str, Any]:
    params = {"witness": f"{witness[0]}:{witness[1]}"} if witness else None
    report: dict[str, Any] = client().request("GET", "/api/v1/audit/verify", params=params)
    return report


@app.command("verify")
@handle_errors
def verify(
    local: Annotated[
        bool,
        typer.Option(
            "--local",
            help="Read the database directly (SHAMAL_DATABASE_URL / SHAMAL_HOME) "
            "instead of asking the server; works while the server is down.",
        ),
    ] = False,
    fresh: Annotated[
        bool,
        typer.Option("--fresh", help="Ignore the remembered witness (after restoring a backup)."),
    ] = False,
    as_json: bool = JsonOption,
) -> None:
    """Check every link of the hash chain; report the first broken one. Exit 1 if broken.

    The newest verified entry is remembered in SHAMAL_HOME/audit-witness.json, outside
    the database: the next run also fails if that entry was removed or changed since.
    """
    name = _witness_name(local)
    witness = None if fresh else _witnesses().witness(name)
    with console.status("verifying the audit chain..."):
        report = _verify_locally(witness) if local else _verify_remotely(witness)
    if report["ok"]:  # the verified head: the witness of the next run
        _witnesses().keep(name, {"seq": report["head_seq"], "hash": report["head_hash"]})
    if as_json:
        console.print_json(data=report)
    elif report["ok"]:
        console.print(f"[green]audit chain intact[/]: {report['entries_checked']} entries verified")
    else:
        console.print(
            f"[bold red]audit chain BROKEN[/] at entry {report['first_broken_seq']}: "
            f"{report['reason']} ({report['entries_checked']} entries verified before it)"
        )
    if not report["ok"]:
        raise typer.Exit(1)
