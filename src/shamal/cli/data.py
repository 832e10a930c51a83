"""`shamal data`: governed datasets: create, ingest, stream, list, show versions, alias, download.

`shamal data ingest customers --from customers.csv` writes a version (the format is told by the
suffix, or `--format`); `--mode overwrite` replaces the rows instead of appending. Versions are
named `customers` (the latest valid one), `customers/3`, or `customers@prod`.
`shamal data stream customers --from redis://host:6379/0?stream=events` consumes a broker
(MQTT, NATS JetStream, RabbitMQ, Redis Streams) into micro-batched versions, each record once.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass
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
from shamal.cli.job import parse_env
from shamal.client import has_password, is_remote, redact
from shamal.errors import InvalidParameter

app = typer.Typer(
    help="Datasets: create them, ingest versions, list, show, alias and download them.",
    no_args_is_help=True,
)

_MODES = ("append", "overwrite")
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


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


#: The options every ingestion command takes alike.
FormatOption = Annotated[
    str | None,
    typer.Option("--format", help="csv, parquet, jsonl or arrow (default: by suffix)."),
]
QueryOption = Annotated[
    str | None, typer.Option("--query", help="The SELECT a SQL source runs (read-only).")
]
ModeOption = Annotated[str, typer.Option(help="append (default) or overwrite.")]


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
    fmt: FormatOption = None,
    query: QueryOption = None,
    mode: ModeOption = "append",
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            help="The store to write to (default: the first the dataset's residency policy "
            "allows; `shamal data residency NAME` lists them).",
        ),
    ] = None,
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
    partitions: Annotated[
        int,
        typer.Option(
            "--partitions",
            min=1,
            max=1024,
            help="With --as-job: read the source in N partitions, one per worker of a gang "
            "job (on the Ray executor, across its nodes); the parts commit as one version. "
            "An S3 source is then a prefix, s3://BUCKET/PREFIX/; a SQL source needs "
            "--partition-by.",
        ),
    ] = 1,
    partition_by: Annotated[
        str | None,
        typer.Option(
            "--partition-by",
            help="With --partitions: the column of a SQL query's result whose hash shares "
            "the rows out among the partitions.",
        ),
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
    if (partitions > 1 or partition_by is not None) and not as_job:
        raise InvalidParameter(
            "--partitions and --partition-by split a read among the workers of a job: add --as-job"
        )
    if as_job:
        job = _JobOptions(team, parse_env(env or []), wait, as_json, partitions, partition_by)
        _submit_ingestion(name, source, fmt, query, mode, job)
        return
    if is_remote(source):
        with console.status(f"the server is reading {escape(redact(source))} ..."):
            version = client().ingest_source(name, source, query=query, fmt=fmt, mode=mode)
    else:
        version = _upload(name, _local_file(source, query), fmt, mode, as_json, store)
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


def _upload(
    name: str, path: Path, fmt: str | None, mode: str, as_json: bool, store: str | None
) -> dict[str, Any]:
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
            name,
            path,
            fmt=fmt,
            mode=mode,
            on_progress=lambda n: bar.advance(task, n),
            store=store,
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
    partitions: int = 1
    partition_by: str | None = None


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
    if options.partitions > 1 or options.partition_by is not None:
        # A gang: each worker stages the partition of its RANK; rank 0 then commits them.
        command[4] = "ingest-partition"
        command += ["--partitions", str(options.partitions)]
        command += ["--partition-by", options.partition_by] if options.partition_by else []
    command += [*(["--query", query] if query else []), *(["--format", fmt] if fmt else [])]
    shamal = client()
    job = shamal.submit_job(
        command,
        name=f"ingest {name}"[:100],
        team=options.team,
        env=options.env,
        memory_mib=2048,
        workers=options.partitions,
        # The ingestion processes the dataset's rows: only where its residency policy allows.
        datasets=[name],
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


#: How long partition 0 waits, by default, for the other workers to stage theirs.
_COMMIT_WAIT_S = 3600.0


@app.command("ingest-partition")
@handle_errors
def ingest_partition(
    name: str,
    source: Annotated[
        str,
        typer.Option(
            "--from",
            help="A source the server reads: s3://BUCKET/PREFIX/ (its objects are shared "
            "out) or postgresql:// / mysql:// with --query and --partition-by.",
        ),
    ],
    partitions: Annotated[
        int, typer.Option("--partitions", min=1, max=1024, help="How many partitions.")
    ],
    partition_index: Annotated[
        int | None,
        typer.Option(
            "--partition-index", min=0, help="This one (default: $RANK, a gang worker's rank)."
        ),
    ] = None,
    batch: Annotated[
        str | None,
        typer.Option(
            "--batch", help="Names the write's parts (default: $SHAMAL_JOB_ID, the job's id)."
        ),
    ] = None,
    partition_by: Annotated[
        str | None,
        typer.Option("--partition-by", help="A SQL source's column whose hash shares out rows."),
    ] = None,
    fmt: FormatOption = None,
    query: QueryOption = None,
    mode: ModeOption = "append",
    wait_s: Annotated[
        float,
        typer.Option(
            "--commit-timeout",
            min=0,
            help="How long partition 0 waits for every partition to be staged, in seconds.",
        ),
    ] = _COMMIT_WAIT_S,
    as_json: bool = JsonOption,
) -> None:
    """Stage one partition of a source as a part of NAME; partition 0 then waits until every
    partition is staged and commits them as one version. What each worker of `shamal data
    ingest NAME --from SOURCE --as-job --partitions N` runs.

    Example: shamal data ingest-partition events --from s3://raw/events/ --partitions 4
    --partition-index 1 --batch nightly-0611
    """
    if mode not in _MODES:
        raise InvalidParameter(f"--mode is append or overwrite, not {mode!r}")
    index = partition_index if partition_index is not None else _rank()
    label = batch or os.environ.get("SHAMAL_JOB_ID")
    if not label:
        raise InvalidParameter("--batch names the write's parts (a job's workers use its id)")
    shamal = client()
    staged = shamal.stage_partition(
        name,
        source,
        batch=label,
        partition=index,
        partitions=partitions,
        query=query,
        fmt=fmt,
        partition_by=partition_by,
    )
    if not as_json:
        console.print(
            f"staged partition {index} of {partitions}: {staged['rows']:,} rows, "
            f"digest {staged['digest'][:12]}"
        )
    if index != 0:
        if as_json:
            typer.echo(json.dumps(staged))
        return
    deadline = time.monotonic() + wait_s
    while len(_staged(shamal, name, label, partitions)) < partitions:
        if time.monotonic() > deadline:
            raise InvalidParameter(
                f"not every partition of batch {label!r} was staged within {wait_s:.0f} s: "
                "commit later with the same --batch, or stage the missing ones"
            )
        time.sleep(_POLL_S)  # the CLI's polling interval, not a synchronisation
    version = shamal.commit_partitions(name, label, partitions, mode=mode)
    if as_json:
        typer.echo(json.dumps(version))
        return
    console.print(_version_line(version))


def _rank() -> int:
    raw = os.environ.get("RANK", "0")
    if not raw.isdigit():
        raise InvalidParameter("$RANK is not a number: give --partition-index")
    return int(raw)


def _staged(shamal: Any, name: str, batch: str, partitions: int) -> list[dict[str, Any]]:
    return [p for p in shamal.staged_partitions(name, batch) if p["partitions"] == partitions]


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


@app.command("residency")
@handle_errors
def residency(
    name: str,
    allow: Annotated[
        str | None,
        typer.Option(
            "--allow",
            help="Comma-separated regions the data may be stored and processed in, e.g. "
            "ae-dubai,ae-abudhabi (maintainers).",
        ),
    ] = None,
    anywhere: Annotated[
        bool, typer.Option("--anywhere", help="Remove the policy: any region (maintainers).")
    ] = False,
    as_json: bool = JsonOption,
) -> None:
    """Show NAME's residency policy and the stores judged by it; --allow sets it."""
    if allow is not None and anywhere:
        raise InvalidParameter("give --allow REGIONS or --anywhere, not both")
    shamal = client()
    if anywhere:
        found = shamal.set_dataset_residency(name, None)
    elif allow is not None:
        regions = [r.strip() for r in allow.split(",") if r.strip()]
        if not regions:
            raise InvalidParameter("--allow lists regions, e.g. --allow ae-dubai,ae-abudhabi")
        found = shamal.set_dataset_residency(name, regions)
    else:
        found = shamal.dataset_residency(name)
    if as_json:
        typer.echo(json.dumps(found))
        return
    policy = "any region" if found["regions"] is None else ", ".join(found["regions"])
    console.print(f"[bold]{escape(name)}[/]: data may be stored and processed in {escape(policy)}")
    rows = [
        {**s, "region": s["region"] or "(unlabelled)", "allowed": "yes" if s["allowed"] else "no"}
        for s in found["stores"]
    ]
    print_table(
        "Stores", ["name", "region", "allowed", "parts"], rows, rank=["name", "allowed", "region"]
    )


@app.command("copy")
@handle_errors
def copy(
    reference: Annotated[str, typer.Argument(help="NAME/3: the version to copy.")],
    to_store: Annotated[str, typer.Option("--to-store", help="The store to copy it into.")],
    as_json: bool = JsonOption,
) -> None:
    """Copy a version's parts into another store (maintainers); refused when the store's
    region is outside the dataset's residency policy."""
    name, sep, number = reference.removeprefix("data:/").partition("/")
    if not sep or not number.isdigit():
        raise InvalidParameter(f"name the version by number, e.g. {name or 'customers'}/3")
    copied = client().copy_dataset_version(name, int(number), to_store)
    if as_json:
        typer.echo(json.dumps(copied))
        return
    console.print(f"{escape(copied['uri'])} is held in: {escape(', '.join(copied['stores']))}")


def _split_ref(reference: str) -> tuple[str, str]:
    """``NAME/3``, ``NAME@alias`` or ``NAME`` as (name, version within it)."""
    body = reference.removeprefix("data:/")
    if "@" in body:
        name, _, alias = body.partition("@")
        return name, alias
    name, sep, number = body.partition("/")
    return name, number if sep else "latest"


def _signed(value: float | None, digits: int = 4) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return f"{value:+.{digits}g}"


def _shift_word(psi: float | None) -> str:
    if psi is None:
        return "-"
    return "major" if psi > 0.25 else "moderate" if psi > 0.1 else "stable"


def _schema_changes(found: dict[str, Any]) -> dict[str, str]:
    """Column name -> what changed in its schema, for the columns whose schema changed."""
    changes: dict[str, str] = {}
    for column in found["added"]:
        changes[column["name"]] = f"added ({column['type']})"
    for column in found["removed"]:
        changes[column["name"]] = f"removed ({column['type']})"
    for change in found["type_changes"]:
        changes[change["name"]] = f"type {change['before']} -> {change['after']}"
    for name in found["nullability_changes"]:
        changes.setdefault(name, "nullability changed")
    return changes


def _number(value: float | None, spec: str) -> str | None:
    return None if value is None else format(value, spec)


def _diff_rows(found: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per column: its schema change and the shift of its profile."""
    changes = _schema_changes(found)
    rows: list[dict[str, Any]] = [
        {
            "column": c["name"],
            "schema": changes.get(c["name"], "-"),
            "null_rate_change": _signed(c["null_rate_change"]),
            "mean_change": _signed(c["mean_change"]),
            "distinct_change": _number(c["distinct_change"], "+,"),
            "ks": _number(c["ks"], ".3f"),
            "psi": _number(c["psi"], ".3f"),
            "shift": _shift_word(c["psi"]),
        }
        for c in found["columns"]
    ]
    shifted = {c["name"] for c in found["columns"]}
    rows += [{"column": n, "schema": what} for n, what in changes.items() if n not in shifted]
    return rows


@app.command("diff")
@handle_errors
def diff(
    before: Annotated[str, typer.Argument(help="NAME/1, NAME@alias or NAME (latest valid).")],
    after: Annotated[str, typer.Argument(help="Another version of the same dataset.")],
    as_json: bool = JsonOption,
) -> None:
    """How version AFTER differs from BEFORE: schema changes, rows, and each column's shift
    (null rate, mean, distinct count, KS and PSI between their profiles)."""
    name, old = _split_ref(before)
    other, new = _split_ref(after)
    if other != name:
        raise InvalidParameter(
            f"compare two versions of one dataset, e.g. `shamal data diff {name}/1 {name}/2`"
        )
    found = client().diff_dataset_versions(name, old, new)
    if as_json:
        typer.echo(json.dumps(found))
        return
    same = " (the same content)" if found["same_content"] else ""
    console.print(
        f"[bold]{escape(found['before'])}[/] -> [bold]{escape(found['after'])}[/]{same}: "
        f"rows {found['rows_before']:,} -> {found['rows_after']:,} ({found['row_change']:+,})"
    )
    if not found["schema_changed"]:
        console.print("schema: unchanged")
    if "write" in found["profile_scopes"]:
        console.print(
            "[yellow]a profile covers only the rows its write added (a concurrent append): "
            "shifts compare those rows[/]"
        )
    rows = _diff_rows(found)
    print_table(
        f"Columns of {name}",
        [
            "column",
            "schema",
            "null_rate_change",
            "mean_change",
            "distinct_change",
            "ks",
            "psi",
            "shift",
        ],
        rows,
        rank=["column", "shift", "psi", "schema"],
        right=["null_rate_change", "mean_change", "distinct_change", "ks", "psi"],
    )


_FROM_HELP = (
    "The broker: mqtt://host:1883/TOPIC, nats://host:4222/SUBJECT?stream=S, "
    "amqp://USER:PASSWORD@host:5672/QUEUE or redis://host:6379/0?stream=KEY&group=G "
    "(SHAMAL_STREAM_FROM keeps a password off the command line; it is never printed)."
)


@app.command("stream")
@handle_errors
def stream(
    name: str,
    url: Annotated[
        str,
        typer.Option("--from", envvar="SHAMAL_STREAM_FROM", show_envvar=False, help=_FROM_HELP),
    ],
    max_rows: Annotated[
        int, typer.Option(min=1, max=10_000, help="Close a batch at this many records.")
    ] = 1000,
    max_seconds: Annotated[
        float,
        typer.Option(min=0.05, max=86_400, help="Close a batch this long after its first record."),
    ] = 5.0,
    idle_exit: Annotated[
        float | None,
        typer.Option(min=0.1, help="Stop once nothing came for this many seconds (drain, exit)."),
    ] = None,
    as_json: bool = JsonOption,
) -> None:
    """Consume a broker into NAME: each micro-batch becomes a version (append), each record
    is written once (acknowledged only after its version commits; redeliveries are skipped),
    and a record that is not a row is parked (see `shamal data dead-letters`). SIGTERM or
    Ctrl-C stops after committing the open batch."""
    from shamal.datasets import Consumer, describe, open_broker, parse_url

    where = describe(parse_url(url))
    calls = client()
    broker = open_broker(url, batch=max_rows)
    stop = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in _STOP_SIGNALS}

    def sink(stream: str, rows: Any, dead: Any) -> dict[str, Any]:
        return calls.write_stream_batch(name, stream, rows, dead)

    def show(answer: Any) -> None:
        if as_json:
            typer.echo(json.dumps(answer))
            return
        made = answer["version"]["uri"] if answer["version"] else "no new version"
        console.print(
            f"{escape(made)}: +{answer['written']:,} rows, {answer['skipped']:,} skipped "
            f"(already written), {answer['parked']:,} parked"
        )

    try:
        if not as_json:
            err_console.print(f"consuming {escape(where)} into {escape(name)}; Ctrl-C stops")
        consumer = Consumer(broker, sink, max_rows=max_rows, max_seconds=max_seconds)
        totals = consumer.run(stop, on_batch=show, idle_exit=idle_exit)
    finally:
        broker.close()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if as_json:
        typer.echo(json.dumps({"totals": asdict(totals)}))
        return
    console.print(
        f"stopped: {totals.batches} batch(es), {totals.written:,} rows written, "
        f"{totals.skipped:,} skipped, {totals.parked:,} parked"
    )


@app.command("dead-letters")
@handle_errors
def dead_letters(
    name: str,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 100,
    as_json: bool = JsonOption,
) -> None:
    """Stream records of NAME that were parked (not a row): the reason and the payload's
    sha256, never the payload."""
    found = client().dead_letters(name, limit=limit)
    if as_json:
        typer.echo(json.dumps(found))
        return
    rows = [{**d, "digest": d["digest"][:16]} for d in found]
    print_table(
        f"Parked records of {name}",
        ["created_at", "stream", "key", "reason", "size", "digest"],
        rows,
        rank=["key", "reason", "stream", "created_at"],
    )


@app.command("privacy")
@handle_errors
def privacy(
    name: str,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file", exists=True, dir_okay=False, help="The privacy policy, as YAML or JSON."
        ),
    ] = None,
    remove: Annotated[bool, typer.Option("--remove", help="Stop pseudonymizing.")] = False,
) -> None:
    """Pseudonymize the personal columns of every new version of NAME under a policy
    (maintainers): hmac (per purpose), tokenize (reversible by privacy officers), drop or
    generalize each, before any byte is stored. Without options, print the policy in force.

    \b
    version: 1
    columns:
      email: {action: hmac, purpose: crm}
      phone: {action: tokenize, purpose: support}
      name: {action: drop}
      birth_date: {action: generalize, to: month}
      income: {action: generalize, width: 1000}
    """
    shamal = client()
    if remove:
        shamal.set_dataset_privacy(name, None)
        console.print(f"{escape(name)}: new versions are no longer pseudonymized")
        return
    if file is None:
        current = shamal.get_dataset_privacy(name)["yaml"]
        typer.echo(current if current is not None else f"{name} has no privacy policy")
        return
    shamal.set_dataset_privacy(name, file.read_text(encoding="utf-8"))
    console.print(f"{escape(name)}: new versions are pseudonymized under {escape(file.name)}")


def _subject(given: str) -> str:
    """The subject as given, or (``-``) the first line of standard input: a value on the
    command line stays in the shell's history."""
    if given != "-":
        return given
    line = typer.get_text_stream("stdin").readline().rstrip("\r\n")
    if not line:
        raise InvalidParameter("--subject -: standard input held no value")
    return line


@app.command("erase")
@handle_errors
def erase(
    name: str,
    subject: Annotated[
        str,
        typer.Option(
            "--subject", help="The data subject's value in the column ('-': read it from stdin)."
        ),
    ],
    column: Annotated[str, typer.Option("--column", help="The column that identifies them.")],
    as_json: bool = JsonOption,
) -> None:
    """Erase a data subject: remove their rows from EVERY version of NAME (the affected
    Parquet parts are rewritten, the old ones deleted). Maintainers and privacy officers;
    audited, the subject kept only as a keyed hash."""
    done = client().erase_subject(name, column, _subject(subject))
    if as_json:
        typer.echo(json.dumps(done))
        return
    changed = ", ".join(str(v["version"]) for v in done["versions"]) or "none"
    console.print(
        f"erasure {done['id']}: removed {done['rows_removed']:,} row(s) from "
        f"{escape(name)} (versions changed: {changed})"
    )


@app.command("erasures")
@handle_errors
def erasures(name: str, as_json: bool = JsonOption) -> None:
    """The erasures made in NAME (maintainers and privacy officers)."""
    rows = [
        {**e, "versions": ", ".join(str(v["version"]) for v in e["versions"])}
        for e in client().dataset_erasures(name)
    ]
    print_table(
        f"Erasures of {name}",
        ["id", "column", "rows_removed", "versions", "created_by", "created_at"],
        rows,
        as_json=as_json,
        rank=["id", "rows_removed", "column", "created_at"],
        right=["rows_removed"],
    )


@app.command("reveal")
@handle_errors
def reveal(
    name: str,
    tokens: Annotated[list[str], typer.Argument(help="Tokens of the column.")],
    column: Annotated[str, typer.Option("--column", help="The tokenized column.")],
    as_json: bool = JsonOption,
) -> None:
    """The values behind tokenized values of a column of NAME (privacy officers; audited)."""
    values = client().reveal_tokens(name, column, tokens)
    if as_json:
        typer.echo(json.dumps(dict(zip(tokens, values, strict=True))))
        return
    for token, value in zip(tokens, values, strict=True):
        shown = "[red](not a token of this column)[/]" if value is None else escape(value)
        console.print(f"{escape(token)}\t{shown}")


@app.command("rotate-privacy-key")
@handle_errors
def rotate_privacy_key() -> None:
    """Make a new pseudonymization key active (platform admins). Older tokens still reveal
    and still match for erasure; new hmac tokens differ from old ones."""
    key = client().rotate_privacy_key()
    console.print(f"[green]new pseudonymization key[/] {escape(key)}")
