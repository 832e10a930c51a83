"""`shamal artifacts`: a team's files in the artifact store, and the encryption keys."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from shamal.cli._common import JsonOption, client, console, handle_errors, print_table
from shamal.config import Settings
from shamal.errors import InvalidParameter

app = typer.Typer(
    help="Artifacts: upload, download, list and delete a team's files.", no_args_is_help=True
)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


def _files_under(source: Path) -> list[tuple[Path, str]]:
    if source.is_file():
        return [(source, source.name)]
    return [
        (p, p.relative_to(source).as_posix())
        for p in sorted(source.rglob("*"))
        if p.is_file() and not p.is_symlink()
    ]


@app.command("put")
@handle_errors
def put(
    team: str,
    source: Annotated[Path, typer.Argument(exists=True, help="A file or a folder (recursive).")],
    dest: Annotated[str, typer.Option("--to", help="Folder in the team's tree.")] = "",
) -> None:
    """Upload a file or a whole folder, streaming, with a progress bar."""
    files = _files_under(source)
    total = sum(p.stat().st_size for p, _ in files)
    api = client()
    with _progress() as progress:
        task = progress.add_task(f"uploading {len(files)} file(s)", total=total)
        for local, rel in files:
            remote = f"{dest.strip('/')}/{rel}" if dest.strip("/") else rel
            with local.open("rb") as handle:
                api.upload_artifact(
                    team, remote, handle, on_progress=lambda n: progress.advance(task, n)
                )
    console.print(f"[green]uploaded[/] {len(files)} file(s) to {team}")


@app.command("get")
@handle_errors
def get(
    team: str,
    path: str,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Default: file name.")
    ] = None,
) -> None:
    """Download a file; its sha256 is verified by the server as it streams."""
    api = client()
    target = output or Path(path.rsplit("/", 1)[-1])
    size = next((f["size"] for f in api.list_artifacts(team, path) if f["path"] == path), None)
    if size is None:
        raise InvalidParameter(f"no artifact {path!r} in team {team!r}; see `shamal artifacts ls`")
    partial = target.with_name(target.name + ".part")
    with _progress() as progress, partial.open("wb") as out:
        task = progress.add_task(f"downloading {path}", total=size)
        for chunk in api.download_artifact(team, path):
            out.write(chunk)
            progress.advance(task, len(chunk))
    partial.replace(target)
    console.print(f"[green]saved[/] {target}")


@app.command("ls")
@handle_errors
def ls(
    team: str,
    prefix: Annotated[str, typer.Option("--prefix", "-p")] = "",
    as_json: bool = JsonOption,
) -> None:
    """List a team's files."""
    print_table(
        f"Artifacts of {team}",
        ["path", "size", "digest", "created_by", "created_at"],
        client().list_artifacts(team, prefix),
        as_json=as_json,
    )


@app.command("rm")
@handle_errors
def rm(team: str, path: str) -> None:
    """Delete a file (maintainers)."""
    client().delete_artifact(team, path)
    console.print(f"deleted {path}")


@app.command("rotate-key")
@handle_errors
def rotate_key(
    retire_old: Annotated[
        bool,
        typer.Option(
            "--retire-old", help="Drop the old master keys once every blob key is re-wrapped."
        ),
    ] = False,
) -> None:
    """Rotate the master key of encryption at rest (run where the server's SHAMAL_HOME is).

    Adds a new master key and re-wraps every blob's data key with it, in the artifact store
    and in every data store; the blobs themselves are not rewritten.
    """
    from shamal.artifacts import Keyring, open_blob_store, open_data_stores

    settings = Settings()
    if not settings.encrypt_artifacts:
        raise InvalidParameter("encryption at rest is off: set SHAMAL_ENCRYPT_ARTIFACTS=true")
    key_file = settings.resolved_master_key_file
    keyring = Keyring.load_or_create(key_file)
    old = [k for k in keyring.key_ids if k != keyring.active_id]
    old.append(keyring.active_id)
    new_id = keyring.add_key()
    keyring.save(key_file)
    with console.status("re-wrapping data keys..."):
        count = open_blob_store(settings).rotate_master_key(keyring)
        # The data stores' blobs are wrapped by the same keyring: re-wrapped with it.
        for blobs, _region in open_data_stores(settings, keyring).values():
            count += blobs.rotate_master_key(keyring)
    console.print(f"[green]new master key[/] {new_id}; re-wrapped {count} blob key(s)")
    if retire_old:
        for key_id in old:
            keyring.retire(key_id)
        keyring.save(key_file)
        console.print(f"retired {len(old)} old key(s)")
