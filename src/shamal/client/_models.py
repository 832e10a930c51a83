"""Client calls about model files: resolving ``models:/`` URIs, fetching a version's files,
and registering optimized variants as new versions.

Everything goes through the MLflow-dialect routes every MLflow client already speaks
(``/api/2.0/mlflow/...``) and the ``mlflow-artifacts`` proxy, so the calls work against any
server that speaks that dialect.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any
from urllib.parse import quote

import httpx

from shamal.client._calls import CHUNK, ClientCalls, raise_for
from shamal.errors import (
    InvalidParameter,
    NotFound,
    ServiceUnavailable,
)

__all__ = ["MODEL_MARKERS", "ModelCalls", "ModelRef"]

logger = logging.getLogger(__name__)

MLFLOW = "/api/2.0/mlflow"
ARTIFACTS = "/api/2.0/mlflow-artifacts/artifacts"
ARTIFACT_SCHEME = "mlflow-artifacts:/"
#: Files that mark the folder holding a model, in the order they are looked for.
MODEL_MARKERS = ("MLmodel", "model.onnx", "shamal-model.json", "shamal-variants.json")
_MAX_FILES = 10_000
_MAX_DEPTH = 32
_VERSION = re.compile(r"[1-9][0-9]{0,9}")


@dataclass(frozen=True, slots=True)
class ModelRef:
    """One registry version, as ``models:/`` URIs name it.

    Attributes:
        name: the registered model's name.
        version: the version number (1, 2, ...).
        source: the source the version was created from (``runs:/...``, ``mlflow-artifacts:/...``).
        run_id: the run that produced the version, when known.
        tags: the version's tags.
    """

    name: str
    version: int
    source: str
    run_id: str | None
    tags: dict[str, str]

    @property
    def uri(self) -> str:
        """``models:/NAME/VERSION``: the exact version, whatever alias named it."""
        return f"models:/{self.name}/{self.version}"


def _ref_of(message: Mapping[str, Any]) -> ModelRef:
    tags = {str(t["key"]): str(t.get("value", "")) for t in message.get("tags") or []}
    return ModelRef(
        name=str(message["name"]),
        version=int(message["version"]),
        source=str(message.get("source") or ""),
        run_id=message.get("run_id") or None,
        tags=tags,
    )


def _parse_version(text: str, uri: str) -> int:
    if not _VERSION.fullmatch(text):
        raise InvalidParameter(
            f"{uri!r}: the version must be a positive number, 'latest' or '@alias'."
        )
    return int(text)


#: A first segment that reads as a drive ("C:") or a URL scheme ("file:"), as the server's
#: path rule refuses it; a colon further on is part of a name ("2026-11-22T05:20:00.png").
_DRIVE_OR_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")


def _safe_member(path: str) -> PurePosixPath:
    """A server-listed relative path, refused unless it is plainly relative and inside."""
    if not path or "\\" in path or "\x00" in path or path.startswith("/"):
        raise InvalidParameter("The server listed a file with an unsafe path; nothing was written.")
    parts = PurePosixPath(path).parts
    if any(part in ("", ".", "..") for part in parts) or _DRIVE_OR_SCHEME.match(parts[0]):
        raise InvalidParameter("The server listed a file with an unsafe path; nothing was written.")
    if os.name == "nt" and any(":" in part for part in parts):  # a stream of another file
        raise InvalidParameter("The server listed a file with an unsafe path; nothing was written.")
    if any(not ch.isprintable() for ch in path):
        raise InvalidParameter("The server listed a file with an unsafe path; nothing was written.")
    return PurePosixPath(*parts)


def _contained(root: Path, member: PurePosixPath) -> Path:
    target = (root / member).resolve()
    if not target.is_relative_to(root):
        raise InvalidParameter("A listed file would land outside the destination; refused.")
    return target


class ModelCalls(ClientCalls):
    """Calls used by ``shamal optimize``, ``shamal serve`` and ``shamal models promote``."""

    # ------------------------------------------------------------------ reading versions
    def get_model_version(self, name: str, version: int) -> ModelRef:
        """One version of a registered model.

        Raises:
            NotFound: no such model or version (or it is not visible to the caller).
        """
        found = self.request(
            "GET", f"{MLFLOW}/model-versions/get", params={"name": name, "version": str(version)}
        )
        return _ref_of(found["model_version"])

    def resolve_model_uri(self, uri: str) -> ModelRef:
        """The version a ``models:/`` URI names.

        Accepts ``models:/NAME/VERSION``, ``models:/NAME@ALIAS`` and ``models:/NAME/latest``
        (the highest version number).

        Raises:
            InvalidParameter: the URI is not one of those forms.
            NotFound: the model, version or alias does not exist (or is not visible).
        """
        if not uri.startswith("models:/"):
            raise InvalidParameter(f"{uri!r} is not a models:/ URI (models:/NAME/VERSION).")
        rest = uri.removeprefix("models:/")
        if "@" in rest:
            name, _, alias = rest.rpartition("@")
            if not name or not alias or "/" in alias:
                raise InvalidParameter(f"{uri!r}: expected models:/NAME@ALIAS.")
            # Shamal's own model read, not the MLflow dialect's alias route: that one answers a
            # missing alias with a stock server's 400, and this method promises NotFound.
            model = self.request("GET", f"/api/v1/models/{quote(name, safe='')}")
            version = (model.get("aliases") or {}).get(alias)
            if version is None:
                raise NotFound(f"Registered model {name!r} has no alias {alias!r}.")
            return self.get_model_version(name, int(version))
        name, sep, version = rest.rpartition("/")
        if not sep or not name:
            raise InvalidParameter(f"{uri!r}: expected models:/NAME/VERSION, /latest or @ALIAS.")
        if version == "latest":
            return self._latest_version(name)
        return self.get_model_version(name, _parse_version(version, uri))

    def _latest_version(self, name: str) -> ModelRef:
        found = self.request("GET", f"/api/v1/models/{quote(name, safe='')}")
        numbers = [int(v["version"]) for v in found.get("versions") or []]
        if not numbers:
            raise NotFound(f"Registered model {name!r} has no versions.")
        return self.get_model_version(name, max(numbers))

    # ------------------------------------------------------------------ downloading files
    def _download_root(self, name: str, version: int) -> str:
        found = self.request(
            "GET",
            f"{MLFLOW}/model-versions/get-download-uri",
            params={"name": name, "version": str(version)},
        )
        uri = str(found.get("artifact_uri") or "")
        if not uri.startswith(ARTIFACT_SCHEME) or uri.startswith(ARTIFACT_SCHEME + "/"):
            raise InvalidParameter(
                f"Version {version} of {name!r} keeps its files outside this server's artifact "
                "proxy (mlflow-artifacts:/); it cannot be downloaded."
            )
        return uri.removeprefix(ARTIFACT_SCHEME).strip("/")

    def _list_files(self, root: str) -> list[tuple[PurePosixPath, int | None]]:
        """Every file below ``root`` (depth-first), as (path relative to root, size)."""
        files: list[tuple[PurePosixPath, int | None]] = []
        pending: list[PurePosixPath] = [PurePosixPath()]
        while pending:
            folder = pending.pop()
            if len(folder.parts) > _MAX_DEPTH:
                raise InvalidParameter("The version's folder tree is too deep to download.")
            where = f"{root}/{folder}" if folder.parts else root
            listed = self.request("GET", ARTIFACTS, params={"path": where})
            for entry in (listed or {}).get("files") or []:
                member = folder / _safe_member(str(entry["path"]))
                if entry.get("is_dir"):
                    pending.append(member)
                else:
                    files.append((member, entry.get("file_size")))
                if len(files) > _MAX_FILES:
                    raise InvalidParameter("The version holds too many files to download.")
        return files

    def _stream_to(self, remote: str, target: Path) -> None:
        """Stream one file to ``target`` through a temporary file in the same folder."""
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as out:
                self._copy_response(remote, out)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _copy_response(self, remote: str, out: IO[bytes]) -> None:
        url = f"{ARTIFACTS}/{quote(remote, safe='/')}"
        try:
            with self._http.stream("GET", url, timeout=httpx.Timeout(30.0, read=None)) as response:
                raise_for(response)
                for block in response.iter_bytes(CHUNK):
                    out.write(block)
        except httpx.TransportError as exc:
            raise ServiceUnavailable(
                f"download from {self.url} failed ({exc.__class__.__name__})"
            ) from exc

    def download_model_version(self, name: str, version: int, dest: Path) -> Path:
        """Write every file of a version (nested folders too) under ``dest``, streaming.

        Each listed path is checked before anything is written: relative, no ``..``, no
        separators or drive letters of other systems, and inside ``dest`` once resolved.

        Returns:
            The folder holding the model: the shallowest one with an ``MLmodel`` file or a
            ``model.onnx`` (``dest`` itself for most versions).

        Raises:
            NotFound: no such version, or its files hold no model.
            InvalidParameter: the files live outside the artifact proxy, or a path is unsafe.
        """
        root_dir = Path(dest).resolve()
        root_dir.mkdir(parents=True, exist_ok=True)
        remote_root = self._download_root(name, version)
        files = self._list_files(remote_root)
        planned = [(member, _contained(root_dir, member)) for member, _ in files]
        for member, target in planned:
            self._stream_to(f"{remote_root}/{member}", target)
        logger.info("downloaded %d files of %s/%d", len(planned), name, version)
        return _model_folder([member for member, _ in planned], root_dir, name, version)

    # ------------------------------------------------------------------ registering variants
    def experiment_for_variants(self, source_run_id: str | None, fallback_name: str) -> str:
        """The experiment a variant's run goes to: its source run's, else ``fallback_name``'s
        (created when missing)."""
        if source_run_id:
            run = self.request("GET", f"{MLFLOW}/runs/get", params={"run_id": source_run_id})
            return str(run["run"]["info"]["experiment_id"])
        try:
            found = self.request(
                "GET",
                f"{MLFLOW}/experiments/get-by-name",
                params={"experiment_name": fallback_name},
            )
            return str(found["experiment"]["experiment_id"])
        except NotFound:
            made = self.request(
                "POST", f"{MLFLOW}/experiments/create", json={"name": fallback_name}
            )
            return str(made["experiment_id"])

    def create_run(self, experiment_id: str, run_name: str, tags: Mapping[str, str]) -> str:
        """Start a run; returns its id."""
        body = {
            "experiment_id": experiment_id,
            "run_name": run_name,
            "tags": [{"key": k, "value": v} for k, v in tags.items()],
        }
        made = self.request("POST", f"{MLFLOW}/runs/create", json=body)
        return str(made["run"]["info"]["run_id"])

    def log_run_values(
        self, run_id: str, params: Mapping[str, str], metrics: Mapping[str, float], timestamp: int
    ) -> None:
        """Params and metrics (step 0) of a run in one call."""
        body = {
            "run_id": run_id,
            "params": [{"key": k, "value": v} for k, v in params.items()],
            "metrics": [
                {"key": k, "value": v, "timestamp": timestamp, "step": 0}
                for k, v in metrics.items()
            ],
        }
        self.request("POST", f"{MLFLOW}/runs/log-batch", json=body)

    def upload_run_folder(self, run_id: str, folder: Path, artifact_path: str) -> str:
        """Upload every file of ``folder`` under ``artifact_path`` of the run; returns the
        ``runs:/`` URI of that path. Symlinks are refused, not followed."""
        run = self.request("GET", f"{MLFLOW}/runs/get", params={"run_id": run_id})
        root = str(run["run"]["info"]["artifact_uri"])
        if not root.startswith(ARTIFACT_SCHEME):
            raise InvalidParameter("The run's artifacts are not behind this server's proxy.")
        base = f"{root.removeprefix(ARTIFACT_SCHEME).strip('/')}/{artifact_path.strip('/')}"
        for path in _files_of(folder):
            member = path.relative_to(folder).as_posix()
            with path.open("rb") as source:
                self.request(
                    "PUT",
                    f"{ARTIFACTS}/{quote(f'{base}/{member}', safe='/')}",
                    content=_chunks(source),
                    headers={"Content-Type": "application/octet-stream"},
                    timeout=httpx.Timeout(30.0, read=None, write=None),
                )
        return f"runs:/{run_id}/{artifact_path.strip('/')}"

    def finish_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.request("POST", f"{MLFLOW}/runs/update", json={"run_id": run_id, "status": status})

    def ensure_registered_model(self, name: str) -> None:
        """Create the registered model unless it exists."""
        try:
            self.request("GET", f"{MLFLOW}/registered-models/get", params={"name": name})
        except NotFound:
            self.request("POST", f"{MLFLOW}/registered-models/create", json={"name": name})

    def create_model_version(
        self, name: str, source: str, run_id: str, tags: Mapping[str, str], description: str = ""
    ) -> ModelRef:
        """Register ``source`` (a ``runs:/`` URI) as a new version of ``name``."""
        body = {
            "name": name,
            "source": source,
            "run_id": run_id,
            "tags": [{"key": k, "value": v} for k, v in tags.items()],
            "description": description,
        }
        made = self.request("POST", f"{MLFLOW}/model-versions/create", json=body)
        return _ref_of(made["model_version"])

    # ------------------------------------------------------------------ promotion gates
    def promote(
        self,
        name: str,
        *,
        from_alias: str,
        to_alias: str,
        rules: Sequence[str],
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Move ``to_alias`` to the version at ``from_alias`` if every rule holds
        (``POST /api/v1/models/{name}/promote``).

        Returns:
            The gate's report: ``passed``, ``promoted``, the versions, and one result per rule
            (``rule``, ``passed``, ``values``, ``explanation``). A refused promotion is a
            report with ``passed`` false, not an error.

        Raises:
            InvalidParameter: no rule, a malformed rule or alias.
            NotFound: no such model (or not visible), or no version at ``from_alias``.
            PermissionDenied: a role too low to move the model's aliases.
        """
        body = {
            "from_alias": from_alias,
            "to_alias": to_alias,
            "rules": list(rules),
            "dry_run": dry_run,
        }
        path = f"/api/v1/models/{quote(name, safe='')}/promote"
        report: dict[str, Any] = self.request("POST", path, json=body)
        return report


def _chunks(source: IO[bytes]) -> Iterator[bytes]:
    while block := source.read(CHUNK):
        yield block


def _files_of(folder: Path) -> Iterable[Path]:
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            raise InvalidParameter(f"{path.name}: symlinks are not uploaded.")
        if path.is_file():
            yield path


def _model_folder(members: list[PurePosixPath], root: Path, name: str, version: int) -> Path:
    holders = sorted(
        (m.parent for m in members if m.name in MODEL_MARKERS), key=lambda p: len(p.parts)
    )
    if not holders:
        raise NotFound(f"Version {version} of {name!r} holds no MLmodel file and no model.onnx.")
    return root / holders[0]
