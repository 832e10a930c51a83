"""Code snapshots: a job's working folder as one content-addressed archive.

``build`` packs a folder the way ``git`` would see it: files ignored by the
``.gitignore`` files of the folder and its subfolders, of its parent folders up to the
repository root (the folder holding ``.git``) and by the repository's
``.git/info/exclude`` are left out, and so are ``.git`` itself and anything that is not
a regular file (symlinks, devices, sockets). The user's own ``core.excludesFile`` is
not read: a snapshot depends on the repository, not on who builds it. The archive is a gzip'd
tar written deterministically (sorted names, zero times and owners, normalised modes),
so the same tree always gives the same bytes and the same sha256: the snapshot's name.
Submitting an unchanged folder twice uploads nothing the second time.

``extract`` is the other end, on the machine that runs the job. It treats the archive
as hostile: only regular files and folders, no absolute names, no ``..``, no links,
bounded total size and file count; anything else stops it with :class:`SnapshotError`
before a byte lands outside the destination.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import logging
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pathspec

__all__ = [
    "MAX_SNAPSHOT_BYTES",
    "MAX_SNAPSHOT_FILES",
    "Snapshot",
    "SnapshotError",
    "build",
    "check",
    "extract",
    "is_digest",
]

logger = logging.getLogger(__name__)

MAX_SNAPSHOT_BYTES = 1024 * 1024 * 1024
"""Largest snapshot (uncompressed) a job may carry; data belongs in datasets, not code."""
MAX_SNAPSHOT_FILES = 100_000

_ALWAYS_SKIPPED = frozenset({".git", ".hg", ".svn", "__pycache__"})


class SnapshotError(ValueError):
    """The folder or the archive cannot be a snapshot (too large, hostile, unreadable)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A built snapshot: the archive file, its sha256 and what it holds."""

    path: Path
    digest: str
    files: int
    bytes_in: int

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def is_digest(value: str) -> bool:
    """True for a lowercase hex sha256, the only form a snapshot name takes."""
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _spec_of(path: Path) -> pathspec.GitIgnoreSpec | None:
    """The patterns of one ignore file (``None`` when there is no readable file)."""
    if not path.is_file():
        return None
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _repository_root(folder: Path) -> Path | None:
    """The folder holding ``.git`` (a folder, or a file in worktrees and submodules) at or
    above ``folder``, or ``None`` outside any repository."""
    for candidate in (folder, *folder.parents):
        if (candidate / ".git").exists():
            return candidate
    return None


Specs = list[tuple[str, pathspec.GitIgnoreSpec]]
"""(folder the patterns belong to, relative to the repository root; its patterns),
outermost and weakest first."""


def _inherited_specs(folder: Path) -> tuple[str, Specs]:
    """Where ``folder`` sits in its repository and the patterns that reach it from outside:
    ``.git/info/exclude``, then the ``.gitignore`` of each folder from the repository root
    down to (not including) ``folder``. Outside a repository: ``("", [])``.
    """
    root = _repository_root(folder)
    if root is None:
        return "", []
    specs: Specs = []
    exclude = _spec_of(root / ".git" / "info" / "exclude")
    if exclude is not None:
        specs.append(("", exclude))
    prefix = folder.relative_to(root).as_posix()
    parts = [] if prefix == "." else prefix.split("/")
    for depth in range(len(parts)):
        spec = _spec_of(root.joinpath(*parts[:depth], ".gitignore"))
        if spec is not None:
            specs.append(("/".join(parts[:depth]), spec))
    return ("" if prefix == "." else prefix), specs


def _ignored(specs: Specs, rel: str, is_dir: bool) -> bool:
    # Weakest first; a later (deeper) file's verdict overrides theirs (git's rule).
    verdict = False
    for base, spec in specs:
        if base and not rel.startswith(base + "/"):
            continue
        sub = rel[len(base) + 1 :] if base else rel
        include = spec.check_file(sub + "/" if is_dir else sub).include
        if include is not None:
            verdict = include
    return verdict


def _walk(folder: Path) -> Iterator[tuple[str, Path]]:
    """(posix name relative to ``folder``, path) of every file git would keep, sorted.

    Patterns are matched as git matches them: against the path from the repository
    root, so that a parent folder's ``.gitignore`` (anchored patterns included) and
    ``.git/info/exclude`` apply inside ``folder`` too.
    """
    prefix, specs = _inherited_specs(folder)

    def visit(directory: Path, rel_dir: str) -> Iterator[tuple[str, Path]]:
        from_root = f"{prefix}/{rel_dir}".strip("/")
        spec = _spec_of(directory / ".gitignore")
        if spec is not None:
            specs.append((from_root, spec))
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            raise SnapshotError(f"cannot read {directory}: {exc.strerror}") from None
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            path_from_root = f"{from_root}/{entry.name}" if from_root else entry.name
            if entry.name in _ALWAYS_SKIPPED:
                continue
            if entry.is_symlink():
                logger.info("snapshot: skipping symlink %s", rel)
            elif entry.is_dir():
                if not _ignored(specs, path_from_root, True):
                    yield from visit(Path(entry.path), rel)
            elif entry.is_file() and not _ignored(specs, path_from_root, False):
                yield rel, Path(entry.path)
        if spec is not None:
            specs.pop()

    yield from visit(folder, "")


def _unreadable(folder: Path, rel: str, exc: OSError) -> SnapshotError:
    return SnapshotError(
        f"cannot read {rel} in {folder} ({exc.strerror}): make it readable or add it to .gitignore"
    )


def build(folder: Path, out_dir: Path | None = None) -> Snapshot:
    """Pack ``folder`` into a deterministic ``.tar.gz``; returns where it is and its digest.

    Raises:
        SnapshotError: not a folder, unreadable, or larger than the limits.
    """
    folder = folder.resolve()
    if not folder.is_dir():
        raise SnapshotError(f"{folder} is not a folder")
    fd, tmp_name = tempfile.mkstemp(prefix="shamal-snapshot-", suffix=".tar.gz", dir=out_dir)
    tmp = Path(tmp_name)
    files = total = 0
    try:
        with (
            os.fdopen(fd, "wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped,
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for rel, path in _walk(folder):
                try:
                    info = path.stat()
                except OSError as exc:
                    raise _unreadable(folder, rel, exc) from None
                files += 1
                total += info.st_size
                if files > MAX_SNAPSHOT_FILES or total > MAX_SNAPSHOT_BYTES:
                    raise SnapshotError(
                        f"{folder} holds more than {MAX_SNAPSHOT_FILES:,} files or "
                        f"{MAX_SNAPSHOT_BYTES // 2**20:,} MiB: add data and outputs to .gitignore"
                    )
                entry = tarfile.TarInfo(rel)
                entry.size = info.st_size
                entry.mode = 0o755 if info.st_mode & stat.S_IXUSR else 0o644
                entry.mtime = 0
                try:
                    handle = path.open("rb")
                except OSError as exc:
                    raise _unreadable(folder, rel, exc) from None
                with handle:
                    tar.addfile(entry, handle)
        digest = hashlib.sha256()
        with tmp.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return Snapshot(tmp, digest.hexdigest(), files, total)


def _check_member(member: tarfile.TarInfo, seen: dict[str, int]) -> None:
    name = PurePosixPath(member.name)
    if member.name.startswith("/") or name.is_absolute() or ".." in name.parts or not name.parts:
        raise SnapshotError(f"refusing archive entry {member.name[:200]!r}: outside the folder")
    if "\x00" in member.name or any(part in ("", ".") for part in member.name.split("/")):
        raise SnapshotError(f"refusing archive entry {member.name[:200]!r}: malformed name")
    if not (member.isfile() or member.isdir()):
        raise SnapshotError(f"refusing archive entry {member.name[:200]!r}: not a regular file")
    seen["files"] += 1
    seen["bytes"] += member.size
    if seen["files"] > MAX_SNAPSHOT_FILES or seen["bytes"] > MAX_SNAPSHOT_BYTES:
        raise SnapshotError("archive is larger than a snapshot may be")


def check(archive: Path) -> int:
    """Read a whole archive without writing anything; returns its file count.

    Raises:
        SnapshotError: as :func:`extract` would.
    """
    seen = {"files": 0, "bytes": 0}
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            for member in tar:
                _check_member(member, seen)
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, OSError) as exc:
        raise SnapshotError(f"not a readable snapshot archive ({type(exc).__name__})") from None
    return seen["files"]


def extract(archive: Path | bytes, dest: Path) -> int:
    """Unpack a snapshot into the empty or new folder ``dest``; returns the file count.

    Raises:
        SnapshotError: the archive is not a gzip'd tar, or holds anything a snapshot
            cannot (links, devices, absolute or escaping names, too many bytes).
    """
    dest.mkdir(parents=True, exist_ok=True)
    source = io.BytesIO(archive) if isinstance(archive, bytes) else archive.open("rb")
    seen = {"files": 0, "bytes": 0}
    try:
        with tarfile.open(fileobj=source, mode="r:gz") as tar:
            members = []
            for member in tar:
                _check_member(member, seen)
                members.append(member)
            # The checks above already refuse what the 'data' filter would; the filter
            # stays as a second line of defence.
            tar.extractall(dest, members=members, filter="data")
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, OSError) as exc:
        raise SnapshotError(f"not a readable snapshot archive ({type(exc).__name__})") from None
    finally:
        source.close()
    return seen["files"]
