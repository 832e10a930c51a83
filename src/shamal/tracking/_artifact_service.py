"""Run and model artifacts behind the ``mlflow-artifacts:/`` proxy.

A proxy path is ``<experiment id>/<rest>``: files live in the artifact store's
namespace ``mlflow/<experiment id>`` and follow the experiment's access rules
(viewers read, members write, maintainers delete). Every path passes the one
path validator before anything is looked up.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from shamal.artifacts import ArtifactFile, ArtifactService, safe_relpath
from shamal.errors import InvalidParameter, NotFound
from shamal.security import AuditContext, Principal, Role
from shamal.tracking._access import RunAccess

#: The most entries one folder listing holds (a stock server lists every one; this bounds
#: the answer of a folder of millions of files).
MAX_LISTED = 100_000


@dataclass(frozen=True, slots=True)
class ListedFile:
    """One entry of a folder listing: a name relative to the folder."""

    path: str
    is_dir: bool
    file_size: int | None


def children(
    files: Iterable[ArtifactFile], folder: str, *, file_itself: bool = True
) -> list[ListedFile]:
    """The immediate children of ``folder`` among ``files`` (paths relative to the namespace).

    When ``folder`` names a file, the listing is that file alone, or nothing when
    ``file_itself`` is False (what a stock server's ``artifacts/list`` answers).
    """
    found: dict[str, ListedFile] = {}
    prefix = f"{folder}/" if folder else ""
    for f in files:
        if f.path == folder:
            if not file_itself:
                return []
            return [ListedFile(f.path.rsplit("/", 1)[-1], False, f.size)]
        if not f.path.startswith(prefix):
            continue
        head, sep, _ = f.path[len(prefix) :].partition("/")
        if sep:
            found.setdefault(head, ListedFile(head, True, None))
        else:
            found[head] = ListedFile(head, False, f.size)
    return sorted(found.values(), key=lambda f: f.path)


class RunArtifacts:
    """The files of experiments, runs and logged models."""

    def __init__(self, artifacts: ArtifactService, tracking: RunAccess) -> None:
        self._artifacts = artifacts
        self._tracking = tracking

    def _locate(self, principal: Principal, path: str, needed: Role) -> tuple[str, str]:
        """(namespace, path inside it) for a proxy path, after the access check."""
        clean = safe_relpath(path)
        experiment_id, _, rest = clean.partition("/")
        if not experiment_id.isdigit():
            raise InvalidParameter("Artifact paths start with an experiment id.")
        self._tracking.experiment(principal, experiment_id, needed)
        return f"mlflow/{experiment_id}", rest

    def upload(self, ctx: AuditContext, path: str, chunks: Iterable[bytes]) -> ArtifactFile:
        namespace, rest = self._locate(ctx.require_principal(), path, Role.MEMBER)
        if not rest:
            raise InvalidParameter("Give a file path below the experiment.")
        ctx.target = f"artifact:{path}"
        return self._artifacts.store_file(ctx, namespace, rest, chunks)

    def download(self, principal: Principal, path: str) -> tuple[ArtifactFile, Iterator[bytes]]:
        namespace, rest = self._locate(principal, path, Role.VIEWER)
        if not rest:
            raise NotFound("Artifact not found.")
        return self._artifacts.read_file(namespace, rest)

    def listing(
        self, principal: Principal, path: str, *, file_itself: bool = True
    ) -> list[ListedFile]:
        """The children of the folder ``path``; see :func:`children` for a file's path."""
        namespace, rest = self._locate(principal, path, Role.VIEWER)
        files = self._artifacts.folder_files(namespace, rest, MAX_LISTED)
        return children(files, rest, file_itself=file_itself)

    def delete(self, ctx: AuditContext, path: str) -> None:
        namespace, rest = self._locate(ctx.require_principal(), path, Role.MAINTAINER)
        ctx.target = f"artifact:{path}"
        if not rest or not self._artifacts.remove_files(ctx, namespace, rest):
            raise NotFound("Artifact not found.")

    def list_run(
        self, principal: Principal, run_id: str, path: str
    ) -> tuple[str, list[ListedFile]]:
        """(root uri, children of ``path``) of a run's artifacts: the `artifacts/list` call."""
        root = self._tracking.run_info(principal, run_id).artifact_uri
        proxy = root.removeprefix("mlflow-artifacts:/")
        folder = f"{proxy}/{safe_relpath(path)}" if path.strip("/") else proxy
        listed = self.listing(principal, folder, file_itself=False)
        prefix = path.strip("/")
        return root, [
            ListedFile(f"{prefix}/{f.path}" if prefix else f.path, f.is_dir, f.file_size)
            for f in listed
        ]
