"""`shamal monitor ...`: watch a deployment's traffic for drift, on a schedule.

`shamal monitor create fraud-api --schedule 1h --on-drift retrain:retrain-fraud` attaches a
monitor that compares each hour's sampled requests with the reference profile of the
deployment's primary model version (built first with `shamal monitor reference build
fraud/3 --dataset transactions/7 --label is_fraud`). `show` prints each column's latest
statistic and verdict with a sparkline of its recent values (`--plot FILE.png` draws them);
`run` runs it now; `pause`, `resume` and `delete` do what they say.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from shamal.cli._common import JsonOption, client, console, escape, handle_errors, print_table
from shamal.cli._curves import sparkline
from shamal.cli._quantities import parse_duration_s
from shamal.errors import InvalidParameter

app = typer.Typer(
    help="Monitors: drift of a deployment's traffic against its model's reference profile.",
    no_args_is_help=True,
)
reference_app = typer.Typer(
    help="Reference profiles: sketches of a model version's training data and predictions.",
    no_args_is_help=True,
)
app.add_typer(reference_app, name="reference")

NameArgument = typer.Argument(help="The monitor's name.")


def parse_model_version(text: str, option: str = "MODEL/VERSION") -> tuple[str, int]:
    """``fraud/3`` -> ("fraud", 3)."""
    model, sep, version = text.rpartition("/")
    if not sep or not model or not version.isdigit() or int(version) < 1:
        raise InvalidParameter(f"{option} is MODEL/VERSION such as fraud/3, not {text[:80]!r}")
    return model, int(version)


def parse_tests(items: Sequence[str]) -> dict[str, str]:
    """``--test amount=ks`` (repeated) -> {column: test}."""
    tests: dict[str, str] = {}
    for item in items:
        column, sep, test = item.rpartition("=")
        if not sep or not column or not test:
            raise InvalidParameter(f"--test takes COLUMN=TEST such as amount=ks, not {item[:80]!r}")
        tests[column] = test
    return tests


def monitor_body(
    deployment: str,
    schedule: str,
    *,
    name: str | None = None,
    reference: str | None = None,
    columns: Sequence[str] = (),
    tests: Sequence[str] = (),
    threshold: float | None = None,
    correction: str = "none",
    drift_share: float = 0.5,
    window: int = 1000,
    on_drift: str = "none",
    alert: str | None = None,
    params: Sequence[str] = (),
) -> dict[str, Any]:
    """The body of ``POST /api/v1/monitors`` from the command's options."""
    body: dict[str, Any] = {
        "deployment": deployment,
        "schedule_s": round(parse_duration_s(schedule, "--schedule")),
        "columns": list(columns),
        "tests": parse_tests(tests),
        "correction": correction,
        "drift_share": drift_share,
        "window": window,
        "on_drift": on_drift,
    }
    if name is not None:
        body["name"] = name
    if reference is not None:
        model, version = parse_model_version(reference, "--reference")
        body["reference"] = {"model": model, "version": version}
    if threshold is not None:
        body["threshold"] = threshold
    if alert is not None:
        body["alert_url"] = alert
    if params:
        from shamal.cli.pipeline import parse_params

        body["retrain_params"] = parse_params(params)
    return body


def _print_monitor(m: dict[str, Any]) -> None:
    state = "[yellow]paused[/]" if m["paused"] else "[green]active[/]"
    ref = m["reference"]
    follows = " (follows the primary)" if ref.get("follows_primary") else ""
    console.print(
        f"[bold]{escape(m['name'])}[/] on deployment {escape(m['deployment'])} "
        f"(team {escape(m['team'] or '-')}) {state}: every {m['schedule_s']} s, reference "
        f"{escape(ref['model'])}/{ref['version']}{follows}, on drift {escape(m['on_drift'])}, "
        f"correction {m['correction']}, drift share {m['drift_share']:g}, window {m['window']}"
    )
    console.print(f"next run {m['next_run_at']}; last run {m['last_run_at'] or '-'}")
    if m.get("last_error"):
        console.print(f"[red]last error:[/] {escape(m['last_error'])}")


@app.command("create")
@handle_errors
def create(
    deployment: Annotated[str, typer.Argument(help="The deployment to watch.")],
    schedule: Annotated[str, typer.Option("--schedule", help="How often: 15m, 1h, 1d.")] = "1h",
    name: Annotated[str | None, typer.Option(help="Default: DEPLOYMENT-drift.")] = None,
    reference: Annotated[
        str | None,
        typer.Option(help="MODEL/VERSION whose profile is the reference (default: the primary)."),
    ] = None,
    columns: Annotated[
        list[str] | None, typer.Option("--column", "-c", help="A column to compare (repeat).")
    ] = None,
    tests: Annotated[
        list[str] | None, typer.Option("--test", help="COLUMN=TEST: ks, chisquare, z, psi, ...")
    ] = None,
    threshold: Annotated[float | None, typer.Option(help="One threshold for every column.")] = None,
    correction: Annotated[str, typer.Option(help="none, bonferroni, holm or bh.")] = "none",
    drift_share: Annotated[float, typer.Option(help="Share of drifted columns = drift.")] = 0.5,
    window: Annotated[int, typer.Option(help="At most this many rows per run.")] = 1000,
    on_drift: Annotated[str, typer.Option(help="none, rollback or retrain:PIPELINE.")] = "none",
    alert: Annotated[str | None, typer.Option(help="A webhook URL told of each drift.")] = None,
    params: Annotated[
        list[str] | None, typer.Option("--param", help="NAME=VALUE for the retraining run.")
    ] = None,
    as_json: bool = JsonOption,
) -> None:
    """Attach a monitor to a deployment."""
    body = monitor_body(
        deployment,
        schedule,
        name=name,
        reference=reference,
        columns=columns or (),
        tests=tests or (),
        threshold=threshold,
        correction=correction,
        drift_share=drift_share,
        window=window,
        on_drift=on_drift,
        alert=alert,
        params=params or (),
    )
    found = client().create_monitor(body)
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    _print_monitor(found)


@app.command("list")
@handle_errors
def list_monitors(
    deployment: Annotated[str | None, typer.Option(help="Only this deployment's.")] = None,
    as_json: bool = JsonOption,
) -> None:
    """The monitors you may see."""
    rows = [
        {
            "name": m["name"],
            "deployment": m["deployment"],
            "state": "paused" if m["paused"] else "active",
            "schedule_s": m["schedule_s"],
            "on_drift": m["on_drift"],
            "next_run_at": m["next_run_at"],
            "last_error": m["last_error"],
        }
        for m in client().monitors(deployment)
    ]
    print_table(
        "Monitors",
        ["name", "deployment", "state", "schedule_s", "on_drift", "next_run_at", "last_error"],
        rows,
        as_json=as_json,
        right=["schedule_s"],
    )


def column_rows(points: Sequence[dict[str, Any]], width: int = 24) -> list[dict[str, Any]]:
    """One row per column: its latest point and a sparkline of its statistic over time."""
    by_column: dict[str, list[dict[str, Any]]] = {}
    for point in points:
        by_column.setdefault(point["column"], []).append(point)
    rows = []
    for column, series in sorted(by_column.items()):
        last = series[-1]
        metric = last["test"] == "performance"  # a score on labels: no threshold, no verdict
        rows.append(
            {
                "column": column,
                "test": last["test"],
                "statistic": "-" if last["statistic"] is None else f"{last['statistic']:.4g}",
                "p_value": "-" if last["p_value"] is None else f"{last['p_value']:.3g}",
                "threshold": "-" if metric else f"{last['threshold']:.3g}",
                "verdict": "-" if metric else ("DRIFT" if last["drifted"] else "ok"),
                "recent": sparkline([p["statistic"] for p in series], width),
            }
        )
    return rows


def _drawable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)


def _draw_column(axis: Any, column: str, series: Sequence[dict[str, Any]]) -> None:
    """One column's panel: its statistic, its threshold dashed, drifted runs in red."""
    xs = list(range(len(series)))
    ys = [math.nan if p["statistic"] is None else p["statistic"] for p in series]
    axis.plot(xs, ys, linewidth=1.2, marker="o", markersize=3)
    axis.plot(xs, [p["threshold"] for p in series], linestyle="--", linewidth=0.8)
    drifted = [(x, y) for x, y, p in zip(xs, ys, series, strict=True) if p["drifted"]]
    if drifted:
        axis.scatter([x for x, _ in drifted], [y for _, y in drifted], color="red", zorder=3)
    axis.set_ylabel(f"{_drawable(column)}\n({series[-1]['test']})", parse_math=False)
    axis.grid(alpha=0.3)


def plot_series(points: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Each column's statistic over time as a line chart (its threshold dashed)."""
    from shamal.cli._plotfile import pyplot, save_figure

    plt = pyplot()
    columns = sorted({p["column"] for p in points})
    panels = max(len(columns), 1)
    fig, axes = plt.subplots(
        panels, 1, sharex=True, squeeze=False, figsize=(10, 2.2 * panels + 0.8)
    )
    for column, axis in zip(columns, axes[:, 0], strict=False):
        _draw_column(axis, column, [p for p in points if p["column"] == column])
    axes[-1, 0].set_xlabel("run (oldest first)")
    fig.suptitle(_drawable(title), parse_math=False)
    fig.tight_layout()
    return save_figure(fig, path)


@app.command("show")
@handle_errors
def show(
    name: Annotated[str, NameArgument],
    last: Annotated[int, typer.Option(help="How many recent runs the sparklines cover.")] = 30,
    plot: Annotated[str | None, typer.Option("--plot", help="Draw the series to a PNG.")] = None,
    as_json: bool = JsonOption,
) -> None:
    """A monitor, each column's latest verdict and a sparkline of its recent statistic."""
    from shamal.cli._plotfile import checked_plot_path

    target = checked_plot_path(plot)
    api = client()
    found = api.monitor(name)
    points = api.monitor_series(name, limit=last)
    results = api.monitor_results(name, limit=1)
    if as_json:
        typer.echo(json.dumps({"monitor": found, "points": points, "latest": results}, indent=2))
    else:
        _print_monitor(found)
        _print_latest(results[0] if results else None)
        print_table(
            "Columns",
            ["column", "test", "statistic", "p_value", "threshold", "verdict", "recent"],
            column_rows(points),
            right=["statistic", "p_value", "threshold"],
        )
    if target is not None:
        written = plot_series(points, target, f"monitor {name}")
        console.print(f"drew {len(points)} points to {escape(str(written))}")


def _print_latest(result: dict[str, Any] | None) -> None:
    if result is None:
        console.print("no results yet")
        return
    verdict = "[bold red]DRIFT[/]" if result["drifted"] else "[green]no drift[/]"
    console.print(
        f"latest run {result['at']}: {verdict}, {result['share']:.0%} of columns drifted, "
        f"{result['rows']} rows from {result['samples']} samples"
    )
    for issue in result["report"].get("quality", [])[:20]:
        console.print(
            f"[yellow]quality:[/] {escape(str(issue.get('column')))}: "
            f"{escape(str(issue.get('kind')))} ({escape(str(issue.get('detail', '')))})"
        )
    scored = result["report"].get("performance")
    if scored and scored.get("rows"):
        figures = ", ".join(
            f"{k} {v:.4g}" for k, v in sorted(scored["metrics"].items()) if v is not None
        )
        console.print(
            f"performance on {scored['rows']} labelled rows ({escape(str(scored.get('task')))}): "
            f"{escape(figures)}"
        )
    for action in result.get("actions", []):
        console.print(f"action: {escape(describe_action(action))}")


def describe_action(action: dict[str, Any]) -> str:
    """One drift policy action in words: ``retrain retrain-wine: started run 3f2a...``."""
    what = str(action.get("action", "?"))
    if action.get("pipeline"):
        what += f" {action['pipeline']}"
    status = str(action.get("status", ""))
    if action.get("run"):
        status += f" run {action['run']}"
    why = action.get("reason") or action.get("error")
    return f"{what}: {status}" + (f" ({why})" if why else "")


@app.command("run")
@handle_errors
def run(name: Annotated[str, NameArgument], as_json: bool = JsonOption) -> None:
    """Run a monitor now."""
    outcome = client().run_monitor(name)
    if as_json:
        typer.echo(json.dumps(outcome, indent=2))
        return
    result = outcome["result"]
    if result is None:
        console.print(f"{escape(name)}: {escape(outcome['reason'])}")
        return
    _print_latest(result)


@app.command("pause")
@handle_errors
def pause(name: Annotated[str, NameArgument]) -> None:
    """Stop a monitor's scheduled runs."""
    client().pause_monitor(name)
    console.print(f"monitor {escape(name)} paused")


@app.command("resume")
@handle_errors
def resume(name: Annotated[str, NameArgument]) -> None:
    """Run a monitor on schedule again."""
    found = client().resume_monitor(name)
    console.print(f"monitor {escape(name)} resumed; next run {found['next_run_at']}")


@app.command("delete")
@handle_errors
def delete(name: Annotated[str, NameArgument]) -> None:
    """Delete a monitor and its results."""
    client().delete_monitor(name)
    console.print(f"monitor {escape(name)} deleted")


@reference_app.command("build")
@handle_errors
def build_reference(
    model_version: Annotated[str, typer.Argument(help="MODEL/VERSION, e.g. fraud/3.")],
    dataset: Annotated[str, typer.Option(help="The training dataset version: NAME/3.")],
    label: Annotated[str | None, typer.Option(help="The label column.")] = None,
    columns: Annotated[
        list[str] | None, typer.Option("--column", "-c", help="Only these columns (repeat).")
    ] = None,
    as_json: bool = JsonOption,
) -> None:
    """Profile a dataset version as a model version's reference (on the server, streamed)."""
    model, version = parse_model_version(model_version)
    found = client().build_reference(model, version, dataset, label=label, columns=columns)
    _print_reference(found, as_json)


@reference_app.command("show")
@handle_errors
def show_reference(
    model_version: Annotated[str, typer.Argument(help="MODEL/VERSION, e.g. fraud/3.")],
    as_json: bool = JsonOption,
) -> None:
    """A model version's reference profile."""
    model, version = parse_model_version(model_version)
    _print_reference(client().reference(model, version), as_json)


def _print_reference(found: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    source = f"{found['dataset']}/{found['dataset_version']}" if found["dataset"] else "uploaded"
    console.print(
        f"reference of [bold]{escape(found['model'])}/{found['version']}[/]: "
        f"{found['rows']} rows of {escape(source)}"
    )
    rows = []
    for name, column in found["columns"].items():
        sketch = column["sketch"]
        rows.append(
            {
                "column": name,
                "role": column["role"],
                "kind": sketch.get("kind"),
                "count": sketch.get("count"),
                "nulls": sketch.get("nulls"),
                "mean": sketch.get("mean"),
            }
        )
    print_table("Columns", ["column", "role", "kind", "count", "nulls", "mean"], rows)
