"""`shamal sim`: replay a job trace through the scheduler's policies, offline.

The simulator runs the same policy, admission and placement code as the live
scheduler (see :mod:`shamal.scheduler.core.sim`); nothing talks to a server.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from shamal.cli._common import JsonOption, console, err_console, escape
from shamal.cli._plotfile import plot_path
from shamal.cli.sim_pack import pack
from shamal.scheduler.core import (
    DEFAULT_POLICY,
    DEFAULT_PREEMPTION_COST_S,
    Cluster,
    TeamQuota,
    policy_names,
)

if TYPE_CHECKING:  # the simulator brings numpy: imported by the commands that run it
    from shamal.scheduler.core.sim import SimResult, TraceJob

app = typer.Typer(
    help="Simulate the scheduler on a job trace: `shamal sim --trace jobs.csv --machines "
    "machines.csv [--policy NAME] [--json]`; `shamal sim pack` for GPU-sharing packing.",
)
app.command("pack")(pack)

_PROGRESS_MIN_JOBS = 20_000
MAX_PREEMPTION_COST_S = 7 * 86400.0
"""A week per restore: more is no cost a simulation can mean (and inf broke the table)."""


def _fail(message: str, hint: str | None = None) -> typer.Exit:
    # Messages quote file contents and names users chose: never read as markup or emoji.
    err_console.print(f"[bold red]error:[/] {escape(message)}", emoji=False)
    if hint:
        err_console.print(f"[yellow]hint:[/] {escape(hint)}", emoji=False)
    return typer.Exit(1)


def _clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _seconds(value: float) -> str:
    if value >= 86_400:
        return f"{value:,.0f} s ({value / 86_400:.1f} d)"
    if value >= 3600:
        return f"{value:,.0f} s ({value / 3600:.1f} h)"
    return f"{value:,.1f} s"


def _share(value: float | None) -> str:
    return "n/a (no GPUs)" if value is None else f"{100 * value:.1f}%"


def _print_table(metrics: dict[str, Any]) -> None:
    table = Table(
        title=f"Simulation: policy {metrics['policy']}", title_justify="left", header_style="bold"
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows: list[tuple[str, str]] = [
        ("jobs finished", f"{metrics['jobs_finished']:,} of {metrics['jobs']:,}"),
        ("jobs rejected (never fit)", f"{metrics['jobs_rejected']:,}"),
        ("GPUs", f"{metrics['gpus']:,.0f}"),
        ("average JCT", _seconds(metrics["avg_jct_s"])),
        ("median JCT", _seconds(metrics["p50_jct_s"])),
        ("p99 JCT", _seconds(metrics["p99_jct_s"])),
        ("average queueing delay", _seconds(metrics["avg_queue_s"])),
        ("p99 queueing delay", _seconds(metrics["p99_queue_s"])),
        ("GPU utilization", _share(metrics["gpu_utilization"])),
        ("makespan", _seconds(metrics["makespan_s"])),
        ("preemptions (jobs)", f"{metrics['preemptions']:,} ({metrics['preempted_jobs']:,})"),
        ("preemption cost", f"{metrics['preemption_cost_s']:g} s each"),
        ("policy rounds", f"{metrics['policy_calls']:,}"),
        ("simulation time", f"{metrics['sim_seconds']:.1f} s"),
    ]
    prediction = metrics.get("prediction")
    if prediction and prediction.get("n"):
        rows.append(
            (
                "runtime prediction (online)",
                f"MdAPE {100 * prediction['mdape']:.0f}%, within 2x "
                f"{100 * prediction['within_2x']:.0f}%, MAE {prediction['mae_s']:,.0f} s",
            )
        )
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    teams = metrics.get("teams")
    if teams:
        per_team = Table(title="Per team", title_justify="left", header_style="bold")
        for column in ("team", "jobs", "avg JCT (s)", "avg queue (s)", "p99 queue (s)"):
            per_team.add_column(column, justify="left" if column == "team" else "right")
        for team, figures in teams.items():
            per_team.add_row(
                team,
                f"{figures['jobs']:,}",
                f"{figures['avg_jct_s']:,.0f}",
                f"{figures['avg_queue_s']:,.1f}",
                f"{figures['p99_queue_s']:,.0f}",
            )
        console.print(per_team)


@app.callback(invoke_without_command=True)
def sim(
    ctx: typer.Context,
    trace: Annotated[
        Path | None,
        typer.Option("--trace", help="Job trace CSV (job_id, submit_time_s, duration_s, ...)."),
    ] = None,
    machines: Annotated[
        Path | None,
        typer.Option(
            "--machines",
            help="Machine list, CSV with a header or JSON: a GPU count column (gpus, "
            "'number of GPUs' or gpu) and optionally name, gpu_model, gpu_memory_mib, cpus "
            "or cpu_milli, memory_mib, pool, count; Philly's machines.csv and Alibaba's "
            "openb node lists work as they are. Optional with --teams: then the teams' "
            "nodes are the cluster.",
        ),
    ] = None,
    policy: Annotated[
        str,
        typer.Option("--policy", help=f"One of: {', '.join(policy_names(simulation=True))}."),
    ] = DEFAULT_POLICY,
    as_json: bool = JsonOption,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            help="Draw queue length and GPU utilization over time to this file: .png, .svg "
            "or .pdf (no extension: .png).",
        ),
    ] = None,
    preemption_cost: Annotated[
        float,
        typer.Option(
            "--preemption-cost",
            min=0,
            max=MAX_PREEMPTION_COST_S,
            help="Checkpoint/restore seconds added per preemption.",
        ),
    ] = DEFAULT_PREEMPTION_COST_S,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Replay only the first N jobs.")
    ] = None,
    teams: Annotated[
        Path | None,
        typer.Option(
            "--teams",
            help="Team quotas (CSV 'team, nodes', e.g. philly/vc_nodes.csv): each job is "
            "assigned a team at random (seeded, in proportion to team size) unless the "
            "trace names one; quota = nodes x --gpus-per-node GPUs.",
        ),
    ] = None,
    isolated: Annotated[
        bool,
        typer.Option("--isolated", help="With --teams: no borrowing of idle quota."),
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the team assignment.")] = 0,
    gpus_per_node: Annotated[
        int, typer.Option("--gpus-per-node", min=1, help="With --teams: GPUs per team node.")
    ] = 8,
) -> None:
    """Replay a trace through a scheduling policy and print the metrics.

    JCT is finish - submission; queueing delay is JCT minus the time the job ran, so
    time spent preempted counts as waiting. Every job of the trace runs (failed and
    cancelled ones too); each preemption adds --preemption-cost seconds of restore. A
    job that can never fit the machines is rejected and counted; if no job fits at all
    the command fails.

    With --json: one JSON object with jobs, jobs_finished, jobs_rejected, gpus,
    avg/p50/p99_jct_s, avg/p50/p99_queue_s, makespan_s (seconds), gpu_utilization (the
    share of GPU capacity held over the makespan, between 0 and 1; null when the
    machines have no GPUs), preemptions, per-team figures with --teams, and plot.
    """
    if ctx.invoked_subcommand is not None:
        return
    if trace is None:
        raise _fail("--trace is required", "e.g. shamal sim --trace jobs.csv --machines m.csv")
    if machines is None and teams is None:
        raise _fail("--machines is required (or --teams, whose nodes then form the cluster)")
    names = policy_names(simulation=True)
    if policy not in names:
        raise _fail(f"unknown policy {policy!r}", f"choose one of: {', '.join(names)}")
    plot = _checked_plot(plot)  # before the simulation, not after it
    jobs, cluster, quotas = _load(trace, machines, limit, teams, isolated, seed, gpus_per_node)
    result = _run(jobs, cluster, policy, preemption_cost, quotas, as_json)
    if result.metrics["jobs_rejected"] == len(jobs):
        raise _fail(
            f"none of the {len(jobs):,} jobs of {trace} can ever run on "
            f"{machines or teams}: {_nothing_fits(jobs, cluster, quotas is not None)}",
            "check that --machines is the machine list meant for this trace",
        )
    metrics = _clean(result.metrics)
    failed = _draw(result, plot, metrics) if plot is not None else None
    if as_json:
        typer.echo(json.dumps(metrics))
    else:
        _print_table(metrics)
        if metrics.get("plot"):
            console.print(f"plot written to {metrics['plot']}")
    if failed is not None:
        raise _fail(failed)


def _checked_plot(plot: Path | None) -> Path | None:
    """The plot file that will be written (see :func:`plot_path`), or a clean error."""
    if plot is None:
        return None
    try:
        return plot_path(plot)
    except ValueError as exc:
        raise _fail(str(exc)) from None


def _draw(result: SimResult, plot: Path, metrics: dict[str, Any]) -> str | None:
    """Draw the plot and record its path in ``metrics``; the error, if it failed (the
    metrics are printed all the same)."""
    from shamal.cli._sim_plot import plot_timeline

    try:
        metrics["plot"] = str(plot_timeline(result, plot))
    except (OSError, ValueError) as exc:
        metrics["plot"] = None
        return f"could not write the plot {plot}: {getattr(exc, 'strerror', None) or exc}"
    return None


def _nothing_fits(jobs: list[TraceJob], cluster: Cluster, teams: bool) -> str:
    """Why no job fits: the smallest request against the largest machine."""
    smallest = min(jobs, key=lambda j: (j.gpus, j.cpus or 0, j.memory_mib or 0))
    nodes = list(cluster.nodes.values())
    gpus = max(len(n.gpus) for n in nodes)
    cpus = max(n.cpu_milli for n in nodes) / 1000
    memory = max(n.memory_mib for n in nodes)
    asks = f"{smallest.gpus:g} GPU(s)"
    if smallest.cpus:
        asks += f", {smallest.cpus:g} CPU(s)"
    if smallest.memory_mib:
        asks += f", {smallest.memory_mib:,} MiB"
    return (
        f"the smallest asks for {asks}; the largest machine has {gpus} GPU(s), "
        f"{cpus:g} CPU(s), {memory:,} MiB" + (" (or its team's quota is smaller)" if teams else "")
    )


def _load(
    trace: Path,
    machines: Path | None,
    limit: int | None,
    teams: Path | None,
    isolated: bool,
    seed: int,
    gpus_per_node: int,
) -> tuple[list[TraceJob], Cluster, dict[tuple[str, str], TeamQuota] | None]:
    """The jobs, the cluster and the quotas (``None``: no team mode) of a run."""
    from shamal.scheduler.core.sim import (
        DEFAULT_POOL,
        TraceError,
        assign_teams,
        load_machines,
        load_teams,
        load_trace,
        team_cluster,
    )

    try:
        jobs = load_trace(trace, limit=limit)
        if machines is not None:
            cluster = load_machines(machines)
        else:
            assert teams is not None  # noqa: S101 - the caller checks
            cluster = team_cluster(teams, gpus_per_node=gpus_per_node)
        quotas = None
        if teams is not None:
            pool = next(iter(cluster.pools)) if len(cluster.pools) == 1 else DEFAULT_POOL
            quotas = load_teams(teams, gpus_per_node=gpus_per_node, pool=pool, borrow=not isolated)
            if not any(job.team for job in jobs):
                jobs = assign_teams(jobs, quotas, seed=seed)
    except TraceError as exc:
        raise _fail(str(exc), "see `shamal sim --help` for the file formats") from None
    if not jobs:
        raise _fail(f"{trace} has no jobs")
    return jobs, cluster, quotas


def _run(
    jobs: list[Any],
    cluster: Any,
    policy: str,
    preemption_cost: float,
    quotas: Any,
    as_json: bool,
) -> SimResult:
    from shamal.scheduler.core.sim import Simulator

    show = not as_json and err_console.is_terminal and len(jobs) >= _PROGRESS_MIN_JOBS
    try:
        if not show:
            return Simulator(
                jobs, cluster, policy=policy, preemption_cost_s=preemption_cost, quotas=quotas
            ).run()
        with Progress(
            TextColumn(f"simulating [bold]{policy}[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("jobs done"),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
        ) as bar:
            task = bar.add_task("sim", total=len(jobs))
            return Simulator(
                jobs,
                cluster,
                policy=policy,
                preemption_cost_s=preemption_cost,
                quotas=quotas,
                progress=lambda done, total: bar.update(task, completed=done),
            ).run()
    except ValueError as exc:  # e.g. an oracle policy on a trace without durations
        raise _fail(str(exc)) from None


if __name__ == "__main__":  # pragma: no cover
    app(sys.argv[1:])
