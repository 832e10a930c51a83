"""`shamal token`: API tokens."""

from __future__ import annotations

import re
from typing import Annotated

import typer

from shamal.cli._common import JsonOption, client, console, handle_errors, print_table

app = typer.Typer(help="API tokens: issue (shown once), list, revoke.", no_args_is_help=True)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """'90d', '12h', '30m', '45s' -> seconds."""
    match = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if not match:
        raise typer.BadParameter("use a number and a unit: 45s, 30m, 12h, 90d")
    return int(match.group(1)) * _UNITS[match.group(2)]


@app.command("create")
@handle_errors
def create(
    name: Annotated[str, typer.Argument(help="What the token is for, e.g. 'laptop' or 'ci'.")],
    expires: Annotated[
        str | None, typer.Option("--expires", help="Lifetime: 30m, 12h, 90d.")
    ] = "90d",
    user: Annotated[
        str | None, typer.Option("--user", help="For another account (admins).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the secret.")] = False,
) -> None:
    """Issue a token. The secret is printed once: store it now."""
    seconds = parse_duration(expires) if expires and expires != "never" else None
    issued = client().create_token(name, expires_in_s=seconds, user=user)
    if quiet:
        typer.echo(issued["secret"])
        return
    console.print(
        f"[green]token {issued['name']}[/] for {issued['user']} "
        f"(expires {issued['expires_at'] or 'never'})"
    )
    console.print(f"[bold]{issued['secret']}[/]")
    console.print(
        "[dim]This is the only time the secret is shown. Use it as: export SHAMAL_TOKEN=<secret>[/]"
    )


@app.command("list")
@handle_errors
def list_(
    all_users: Annotated[bool, typer.Option("--all", help="Everybody's tokens (admins).")] = False,
    as_json: bool = JsonOption,
) -> None:
    """List tokens (never their secrets)."""
    rows = client().list_tokens(all_users=all_users)
    print_table(
        "Tokens",
        ["id", "user", "name", "scope", "prefix", "expires_at", "revoked_at", "last_used_at"],
        rows,
        as_json=as_json,
        rank=["user", "expires_at", "last_used_at", "revoked_at"],
    )


@app.command("revoke")
@handle_errors
def revoke(
    token_id: Annotated[str, typer.Argument(help="The id from `shamal token list`.")],
) -> None:
    """Revoke a token at once."""
    client().revoke_token(token_id)
    console.print(f"revoked {token_id}")
