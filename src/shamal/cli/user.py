"""`shamal user`: people and service accounts."""

from __future__ import annotations

from typing import Annotated

import typer

from shamal.cli._common import JsonOption, client, console, handle_errors, print_table

app = typer.Typer(
    help="Accounts: people and service accounts (platform admins).", no_args_is_help=True
)


@app.command("create")
@handle_errors
def create(
    name: str,
    service: Annotated[
        bool, typer.Option("--service", help="A service account (for CI, jobs).")
    ] = False,
    admin: Annotated[bool, typer.Option("--admin", help="Make a platform admin.")] = False,
) -> None:
    """Create an account. Give it a token with `shamal token create --user NAME`."""
    user = client().create_user(name, service=service, admin=admin)
    console.print(f"[green]created {user['kind']}[/] {user['name']}")


@app.command("list")
@handle_errors
def list_(as_json: bool = JsonOption) -> None:
    """List all accounts."""
    print_table(
        "Accounts",
        ["name", "kind", "is_admin", "disabled", "created_at"],
        client().list_users(),
        as_json=as_json,
    )


@app.command("disable")
@handle_errors
def disable(name: str) -> None:
    """Disable an account: all its tokens stop working at once."""
    client().set_user_disabled(name, True)
    console.print(f"disabled {name}")


@app.command("enable")
@handle_errors
def enable(name: str) -> None:
    """Enable a disabled account again."""
    client().set_user_disabled(name, False)
    console.print(f"enabled {name}")
