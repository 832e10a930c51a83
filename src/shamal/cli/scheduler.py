"""`shamal scheduler`: run a scheduler process on its own, list the policies, show quotas."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from shamal.cli._common import JsonOption, client, console, escape, handle_errors, print_table
from shamal.config import Settings
from shamal.scheduler.core import DEFAULT_POLICY, policy_defaults, policy_names, policy_summary

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
    from shamal.server import start_platform

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    settings = Settings()
    platform = start_platform(settings)
    loop = platform.scheduler_loop(name=name, api_url=api_url)
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


#: The parts of a quota, in the order a table shows them.
_PARTS = ("gpus", "cpus", "memory_mib")


def _amount(amount: dict[str, Any], shown: tuple[str, ...]) -> str:
    """'2 GPUs, 8 CPUs' for the parts of a quota that are limited (``shown``)."""
    parts = []
    if "gpus" in shown:
        parts.append(f"{amount['gpus']:g} GPU" + ("" if amount["gpus"] == 1 else "s"))
    if "cpus" in shown:
        parts.append(f"{amount['cpus']:g} CPU" + ("" if amount["cpus"] == 1 else "s"))
    if "memory_mib" in shown:
        parts.append(f"{amount['memory_mib'] / 1024:g} GiB")
    return ", ".join(parts) or "-"


def _borrowing(quota: dict[str, Any], shown: tuple[str, ...]) -> dict[str, Any]:
    held, guaranteed = quota["held"], quota["guaranteed"]
    return {key: max(held[key] - guaranteed[key], 0) for key in shown}


@app.command("quotas")
@handle_errors
def quotas(as_json: bool = JsonOption) -> None:
    """Team quotas per pool (from the cluster file) and what each team's jobs hold now.

    A team runs up to its guarantee; beyond it, up to its borrow limit, it borrows idle
    quota of its cohort, which the scheduler takes back by preemption when the lending
    team needs it. 'queued' counts the team's waiting jobs the pool could run: those
    naming it, and those naming no pool that could start there (they count in each such
    pool). Admins see every team, others their own teams.
    """
    rows: list[dict[str, Any]] = client().quotas()
    if as_json:
        console.print_json(data=rows)
        return
    if not rows:
        console.print(
            Text(
                "no team quotas: every team may use any idle capacity. Quotas go in the "
                "cluster file (SHAMAL_SCHEDULER__CLUSTER_FILE) as [[quotas]] entries.",
                style="dim",
            )
        )
        return
    print_quotas(rows, "Team quotas")


def print_quotas(rows: list[dict[str, Any]], title: str) -> None:
    """The quota rows the API answers, as a table (see `shamal scheduler quotas`)."""
    print_table(
        title,
        ["pool", "team", "cohort", "guaranteed", "may borrow", "holds now", *_COUNTS],
        [_quota_row(quota) for quota in rows],
        rank=["team", "holds now", "guaranteed", *_COUNTS],
        right=_COUNTS,
    )


_COUNTS = ("borrowing", "running", "queued")


def _quota_row(quota: dict[str, Any]) -> dict[str, str]:
    """A quota as `scheduler quotas` shows it: amounts of the resources it limits."""
    limits = {k: quota["guaranteed"][k] + quota["borrow_limit"][k] for k in _PARTS}
    shown = tuple(k for k in _PARTS if limits[k]) or _PARTS
    return {
        "pool": quota["pool"],
        "team": quota["team"],
        "cohort": quota["cohort"],
        "guaranteed": _amount(quota["guaranteed"], shown),
        "may borrow": _amount(quota["borrow_limit"], shown),
        "holds now": _amount(quota["held"], shown),
        "borrowing": _amount(_borrowing(quota, shown), shown),
        "running": str(quota["running"]),
        "queued": str(quota["queued"]),
    }


@app.command("policies")
def policies() -> None:
    """List the scheduling policies, what each does and its options with their defaults.

    Choose one with SHAMAL_SCHEDULER__POLICY and set options with
    SHAMAL_SCHEDULER__POLICY_OPTIONS, e.g. '{"min_run_s": 600}'.
    """
    table = Table(title="Scheduling policies", title_justify="left", header_style="bold")
    for column in ("policy", "what it does", "options (defaults)"):
        table.add_column(column)
    for policy in policy_names():
        marker = " (default)" if policy == DEFAULT_POLICY else ""
        options = ", ".join(
            f"{key}={_option(value)}" for key, value in policy_defaults(policy).items()
        )
        table.add_row(Text(policy + marker), Text(policy_summary(policy)), Text(options))
    console.print(table)
    console.print(
        Text(
            "choose with SHAMAL_SCHEDULER__POLICY; options with SHAMAL_SCHEDULER__POLICY_OPTIONS, "
            "e.g. '{\"min_run_s\": 600}' (min_run_s: seconds a started job is protected from "
            "preemption, for priority and for reclaiming borrowed quota)",
            style="dim",
        )
    )


def _option(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(f"{item:g}" for item in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)
