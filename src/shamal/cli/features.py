"""`shamal features ...`: definitions as code, training sets, and online features.

Definitions live in the user's repository, in YAML or Python (`from shamal.features import
Entity, FeatureView, ...`). `shamal features plan [PATH]` shows what applying them would change
on the server, `shamal features apply [PATH]` applies it (refused, with the reasons, when it
would break a feature service a deployment uses). `materialize` fills the online store,
`online` reads it, `historical` builds a point-in-time-correct training set.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from shamal.cli._common import JsonOption, client, console, escape, handle_errors, print_table
from shamal.errors import InvalidParameter

app = typer.Typer(
    help="Feature store: plan and apply definitions, build training sets, serve online features.",
    no_args_is_help=True,
)

_ACTION_STYLE = {"create": "green", "update": "yellow", "delete": "red"}

RepoArgument = typer.Argument(
    help="A YAML or Python file of definitions, or a folder of them (default: this folder)."
)
PruneOption = typer.Option(
    "--prune", help="Delete what the server holds and these definitions leave out."
)


def _load(path: Path) -> dict[str, Any]:
    from shamal.features import load_repo

    definitions: dict[str, Any] = load_repo(path).to_json()
    return definitions


def print_plan(found: dict[str, Any]) -> None:
    """A plan as lines: + create, ~ update (with the fields), - delete, then what breaks."""
    changes = found.get("changes", [])
    if not changes:
        console.print("No changes: the server's registry matches these definitions.")
    for change in changes:
        style = _ACTION_STYLE.get(change["action"], "white")
        mark = {"create": "+", "update": "~", "delete": "-"}.get(change["action"], "?")
        kind = change["kind"].replace("_", " ")
        fields = (
            f" [dim]({escape(', '.join(change.get('fields') or []))})[/]"
            if change.get("fields")
            else ""
        )
        console.print(f"[{style}]{mark} {kind} {escape(change['name'])}[/]{fields}")
    for reason in found.get("breaking", []):
        console.print(f"[bold red]breaks:[/] {escape(reason)}")


def _send(path: Path, prune: bool, as_json: bool, apply: bool) -> dict[str, Any] | None:
    """The repository's definitions planned (or applied) on the server; the answer, or None
    once it was printed as JSON."""
    with client() as c:
        send = c.apply_features if apply else c.plan_features
        found = send(_load(path), prune=prune)
    if as_json:
        console.print_json(json.dumps(found))
        return None
    print_plan(found)
    return found


@app.command("plan")
@handle_errors
def plan(
    path: Annotated[Path, RepoArgument] = Path("."),
    prune: Annotated[bool, PruneOption] = False,
    as_json: bool = JsonOption,
) -> None:
    """Show what `apply` would change on the server (exit 1 when it would be refused).

    Example: shamal features plan features/
    """
    found = _send(path, prune, as_json, apply=False)
    if found is not None and found.get("breaking"):
        raise typer.Exit(1)


@app.command("apply")
@handle_errors
def apply(
    path: Annotated[Path, RepoArgument] = Path("."),
    prune: Annotated[bool, PruneOption] = False,
    as_json: bool = JsonOption,
) -> None:
    """Apply the definitions: each changed object gets a new version, audited.

    Example: shamal features apply features/
    """
    found = _send(path, prune, as_json, apply=True)
    if found is not None and found.get("number") is not None:
        console.print(f"Applied as registry number {found['number']}.")


@app.command("list")
@handle_errors
def list_objects(
    kind: Annotated[
        str | None,
        typer.Option("--kind", help="entity, feature_view or feature_service (default: all)."),
    ] = None,
    as_json: bool = JsonOption,
) -> None:
    """The live definitions, with their versions and owners."""
    with client() as c:
        found = c.feature_objects(kind)
    rows = [
        {
            "kind": o["kind"],
            "name": o["name"],
            "version": o["version"],
            "owner": o["owner"],
            "created_by": o["created_by"],
            "created_at": o["created_at"],
        }
        for o in found
    ]
    print_table(
        "Feature definitions",
        ["kind", "name", "version", "owner", "created_by", "created_at"],
        rows,
        as_json=as_json,
        right=("version",),
    )


@app.command("history")
@handle_errors
def history(
    kind: Annotated[str, typer.Argument(help="entity, feature_view or feature_service")],
    name: Annotated[str, typer.Argument(help="The definition's name.")],
    as_json: bool = JsonOption,
) -> None:
    """Every version of one definition, newest first."""
    with client() as c:
        found = c.feature_object_versions(kind, name)
    rows = [
        {
            "version": o["version"],
            "deleted": o["deleted"],
            "apply": o["apply_number"],
            "created_by": o["created_by"],
            "created_at": o["created_at"],
            "digest": o["digest"][:12],
        }
        for o in found
    ]
    print_table(
        f"{kind.replace('_', ' ')} {name}",
        ["version", "deleted", "apply", "created_by", "created_at", "digest"],
        rows,
        as_json=as_json,
        right=("version", "apply"),
    )


@app.command("materialize")
@handle_errors
def materialize(
    views: Annotated[
        list[str] | None, typer.Argument(help="Feature views (default: every online one).")
    ] = None,
    incremental: Annotated[
        bool, typer.Option("--incremental", help="Only rows newer than the last run's end.")
    ] = False,
    end: Annotated[
        str | None, typer.Option("--end", help="Event times up to this ISO-8601 time (now).")
    ] = None,
    as_json: bool = JsonOption,
) -> None:
    """Write each entity's newest feature row into the online store.

    A run cut short (the server killed) is resumed by running this again.

    Example: shamal features materialize customer_stats --incremental
    """
    started = time.monotonic()
    with client() as c, console.status("materializing ..."):
        found = c.materialize_features(views, end=end, incremental=incremental)
    rows = [
        {
            "view": m["view"],
            "version": m["view_version"],
            "state": m["state"],
            "rows": m["rows"],
            "chunks": f"{m['chunks_done']}/{m['chunks_total']}",
            "source": m["source"],
        }
        for m in found
    ]
    print_table(
        "Materializations",
        ["view", "version", "state", "rows", "chunks", "source"],
        rows,
        as_json=as_json,
        right=("version", "rows"),
    )
    if not as_json:
        console.print(f"[dim]{time.monotonic() - started:.1f} s[/]")


def _entity_columns(pairs: list[str]) -> dict[str, list[Any]]:
    columns: dict[str, list[Any]] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise InvalidParameter(f"an entity is KEY=VALUE[,VALUE...], not {pair[:80]!r}")
        values: list[Any] = []
        for text in raw.split(","):
            try:
                values.append(json.loads(text))
            except json.JSONDecodeError:
                values.append(text)
        columns[key] = values
    return columns


@app.command("online")
@handle_errors
def online(
    entity: Annotated[
        list[str],
        typer.Option(
            "--entity", "-e", help="KEY=VALUE[,VALUE...]: join key values, one per entity."
        ),
    ],
    feature: Annotated[
        list[str] | None, typer.Option("--feature", "-f", help="VIEW:FEATURE or VIEW:*.")
    ] = None,
    service: Annotated[str | None, typer.Option("--service", help="A feature service.")] = None,
    as_json: bool = JsonOption,
) -> None:
    """Read online features of entities.

    Example: shamal features online -e customer_id=1001,1002 -f customer_stats:*
    """
    with client() as c:
        found = c.online_features(
            _entity_columns(entity), features=feature, feature_service=service
        )
    if as_json:
        console.print_json(json.dumps(found))
        return
    entities = found["entities"]
    count = len(next(iter(entities.values()), []))
    rows = []
    for i in range(count):
        row = {k: v[i] for k, v in entities.items()}
        for name, values in found["features"].items():
            status = found["status"][found["views"][name]][i]
            row[name] = values[i] if status == "present" else f"({status})"
        rows.append(row)
    print_table("Online features", [*entities, *found["features"]], rows)


@app.command("historical")
@handle_errors
def historical(
    entities: Annotated[
        str,
        typer.Argument(
            help="The entity rows: a dataset (NAME, NAME/3, NAME@alias) or a Parquet file."
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Write the training set here (Parquet).")
    ],
    feature: Annotated[
        list[str] | None, typer.Option("--feature", "-f", help="VIEW:FEATURE or VIEW:*.")
    ] = None,
    service: Annotated[str | None, typer.Option("--service", help="A feature service.")] = None,
    timestamp: Annotated[
        str, typer.Option("--timestamp", help="The entity rows' time column.")
    ] = "event_timestamp",
    sql: Annotated[
        str | None, typer.Option("--sql", help="A SELECT over the dataset's rows (`source`).")
    ] = None,
    save_as: Annotated[
        str | None, typer.Option("--save-as", help="Also save it as a version of this dataset.")
    ] = None,
) -> None:
    """Build a point-in-time-correct training set.

    Example: shamal features historical orders@prod -f customer_stats:* -o train.parquet
    """
    import pyarrow.parquet as pq

    rows: Any = entities
    if entities.endswith(".parquet") and Path(entities).is_file():
        rows = pq.read_table(entities)
    with client() as c, console.status("joining ..."):
        table, headers = c.historical_features(
            rows,
            features=feature,
            feature_service=service,
            timestamp=timestamp,
            sql=sql,
            save_as=save_as,
        )
    pq.write_table(table, out, compression="zstd")
    console.print(
        f"{table.num_rows:,} rows x {table.num_columns} columns written to {escape(str(out))}"
    )
    if headers.get("x-shamal-views"):
        console.print(f"[dim]from {escape(headers['x-shamal-views'])}[/]")
    if headers.get("x-shamal-saved-as"):
        console.print(f"saved as {escape(headers['x-shamal-saved-as'])}")
