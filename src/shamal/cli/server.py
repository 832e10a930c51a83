"""`shamal server`: run the platform."""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.panel import Panel

from shamal.cli._common import (
    SETTINGS_HINT,
    console,
    err_console,
    explain_invalid,
)
from shamal.cli._quickstart import run_quickstart, wait_until_up
from shamal.client import ShamalClient
from shamal.config import Settings
from shamal.errors import ShamalError

if TYPE_CHECKING:
    from shamal.server import Platform


def sign_in_link(platform: Platform, url: str) -> str | None:
    """A link that signs the admin into the web UI once, within 15 minutes; None when
    there is no admin account of the bootstrap's name any more."""
    from shamal.security import BOOTSTRAP_ADMIN  # the server's side: loaded by now

    try:
        code = platform.security.issue_sign_in_link(BOOTSTRAP_ADMIN)
    except ShamalError:
        return None
    return f"{url}/ui/sign-in#once={code}"


def _banner(settings: Settings, platform: Platform, url: str, *, with_link: bool) -> None:
    backend = settings.resolved_database_url.split(":", 1)[0]
    token_line = f"admin token: {settings.token_file}"
    if platform.admin_secret:
        token_line += "  [green](created now: first start)[/]"
    # One fact per line, each short enough not to wrap in an 80-column terminal.
    console.print(
        Panel(
            f"Shamal is running at [bold]{url}[/]\n"
            f"web UI:      {url}/\n"
            f"API docs:    {url}/docs  (OpenAPI: /openapi.json)\n"
            f"{token_line}\n"
            f"use it:      export SHAMAL_URL={url}\n"
            f"             export SHAMAL_TOKEN=$(cat {settings.token_file})\n"
            f"data:        {settings.home}  (database: {backend})",
            title="shamal",
            title_align="left",
        )
    )
    link = sign_in_link(platform, url) if with_link else None
    if link:
        # On a line of its own, never wrapped: a terminal opens it with a click.
        console.print("sign in to the web UI as the admin (once, within 15 minutes):")
        console.print(link, soft_wrap=True, highlight=False, markup=False)


def _quickstart_in_background(settings: Settings, url: str) -> None:
    def work() -> None:
        token = settings.token_file.read_text().strip()
        with ShamalClient(url, token) as client:
            try:
                wait_until_up(client)
                run_quickstart(client, console)
            except ShamalError as exc:
                err_console.print(f"[red]quickstart failed:[/] {exc.message}")

    threading.Thread(target=work, name="quickstart", daemon=True).start()


def access_log_choice(flag: bool | None, *, quickstart: bool) -> bool | None:
    """The access-log override: the flag when given; off for the quickstart, whose
    walkthrough would scroll away under its own job's requests, unless SHAMAL_ACCESS_LOG
    says otherwise; else None (the setting)."""
    if flag is None and quickstart and "SHAMAL_ACCESS_LOG" not in os.environ:
        return False
    return flag


def server(
    host: Annotated[
        str | None, typer.Option(help="Address to bind. Default 127.0.0.1 (this machine only).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port; 0 picks a free one. Default 8600.")
    ] = None,
    workers: Annotated[int | None, typer.Option(help="Worker processes. Default 1.")] = None,
    quickstart: Annotated[
        bool, typer.Option("--quickstart", help="After start-up, walk through the quickstart.")
    ] = False,
    sign_in_link: Annotated[
        bool,
        typer.Option(
            "--sign-in-link",
            help="Print a link that signs the admin into the web UI once, within 15 minutes "
            "(on with --quickstart).",
        ),
    ] = False,
    access_log: Annotated[
        bool | None,
        typer.Option(
            "--access-log/--no-access-log",
            help="Log one line per HTTP request. Default on (SHAMAL_ACCESS_LOG), "
            "off with --quickstart so its walkthrough stays readable.",
        ),
    ] = None,
) -> None:
    """Start the Shamal server (API under /api, docs at /docs).

    With no configuration it runs the embedded default: SQLite and artifacts
    under SHAMAL_HOME (~/.shamal), bound to 127.0.0.1:8600, and an admin token
    written to SHAMAL_HOME/token on first start. SHAMAL_DATABASE_URL selects
    PostgreSQL. Jobs run with this install's `python` first on PATH. Stop it with
    Ctrl-C; in-flight requests finish first.
    """
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for chatty in ("alembic", "httpx"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    from shamal.server import serve  # the whole platform: imported only to run it

    access_log = access_log_choice(access_log, quickstart=quickstart)
    given = {"host": host, "port": port, "workers": workers, "access_log": access_log}
    overrides: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    try:
        settings = Settings(**overrides)

        def on_ready(platform: Platform, url: str) -> None:
            _banner(settings, platform, url, with_link=quickstart or sign_in_link)
            if quickstart:
                _quickstart_in_background(settings, url)

        serve(settings, on_ready=on_ready)
    except ValidationError as exc:
        err_console.print(f"[bold red]error:[/] {escape(explain_invalid(exc))}")
        err_console.print(f"[yellow]hint:[/] {SETTINGS_HINT}")
        raise typer.Exit(1) from None
    except ShamalError as exc:
        err_console.print(f"[bold red]error:[/] {exc.message}")
        raise typer.Exit(1) from None
    except OSError as exc:
        err_console.print(f"[bold red]error:[/] cannot start the server: {exc.strerror}")
        raise typer.Exit(1) from None
