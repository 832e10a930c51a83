"""`shamal audit`: read and verify the tamper-evident audit log."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from shamal.cli._common import JsonOption, client, console, handle_errors, print_table
from shamal.config import Settings

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


def _verify_locally() -> dict[str, Any]:
    from shamal.db import open_database
    from shamal.security import AuditLog, load_or_create_key

    settings = Settings()
    db = open_database(settings.resolved_database_url)
    try:
        key = load_or_create_key(settings.keys_dir / "audit.key", settings.audit_key)
        report = AuditLog(db, key).verify()
    finally:
        db.dispose()
    return {
        "ok": report.ok,
        "entries_checked": report.entries_checked,
        "first_broken_seq": report.first_broken_seq,
        "reason": report.reason,
    }


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
    as_json: bool = JsonOption,
) -> None:
    """Check every link of the hash chain; report the first broken one. Exit 1 if broken."""
    with console.status("verifying the audit chain..."):
        report = _verify_locally() if local else client().verify_audit()
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
