"""`shamal events` and `shamal webhooks`: read the event stream, manage webhooks.

`shamal events list --kind job_finished --where "state = 'failed'"` shows what happened;
`shamal webhooks create alerts https://hooks.example.com/x --on "job_finished where state =
'failed'"` subscribes a URL and prints the secret its deliveries are signed with, once.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from shamal.cli._common import JsonOption, client, console, escape, handle_errors, print_table

events_app = typer.Typer(
    help="The event stream: what happened on the platform.", no_args_is_help=True
)
webhooks_app = typer.Typer(
    help="Webhooks: events POSTed to a URL, signed (MLflow 3's scheme).", no_args_is_help=True
)


def _event_row(event: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": event["id"],
        "kind": event["kind"],
        "subject": event["subject"],
        "team": event["team"] or "-",
        "actor": event["actor"],
        "time": event["created_at"],
    }


@events_app.command("list")
@handle_errors
def list_events(
    kind: Annotated[
        list[str] | None,
        typer.Option("--kind", help="Only events of this kind (repeatable), e.g. job_finished."),
    ] = None,
    where: Annotated[
        str | None,
        typer.Option("--where", help="A filter condition, e.g. \"state = 'failed'\"."),
    ] = None,
    after: Annotated[int, typer.Option("--after", min=0, help="Events after this id.")] = 0,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=1000)] = 100,
    as_json: bool = JsonOption,
) -> None:
    """Show the events after a position, oldest first (those of your teams; admins: all)."""
    page = client().events(after=after, kinds=kind or (), where=where, limit=limit)
    if as_json:
        console.print_json(json.dumps(page))
        return
    print_table(
        "Events",
        ["id", "kind", "subject", "team", "actor", "time"],
        [_event_row(e) for e in page["events"]],
    )
    if page["events"]:
        console.print(f"[dim]read on with --after {page['next_after']}[/]")


def _hook_row(hook: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": hook["id"],
        "name": hook["name"],
        "team": hook["team"] or "-",
        "state": "active" if hook["active"] else "paused",
        "format": hook.get("format", "shamal"),
        "filter": hook["filter"],
        "position": hook["position"],
    }


@webhooks_app.command("create")
@handle_errors
def create(
    name: Annotated[str, typer.Argument(help="The webhook's name, unique in its team.")],
    url: Annotated[str, typer.Argument(help="Where the events are POSTed (http or https).")],
    on: Annotated[
        str,
        typer.Option(
            "--on", help="Which events: a filter, e.g. \"job_finished where state = 'failed'\"."
        ),
    ],
    team: Annotated[str | None, typer.Option("--team", help="The owning team.")] = None,
    secret: Annotated[
        str | None, typer.Option("--secret", help="The signing secret (default: made for you).")
    ] = None,
    as_json: bool = JsonOption,
) -> None:
    """Subscribe a URL to the events passing a filter; prints the signing secret once."""
    made = client().create_webhook(name, url, on, team=team, secret=secret)
    if as_json:
        console.print_json(json.dumps(made))
        return
    console.print(f"webhook [bold]{escape(made['name'])}[/] created: {made['id']}")
    console.print(f"filter: {escape(made['filter'])}")
    console.print("secret (shown this once; deliveries are signed with it):")
    # Plain print: the secret must come out exactly, without markup or wrapping.
    typer.echo(made["secret"])


@webhooks_app.command("list")
@handle_errors
def list_webhooks(as_json: bool = JsonOption) -> None:
    """The webhooks of the teams you maintain (admins: all)."""
    hooks = client().webhooks()
    if as_json:
        console.print_json(json.dumps(hooks))
        return
    print_table(
        "Webhooks",
        ["id", "name", "team", "state", "format", "filter", "position"],
        map(_hook_row, hooks),
    )


@webhooks_app.command("deliveries")
@handle_errors
def deliveries(
    webhook_id: Annotated[str, typer.Argument(help="The webhook's id.")],
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=1000)] = 50,
    as_json: bool = JsonOption,
) -> None:
    """A webhook's delivery log, newest attempt first."""
    rows = client().webhook_deliveries(webhook_id, limit=limit)
    print_table(
        "Deliveries (newest first)",
        ["event_id", "attempt", "ok", "status_code", "dead", "error", "created_at"],
        rows,
        as_json=as_json,
    )


def _set_active(webhook_id: str, active: bool) -> None:
    hook = client().set_webhook_active(webhook_id, active)
    state = "resumed" if hook["active"] else "paused"
    console.print(f"webhook [bold]{escape(hook['name'])}[/] {state}")


@webhooks_app.command("pause")
@handle_errors
def pause(webhook_id: Annotated[str, typer.Argument(help="The webhook's id.")]) -> None:
    """Stop deliveries; the events meanwhile are delivered on resume."""
    _set_active(webhook_id, False)


@webhooks_app.command("resume")
@handle_errors
def resume(webhook_id: Annotated[str, typer.Argument(help="The webhook's id.")]) -> None:
    """Deliver again, from where the webhook stopped."""
    _set_active(webhook_id, True)


@webhooks_app.command("delete")
@handle_errors
def delete(webhook_id: Annotated[str, typer.Argument(help="The webhook's id.")]) -> None:
    """Delete a webhook and its delivery log."""
    client().delete_webhook(webhook_id)
    console.print(f"webhook {escape(webhook_id)} deleted")
