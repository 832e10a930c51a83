"""`shamal job` and `shamal cost`: submit work to the scheduler, follow it, and see what it cost."""

from __future__ import annotations

import csv
import re
import shlex
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.text import Text

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
from shamal.cli._quantities import (
    MEMORY_HELP,
    parse_duration_s,
    parse_memory_mib,
    require_finite,
    shown,
)
from shamal.client import ShamalClient
from shamal.errors import InvalidParameter, PayloadTooLarge

# What the server checks a job with, loaded without its services or the database layer.
from shamal.jobs import JobIn, JobState, check_env, check_mig_profile, duration_text

app = typer.Typer(
    help="Jobs: submit a command with its code to the scheduler, list, show, follow logs, "
    "cancel and (admins) preempt.",
    no_args_is_help=True,
)
cost = typer.Typer(help="Cost: GPU-, CPU- and memory-seconds per team, pool, user or job.")


def _why(job: dict[str, Any]) -> str:
    """Why a job is where it is: for a queued job, what it waits for (when the server
    says), else the reason of its last transition."""
    waiting = job.get("waiting")
    return str(waiting) if job["state"] == "queued" and waiting else str(job["reason"])


def _job_row(job: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": job["id"][:12],
        "name": job["name"][:40],
        "team": job["team"] or "-",
        "state": job["state"],
        "why": _why(job).split(":", 1)[0][:40],
        "priority": job["priority"],
        "resources": job["resources"],
        "attempt": job["attempt"],
        "submitted": job["submitted_at"],
    }


_JOB_COLUMNS = (
    "id", "name", "team", "state", "why", "priority", "resources", "attempt", "submitted",
)  # fmt: skip
_JOB_RANK = ("submitted", "why", "team", "resources", "priority", "attempt")
"""What a narrow console shows of a job after its id, name and state, most useful first."""


def _print_jobs(jobs: list[dict[str, Any]], title: str) -> None:
    rows = [_job_row(job) for job in jobs]
    print_table(title, _JOB_COLUMNS, rows, rank=_JOB_RANK)


_FLAGS = {
    "command": "COMMAND",
    "name": "--name",
    "team": "--team",
    "priority": "--priority",
    "cpus": "--cpus",
    "memory_mib": "--memory",
    "gpus": "--gpus",
    "gpu_fraction": "--gpu-fraction",
    "mig_profile": "--mig",
    "gpu_memory_mib": "--gpu-memory",
    "workers": "--workers",
    "pool": "--pool",
    "time_limit_s": "--time-limit",
    "retries": "--retries",
    "env": "--env",
    "datasets": "--dataset",
    "executor": "--executor",
}
"""The flag of each field of the API's JobIn, for errors in the user's words."""
_UNITS = {
    "memory_mib": " (MiB)",
    "gpu_memory_mib": " (MiB)",
    "time_limit_s": " (seconds; 30d at most)",
}


def _check_request(command: list[str], options: dict[str, Any]) -> None:
    """Check the job as the server will, before the snapshot is uploaded: a refusal names
    the flag and changes nothing.

    Raises:
        InvalidParameter: the first field the API would refuse, named by its flag.
    """
    require_finite({_FLAGS[field]: options[field] for field in ("cpus", "gpu_fraction")})
    body = {"command": command, **{k: v for k, v in options.items() if v is not None}}
    try:
        JobIn.model_validate(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        flag = _FLAGS.get(field, field)
        raise InvalidParameter(f"{flag}: {error['msg']}{_UNITS.get(field, '')}") from None


_JOB_ID = re.compile(r"[0-9a-f]{6,32}")


def job_id_of(text: str) -> str:
    """A job id (or a prefix of 6+ characters) as typed -> as the API takes it.

    Raises:
        InvalidParameter: not 6 to 32 hexadecimal digits (checked before any request).
    """
    cleaned = text.strip().lower()
    if not _JOB_ID.fullmatch(cleaned):
        raise InvalidParameter(
            "a job id is 6 to 32 hexadecimal digits, as `shamal job list` shows them "
            f"(e.g. 1a2b3c4d5e6f), not {shown(text)}"
        )
    return cleaned


def parse_env(items: list[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` options as a job's environment (checked as a job's is)."""
    variables: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise InvalidParameter(f"--env takes KEY=VALUE, not {item!r}")
        variables[key] = value
    return check_env(variables)


def _upload_snapshot(api: ShamalClient, workdir: Path, team: str | None) -> str:
    """Upload the snapshot of ``workdir`` for ``team``; a server's refusal of its size says
    what to do."""
    try:
        return api.upload_snapshot(workdir, team)
    except PayloadTooLarge as exc:
        raise PayloadTooLarge(
            f"the snapshot of {workdir.resolve()} is larger than this server takes "
            f"({exc.message}): leave data, checkpoints and environments out of it with a "
            ".gitignore (they belong in datasets and artifacts), or give --workdir the "
            "folder that holds only the code"
        ) from None


@app.command(
    "submit",
    context_settings={"allow_interspersed_args": False},
)
@handle_errors
def submit(
    command: Annotated[
        list[str], typer.Argument(help="The command, after `--`.", metavar="COMMAND")
    ],
    team: Annotated[str | None, typer.Option("--team", help="Team that runs (and pays).")] = None,
    priority: Annotated[
        str | None, typer.Option("--priority", help="low, normal, high, critical ...")
    ] = None,
    cpus: Annotated[float, typer.Option("--cpus", help="CPUs per worker.")] = 1.0,
    memory: Annotated[str, typer.Option("--memory", help=MEMORY_HELP)] = "2GiB",
    gpus: Annotated[int, typer.Option("--gpus", help="Whole GPUs per worker.")] = 0,
    gpu_fraction: Annotated[
        float, typer.Option("--gpu-fraction", help="A share of one GPU, e.g. 0.25.")
    ] = 0.0,
    mig: Annotated[
        str | None, typer.Option("--mig", help="A MIG slice, e.g. 1g.10gb or 3g.40gb.")
    ] = None,
    gpu_memory: Annotated[
        str | None,
        typer.Option(
            "--gpu-memory",
            help="Memory each worker's GPU must have (e.g. 40GiB): whole GPUs, fractions "
            "and MIG slices count their own share; gang workers (pipeline stages) go only "
            "where that much is free.",
        ),
    ] = None,
    workers: Annotated[int, typer.Option("--workers", help="Gang size (all or nothing).")] = 1,
    time_limit: Annotated[
        str | None,
        typer.Option(
            "--time-limit", help="e.g. 2h, 30min, 90s or 1h30m; the job is stopped after it."
        ),
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
    dataset: Annotated[
        list[str] | None,
        typer.Option(
            "--dataset",
            help="A dataset the job reads (NAME, NAME@alias, NAME/3), repeatable: it runs "
            "only in pools of regions their residency policies allow.",
        ),
    ] = None,
    executor: Annotated[
        str | None,
        typer.Option(
            "--executor",
            help="local or ray: what runs it (default: the server's); the server must run it.",
        ),
    ] = None,
    as_json: bool = JsonOption,
) -> None:
    """Queue COMMAND as a job with a snapshot of the working folder.

    Example: shamal job submit --team vision --gpus 1 --time-limit 2h -- python train.py
    """
    variables = parse_env(env or [])
    memory_mib = parse_memory_mib(memory, "--memory")
    gpu_memory_mib = parse_memory_mib(gpu_memory, "--gpu-memory") if gpu_memory else None
    time_limit_s = parse_duration_s(time_limit, "--time-limit") if time_limit else None
    if mig is not None:
        check_mig_profile(mig)
    options: dict[str, Any] = {
        "name": name,
        "team": team,
        "priority": priority,
        "cpus": cpus,
        "memory_mib": memory_mib,
        "gpus": gpus,
        "gpu_fraction": gpu_fraction,
        "mig_profile": mig,
        "gpu_memory_mib": gpu_memory_mib,
        "workers": workers,
        "pool": pool,
        "time_limit_s": time_limit_s,
        "retries": retries,
        "env": variables,
        "datasets": list(dataset or []),
        "executor": executor,
    }
    _check_request(command, options)
    if not no_snapshot and not workdir.is_dir():
        raise InvalidParameter(
            f"--workdir {workdir} is not a folder: give the folder to snapshot, "
            "or --no-snapshot to run a command that needs no code"
        )
    api = client()
    digest = None
    if not no_snapshot:
        with console.status(f"snapshotting {escape(str(workdir.resolve()))} ..."):
            digest = _upload_snapshot(api, workdir, team)
    job = api.submit_job(command, **options, snapshot=digest)
    if as_json:
        console.print_json(data=job)
        return
    console.print(
        f"queued job [bold]{job['id']}[/] ({escape(job['resources'])}, {escape(job['priority'])})"
    )
    if job.get("waiting"):
        console.print(f"[dim]{escape(job['waiting'])}[/]")
    console.print(f"[dim]follow it with:[/] shamal job logs -f {job['id'][:12]}")


def _states(given: list[str]) -> list[str]:
    """The --state values in lower case, each one of the job states."""
    known = [state.value for state in JobState]
    states = [value.strip().lower() for value in given]
    for value, typed in zip(states, given, strict=True):
        if value not in known:
            raise InvalidParameter(f"--state takes one of {', '.join(known)}, not {shown(typed)}")
    if len(set(states)) > 8:
        raise InvalidParameter("--state may be given at most 8 times")
    return list(dict.fromkeys(states))


def _check_name_filter(flag: str, value: str | None, most: int) -> None:
    """Refuse a --team or --user filter the API would: a name is 1 to ``most`` characters.

    Raises:
        InvalidParameter: ``value`` is given and empty or longer than ``most``.
    """
    if value is not None and not 0 < len(value) <= most:
        raise InvalidParameter(f"{flag} takes a name of 1 to {most} characters, not {shown(value)}")


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
    states = _states(state or [])
    _check_name_filter("--team", team, 64)
    _check_name_filter("--user", user, 256)
    jobs = client().list_jobs(states=states, team=team, user=user, limit=limit)
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
    job = api.get_job(job_id_of(job_id))
    events = api.job_events(job["id"])
    if as_json:
        console.print_json(data={**job, "events": events})
        return
    console.print(
        Text.assemble(
            (job["name"], "bold"),
            f" {job['id']}  ",
            (job["state"], "bold"),
            f" ({_why(job)})",
        )
    )
    for key, value in _job_details(job).items():
        console.print(Text(f"  {key:<10} {fmt(value)}"))
    transitions = [
        {
            "at": event["at"],
            "from": event["from_state"],
            "to": event["to_state"],
            "attempt": event["attempt"],
            "by": event["actor"],
            "reason": event["reason"][:60],
        }
        for event in events
    ]
    print_table(
        "Transitions", ["at", "from", "to", "attempt", "by", "reason"], transitions, rank=["to"]
    )


def _job_details(job: dict[str, Any]) -> dict[str, Any]:
    """What `job show` says of a job under its name, label by label."""
    return {
        "team": job["team"] or "(no team)",
        "user": job["user"],
        "command": shlex.join(job["command"]),
        "resources": job["resources"],
        "priority": job["priority"],
        "pool": job["pool"] or "any",
        "executor": job.get("executor") or "the server's default",
        "datasets": ", ".join(job.get("datasets") or []) or "-",
        "regions": "any" if job.get("regions") is None else ", ".join(job["regions"]),
        "attempt": f"{job['attempt']} (retries used {job['retries_used']} of "
        f"{job['max_retries']}, preempted {job['preemptions']}x)",
        "time limit": (None if job["time_limit_s"] is None else duration_text(job["time_limit_s"])),
        "exit code": job["exit_code"],
        "snapshot": (job["snapshot"] or "-")[:16],
    }


@app.command("logs")
@handle_errors
def logs(
    job_id: Annotated[str, typer.Argument(help="Job id (or its first 6+ characters).")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing.")] = False,
    attempt: Annotated[int | None, typer.Option("--attempt", help="Default: latest.")] = None,
    interval: Annotated[float, typer.Option("--interval", min=0.1, max=60)] = 1.0,
) -> None:
    """Print a job's log; with -f, follow it (and its later attempts) until the job ends.

    With -f the command ends when the job does, saying how on stderr, and exits 0 when
    the job succeeded, 1 when it failed, was lost or was cancelled: `shamal job logs -f
    ID && next-step` runs the next step only after a success. While the job waits in the
    queue it says what for. With --attempt N, -f follows that attempt's log to its end and
    exits 0 (the attempt's outcome is in `shamal job show`).
    """
    job_id = job_id_of(job_id)
    api = client()
    offset, current = 0, attempt
    waiting: str | None = None
    first = True
    while True:
        data, offset, complete, current = api.job_log(job_id, offset=offset, attempt=current)
        if first and attempt is None and current > 1:
            err_console.print(
                f"[dim]--- attempt {current} (earlier ones: shamal job logs --attempt N "
                f"{job_id[:12]}, N from 1 to {current - 1}) ---[/]"
            )
        first = False
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
            if job["state"] not in _LIVE_STATES:
                _end_of_follow(job)
            if job["state"] == "queued" and _why(job) != waiting:
                waiting = _why(job)
                err_console.print(Text(f"job {job['id'][:12]} is queued: {waiting}", "dim"))
        time.sleep(interval)  # polling the server for more log, as `tail -f` does


_LIVE_STATES = ("queued", "admitted", "running", "preempted")
"""States a job leaves again; `logs -f` follows it through them."""


def _end_of_follow(job: dict[str, Any]) -> None:
    """Say how the followed job ended and exit with 0 for a success, else 1."""
    ended = Text.assemble(f"job {job['id'][:12]} ", (job["state"], "bold"), f" ({_why(job)})")
    err_console.print(ended)
    raise typer.Exit(0 if job["state"] == "succeeded" else 1)


def _print_stop(job: dict[str, Any], what: str) -> None:
    """What a cancel or preempt request did, and what the job waits for if it is queued."""
    short = job["id"][:12]
    if job["state"] == "cancelled":
        console.print(f"cancelled job {short}")
    elif what == "preempt":
        console.print(
            f"preempting job {short}: its scheduler stops it (SIGTERM, then the grace period) "
            f"and puts it back in the queue; `shamal job show {short}` then says what it waits for"
        )
    else:
        console.print(f"stopping job {short} (it is {job['state']})")
    if job["state"] == "queued" and job.get("waiting"):
        console.print(Text(job["waiting"], style="dim"))


@app.command("cancel")
@handle_errors
def cancel(
    job_id: Annotated[str, typer.Argument(help="Job id (or its first 6+ characters).")],
    as_json: bool = JsonOption,
) -> None:
    """Cancel a job: at once if queued; a running job is stopped by its scheduler."""
    job = client().cancel_job(job_id_of(job_id))
    if as_json:
        console.print_json(data=job)
        return
    _print_stop(job, "cancel")


@app.command("preempt")
@handle_errors
def preempt(
    job_id: Annotated[str, typer.Argument(help="Job id (or its first 6+ characters).")],
    as_json: bool = JsonOption,
) -> None:
    """(Admins) Preempt a running job: SIGTERM, grace period, SIGKILL, then requeue."""
    job = client().preempt_job(job_id_of(job_id))
    if as_json:
        console.print_json(data=job)
        return
    _print_stop(job, "preempt")


NO_TEAM = "(no team)"
"""How cost reports show jobs that ran without a team (an admin's own jobs)."""
_FIGURES = ("gpu_seconds", "cpu_seconds", "memory_gib_seconds")


def _since(text: str) -> datetime:
    """'7d', '24h', '90min' before now, or an ISO date or time (UTC unless it says)."""
    try:
        start = datetime.fromisoformat(text.strip())
    except ValueError:
        pass
    else:
        start = start if start.tzinfo else start.replace(tzinfo=UTC)
        if start >= datetime.now(UTC):
            raise InvalidParameter(
                f"--since {shown(text)} is in the future: give a past date, or a duration "
                "such as 7d"
            )
        return start
    try:
        seconds = parse_duration_s(text, "--since")
    except InvalidParameter:
        raise InvalidParameter(
            f"--since takes a duration such as 7d, 24h or 90min (at most ten years), or an "
            f"ISO date such as 2026-01-31 or 2026-01-31T12:00, not {shown(text)}"
        ) from None
    return datetime.now(UTC) - timedelta(seconds=seconds)


def _key(line: dict[str, Any], by: str) -> str:
    key = str(line["key"])
    return NO_TEAM if by == "team" and key in ("", "-") else key


def _unwritable(path: Path, why: str) -> InvalidParameter:
    return InvalidParameter(
        f"--csv cannot write {shown(str(path), 80)}: {why}; name a file in a folder that "
        "exists, or give --no-csv"
    )


def _check_csv_path(path: Path) -> None:
    """Refuse a CSV path that cannot be written before asking the server for the report."""
    if path.is_dir():
        raise _unwritable(path, "it is a folder")
    if not path.parent.is_dir():
        raise _unwritable(path, "its folder does not exist")


def _write_csv(path: Path, lines: list[dict[str, Any]], by: str) -> None:
    try:
        handle = path.open("w", newline="", encoding="utf-8")
    except OSError as exc:
        raise _unwritable(path, exc.strerror or "not writable") from None
    with handle:
        writer = csv.writer(handle)
        writer.writerow([by, "jobs", "attempts", *_FIGURES, "cost"])
        for line in lines:
            figures = [f"{line[c]:.3f}" for c in _FIGURES]
            counts = [line["jobs"], line["attempts"]]
            writer.writerow([_key(line, by), *counts, *figures, f"{line['cost']:.6f}"])


@cost.command("report")
@handle_errors
def cost_report(
    by: Annotated[str, typer.Option("--by", help="team, pool, user or job.")] = "team",
    since: Annotated[
        str, typer.Option("--since", help="e.g. 7d, 24h, 90min, or an ISO date (UTC).")
    ] = "7d",
    csv_path: Annotated[
        Path | None,
        typer.Option(
            "--csv",
            help="CSV file to write. Default: cost-by-BY-DATE.csv in this folder with the "
            "table; none with --json.",
        ),
    ] = None,
    no_csv: Annotated[bool, typer.Option("--no-csv", help="Print only; write no CSV.")] = False,
    as_json: bool = JsonOption,
) -> None:
    """Usage and cost per team (or pool, user, job), priced by each pool's labels.

    Prints a table and writes the same figures as CSV for chargeback spreadsheets
    (cost-by-team-YYYYMMDD.csv here unless --csv names a file or --no-csv). With --json
    it prints JSON only, and writes CSV only to a file --csv names. Jobs that ran
    without a team show as "(no team)".
    """
    start = _since(since)
    if csv_path is not None and not no_csv:
        _check_csv_path(csv_path)
    lines = client().cost_report(by=by, since=start)
    target = _csv_target(csv_path, by, no_csv=no_csv, as_json=as_json)
    if target is not None:
        _write_csv(target, lines, by)
        err_console.print(Text(f"wrote {target}"))
    if as_json:
        console.print_json(data=lines)
        return
    if not lines:
        console.print(f"[dim]no usage since {start:%Y-%m-%d %H:%M}[/]")
        return
    print_table(
        f"Cost by {escape(by)} since {start:%Y-%m-%d %H:%M} UTC",
        [by, *_COST_COLUMNS],
        [_cost_row(line, by) for line in lines],
        right=_COST_COLUMNS,
    )


_COST_COLUMNS = ("jobs", "attempts", "GPU-h", "CPU-h", "GiB-h", "cost")


def _csv_target(csv_path: Path | None, by: str, *, no_csv: bool, as_json: bool) -> Path | None:
    """Where `cost report` writes its CSV: nowhere with --no-csv, else the file --csv names,
    else (without --json) cost-by-BY-YYYYMMDD.csv in this folder."""
    if no_csv:
        return None
    if csv_path is not None or as_json:
        return csv_path
    return Path(f"cost-by-{by}-{datetime.now(UTC):%Y%m%d}.csv")


def _cost_row(line: dict[str, Any], by: str) -> dict[str, str]:
    """A line of the cost report as the table shows it: hours and cost to the cent."""
    return {
        by: _key(line, by),
        "jobs": str(line["jobs"]),
        "attempts": str(line["attempts"]),
        "GPU-h": f"{line['gpu_seconds'] / 3600:.2f}",
        "CPU-h": f"{line['cpu_seconds'] / 3600:.2f}",
        "GiB-h": f"{line['memory_gib_seconds'] / 3600:.2f}",
        "cost": f"{line['cost']:.2f}",
    }
