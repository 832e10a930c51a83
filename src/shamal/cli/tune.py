"""`shamal tune`: hyperparameter search, every trial a scheduled job.

Registered in the root app as a command: ``app.command("tune", ...)(tune.tune)``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from shamal.cli._common import client, console, err_console, escape, handle_errors, list_table
from shamal.cli._quantities import parse_duration_s, parse_memory_mib, require_finite
from shamal.errors import InvalidParameter
from shamal.tune import TuneDriver, TuneOptions, register_best

CONTEXT = {"allow_interspersed_args": False}


def _params(params: dict[str, Any]) -> str:
    return ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()
    )


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _trial_table(title: str, trials: list[dict[str, Any]]) -> Table:
    rows = [
        {
            "trial": t["number"],
            "state": t["state"],
            "value": _value(t["value"]),
            "params": _params(t["params"]),
            "job": (t["job_id"] or "-")[:12],
        }
        for t in trials
    ]
    return list_table(title, ["trial", "state", "value", "params", "job"], rows, rank=["value"])


def _print_trial(trial: dict[str, Any]) -> None:
    console.print(_trial_table(f"trial {trial['number']} ended", [trial]))


def _explain_no_best(finished: list[dict[str, Any]]) -> None:
    """What to look at when no trial completed: how a trial completes, and a log to read."""
    states = ", ".join(
        f"{n} {state}" for state, n in sorted(Counter(t["state"] for t in finished).items())
    )
    if states:
        err_console.print(f"[yellow]trials:[/] {escape(states)}")
    err_console.print(
        "[yellow]hint:[/] a trial completes when its command calls "
        "shamal.tune.current_trial().complete(value) (or reports and is pruned); "
        "a trial whose command exits without that fails"
    )
    job_id = next((t["job_id"] for t in reversed(finished) if t.get("job_id")), None)
    if job_id:
        err_console.print(f"[yellow]hint:[/] read a trial's output: shamal job logs {job_id[:12]}")


def _env(items: list[str] | None) -> dict[str, str]:
    variables = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise InvalidParameter(f"--env takes KEY=VALUE, not {item!r}")
        variables[key] = value
    return variables


@handle_errors
def tune(
    command: Annotated[list[str], typer.Argument(help="The trial's command, after `--`.")],
    study: Annotated[str, typer.Option("--study", help="Study name (created or resumed).")],
    trials: Annotated[int, typer.Option("--trials", min=1, help="Trials to finish.")] = 10,
    parallel: Annotated[int, typer.Option("--parallel", min=1, help="Jobs at once.")] = 1,
    team: Annotated[str | None, typer.Option("--team", help="Team that owns it.")] = None,
    direction: Annotated[str, typer.Option("--direction", help="minimize|maximize")] = "minimize",
    sampler: Annotated[str, typer.Option("--sampler", help="tpe, random, cmaes, ...")] = "tpe",
    pruner: Annotated[
        str, typer.Option("--pruner", help="median, asha, hyperband or none")
    ] = "median",
    seed: Annotated[int | None, typer.Option("--seed", help="Sampler seed.")] = None,
    register_model: Annotated[
        str | None,
        typer.Option("--register-best", help="Register the best trial's model under this name."),
    ] = None,
    cpus: Annotated[float, typer.Option("--cpus", help="CPUs per trial.")] = 1.0,
    memory: Annotated[str, typer.Option("--memory", help="Memory per trial.")] = "2GiB",
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs per trial.")] = 0,
    time_limit: Annotated[str | None, typer.Option("--time-limit", help="Per trial.")] = None,
    priority: Annotated[str | None, typer.Option("--priority")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE.")] = None,
    workdir: Annotated[Path, typer.Option("--workdir", help="Folder to snapshot.")] = Path("."),
    poll: Annotated[float, typer.Option("--poll", min=0.05, help="Seconds between checks.")] = 1.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the study as JSON.")] = False,
) -> None:
    """Search hyperparameters: run COMMAND as N trial jobs, K at a time.

    The command reads its parameters with shamal.tune.current_trial().suggest_*, reports
    with trial.report(step, value) and stops when trial.should_prune().
    Ctrl-C cancels the running trial jobs.

    Example: shamal tune --study lr --trials 20 --parallel 4 --pruner asha -- python train.py
    """
    require_finite({"--cpus": cpus, "--poll": poll})
    options = TuneOptions(
        study=study, command=command, trials=trials, parallel=parallel, team=team,
        direction=direction, sampler=sampler, pruner=pruner, seed=seed, workdir=workdir,
        job={"cpus": cpus, "memory_mib": parse_memory_mib(memory, "--memory"), "gpus": gpus,
             "time_limit_s": parse_duration_s(time_limit, "--time-limit") if time_limit else None,
             "priority": priority},
        env=_env(env), poll_s=poll,
    )  # fmt: skip
    api = client()
    driver = TuneDriver(api, options, on_trial_end=(lambda t: None) if as_json else _print_trial)
    try:
        result = driver.run()
    except KeyboardInterrupt:
        driver.cancel_running()
        err_console.print(f"[yellow]interrupted:[/] cancelled {len(driver.cancelled)} trial job(s)")
        raise typer.Exit(130) from None
    registered = register_best(api, result, register_model) if register_model else None
    if as_json:
        console.print_json(json.dumps({**result, "registered": registered}, default=str))
        return
    best = result["best"]
    if best is None:
        console.print("[yellow]no trial completed[/]")
        _explain_no_best(driver.finished)
    else:
        console.print(_trial_table(f"best of study {study}", [best]))
    if registered:
        console.print(f"registered {register_model} version {registered.get('version')}")
