"""`shamal experiments` and `shamal runs`: look at tracked work from the terminal."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from shamal.cli._common import JsonOption, client, console, fmt, handle_errors, print_table

experiments = typer.Typer(help="Experiments: list and show.", no_args_is_help=True)
runs = typer.Typer(help="Runs: list, show and compare side by side.", no_args_is_help=True)
models = typer.Typer(
    help="Registered models: list, show versions and aliases, compare versions.",
    no_args_is_help=True,
)


def metric_text(point: dict[str, Any] | None) -> str:
    if point is None:
        return "-"
    if point.get("special"):
        return str(point["special"])
    value = point.get("value")
    return f"{value:.6g}" if isinstance(value, float) else str(value)


@experiments.command("list")
@handle_errors
def list_experiments(
    all_: Annotated[bool, typer.Option("--all", help="Include deleted experiments.")] = False,
    filter_: Annotated[
        str | None, typer.Option("--filter", help="e.g. \"name LIKE 'cv-%'\"")
    ] = None,
    as_json: bool = JsonOption,
) -> None:
    """List experiments."""
    rows = client().list_experiments(filter_string=filter_, view="ALL" if all_ else "ACTIVE_ONLY")
    print_table(
        "Experiments",
        ["experiment_id", "name", "lifecycle_stage", "creation_time"],
        [{**r, "creation_time": _ms(r["creation_time"])} for r in rows],
        as_json=as_json,
    )


@experiments.command("show")
@handle_errors
def show_experiment(experiment: str, as_json: bool = JsonOption) -> None:
    """Show an experiment (by id or name) and its latest runs."""
    api = client()
    exp = api.get_experiment(api.experiment_id_of(experiment))
    if as_json:
        console.print_json(data=exp)
        return
    console.print(f"[bold]{exp['name']}[/] (id {exp['experiment_id']}, {exp['lifecycle_stage']})")
    for key, value in sorted(exp["tags"].items()):
        console.print(f"  {key} = {value}")
    _print_runs(api.list_runs(exp["experiment_id"], limit=20), f"Latest runs of {exp['name']}")


@runs.command("list")
@handle_errors
def list_runs(
    experiment: Annotated[str, typer.Argument(help="Experiment id or name.")],
    filter_: Annotated[
        str | None, typer.Option("--filter", help="e.g. 'metrics.acc > 0.9'")
    ] = None,
    order_by: Annotated[
        list[str] | None, typer.Option("--order-by", help="e.g. 'metrics.acc DESC'")
    ] = None,
    limit: Annotated[int, typer.Option("--max", min=1, max=5000)] = 50,
    as_json: bool = JsonOption,
) -> None:
    """List (and search) the runs of an experiment."""
    api = client()
    rows = api.list_runs(
        api.experiment_id_of(experiment), filter_string=filter_, order_by=order_by, limit=limit
    )
    if as_json:
        console.print_json(data=rows)
        return
    _print_runs(rows, "Runs")


@runs.command("show")
@handle_errors
def show_run(run_id: str, as_json: bool = JsonOption) -> None:
    """Show a run: status, params, latest metrics and tags."""
    run = client().get_run(run_id)
    if as_json:
        console.print_json(data=run)
        return
    console.print(
        f"[bold]{run['run_name']}[/] {run['run_id']}  {run['status']}  "
        f"started {_ms(run['start_time'])}"
    )
    print_table(
        "Params",
        ["key", "value"],
        [{"key": k, "value": v} for k, v in sorted(run["params"].items())],
    )
    print_table(
        "Metrics (latest)",
        ["key", "value", "step"],
        [
            {"key": k, "value": metric_text(p), "step": p["step"]}
            for k, p in sorted(run["metrics"].items())
        ],
    )


@runs.command("compare")
@handle_errors
def compare(
    run_ids: Annotated[list[str], typer.Argument(help="Two or more run ids.")],
    as_json: bool = JsonOption,
) -> None:
    """Compare runs side by side: params and latest metrics, one column per run."""
    if len(run_ids) < 2:
        raise typer.BadParameter("give at least two run ids")
    api = client()
    found = [api.get_run(r) for r in run_ids]
    if as_json:
        console.print_json(data=found)
        return
    _print_comparison(
        "Run comparison", [f"{r['run_name']}\n{r['run_id'][:8]}" for r in found], found
    )


def _print_comparison(title: str, headers: list[str], found: list[dict[str, Any]]) -> None:
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("")
    for header in headers:
        table.add_column(header, justify="right")
    for key in sorted({k for run in found for k in run["params"]}):
        table.add_row(f"param {key}", *(run["params"].get(key, "-") for run in found))
    table.add_section()
    for key in sorted({k for run in found for k in run["metrics"]}):
        values = [run["metrics"].get(key) for run in found]
        cells = [metric_text(v) for v in values]
        numbers = [v["value"] for v in values if v and isinstance(v.get("value"), float)]
        if len(numbers) > 1 and max(numbers) != min(numbers):
            # Highest and lowest marked, not "best": for a loss, lower is better.
            hi, lo = max(numbers), min(numbers)
            cells = [
                f"{c} ▲"
                if v and v.get("value") == hi
                else f"{c} ▼"
                if v and v.get("value") == lo
                else c
                for c, v in zip(cells, values, strict=True)
            ]
        table.add_row(f"metric {key}", *cells)
    console.print(table)


def _ms(value: int | None) -> str:
    if value is None:
        return "-"
    return fmt(datetime.fromtimestamp(value / 1000, UTC).isoformat())


def _print_runs(rows: list[dict[str, Any]], title: str) -> None:
    metric_keys = sorted({k for r in rows for k in r["metrics"]})[:6]
    table_rows = [
        {
            "run_id": r["run_id"][:12],
            "run_name": r["run_name"],
            "status": r["status"],
            "start_time": _ms(r["start_time"]),
            **{k: metric_text(r["metrics"].get(k)) for k in metric_keys},
        }
        for r in rows
    ]
    print_table(title, ["run_id", "run_name", "status", "start_time", *metric_keys], table_rows)


@models.command("list")
@handle_errors
def list_models(
    search: Annotated[str, typer.Option("--search", help="Part of the name.")] = "",
    as_json: bool = JsonOption,
) -> None:
    """List registered models with their aliases."""
    rows = client().list_models(search=search)
    print_table(
        "Registered models",
        ["name", "team", "aliases", "latest", "updated_at"],
        [
            {
                **r,
                "aliases": ", ".join(f"@{a}=v{v}" for a, v in sorted(r["aliases"].items())),
                "latest": ", ".join(f"v{v['version']}" for v in r["latest_versions"]),
            }
            for r in rows
        ],
        as_json=as_json,
    )


@models.command("show")
@handle_errors
def show_model(name: str, as_json: bool = JsonOption) -> None:
    """Show a registered model: its versions, their sources and aliases."""
    model = client().get_model(name)
    if as_json:
        console.print_json(data=model)
        return
    console.print(f"[bold]{model['name']}[/] {model['description']}")
    print_table(
        "Versions",
        ["version", "aliases", "stage", "status", "run_id", "created_at"],
        [
            {
                **v,
                "aliases": ", ".join(f"@{a}" for a in v["aliases"]),
                "run_id": (v["run_id"] or "-")[:12],
            }
            for v in model["versions"]
        ],
    )


@models.command("compare")
@handle_errors
def compare_models(
    name: str,
    versions: Annotated[list[int], typer.Argument(help="Two or more version numbers.")],
) -> None:
    """Compare versions of a model by the params and metrics of the runs that made them."""
    if len(versions) < 2:
        raise typer.BadParameter("give at least two versions")
    api = client()
    by_number = {v["version"]: v for v in api.get_model(name)["versions"]}
    missing = [n for n in versions if n not in by_number or not by_number[n]["run_id"]]
    if missing:
        raise typer.BadParameter(f"no version with a source run: {missing}")
    found = [api.get_run(by_number[n]["run_id"]) for n in versions]
    _print_comparison(f"{name}: versions side by side", [f"v{n}" for n in versions], found)
