"""`shamal user`: people and service accounts."""

from __future__ import annotations

from typing import Annotated

import typer

from shamal.cli._common import JsonOption, client, console, handle_errors, print_table
from shamal.errors import InvalidParameter

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
        ["name", "kind", "is_admin", "privacy_officer", "disabled", "created_at"],
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


_GRANTS = ("privacy-officer",)


def _check_grant(grant: str) -> None:
    if grant not in _GRANTS:
        raise InvalidParameter(f"unknown grant {grant!r}; grants: {', '.join(_GRANTS)}")


@app.command("grant")
@handle_errors
def grant(
    grant_name: Annotated[str, typer.Argument(metavar="GRANT", help="privacy-officer")],
    name: Annotated[str, typer.Argument(metavar="USER")],
) -> None:
    """Give USER a platform-level grant. privacy-officer: may reveal tokenized personal
    values and erase a data subject from any dataset (audited)."""
    _check_grant(grant_name)
    client().set_user_grant(name, grant_name, True)
    console.print(f"{name} now holds {grant_name}")


@app.command("revoke")
@handle_errors
def revoke(
    grant_name: Annotated[str, typer.Argument(metavar="GRANT", help="privacy-officer")],
    name: Annotated[str, typer.Argument(metavar="USER")],
) -> None:
    """Take a platform-level grant back from USER."""
    _check_grant(grant_name)
    client().set_user_grant(name, grant_name, False)
    console.print(f"{name} no longer holds {grant_name}")
