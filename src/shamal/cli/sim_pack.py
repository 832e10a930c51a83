"""`shamal sim pack`: the GPU-sharing packing experiment (FGD, ATC'23) on a node and pod list.

A Typer command function, registered by the ``shamal sim`` group as
``app.command("pack")(pack)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from shamal.cli._common import JsonOption, console, err_console
from shamal.scheduler.core import DEFAULT_STRATEGY, STRATEGIES

__all__ = ["pack"]

_CHECKPOINTS = (0.9, 1.0, 1.3)


def _fail(message: str, hint: str | None = None) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}")
    if hint:
        err_console.print(f"[yellow]hint:[/] {hint}")
    return typer.Exit(1)


def _run(
    nodes: Path, pods: Path, demand: float, seeds: int, policy: str, show: bool
) -> dict[str, Any]:
    # The simulator brings numpy: imported by the command that runs it, not by the CLI's start.
    from shamal.scheduler.core.sim import run_pack_experiment

    if not show:
        return run_pack_experiment(
            nodes, pods, demand=demand, seeds=seeds, strategy=policy, checkpoints=_CHECKPOINTS
        )
    with Progress(
        TextColumn(f"packing with [bold]{policy}[/]"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("of {task.total} seeds"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as bar:
        task = bar.add_task("pack", total=seeds)
        return run_pack_experiment(
            nodes,
            pods,
            demand=demand,
            seeds=seeds,
            strategy=policy,
            checkpoints=_CHECKPOINTS,
            progress=lambda done, total: bar.update(task, completed=done),
        )


def _span(values: list[float]) -> tuple[float, float]:
    return min(values), max(values)


def _print_table(result: dict[str, Any]) -> None:
    table = Table(
        title=f"GPU allocation ratio: {result['strategy']}, {result['seeds']} seed(s), "
        f"{result['total_gpus']:,} GPUs on {result['nodes']:,} nodes",
        title_justify="left",
        header_style="bold",
    )
    table.add_column("demand")
    table.add_column("allocated (mean)", justify="right")
    table.add_column("min", justify="right")
    table.add_column("max", justify="right")
    for label, mean in result["alloc_ratio"].items():
        per_seed = result["alloc_ratio_per_seed"][label]
        table.add_row(f"{float(label):.0%}", *(f"{100 * r:.2f}%" for r in (mean, *_span(per_seed))))
    console.print(table)
    console.print(
        f"[dim]{result['placed_mean']:,.0f} pods placed and {result['failed_mean']:,.0f} "
        f"not per seed; {result['seconds']:.1f} s[/]"
    )


def pack(
    nodes: Annotated[
        Path, typer.Option("--nodes", help="Node list CSV: sn, cpu_milli, memory_mib, gpu, model.")
    ],
    pods: Annotated[
        Path,
        typer.Option(
            "--pods", help="Pod list CSV: cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec."
        ),
    ],
    demand: Annotated[
        float,
        typer.Option("--demand", min=0.01, max=10.0, help="Stop when GPUs asked reach this share."),
    ] = 1.3,
    seeds: Annotated[int, typer.Option("--seeds", min=1, max=1000, help="Runs to average.")] = 10,
    policy: Annotated[
        str,
        typer.Option("--policy", help=f"Placement strategy: {', '.join(STRATEGIES)}."),
    ] = DEFAULT_STRATEGY,
    as_json: bool = JsonOption,
) -> None:
    """Pack pods that never leave onto the nodes; report the GPU allocation ratio.

    Pods: the pod list plus seeded random draws from it, up to DEMAND x the GPUs.
    Reported: the allocation ratio (share of the GPU capacity held) at 90%, 100% and
    130% of demand, mean over the seeds; with --json, alloc_ratio maps "0.9", "1.0" and
    "1.3" to it as a number between 0 and 1 (the table shows percent).
    """
    if policy not in STRATEGIES:
        raise _fail(f"unknown policy {policy!r}", f"one of {', '.join(STRATEGIES)}")
    from shamal.scheduler.core.sim import TraceError

    show = err_console.is_terminal
    try:
        result = _run(nodes, pods, demand, seeds, policy, show)
    except TraceError as exc:
        raise _fail(
            str(exc), "expected the openb node and pod lists of the Alibaba trace"
        ) from None
    if as_json:
        typer.echo(json.dumps(result))
    else:
        _print_table(result)
