"""`shamal scheduler`: run a scheduler process on its own, list the policies."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Annotated

import typer
from rich.markup import escape

from shamal.cli._common import JsonOption, client, console, handle_errors
from shamal.config import Settings
from shamal.scheduler import DEFAULT_POLICY, policy_names
from shamal.server._platform import start_platform
from shamal.server._scheduler import build_loop

app = typer.Typer(
    help="The scheduler: `shamal server` runs one; run more (on PostgreSQL) with `run`.",
    no_args_is_help=True,
)


@app.command("run")
@handle_errors
def run(
    name: Annotated[
        str | None,
        typer.Option("--name", help="This scheduler's name (default: configured, else host)."),
    ] = None,
    api_url: Annotated[
        str | None,
        typer.Option(
            "--api-url",
            help="The URL its jobs reach the API at, e.g. http://shamal:8600 (or "
            "SHAMAL_SCHEDULER__API_URL); without it jobs get no platform token.",
        ),
    ] = None,
) -> None:
    """Schedule jobs until SIGINT/SIGTERM, without serving HTTP.

    Several schedulers may run against one PostgreSQL database: claims take turns on a
    database lock, each launches only the jobs it claimed, and each re-attaches to its
    own jobs when restarted under the same name. Jobs run with this install's `python`
    first on PATH.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    settings = Settings()
    platform = start_platform(settings)
    loop = build_loop(platform, name=name, api_url=api_url)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    name, policy = escape(loop.name), escape(loop.policy.name)  # --name is the user's text
    console.print(f"scheduler [bold]{name}[/] with policy {policy}; Ctrl-C stops it")
    try:
        loop.run(stop)
    finally:
        platform.close()


@app.command("predictions")
@handle_errors
def predictions(as_json: bool = JsonOption) -> None:
    """How well the runtime predictor does: every succeeded job predicted before it ran."""
    report = client().predictor_report()
    if as_json:
        console.print_json(data=report)
        return
    if not report["n"]:
        console.print(f"[dim]no predictions yet ({report['unpredicted']} jobs without one)[/]")
        return
    console.print(
        f"{report['n']} jobs: median error {report['mdape']:.0%}, "
        f"{report['within_2x']:.0%} within 2x, mean absolute error {report['mae_s']:.0f} s, "
        f"bias {report['median_log2_ratio']:+.2f} (log2; positive over-estimates)"
    )


@app.command("policies")
def policies() -> None:
    """List the scheduling policies (set one with SHAMAL_SCHEDULER__POLICY)."""
    for policy in policy_names():
        marker = " (default)" if policy == DEFAULT_POLICY else ""
        console.print(f"{policy}{marker}")
