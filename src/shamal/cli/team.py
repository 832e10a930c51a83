"""`shamal team`: teams and who is in them with which role."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from shamal.cli._common import JsonOption, client, console, escape, handle_errors, print_table
from shamal.cli.scheduler import print_quotas
from shamal.errors import ShamalError

app = typer.Typer(
    help="Teams: create them, list them, manage members and their roles.", no_args_is_help=True
)

ROLE_HELP = "admin (manage members), maintainer, member (write), viewer (read only)"


@app.command("create")
@handle_errors
def create(
    name: Annotated[str, typer.Argument(help="Lowercase name, e.g. 'vision'.")],
    description: Annotated[str, typer.Option("--description", "-d")] = "",
) -> None:
    """Create a team (platform admins only)."""
    team = client().create_team(name, description)
    console.print(f"[green]created team[/] {team['name']}")


@app.command("list")
@handle_errors
def list_(as_json: bool = JsonOption) -> None:
    """List the teams you can see (admins see all)."""
    print_table(
        "Teams", ["name", "description", "created_at"], client().list_teams(), as_json=as_json
    )


@app.command("show")
@handle_errors
def show(name: str, as_json: bool = JsonOption) -> None:
    """Show a team, its members, and its quotas with what its jobs hold now (--json:
    the members; `shamal scheduler quotas --json` gives the quotas)."""
    api = client()
    team = api.get_team(name)
    if as_json:
        print_table("Members", ["user", "role"], team.get("members") or [], as_json=True)
        return
    console.print(f"[bold]{escape(team['name'])}[/] {escape(team['description'])}")
    print_table("Members", ["user", "role"], team.get("members") or [])
    try:
        rows: list[dict[str, Any]] = api.quotas()
    except ShamalError as exc:  # an older server, or none of the scheduler's business
        console.print(f"[dim]quotas not shown: {escape(exc.message)}[/]")
        return
    quotas = [row for row in rows if row["team"] == team["name"]]
    if quotas:
        print_quotas(quotas, "Quotas")
    else:
        console.print("[dim]no quota: its jobs use idle capacity of any pool[/]")


@app.command("delete")
@handle_errors
def delete(name: str, yes: Annotated[bool, typer.Option("--yes", "-y")] = False) -> None:
    """Delete a team (platform admins only)."""
    if not yes:
        typer.confirm(f"Delete team {name!r}?", abort=True)
    client().delete_team(name)
    console.print(f"[green]deleted team[/] {name}")


@app.command("add-member")
@handle_errors
def add_member(
    team: str,
    user: str,
    role: Annotated[str, typer.Option("--role", "-r", help=ROLE_HELP)] = "member",
) -> None:
    """Add a user to a team, or change their role (team admins). A team admin who is not
    a platform admin invites an account that is not a member yet: it joins when it runs
    `shamal team accept TEAM`."""
    done = client().set_member(team, user, role)
    if done.get("status") == "invited":
        console.print(
            f"invited [bold]{escape(user)}[/] to {escape(team)} as {escape(role)}: "
            f"they join when they run `shamal team accept {escape(team)}`"
        )
        return
    console.print(f"[green]{escape(user)}[/] is now {escape(role)} in {escape(team)}")


@app.command("invitations")
@handle_errors
def invitations(as_json: bool = JsonOption) -> None:
    """Your invitations to teams, waiting for `shamal team accept` or `decline`."""
    print_table(
        "Invitations",
        ["team", "role", "invited_by", "created_at"],
        client().invitations(),
        as_json=as_json,
    )


@app.command("accept")
@handle_errors
def accept(team: str) -> None:
    """Accept an invitation: join TEAM with the role it offers."""
    member = client().accept_invitation(team)
    console.print(f"[green]joined[/] {escape(team)} as {escape(member['role'])}")


@app.command("decline")
@handle_errors
def decline(team: str) -> None:
    """Decline an invitation to TEAM."""
    client().decline_invitation(team)
    console.print(f"declined the invitation to {escape(team)}")


@app.command("remove-member")
@handle_errors
def remove_member(team: str, user: str) -> None:
    """Remove a user from a team (team admins)."""
    client().remove_member(team, user)
    console.print(f"removed {user} from {team}")
