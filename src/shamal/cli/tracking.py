"""`shamal experiments`, `shamal runs` and `shamal models`: look at tracked work from the terminal.

Run ids are shown by their first :data:`SHORT_ID` characters; every command that takes a run id
takes that short form back (any unique prefix of 8 or more), resolved by the client.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
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
from shamal.client import ShamalClient
from shamal.errors import InvalidParameter, NotFound

#: Characters of a run id the tables show (the quickstart prints as many).
SHORT_ID: Final = 12
#: Metrics whose history `runs show` reads for its curves; panels and lines of `runs plot`.
MAX_CURVES: Final = 20
CURVE_WIDTH: Final = 16
MAX_PANELS: Final = 8
MAX_LINES: Final = 20
#: The order run states are listed in; others follow by name.
_STATUS_ORDER: Final = ("RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED")
_RUN_ID_HELP: Final = "A run id, or its first 8 or more characters (as tables show them)."
_LIST_EXPERIMENTS: Final = "`shamal experiments list` shows the experiments you can see"
_LIST_RUNS: Final = "`shamal runs list EXPERIMENT` shows the runs of an experiment and their ids"

experiments = typer.Typer(help="Experiments: list, show and compare.", no_args_is_help=True)
runs = typer.Typer(
    help="Runs: list, show with metric curves, compare side by side, plot.", no_args_is_help=True
)
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


def summarize_experiment(
    exp: dict[str, Any],
    runs_of: Iterable[dict[str, Any]],
    *,
    metric: str | None,
    maximize: bool | None,
) -> dict[str, Any]:
    """What `experiments compare` shows of one experiment, from its API record and runs.

    Returns:
        ``experiment_id``, ``name``, ``lifecycle_stage``; ``runs`` (how many) and
        ``runs_by_status``; ``last_activity`` (ms: the latest of the experiment's update time
        and its runs' start, end and latest-metric times); ``goal`` ("max", "min", or "by
        name" when ``maximize`` is None: see :func:`goal_of`); ``best``: per metric (only
        ``metric`` when given), the best finite latest value with its ``step``, ``run_id``,
        ``run_name`` and ``goal`` (the newest run wins a tie); ``metric_keys``: every metric
        any run logged.
    """
    by_status: Counter[str] = Counter()
    times = [exp["last_update_time"]]
    best: dict[str, dict[str, Any]] = {}
    keys: set[str] = set()
    for run in runs_of:
        by_status[run["status"]] += 1
        times.extend(t for t in (run["start_time"], run["end_time"]) if t is not None)
        for key, point in run["metrics"].items():
            keys.add(key)
            times.append(point["timestamp"])
            value = point.get("value")
            if value is None or (metric is not None and key != metric):
                continue
            held = best.get(key)
            highest = goal_of(key, maximize) == "max"
            if held is None or (value > held["value"] if highest else value < held["value"]):
                best[key] = {
                    "value": value,
                    "step": point["step"],
                    "run_id": run["run_id"],
                    "run_name": run["run_name"],
                    "goal": "max" if highest else "min",
                }
    return {
        "experiment_id": exp["experiment_id"],
        "name": exp["name"],
        "lifecycle_stage": exp["lifecycle_stage"],
        "runs": sum(by_status.values()),
        "runs_by_status": dict(sorted(by_status.items(), key=lambda kv: _status_rank(kv[0]))),
        "last_activity": max(times),
        "goal": "by name" if maximize is None else "max" if maximize else "min",
        "best": dict(sorted(best.items())),
        "metric_keys": sorted(keys),
    }


#: Words of a metric name that make its best value the lowest, unless --max/--min says
#: otherwise; "loss" and "error" count inside words too (trainloss, mean_abs_error).
_LOWER_IS_BETTER: Final = frozenset(
    [
        "loss",
        "err",
        "error",
        "errors",
        "mse",
        "mae",
        "mape",
        "rmse",
        "rmsle",
        "nll",
        "perplexity",
        "ppl",
        "latency",
        "time",
        "duration",
        "wer",
        "cer",
        "regret",
        "cost",
    ]
)
_WORDS: Final = re.compile(r"[a-z]+")


def goal_of(key: str, maximize: bool | None) -> str:
    """``"max"`` or ``"min"``: what --max/--min says, or else what the name suggests
    (``val_loss``, ``test_rmse``, ``latency_ms`` are best low; ``accuracy``, ``f1`` high)."""
    if maximize is not None:
        return "max" if maximize else "min"
    name = key.lower()
    lower = (
        "loss" in name or "error" in name or not _LOWER_IS_BETTER.isdisjoint(_WORDS.findall(name))
    )
    return "min" if lower else "max"


def _status_rank(status: str) -> tuple[int, str]:
    known = status in _STATUS_ORDER
    return (_STATUS_ORDER.index(status) if known else len(_STATUS_ORDER), status)


def _print_experiment_comparison(summaries: list[dict[str, Any]], *, maximize: bool | None) -> None:
    table = Table(title="Experiment comparison", title_justify="left", header_style="bold")
    table.add_column("")
    for s in summaries:
        table.add_column(f"{escape(s['name'])}\nid {s['experiment_id']}", justify="right")
    table.add_row("runs", *(str(s["runs"]) for s in summaries))
    statuses = sorted({k for s in summaries for k in s["runs_by_status"]}, key=_status_rank)
    for status in statuses:
        table.add_row(
            f"  {status.lower()}", *(str(s["runs_by_status"].get(status, 0)) for s in summaries)
        )
    table.add_row("last activity", *(_ms(s["last_activity"]) for s in summaries))
    width = short_id_width(b["run_id"] for s in summaries for b in s["best"].values())
    for key in sorted({k for s in summaries for k in s["best"]}):
        table.add_section()
        found = [s["best"].get(key) for s in summaries]
        values = {b["value"] for b in found if b}
        goal = goal_of(key, maximize)
        mark = "▲" if goal == "max" else "▼"
        winner = (max if goal == "max" else min)(values) if len(values) > 1 else None
        table.add_row(
            f"{escape(key)} ({goal})",
            *(
                "-"
                if b is None
                else f"{metric_text(b)}{' ' + mark if b['value'] == winner else ''}"
                for b in found
            ),
        )
        table.add_row(
            "  best run",
            *(
                "-" if b is None else f"{escape(b['run_name'])} {b['run_id'][:width]}"
                for b in found
            ),
        )
    console.print(table)


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
    rows = []
    for key in keys:
        latest = run["metrics"][key]
        row = {"key": key, "latest": metric_text(latest), "step": latest["step"]}
        if curves:
            found = histories.get((run["run_id"], key))
            summary = summarize(found, CURVE_WIDTH) if found is not None else None
            row |= {
                "min": metric_text({"value": summary.low}) if summary else "-",
                "max": metric_text({"value": summary.high}) if summary else "-",
                "points": f"{summary.points:,}" if summary else "-",
                "curve": summary.curve if summary else "",
            }
        rows.append(row)
    _print_metrics(rows, curves)
    if curves and len(keys) > MAX_CURVES:
        console.print(
            f"[dim]curves of the first {MAX_CURVES} of {len(keys)} metrics; "
            f"`shamal runs plot {run['run_id'][:SHORT_ID]} --metric KEY` draws any[/]"
        )


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
    try:
        path = plot_path(out, "--out")
    except ValueError as exc:
        raise InvalidParameter(str(exc)) from None
    if x not in ("step", "time"):
        raise InvalidParameter(f"--x takes step or time, not {x!r}")
    if len(run_ids) > MAX_LINES:
        raise InvalidParameter(f"give at most {MAX_LINES} runs; a chart of more cannot be read")
    api = client()
    found = list({r["run_id"]: r for r in (_run(api, r) for r in run_ids)}.values())
    keys = (
        list(dict.fromkeys(metric or []))
        or sorted({k for r in found for k in r["metrics"]})[:MAX_PANELS]
    )
    if not keys:
        raise InvalidParameter("these runs have no metrics to draw")
    if len(keys) > MAX_PANELS:
        raise InvalidParameter(f"give at most {MAX_PANELS} metrics; one chart holds that many")
    wanted = [(r["run_id"], k) for k in keys for r in found if k in r["metrics"]]
    missing = [k for k in keys if not any(k in r["metrics"] for r in found)]
    if missing:
        raise InvalidParameter(
            f"no run given has the metric {missing[0]!r}; `shamal runs show RUN` lists them"
        )
    histories = _histories(api, wanted)
    width = short_id_width(r["run_id"] for r in found)
    names = {r["run_id"]: f"{r['run_name']} ({r['run_id'][:width]})" for r in found}
    curves = [Curve(k, names[run_id], histories[(run_id, k)]) for run_id, k in wanted]
    written = plot_curves(curves, path, x=x, title=", ".join(keys))
    drawn = len({run_id for run_id, _ in wanted})
    console.print(f"wrote {escape(str(written))}: {escape(', '.join(keys))} of {drawn} run(s)")


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
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("")
    for header in headers:
        table.add_column(header, justify="right")
    for key in sorted({k for run in found for k in run["params"]}):
        table.add_row(
            f"param {escape(key)}", *(escape(run["params"].get(key, "-")) for run in found)
        )
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
        table.add_row(f"metric {escape(key)}", *cells)
    console.print(table)


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


def _ms(value: int | None) -> str:
    if value is None:
        return "-"
    return fmt(datetime.fromtimestamp(value / 1000, UTC).isoformat())


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


def _show_version(name: str, version: int, as_json: bool) -> None:
    found = client().model_version_detail(name, version)
    if as_json:
        console.print_json(data=found)
        return
    lineage = found["lineage"]
    signature = found["signature"] or {}
    run = lineage["run_id"] or "-"
    if lineage["run_id"] and not lineage["run_visible"]:
        run += " (deleted, or not visible to you)"
    facts = {
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
    for key, value in facts.items():
        console.print(f"[bold]{key:>15}[/]  {value}")
    print_table(
        "Datasets its run read",
        ["name", "digest", "context", "source_type", "source"],
        [{**d, "context": d["context"] or "-"} for d in lineage["datasets"]],
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
