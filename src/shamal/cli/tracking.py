"""`shamal experiments`, `shamal runs` and `shamal models`: look at tracked work from the terminal.

Run ids are shown by their first :data:`SHORT_ID` characters; every command that takes a run id
takes that short form back (any unique prefix of 8 or more), resolved by the client.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Final

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from shamal.cli._common import (
    JsonOption,
    client,
    console,
    err_console,
    escape,
    fmt,
    handle_errors,
    print_table,
)
from shamal.cli._curves import Curve, plot_curves, summarize
from shamal.cli._plotfile import plot_path
from shamal.client import (
    ShamalClient,
    best_value,
    extremes,
    goal_of,
    metrics_to_draw,
    missing_metrics,
    status_rank,
    summarize_experiment,
)
from shamal.errors import InvalidParameter, NotFound

#: Characters of a run id the tables show (the quickstart prints as many).
SHORT_ID: Final = 12
#: Metrics whose history `runs show` reads for its curves; panels and lines of `runs plot`.
MAX_CURVES: Final = 20
CURVE_WIDTH: Final = 16
MAX_PANELS: Final = 8
MAX_LINES: Final = 20
_RUN_ID_HELP: Final = "A run id, or its first 8 or more characters (as tables show them)."
_LIST_EXPERIMENTS: Final = "`shamal experiments list` shows the experiments you can see"
_LIST_RUNS: Final = "`shamal runs list EXPERIMENT` shows the runs of an experiment and their ids"

experiments = typer.Typer(help="Experiments: list, show and compare.", no_args_is_help=True)
runs = typer.Typer(
    help="Runs: list, show with metric curves, compare side by side, plot.", no_args_is_help=True
)
models = typer.Typer(
    help="Registered models: list, show versions and aliases, compare versions, promote "
    "through a gate.",
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
    if as_json:
        console.print_json(data=[{**r, "creation_time": _ms(r["creation_time"])} for r in rows])
        return
    print_table(
        "Experiments",
        ["experiment_id", "name", "lifecycle_stage", "creation_time"],
        [{**r, "creation_time": _iso(r["creation_time"])} for r in rows],
    )


@experiments.command("show")
@handle_errors
def show_experiment(experiment: str, as_json: bool = JsonOption) -> None:
    """Show an experiment (by id or name) and its latest runs."""
    api = client()
    exp = _experiment(api, experiment)
    if as_json:
        console.print_json(data=exp)
        return
    console.print(
        f"[bold]{escape(exp['name'])}[/] (id {exp['experiment_id']}, {exp['lifecycle_stage']})"
    )
    for key, value in sorted(exp["tags"].items()):
        console.print(f"  {escape(key)} = {escape(value)}")
    title = f"Latest runs of {escape(exp['name'])}"
    _print_runs(api.list_runs(exp["experiment_id"], limit=20), title)


@experiments.command("compare")
@handle_errors
def compare_experiments(
    names: Annotated[list[str], typer.Argument(help="Two or more experiment ids or names.")],
    metric: Annotated[
        str | None, typer.Option("--metric", help="Compare this metric only.")
    ] = None,
    maximize: Annotated[
        bool | None,
        typer.Option(
            "--max/--min",
            help="Best is the highest value, or the lowest, for every metric. "
            "Default: by name (lowest for loss, error, mse, mae, perplexity, latency, time, ...; "
            "highest for the others).",
        ),
    ] = None,
    as_json: bool = JsonOption,
) -> None:
    """Compare experiments side by side: their (active) runs by status, last activity, and for
    each metric the best value any run has (its latest value; NaN and infinities never win)
    with the run that has it. The best experiment of each metric is marked; each metric says
    whether its best is its highest (max) or lowest (min) value."""
    if len(names) < 2:
        raise typer.BadParameter("give at least two experiments")
    api = client()
    summaries = []
    for name in names:
        exp = _experiment(api, name)
        runs_of = api.iter_runs(exp["experiment_id"])
        summaries.append(summarize_experiment(exp, runs_of, metric=metric, maximize=maximize))
    if as_json:
        console.print_json(data=summaries)
    else:
        _print_experiment_comparison(summaries, maximize=maximize)
    if metric is not None and all(metric not in s["best"] for s in summaries):
        seen = sorted({k for s in summaries for k in s["metric_keys"]})
        err_console.print(
            f"[yellow]note:[/] no run of these experiments has a finite value of metric "
            f"{escape(repr(metric))}; their metrics: {escape(', '.join(seen) or 'none')}"
        )


def _comparison_table(title: str, headers: Iterable[str]) -> Table:
    """A table with a row label column, then one right-aligned column per thing compared.
    Every cell folds (a run's name, a long param) rather than being cut with '…': nothing
    compared is left out in a narrow terminal, and a name reads whole."""
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("", overflow="fold")
    for header in headers:
        table.add_column(header, justify="right", overflow="fold")
    return table


def _print_experiment_comparison(summaries: list[dict[str, Any]], *, maximize: bool | None) -> None:
    table = _comparison_table(
        "Experiment comparison",
        (f"{escape(s['name'])}\nid {s['experiment_id']}" for s in summaries),
    )
    _add_run_rows(table, summaries)
    width = short_id_width(b["run_id"] for s in summaries for b in s["best"].values())
    for key in sorted({k for s in summaries for k in s["best"]}):
        table.add_section()
        found = [s["best"].get(key) for s in summaries]
        _add_best_rows(table, key, goal_of(key, maximize), found, width)
    console.print(table)


def _add_run_rows(table: Table, summaries: list[dict[str, Any]]) -> None:
    """How many runs each experiment has, in all and by status, and its last activity."""
    table.add_row("runs", *(str(s["runs"]) for s in summaries))
    statuses = sorted({k for s in summaries for k in s["runs_by_status"]}, key=status_rank)
    for status in statuses:
        table.add_row(
            f"  {status.lower()}", *(str(s["runs_by_status"].get(status, 0)) for s in summaries)
        )
    table.add_row("last activity", *(_ms(s["last_activity"]) for s in summaries))


def _add_best_rows(
    table: Table, key: str, goal: str, found: list[dict[str, Any] | None], width: int
) -> None:
    """A metric's best value in each experiment (the best of them marked) and its run."""
    winner = best_value((b["value"] for b in found if b is not None), goal)
    mark = " ▲" if goal == "max" else " ▼"
    table.add_row(
        f"{escape(key)} ({goal})",
        *(
            "-" if b is None else metric_text(b) + (mark if b["value"] == winner else "")
            for b in found
        ),
    )
    table.add_row(
        "  best run",
        *("-" if b is None else f"{escape(b['run_name'])} {b['run_id'][:width]}" for b in found),
    )


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
        _experiment_id(api, experiment), filter_string=filter_, order_by=order_by, limit=limit
    )
    if as_json:
        console.print_json(data=rows)
        return
    _print_runs(rows, "Runs")


@runs.command("show")
@handle_errors
def show_run(
    run_id: Annotated[str, typer.Argument(help=_RUN_ID_HELP)],
    curves: Annotated[
        bool,
        typer.Option(
            "--curves/--no-curves",
            help=f"Read each metric's history for its range and curve (the first {MAX_CURVES}).",
        ),
    ] = True,
    as_json: bool = JsonOption,
) -> None:
    """Show a run: status, params, its metrics with their curves, and tags."""
    api = client()
    run = _run(api, run_id)
    if as_json:
        console.print_json(data=run)
        return
    console.print(
        f"[bold]{escape(run['run_name'])}[/] {run['run_id']}  {run['status']}  "
        f"started {_ms(run['start_time'])}"
    )
    print_table(
        "Params",
        ["key", "value"],
        [{"key": k, "value": v} for k, v in sorted(run["params"].items())],
    )
    keys = sorted(run["metrics"])
    drawn = keys[:MAX_CURVES] if curves else []
    histories = _histories(api, [(run["run_id"], key) for key in drawn])
    rows = [
        _metric_row(key, run["metrics"][key], histories.get((run["run_id"], key)), curves)
        for key in keys
    ]
    _print_metrics(rows, curves)
    if curves and len(keys) > MAX_CURVES:
        console.print(
            f"[dim]curves of the first {MAX_CURVES} of {len(keys)} metrics; "
            f"`shamal runs plot {run['run_id'][:SHORT_ID]} --metric KEY` draws any[/]"
        )


def _metric_row(
    key: str, latest: dict[str, Any], history: list[dict[str, Any]] | None, curves: bool
) -> dict[str, Any]:
    """A metric's row of `runs show`: its latest value and, with curves, its history's range,
    size and sparkline (``-`` when its history was not read)."""
    row = {"key": key, "latest": metric_text(latest), "step": latest["step"]}
    if not curves:
        return row
    if history is None:
        return row | {"min": "-", "max": "-", "points": "-", "curve": ""}
    summary = summarize(history, CURVE_WIDTH)
    return row | {
        "min": metric_text({"value": summary.low}),
        "max": metric_text({"value": summary.high}),
        "points": f"{summary.points:,}",
        "curve": summary.curve,
    }


def _print_metrics(rows: list[dict[str, Any]], curves: bool) -> None:
    if not rows:
        console.print("[dim]Metrics: none[/]")
        return
    cells = [{column: fmt(value) for column, value in row.items()} for row in rows]
    table = Table(title="Metrics", title_justify="left", header_style="bold")
    table.add_column("key", overflow="fold")  # long keys wrap; numbers and curves never do
    for column in ("latest", "step", *(("min", "max", "points") if curves else ())):
        widest = max(len(column), *(len(row[column]) for row in cells))
        table.add_column(column, justify="right", no_wrap=True, min_width=widest)
    if curves:
        table.add_column("curve", no_wrap=True, min_width=CURVE_WIDTH)
    for row in cells:
        table.add_row(*(escape(value) for value in row.values()))
    console.print(table)


@runs.command("plot")
@handle_errors
def plot_runs(
    run_ids: Annotated[list[str], typer.Argument(help=f"One or more runs. {_RUN_ID_HELP}")],
    metric: Annotated[
        list[str] | None,
        typer.Option(
            "--metric",
            "-m",
            help=f"A metric to draw (repeatable); default: the runs' metrics, up to {MAX_PANELS}.",
        ),
    ] = None,
    out: Annotated[
        str, typer.Option("--out", "-o", help="The file to write: .png, .svg or .pdf.")
    ] = "metrics.png",
    x: Annotated[str, typer.Option("--x", help="step, or time (minutes).")] = "step",
) -> None:
    """Draw metric histories, one panel per metric and one line per run, into a file.

    Example: shamal runs plot 3f2a9c1d0b7e 8e41d2aa90c3 --metric loss --metric val_loss
    """
    path = _plot_file(out, x, len(run_ids))
    api = client()
    found = list({r["run_id"]: r for r in (_run(api, r) for r in run_ids)}.values())
    keys = _chart_metrics(found, metric or [])
    wanted = [(r["run_id"], k) for k in keys for r in found if k in r["metrics"]]
    histories = _histories(api, wanted)
    width = short_id_width(r["run_id"] for r in found)
    names = {r["run_id"]: f"{r['run_name']} ({r['run_id'][:width]})" for r in found}
    curves = [Curve(k, names[run_id], histories[(run_id, k)]) for run_id, k in wanted]
    written = plot_curves(curves, path, x=x, title=", ".join(keys))
    drawn = len({run_id for run_id, _ in wanted})
    console.print(f"wrote {escape(str(written))}: {escape(', '.join(keys))} of {drawn} run(s)")


def _plot_file(out: str, x: str, lines: int) -> Path:
    """The file `runs plot` writes, once its options are checked (before any request).

    Raises:
        InvalidParameter: not a .png, .svg or .pdf path; ``x`` neither step nor time; more
            runs than a chart can show.
    """
    try:
        path = plot_path(out, "--out")
    except ValueError as exc:
        raise InvalidParameter(str(exc)) from None
    if x not in ("step", "time"):
        raise InvalidParameter(f"--x takes step or time, not {x!r}")
    if lines > MAX_LINES:
        raise InvalidParameter(f"give at most {MAX_LINES} runs; a chart of more cannot be read")
    return path


def _chart_metrics(found: list[dict[str, Any]], given: list[str]) -> list[str]:
    """The metrics `runs plot` draws of ``found`` (see :func:`metrics_to_draw`).

    Raises:
        InvalidParameter: none to draw, more than one chart holds, or one no run has.
    """
    keys = metrics_to_draw(found, given, MAX_PANELS)
    if not keys:
        raise InvalidParameter("these runs have no metrics to draw")
    if len(keys) > MAX_PANELS:
        raise InvalidParameter(f"give at most {MAX_PANELS} metrics; one chart holds that many")
    missing = missing_metrics(found, keys)
    if missing:
        raise InvalidParameter(
            f"no run given has the metric {missing[0]!r}; `shamal runs show RUN` lists them"
        )
    return keys


def _histories(
    api: ShamalClient, wanted: list[tuple[str, str]]
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The whole history of each (run id, metric), with a progress bar when it is long work."""
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with Progress(
        TextColumn("reading metric histories"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err_console,
        transient=True,
        disable=len(wanted) < 2 or not err_console.is_terminal,
    ) as progress:
        task = progress.add_task("histories", total=len(wanted))
        for run_id, key in wanted:
            found[(run_id, key)] = api.metric_history(run_id, key)
            progress.advance(task)
    return found


@runs.command("compare")
@handle_errors
def compare(
    run_ids: Annotated[list[str], typer.Argument(help=f"Two or more runs. {_RUN_ID_HELP}")],
    as_json: bool = JsonOption,
) -> None:
    """Compare runs side by side: params and latest metrics, one column per run."""
    if len(run_ids) < 2:
        raise typer.BadParameter("give at least two run ids")
    api = client()
    found = [_run(api, r) for r in run_ids]
    if as_json:
        console.print_json(data=found)
        return
    width = short_id_width(r["run_id"] for r in found)
    _print_comparison(
        "Run comparison", [f"{escape(r['run_name'])}\n{r['run_id'][:width]}" for r in found], found
    )


def _print_comparison(title: str, headers: list[str], found: list[dict[str, Any]]) -> None:
    table = _comparison_table(title, headers)
    for key in sorted({k for run in found for k in run["params"]}):
        table.add_row(
            f"param {escape(key)}", *(escape(run["params"].get(key, "-")) for run in found)
        )
    table.add_section()
    for key in sorted({k for run in found for k in run["metrics"]}):
        table.add_row(
            f"metric {escape(key)}", *_marked_extremes(run["metrics"].get(key) for run in found)
        )
    console.print(table)


def _marked_extremes(points: Iterable[dict[str, Any] | None]) -> list[str]:
    """Latest values, the highest marked ▲ and the lowest ▼ when they differ (not "best":
    for a loss, lower is better)."""
    found = list(points)
    bounds = extremes([p["value"] for p in found if p and isinstance(p.get("value"), float)])
    return [metric_text(p) + _extreme_mark(p, bounds) for p in found]


def _extreme_mark(point: dict[str, Any] | None, bounds: tuple[float, float] | None) -> str:
    if not point or bounds is None:
        return ""
    highest, lowest = bounds
    value = point.get("value")
    return " ▲" if value == highest else " ▼" if value == lowest else ""


@contextmanager
def _next_step(hint: str) -> Iterator[None]:
    """A NotFound leaves with what to do about it."""
    try:
        yield
    except NotFound as exc:
        raise NotFound(f"{exc.message}; {hint}") from None


def _experiment_id(api: ShamalClient, id_or_name: str) -> str:
    with _next_step(_LIST_EXPERIMENTS):
        return api.experiment_id_of(id_or_name)


def _experiment(api: ShamalClient, id_or_name: str) -> dict[str, Any]:
    with _next_step(_LIST_EXPERIMENTS):
        return api.get_experiment(api.experiment_id_of(id_or_name))


def _run(api: ShamalClient, id_or_prefix: str) -> dict[str, Any]:
    """A run by its id or a unique prefix of it (an ambiguous one lists the candidates)."""
    with _next_step(_LIST_RUNS):
        return api.get_run(api.resolve_run_id(id_or_prefix))


def _iso(value: int | None) -> str | None:
    """A time in ms since the epoch as ISO 8601 (tables show it to the second, or its age)."""
    return None if value is None else datetime.fromtimestamp(value / 1000, UTC).isoformat()


def _ms(value: int | None) -> str:
    """A time in ms since the epoch to the second."""
    return fmt(_iso(value))


def short_id_width(run_ids: Iterable[str]) -> int:
    """How many characters of the ids to show: :data:`SHORT_ID`, or more where two of these
    ids start alike (as git lengthens short ids), so what is shown can be copied back."""
    ids = set(run_ids)
    width = SHORT_ID
    while width < 32 and len({i[:width] for i in ids}) < len(ids):
        width += 1
    return width


def _print_runs(rows: list[dict[str, Any]], title: str) -> None:
    metric_keys = sorted({k for r in rows for k in r["metrics"]})[:6]
    width = short_id_width(r["run_id"] for r in rows)
    table_rows = [
        {
            "run_id": r["run_id"][:width],
            "run_name": r["run_name"],
            "status": r["status"],
            "start_time": _iso(r["start_time"]),
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


def _schema_text(columns: object) -> str:
    """A signature part as ``name: type`` items (tensors as ``dtype[shape]``)."""
    if not isinstance(columns, list):
        return "-"
    items = []
    for column in columns:
        if not isinstance(column, dict):
            continue
        spec = column.get("tensor-spec")
        kind = (
            f"{spec.get('dtype')}{spec.get('shape')}"
            if isinstance(spec, dict)
            else str(column.get("type", "?"))
        )
        name = column.get("name")
        items.append(f"{name}: {kind}" if name else kind)
    return ", ".join(items) or "-"


def _version_facts(name: str, found: dict[str, Any]) -> dict[str, str]:
    """What `models show --version` says of a version, label by label (markup escaped)."""
    lineage = found["lineage"]
    signature = found["signature"] or {}
    run = lineage["run_id"] or "-"
    if lineage["run_id"] and not lineage.get("run_verified", True):
        run += " (unverified: not a run its creator could read)"
    elif lineage["run_id"] and not lineage["run_visible"]:
        run += " (deleted, or not visible to you)"
    return {
        "version": f"{escape(name)} v{found['version']}",
        "aliases": ", ".join(f"@{a}" for a in found["aliases"]) or "-",
        "stage / status": f"{found['stage']} / {found['status']}",
        "formats": ", ".join(found["formats"]) or "- (no MLmodel when it was registered)",
        "inputs": escape(_schema_text(signature.get("inputs"))),
        "outputs": escape(_schema_text(signature.get("outputs"))),
        "source": escape(found["source"]),
        "run": escape(f"{run}  {lineage['run_name'] or ''}".rstrip()),
        "experiment": lineage["experiment_id"] or "-",
        "logged model": lineage["logged_model_id"] or "-",
    }


def _show_version(name: str, version: int, as_json: bool) -> None:
    found = client().model_version_detail(name, version)
    if as_json:
        console.print_json(data=found)
        return
    for key, value in _version_facts(name, found).items():
        console.print(f"[bold]{key:>15}[/]  {value}")
    print_table(
        "Datasets its run read",
        ["name", "digest", "context", "source_type", "source"],
        [{**d, "context": d["context"] or "-"} for d in found["lineage"]["datasets"]],
    )


@models.command("show")
@handle_errors
def show_model(
    name: str,
    version: Annotated[
        int | None,
        typer.Option(
            "--version",
            "-v",
            min=1,
            help="Show this version: its formats, signature and lineage (run, datasets).",
        ),
    ] = None,
    as_json: bool = JsonOption,
) -> None:
    """Show a registered model: its versions, their sources and aliases (or one version)."""
    if version is not None:
        _show_version(name, version, as_json)
        return
    model = client().get_model(name)
    if as_json:
        console.print_json(data=model)
        return
    console.print(f"[bold]{escape(model['name'])}[/] {escape(model['description'])}")
    print_table(
        "Versions",
        ["version", "aliases", "stage", "status", "run_id", "created_at"],
        [
            {
                **v,
                "aliases": ", ".join(f"@{a}" for a in v["aliases"]),
                "run_id": (v["run_id"] or "-")[:SHORT_ID],
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


def _values_text(values: dict[str, Any]) -> str:
    """``name = value`` per line (None: no champion); markup escaped."""
    lines = [escape(f"{name} = {'-' if v is None else repr(v)}") for name, v in values.items()]
    return "\n".join(lines) or "-"


def _print_gate(report: dict[str, Any]) -> None:
    """The gate as a table (rule, values, result), then what it did to the alias."""
    table = Table(
        title=f"Gate: {escape(report['model'])} @{report['from_alias']} -> @{report['to_alias']}"
    )
    for column in ("rule", "values", "result"):
        table.add_column(column, overflow="fold")
    for result in report["results"]:
        verdict = "[green]passed[/]" if result["passed"] else "[red]failed[/]"
        table.add_row(
            escape(result["rule"]),
            _values_text(result["values"]),
            f"{verdict}\n{escape(result['explanation'])}",
        )
    console.print(table)
    candidate, champion = report["candidate_version"], report["champion_version"]
    was = f"v{champion}" if champion is not None else "no version"
    target = f"@{report['to_alias']}"
    if report["promoted"]:
        console.print(f"[green]promoted[/] v{candidate} to {target} (was {was})")
    elif report["passed"]:
        console.print(f"[green]passed[/] (dry run): v{candidate} would take {target} from {was}")
    else:
        failed = sum(1 for r in report["results"] if not r["passed"])
        console.print(
            f"[red]refused[/]: {failed} of {len(report['results'])} rules failed; "
            f"{target} stays at {was}"
        )


@models.command("promote")
@handle_errors
def promote_model(
    name: str,
    from_alias: Annotated[
        str, typer.Option("--from", metavar="ALIAS", help="The alias naming the candidate.")
    ],
    to_alias: Annotated[
        str, typer.Option("--to", metavar="ALIAS", help="The alias to move (the champion's).")
    ],
    require: Annotated[
        list[str],
        typer.Option(
            "--require",
            metavar="EXPR",
            help="A rule every promotion must pass, e.g. "
            '"metrics.f1 >= champion.metrics.f1 - 0.01"; repeat for more.',
        ),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Evaluate the rules; move nothing.")
    ] = False,
    junit: Annotated[
        Path | None,
        typer.Option(
            "--junit",
            metavar="PATH",
            help="Write the result as JUnit XML here, for CI.",
            dir_okay=False,
        ),
    ] = None,
    as_json: bool = JsonOption,
) -> None:
    """Move an alias to the version another names, only if every rule holds.

    Exits 0 when promoted (or, with --dry-run, when it would be), 1 when refused or on error.
    """
    report = client().promote(
        name, from_alias=from_alias, to_alias=to_alias, rules=require, dry_run=dry_run
    )
    if junit is not None:
        from shamal.pipelines import GateReport, junit_xml  # the report's XML, on demand

        junit.write_text(junit_xml(GateReport.from_json(report)), encoding="utf-8")
    if as_json:
        console.print_json(data=report)
    else:
        _print_gate(report)
    if not report["passed"]:
        raise typer.Exit(1)
