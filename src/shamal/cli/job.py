"""`shamal job` and `shamal cost`: submit work to the scheduler, follow it, and see what it cost."""

from __future__ import annotations

import csv
import re
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from shamal.cli._common import JsonOption, client, console, err_console, fmt, handle_errors
from shamal.errors import InvalidParameter

app = typer.Typer(
    help="Jobs: submit a command with its code to the scheduler, list, show, follow logs, "
    "cancel and (admins) preempt.",
    no_args_is_help=True,
)
cost = typer.Typer(help="Cost: GPU-, CPU- and memory-seconds per team, pool, user or job.")

_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_memory_mib(text: str) -> int:
    """'4GiB', '512MiB', '2G', '1536' (MiB) -> MiB."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGtT]?)(i?[bB])?\s*", text)
    if not match:
        raise InvalidParameter(f"--memory takes sizes such as 4GiB or 512MiB, not {text!r}")
    number, unit = float(match.group(1)), match.group(2).lower()
    if not unit and not match.group(3):
        return max(round(number), 1)
    return max(round(number * _UNITS[unit] / 2**20), 1)


def parse_duration_s(text: str) -> float:
    """'90s', '45m', '2h', '1d', '1h30m' or plain seconds -> seconds."""
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text.strip()):
        return float(text)
    parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)([smhdw])", text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise InvalidParameter(f"durations look like 90s, 45m, 2h, 1h30m or 7d, not {text!r}")
    return sum(float(n) * _DURATION[u] for n, u in parts)


def _job_row(job: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": job["id"][:12],
        "name": job["name"][:40],
        "team": job["team"] or "-",
        "state": job["state"],
        "priority": job["priority"],
        "resources": job["resources"],
        "attempt": job["attempt"],
        "submitted": job["submitted_at"],
    }


def _print_jobs(jobs: list[dict[str, Any]], title: str) -> None:
    table = Table(title=title, title_justify="left", header_style="bold")
    columns = ["id", "name", "team", "state", "priority", "resources", "attempt", "submitted"]
    for column in columns:
        table.add_column(column)
    for job in jobs:
        row = _job_row(job)
        table.add_row(*(fmt(row[c]) for c in columns))
    if not jobs:
        console.print(f"[dim]{title}: none[/]")
        return
    console.print(table)


@app.command(
    "submit",
    context_settings={"allow_interspersed_args": False},
)
@handle_errors
def submit(
    command: Annotated[list[str], typer.Argument(help="The command, after `--`.")],
    team: Annotated[str | None, typer.Option("--team", help="Team that runs (and pays).")] = None,
    priority: Annotated[
        str | None, typer.Option("--priority", help="low, normal, high, critical ...")
    ] = None,
    cpus: Annotated[float, typer.Option("--cpus", help="CPUs per worker.")] = 1.0,
    memory: Annotated[str, typer.Option("--memory", help="Memory per worker, e.g. 4GiB.")] = "2GiB",
    gpus: Annotated[int, typer.Option("--gpus", help="Whole GPUs per worker.")] = 0,
    gpu_fraction: Annotated[
        float, typer.Option("--gpu-fraction", help="A share of one GPU, e.g. 0.25.")
    ] = 0.0,
    mig: Annotated[str | None, typer.Option("--mig", help="A MIG slice, e.g. 1g.10gb.")] = None,
    workers: Annotated[int, typer.Option("--workers", help="Gang size (all or nothing).")] = 1,
    time_limit: Annotated[
        str | None, typer.Option("--time-limit", help="e.g. 2h; the job is stopped after it.")
    ] = None,
    retries: Annotated[
        int | None, typer.Option("--retries", help="Retries when the job fails or is lost.")
    ] = None,
    pool: Annotated[str | None, typer.Option("--pool", help="Run in this pool only.")] = None,
    name: Annotated[str, typer.Option("--name", help="A name to find it by.")] = "",
    env: Annotated[
        list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE, repeatable.")
    ] = None,
    workdir: Annotated[
        Path, typer.Option("--workdir", help="Folder to snapshot (honours .gitignore).")
    ] = Path("."),
    no_snapshot: Annotated[
        bool, typer.Option("--no-snapshot", help="Run without code (the command needs none).")
    ] = False,
    as_json: bool = JsonOption,
) -> None:
    """Queue COMMAND as a job with a snapshot of the working folder.

    Example: shamal job submit --team vision --gpus 1 --time-limit 2h -- python train.py
    """
    variables: dict[str, str] = {}
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise InvalidParameter(f"--env takes KEY=VALUE, not {item!r}")
        variables[key] = value
    api = client()
    digest = None
    if not no_snapshot:
        with console.status(f"snapshotting {workdir.resolve()} ..."):
            digest = api.upload_snapshot(workdir)
    job = api.submit_job(
        command,
        name=name,
        team=team,
        priority=priority,
        cpus=cpus,
        memory_mib=parse_memory_mib(memory),
        gpus=gpus,
        gpu_fraction=gpu_fraction,
        mig_profile=mig,
        workers=workers,
        pool=pool,
        time_limit_s=parse_duration_s(time_limit) if time_limit else None,
        retries=retries,
        env=variables,
        snapshot=digest,
    )
    if as_json:
        console.print_json(data=job)
        return
    console.print(f"queued job [bold]{job['id']}[/] ({job['resources']}, {job['priority']})")
    console.print(f"[dim]follow it with:[/] shamal job logs -f {job['id'][:12]}")


@app.command("list")
@handle_errors
def list_jobs(
    state: Annotated[
        list[str] | None, typer.Option("--state", help="queued, running, ... (repeatable)")
    ] = None,
    team: Annotated[str | None, typer.Option("--team")] = None,
    user: Annotated[str | None, typer.Option("--user")] = None,
    limit: Annotated[int, typer.Option("--max", min=1, max=1000)] = 50,
    as_json: bool = JsonOption,
) -> None:
    """List jobs, newest first."""
    jobs = client().list_jobs(states=state or (), team=team, user=user, limit=limit)
    if as_json:
        console.print_json(data=jobs)
        return
    _print_jobs(jobs, "Jobs")


@app.command("show")
@handle_errors
def show(
    job_id: Annotated[str, typer.Argument(help="Job id (or its first 6+ characters).")],
    as_json: bool = JsonOption,
) -> None:
    """Show a job, where it runs and every state it went through."""
    api = client()
    job = api.get_job(job_id)
    events = api.job_events(job["id"])
    if as_json:
        console.print_json(data={**job, "events": events})
        return
    console.print(f"[bold]{job['name']}[/] {job['id']}  [bold]{job['state']}[/] ({job['reason']})")
    details = {
        "team": job["team"] or "-",
        "user": job["user"],
        "command": " ".join(job["command"]),
        "resources": job["resources"],
        "priority": job["priority"],
        "pool": job["pool"] or "any",
        "attempt": f"{job['attempt']} (retries used {job['retries_used']} of "
        f"{job['max_retries']}, preempted {job['preemptions']}x)",
        "time limit": job["time_limit_s"],
        "exit code": job["exit_code"],
        "snapshot": (job["snapshot"] or "-")[:16],
    }
    for key, value in details.items():
        console.print(f"  {key:<10} {fmt(value)}")
    table = Table(title="Transitions", title_justify="left", header_style="bold")
    for column in ("at", "from", "to", "attempt", "by", "reason"):
        table.add_column(column)
    for event in events:
        table.add_row(
            fmt(event["at"]),
            fmt(event["from_state"]),
            event["to_state"],
            str(event["attempt"]),
            event["actor"],
            event["reason"][:60],
        )
    console.print(table)


@app.command("logs")
@handle_errors
def logs(
    job_id: Annotated[str, typer.Argument(help="Job id (or its first 6+ characters).")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing.")] = False,
    attempt: Annotated[int | None, typer.Option("--attempt", help="Default: latest.")] = None,
    interval: Annotated[float, typer.Option("--interval", min=0.1, max=60)] = 1.0,
) -> None:
    """Print a job's log; with -f, follow it (and its later attempts) until the job ends."""
    api = client()
    offset, current = 0, attempt
    while True:
        data, offset, complete, current = api.job_log(job_id, offset=offset, attempt=current)
        if data:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
            continue
        if not follow or (complete and attempt is not None):
            return
        if complete:
            job = api.get_job(job_id)
            if job["attempt"] > current:
                err_console.print(f"[dim]--- attempt {job['attempt']} ---[/]")
                offset, current = 0, job["attempt"]
                continue
            if job["state"] not in ("queued", "admitted", "running"):
                return
        time.sleep(interval)  # polling the server for more log, as `tail -f` does


@app.command("cancel")
@handle_errors
def cancel(
    job_id: Annotated[str, typer.Argument(help="Job id (or its first 6+ characters).")],
) -> None:
    """Cancel a job: at once if queued; a running job is stopped by its scheduler."""
    job = client().cancel_job(job_id)
    if job["state"] == "cancelled":
        console.print(f"cancelled job {job['id'][:12]}")
    else:
        console.print(f"stopping job {job['id'][:12]} (it is {job['state']})")


@app.command("preempt")
@handle_errors
def preempt(
    job_id: Annotated[str, typer.Argument(help="Job id (or its first 6+ characters).")],
) -> None:
    """(Admins) Preempt a running job: SIGTERM, grace period, SIGKILL, then requeue."""
    job = client().preempt_job(job_id)
    console.print(f"preempting job {job['id'][:12]}; it goes back to the queue")


@cost.command("report")
@handle_errors
def cost_report(
    by: Annotated[str, typer.Option("--by", help="team, pool, user or job.")] = "team",
    since: Annotated[str, typer.Option("--since", help="e.g. 7d, 24h, or an ISO date.")] = "7d",
    csv_path: Annotated[
        Path | None,
        typer.Option("--csv", help="CSV file to write (default: cost-by-BY-DATE.csv here)."),
    ] = None,
    no_csv: Annotated[bool, typer.Option("--no-csv", help="Print only; write no CSV.")] = False,
    as_json: bool = JsonOption,
) -> None:
    """Usage and cost per team (or pool, user, job), priced by each pool's labels.

    Prints a table and writes the same figures as CSV for chargeback spreadsheets.
    """
    try:
        start = datetime.fromisoformat(since)
        start = start if start.tzinfo else start.replace(tzinfo=UTC)
    except ValueError:
        start = datetime.now(UTC) - timedelta(seconds=parse_duration_s(since))
    lines = client().cost_report(by=by, since=start)
    columns = ["key", "jobs", "attempts", "gpu_seconds", "cpu_seconds", "memory_gib_seconds"]
    if not no_csv:
        csv_path = csv_path or Path(f"cost-by-{by}-{datetime.now(UTC):%Y%m%d}.csv")
        with csv_path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow([by, *columns[1:], "cost"])
            for line in lines:
                figures = [f"{line[c]:.3f}" for c in columns[3:]]
                writer.writerow([*(line[c] for c in columns[:3]), *figures, f"{line['cost']:.6f}"])
        err_console.print(f"wrote {csv_path}")
    if as_json:
        console.print_json(data=lines)
        return
    table = Table(
        title=f"Cost by {by} since {start:%Y-%m-%d %H:%M} UTC",
        title_justify="left",
        header_style="bold",
    )
    for column in (by, "jobs", "attempts", "GPU-h", "CPU-h", "GiB-h", "cost"):
        table.add_column(column, justify="left" if column == by else "right")
    for line in lines:
        table.add_row(
            line["key"],
            str(line["jobs"]),
            str(line["attempts"]),
            f"{line['gpu_seconds'] / 3600:.2f}",
            f"{line['cpu_seconds'] / 3600:.2f}",
            f"{line['memory_gib_seconds'] / 3600:.2f}",
            f"{line['cost']:.2f}",
        )
    console.print(table if lines else f"[dim]no usage since {start:%Y-%m-%d %H:%M}[/]")
