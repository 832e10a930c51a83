"""`shamal data`: governed datasets: create, ingest, list, show versions, alias, download.

`shamal data ingest customers --from customers.csv` writes a version (the format is told by the
suffix, or `--format`); `--mode overwrite` replaces the rows instead of appending. Versions are
named `customers` (the latest valid one), `customers/3`, or `customers@prod`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from shamal.cli._common import (
    JsonOption,
    client,
    console,
    err_console,
    escape,
    handle_errors,
    print_table,
)
from shamal.client import has_password, is_remote, redact
from shamal.errors import InvalidParameter
from shamal.jobs import check_env

app = typer.Typer(
    help="Datasets: create them, ingest versions, list, show, alias and download them.",
    no_args_is_help=True,
)

_MODES = ("append", "overwrite")


def _size(size: int) -> str:
    for unit, step in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= step:
            return f"{size / step:.1f} {unit}"
    return f"{size} B"


def _version_line(v: dict[str, Any]) -> str:
    return (
        f"[bold]{escape(v['uri'])}[/] {v['status']}: {v['row_count']:,} rows, "
        f"{len(v['columns'])} columns, {len(v['parts'])} part(s), {_size(v['size_bytes'])}, "
        f"digest {v['digest'][:12]}"
    )


@app.command("create")
@handle_errors
def create(
    name: str,
    team: Annotated[str | None, typer.Option(help="Owning team (default: your only one).")] = None,
    description: Annotated[str, typer.Option(help="What the data is.")] = "",
    as_json: bool = JsonOption,
) -> None:
    """Create an empty dataset NAME owned by a team."""
    created = client().create_dataset(name, team=team, description=description)
    if as_json:
        typer.echo(json.dumps(created))
        return
    console.print(f"created dataset [bold]{escape(created['name'])}[/] (team {created['team']})")


@app.command("ingest")
@handle_errors
def ingest(
    name: str,
    source: Annotated[
        str,
        typer.Option(
            "--from",
            help="A local file (csv, parquet, jsonl, arrow; .gz/.zst compressed text too), "
            "uploaded; or a source the server reads: s3://BUCKET/KEY, "
            "postgresql://USER@HOST:PORT/DB or mysql://USER@HOST:PORT/DB with --query.",
        ),
    ],
    fmt: Annotated[
        str | None,
        typer.Option("--format", help="csv, parquet, jsonl or arrow (default: by suffix)."),
    ] = None,
    query: Annotated[
        str | None, typer.Option("--query", help="The SELECT a SQL source runs (read-only).")
    ] = None,
    mode: Annotated[str, typer.Option(help="append (default) or overwrite.")] = "append",
    as_job: Annotated[
        bool,
        typer.Option(
            "--as-job",
            help="Run the ingestion as a job on the scheduler (s3:// and SQL sources); prints "
            "the job's id.",
        ),
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="With --as-job: wait for the job and show its end.")
    ] = False,
    team: Annotated[
        str | None, typer.Option("--team", help="With --as-job: the team the job runs for.")
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", "-e", help="With --as-job: KEY=VALUE for the job, repeatable."),
    ] = None,
    as_json: bool = JsonOption,
) -> None:
    """Write a new version of NAME: a local file streams to the server; an S3 object or a
    SQL query is read by the server (its operator allows which buckets and hosts).

    Examples: shamal data ingest customers --from customers.csv.gz;
    shamal data ingest orders --from postgresql://reader@db:5432/shop --query "SELECT * FROM
    orders" --as-job --wait
    """
    if mode not in _MODES:
        raise InvalidParameter(f"--mode is append or overwrite, not {mode!r}")
    if as_job:
        job = _JobOptions(team, _environment(env or []), wait, as_json)
        _submit_ingestion(name, source, fmt, query, mode, job)
        return
    if is_remote(source):
        with console.status(f"the server is reading {escape(redact(source))} ..."):
            version = client().ingest_source(name, source, query=query, fmt=fmt, mode=mode)
    else:
        version = _upload(name, _local_file(source, query), fmt, mode, as_json)
    if as_json:
        typer.echo(json.dumps(version))
        return
    console.print(_version_line(version))


def _local_file(source: str, query: str | None) -> Path:
    """The local file ``--from`` names (a path, not a URI)."""
    if "://" in source or source.startswith("file:"):
        raise InvalidParameter(
            f"--from {escape(redact(source))}: a local file is given by its path; the server "
            "reads s3://, postgresql:// and mysql:// sources only"
        )
    if query is not None:
        raise InvalidParameter("--query is for SQL sources (postgresql://, mysql://)")
    path = Path(source)
    if not path.is_file():
        raise InvalidParameter(f"--from {escape(source)} is not a readable file")
    return path


def _upload(name: str, path: Path, fmt: str | None, mode: str, as_json: bool) -> dict[str, Any]:
    with Progress(
        TextColumn("uploading {task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
        disable=as_json or not err_console.is_terminal,
    ) as bar:
        task = bar.add_task(escape(path.name), total=path.stat().st_size)
        version: dict[str, Any] = client().ingest_file(
            name, path, fmt=fmt, mode=mode, on_progress=lambda n: bar.advance(task, n)
        )
        bar.update(task, description=f"{escape(path.name)}: the server writes the version")
    return version


#: How often ``--wait`` asks for the job's state.
_POLL_S = 1.0
_FINAL = ("succeeded", "failed", "cancelled", "lost")


@dataclass(frozen=True, slots=True)
class _JobOptions:
    team: str | None
    env: dict[str, str]
    wait: bool
    as_json: bool


def _environment(items: list[str]) -> dict[str, str]:
    variables: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise InvalidParameter(f"--env takes KEY=VALUE, not {item!r}")
        variables[key] = value
    return check_env(variables)


def _submit_ingestion(
    name: str, source: str, fmt: str | None, query: str | None, mode: str, options: _JobOptions
) -> None:
    """Queue ``shamal data ingest`` as a job: it runs with the job's own token, so the
    ingestion is the submitter's, scheduled, time-limited and logged like any job."""
    if not is_remote(source):
        raise InvalidParameter(
            "--as-job ingests what the server can reach (s3://, postgresql://, mysql://); a "
            "local file uploads directly, without --as-job"
        )
    if has_password(source):
        raise InvalidParameter(
            "--as-job stores the job's command, so its source may hold no password: use a "
            "database user the platform's hosts may connect as without one, or ingest "
            "without --as-job"
        )
    command = ["python", "-m", "shamal", "data", "ingest", name, "--from", source, "--mode", mode]
    command += [*(["--query", query] if query else []), *(["--format", fmt] if fmt else [])]
    shamal = client()
    job = shamal.submit_job(
        command, name=f"ingest {name}"[:100], team=options.team, env=options.env, memory_mib=2048
    )
    if not options.wait:
        if options.as_json:
            typer.echo(json.dumps(job))
        else:
            console.print(f"queued ingestion job [bold]{job['id']}[/] (shamal job logs -f ...)")
        return
    with console.status(f"job {job['id'][:12]} ingests {escape(redact(source))} ..."):
        while job["state"] not in _FINAL:
            time.sleep(_POLL_S)  # the CLI's polling interval, not a synchronisation
            job = shamal.get_job(job["id"])
    if options.as_json:
        typer.echo(json.dumps(job))
    else:
        console.print(f"ingestion job [bold]{job['id']}[/] {job['state']}")
    if job["state"] != "succeeded":
        raise typer.Exit(1)


@app.command("list")
@handle_errors
def list_datasets(
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 100,
    as_json: bool = JsonOption,
) -> None:
    """Datasets you can see."""
    found = client().list_datasets(limit=limit)
    if as_json:
        typer.echo(json.dumps(found))
        return
    rows = [
        {**d, "aliases": ", ".join(f"{a}={v}" for a, v in sorted(d["aliases"].items()))}
        for d in found
    ]
    print_table(
        "Datasets",
        ["name", "team", "latest_version", "aliases", "updated_at", "description"],
        rows,
        rank=["name", "latest_version", "team", "aliases"],
    )


@app.command("show")
@handle_errors
def show(
    reference: Annotated[str, typer.Argument(help="NAME, NAME/3 or NAME@alias.")],
    as_json: bool = JsonOption,
) -> None:
    """One version: its columns, parts and where it came from."""
    version = client().dataset_version(reference)
    if as_json:
        typer.echo(json.dumps(version))
        return
    console.print(_version_line(version))
    console.print(
        f"source: {escape(json.dumps(version['source']))}; mode {version['mode']}; "
        f"by {escape(version['created_by'])} at {version['created_at']}"
    )
    print_table("Columns", ["name", "type", "nullable"], version["columns"], rank=["name", "type"])
    if version["validation"] is not None:
        _print_report(version["validation"])


def _print_report(report: dict[str, Any]) -> None:
    verdict = "[green]passed[/]" if report["ok"] else "[bold red]failed: quarantined[/]"
    console.print(f"validation (the {report['scope']}'s {report['rows']:,} rows): {verdict}")
    rows = [
        {
            "expectation": escape(r["kind"]),
            "columns": escape(", ".join(r["columns"])),
            "severity": r["severity"],
            "result": "ok" if r["passed"] else "FAILED",
            "message": escape(r["message"]),
        }
        for r in report["results"]
    ]
    print_table(
        "Expectations",
        ["expectation", "columns", "severity", "result", "message"],
        rows,
        rank=["expectation", "result", "columns", "message"],
    )


@app.command("versions")
@handle_errors
def versions(
    name: str,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 100,
    as_json: bool = JsonOption,
) -> None:
    """A dataset's versions, newest first."""
    rows = [
        {**v, "columns": len(v["columns"]), "digest": v["digest"][:12]}
        for v in client().dataset_versions(name, limit=limit)
    ]
    print_table(
        f"Versions of {name}",
        ["version", "status", "row_count", "columns", "mode", "digest", "created_at"],
        rows,
        as_json=as_json,
        rank=["version", "status", "row_count", "created_at"],
        right=["row_count", "columns"],
    )


@app.command("suite")
@handle_errors
def suite(
    name: str,
    file: Annotated[
        Path | None,
        typer.Option("--file", exists=True, dir_okay=False, help="The suite, as YAML."),
    ] = None,
    remove: Annotated[bool, typer.Option("--remove", help="Stop validating.")] = False,
) -> None:
    """Validate every new version of NAME against a suite (maintainers); without options,
    print the suite in force."""
    shamal = client()
    if remove:
        shamal.set_dataset_suite(name, None)
        console.print(f"{escape(name)}: new versions are no longer validated")
        return
    if file is None:
        current = shamal.get_dataset_suite(name)
        typer.echo(current if current is not None else f"{name} has no suite")
        return
    shamal.set_dataset_suite(name, file.read_text(encoding="utf-8"))
    console.print(f"{escape(name)}: new versions are validated against {escape(file.name)}")


@app.command("alias")
@handle_errors
def alias(
    name: str,
    alias_name: Annotated[str, typer.Argument(metavar="ALIAS")],
    version: Annotated[
        int | None, typer.Argument(help="Version number (omit with --delete).")
    ] = None,
    delete: Annotated[bool, typer.Option("--delete", help="Remove the alias.")] = False,
) -> None:
    """Point ALIAS of NAME at VERSION (maintainers), or remove it with --delete."""
    if delete:
        client().delete_dataset_alias(name, alias_name)
        console.print(f"removed {escape(name)}@{escape(alias_name)}")
        return
    if version is None:
        raise InvalidParameter(
            "give the version the alias names, e.g. `shamal data alias t prod 3`"
        )
    moved = client().set_dataset_alias(name, alias_name, version)
    console.print(f"{escape(name)}@{escape(alias_name)} -> {escape(moved['uri'])}")


@app.command("download")
@handle_errors
def download(
    reference: Annotated[str, typer.Argument(help="NAME, NAME/3 or NAME@alias.")],
    dest: Annotated[Path, typer.Option("--to", file_okay=False, help="Folder to write into.")],
) -> None:
    """Write a version's Parquet parts into a folder (any Parquet reader opens them)."""
    shamal = client()
    version = shamal.dataset_version(reference)
    dest.mkdir(parents=True, exist_ok=True)
    for index, part in enumerate(version["parts"]):
        target = dest / f"part-{index:05d}-{part['digest'][:12]}.parquet"
        shamal.download_dataset_part(version["dataset"], version["version"], index, target)
    console.print(f"wrote {len(version['parts'])} part(s) of {escape(version['uri'])} to {dest}")
