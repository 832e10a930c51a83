"""`shamal pipeline ...`: run DAGs of steps as jobs, and follow them.

`shamal pipeline run flow.py:retrain --param min_rows=500 --wait` snapshots the pipeline's
folder, registers its definition (a new version only when it or the code changed), starts a
run and, with `--wait`, follows it to its end. `show` draws a run's DAG with each step's
state (and `--plot` as an SVG/PNG), `logs` prints a step's job log, `cancel` stops a run,
`retry --from STEP` runs again reusing what came before STEP.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shamal.cli._common import JsonOption, client, console, escape, handle_errors, print_table
from shamal.errors import InvalidParameter

if TYPE_CHECKING:
    from shamal.client import ShamalClient
    from shamal.pipelines import PipelineSpec

app = typer.Typer(
    help="Pipelines: DAGs of steps run as jobs, cached, triggered by events and schedules.",
    no_args_is_help=True,
)

#: How each state looks in the terminal: (mark, style).
STATE_LOOK = {
    "pending": ("·", "dim"),
    "submitting": ("…", "cyan"),
    "running": ("▶", "cyan"),
    "succeeded": ("✓", "green"),
    "cached": ("✓", "blue"),
    "failed": ("✗", "red"),
    "upstream_failed": ("✗", "red"),
    "skipped": ("-", "yellow"),
    "cancelled": ("■", "magenta"),
}
TargetArgument = typer.Argument(
    help="FILE.py:PIPELINE (a @pipeline function; FILE.py alone when it holds one) or FILE.yaml"
)
RunArgument = typer.Argument(help="The run's id (as `shamal pipeline run` printed it).")


def parse_params(items: Sequence[str]) -> dict[str, Any]:
    """``--param k=v``: ``v`` as JSON when it parses (numbers, true, lists), else text."""
    params: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidParameter(f"--param {item[:60]!r}: write NAME=VALUE")
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value
    return params


def _register(api: ShamalClient, target: str, team: str | None) -> dict[str, Any]:
    from shamal.pipelines import load_pipeline

    spec, root = load_pipeline(target)
    body = spec.to_json()
    if team is not None:
        body["team"] = team
    with console.status(f"snapshotting {escape(str(root))} ..."):
        snapshot = api.upload_snapshot(root, body.get("team"))
    found: dict[str, Any] = api.register_pipeline(body, snapshot)
    return found


def _wait(api: ShamalClient, run_id: str, *, quiet: bool) -> dict[str, Any]:
    run = api.pipeline_run(run_id)
    delay = 0.05
    with console.status("", spinner="dots") as status:
        while run["state"] == "running":
            if not quiet:
                status.update(_progress_line(run))
            time.sleep(delay)  # polling the server, not synchronising
            delay = min(delay * 1.5, 1.0)
            run = api.pipeline_run(run_id)
    return run


def _progress_line(run: dict[str, Any]) -> str:
    counts: dict[str, int] = {}
    for step in run["steps"]:
        counts[step["state"]] = counts.get(step["state"], 0) + 1
    told = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "starting"
    return f"run {run['id'][:12]} of {escape(run['pipeline'])}: {told}"


def _wall_s(run: dict[str, Any]) -> float | None:
    if not run.get("finished_at"):
        return None
    start = datetime.fromisoformat(run["created_at"])
    return (datetime.fromisoformat(run["finished_at"]) - start).total_seconds()


def _summary(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "run_id": run["id"],
        "state": run["state"],
        "wall_s": _wall_s(run),
        "reason": run["reason"],
        # Each step that ran as one (a mapped step's items, not the step they make up).
        "steps": [
            {k: s[k] for k in ("key", "name", "state", "ready_at", "started_at", "finished_at")}
            for s in run["steps"]
            if s.get("fan_out") is None
        ],
        "mapped": {s["key"]: s["fan_out"] for s in run["steps"] if s.get("fan_out") is not None},
    }


@app.command("run")
@handle_errors
def run(
    target: Annotated[str, TargetArgument],
    param: Annotated[
        list[str] | None, typer.Option("--param", "-p", help="NAME=VALUE (repeatable).")
    ] = None,
    team: Annotated[str | None, typer.Option(help="The team that owns the pipeline.")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the run to its end.")] = False,
    as_json: bool = JsonOption,
) -> None:
    """Register the pipeline (with a snapshot of its folder) and start a run.

    With --wait the command exits 1 when the run does not succeed."""
    params = parse_params(param or [])
    api = client()
    registered = _register(api, target, team)
    name = registered["pipeline"]["name"]
    started = api.start_pipeline(name, params)
    if not as_json:
        version = registered["pipeline"]["version"]
        console.print(
            f"Started run [bold]{started['id']}[/] of {escape(name)} v{version}"
            + ("" if registered["created"] else " (definition and code unchanged)")
        )
    if not wait:
        if as_json:
            typer.echo(json.dumps(_summary(started)))  # one line, for scripts
        return
    done = _wait(api, started["id"], quiet=as_json)
    if as_json:
        typer.echo(json.dumps(_summary(done)))
    else:
        _print_run(api, done)
    if done["state"] != "succeeded":
        raise typer.Exit(1)


@app.command("register")
@handle_errors
def register(
    target: Annotated[str, TargetArgument],
    team: Annotated[str | None, typer.Option(help="The team that owns the pipeline.")] = None,
) -> None:
    """Register the pipeline's definition and code without running it (its triggers start
    runs from now on)."""
    found = _register(client(), target, team)
    info = found["pipeline"]
    what = "registered" if found["created"] else "unchanged at"
    console.print(f"{escape(info['name'])} {what} version {info['version']}")


@app.command("list")
@handle_errors
def list_pipelines(as_json: bool = JsonOption) -> None:
    """Pipelines you may see, with their newest version and triggers."""
    rows = [
        {
            "name": p["name"],
            "team": p["team"],
            "version": p["version"],
            "steps": len(p["spec"]["steps"]),
            "triggers": "; ".join(_trigger_text(t) for t in p["spec"]["triggers"]) or "-",
            "updated": p["updated_at"],
        }
        for p in client().pipelines()
    ]
    print_table(
        "Pipelines",
        ["name", "team", "version", "steps", "triggers", "updated"],
        rows,
        as_json=as_json,
    )


def _trigger_text(trigger: dict[str, Any]) -> str:
    if trigger.get("on"):
        return f"on {trigger['on']}"
    return f"cron {trigger['schedule']} ({trigger['timezone']})"


@app.command("runs")
@handle_errors
def runs(
    pipeline: Annotated[str | None, typer.Argument(help="Only this pipeline's runs.")] = None,
    state: Annotated[
        list[str] | None, typer.Option(help="running, succeeded, failed, cancelled")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    as_json: bool = JsonOption,
) -> None:
    """Runs, newest first."""
    rows = [
        {
            "id": r["id"],
            "pipeline": r["pipeline"],
            "version": r["version"],
            "state": r["state"],
            "trigger": r["trigger"],
            "started": r["created_at"],
            "wall_s": _wall_s(r),
        }
        for r in client().pipeline_runs(pipeline, state, limit)
    ]
    columns = ["id", "pipeline", "version", "state", "trigger", "started", "wall_s"]
    print_table("Pipeline runs", columns, rows, as_json=as_json)


@app.command("show")
@handle_errors
def show(
    run_id: Annotated[str, RunArgument],
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Also draw the DAG to this SVG/PNG file.")
    ] = None,
    as_json: bool = JsonOption,
) -> None:
    """A run's DAG with each step's state, why each step's cache missed, and its outputs."""
    from shamal.cli._plotfile import checked_plot_path

    target = checked_plot_path(plot)
    api = client()
    found = api.pipeline_run(run_id)
    if as_json:
        console.print_json(json.dumps(found))
    else:
        _print_run(api, found)
    if target is not None:
        from shamal.cli._pipeline_plot import draw_dag

        spec = _spec_of(api, found)
        console.print(f"DAG drawn to {escape(str(draw_dag(spec, found, target)))}")


def _spec_of(api: ShamalClient, run: dict[str, Any]) -> PipelineSpec:
    from shamal.pipelines import PipelineSpec

    return PipelineSpec.from_json(api.pipeline(run["pipeline"], run["version"])["spec"])


def _print_run(api: ShamalClient, run: dict[str, Any]) -> None:
    from rich.tree import Tree

    spec = _spec_of(api, run)
    steps = {s["key"]: s for s in run["steps"]}
    mark, style = STATE_LOOK.get(run["state"], ("?", "white"))
    wall = _wall_s(run)
    took = f" in {wall:.1f} s" if wall is not None else ""
    tree = Tree(
        f"[{style}]{mark}[/] run [bold]{run['id']}[/] of {escape(run['pipeline'])} "
        f"v{run['version']}: [{style}]{run['state']}[/]{took} [dim]({escape(run['trigger'])})[/]"
    )
    for step in spec.steps:
        tree.add(_step_line(step.name, step.upstream, steps, step.executor))
    console.print(tree)
    if run["reason"]:
        console.print(f"[red]{escape(run['reason'])}[/]")


def _step_line(
    name: str,
    upstream: Sequence[str],
    steps: dict[str, dict[str, Any]],
    executor: str | None = None,
) -> str:
    found = steps.get(name)
    state = found["state"] if found else "pending"
    mark, style = STATE_LOOK.get(state, ("?", "white"))
    items = [s for k, s in steps.items() if k.startswith(f"{name}[")]
    width = f" ×{len(items)}" if items else ""
    after = f" [dim]← {escape(', '.join(upstream))}[/]" if upstream else ""
    where = f" [dim](on {executor})[/]" if executor else ""
    line = f"[{style}]{mark} {escape(name)}{width}[/] [{style}]{state}[/]{where}{after}"
    if found and found.get("reason"):
        line += f"\n  [dim]{escape(found['reason'][:300])}[/]"
    if found and found.get("cache_note"):
        line += f"\n  [dim]cache: {escape(found['cache_note'][:300])}[/]"
    if found and found.get("output") is not None and not items:
        line += f"\n  [dim]output: {escape(json.dumps(found['output'])[:200])}[/]"
    return line


@app.command("logs")
@handle_errors
def logs(
    run_id: Annotated[str, RunArgument],
    step: Annotated[str, typer.Argument(help="The step (an item of a mapped step: name[3]).")],
) -> None:
    """The log of a step's job."""
    api = client()
    offset = 0
    while True:
        chunk = api.pipeline_step_log(run_id, step, offset)
        if chunk["text"]:
            console.out(chunk["text"], end="", highlight=False)
        if chunk["next_offset"] == offset:
            return
        offset = chunk["next_offset"]


@app.command("cancel")
@handle_errors
def cancel(run_id: Annotated[str, RunArgument]) -> None:
    """Stop a run: its running steps' jobs are cancelled, nothing new starts."""
    found = client().cancel_pipeline_run(run_id)
    console.print(f"run {found['id']} {found['state']}")


@app.command("retry")
@handle_errors
def retry(
    run_id: Annotated[str, RunArgument],
    from_step: Annotated[
        str | None,
        typer.Option("--from", help="Run this step and all after it again (default: what failed)."),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the new run to its end.")] = False,
) -> None:
    """A new run of the same version and parameters, reusing every finished step before
    --from STEP (default: reusing every step that succeeded)."""
    api = client()
    found = api.retry_pipeline_run(run_id, from_step)
    console.print(f"Started run [bold]{found['id']}[/] (a retry of {run_id})")
    if wait:
        done = _wait(api, found["id"], quiet=False)
        _print_run(api, done)
        if done["state"] != "succeeded":
            raise typer.Exit(1)
