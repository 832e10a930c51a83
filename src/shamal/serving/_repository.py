"""The model repository: served name -> versions -> loaded backend and its metadata.

Models are loaded once at start-up from operator-given sources (a local path or a ``models:/``
URI); a source that fails its checks stops the server with a message that says what to fix. The
repository is read-only afterwards, so request handlers read it without locks.
"""

from __future__ import annotations

import logging
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from shamal.errors import InvalidParameter, NotFound
from shamal.serving._backends import Backend, BackendOptions, load_backend
from shamal.serving._modelfiles import read_model_files
from shamal.serving._types import ModelMetadata

__all__ = [
    "ModelRepository",
    "ModelSource",
    "ServedModel",
    "load_repository",
    "parse_model_option",
]

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


@dataclass(frozen=True)
class ModelSource:
    """One ``--model`` option: the served name, an optional version, and where the files are."""

    name: str
    version: str | None
    location: str


@dataclass
class ServedModel:
    """One loaded model version. ``ready`` turns false only while the server drains."""

    name: str
    version: str
    backend: Backend
    metadata: ModelMetadata
    ready: bool = True


@dataclass
class ModelRepository:
    """Loaded models by name and version; read-only once serving starts."""

    models: dict[str, dict[str, ServedModel]] = field(default_factory=dict)

    def add(self, served: ServedModel) -> None:
        versions = self.models.setdefault(served.name, {})
        if served.version in versions:
            raise InvalidParameter(
                f"Model '{served.name}' version {served.version} is given twice; use "
                "NAME:VERSION=... to serve several versions."
            )
        versions[served.version] = served

    def get(self, name: str, version: str) -> ServedModel:
        """The loaded version.

        Raises:
            NotFound: no such model or version.
        """
        try:
            return self.models[name][version]
        except KeyError:
            if name in self.models:
                raise NotFound(f"Model '{name}' has no version '{version}' here.") from None
            raise NotFound(f"Model '{name}' is not served here.") from None

    def versions(self, name: str) -> list[str]:
        """The loaded versions of ``name``, in load order.

        Raises:
            NotFound: no such model.
        """
        try:
            return list(self.models[name])
        except KeyError:
            raise NotFound(f"Model '{name}' is not served here.") from None

    def version_map(self) -> dict[str, list[str]]:
        return {name: list(versions) for name, versions in self.models.items()}

    def all(self) -> Iterable[ServedModel]:
        for versions in self.models.values():
            yield from versions.values()

    def close(self) -> None:
        for served in self.all():
            served.backend.close()


def parse_model_option(option: str) -> ModelSource:
    """``NAME=PATH_OR_URI`` or ``NAME:VERSION=PATH_OR_URI``.

    Raises:
        InvalidParameter: malformed, or a name/version outside ``[A-Za-z0-9_.-]``.
    """
    key, sep, location = option.partition("=")
    if not sep or not location:
        raise InvalidParameter(
            f"--model takes NAME=PATH_OR_URI (or NAME:VERSION=...), not {option!r}."
        )
    name, _, version = key.partition(":")
    if not _NAME.match(name):
        raise InvalidParameter(f"Model name {name!r} must be letters, digits, '_', '.', '-'.")
    if version and not _VERSION.match(version):
        raise InvalidParameter(f"Model version {version!r} must be letters, digits, '_', '.', '-'.")
    return ModelSource(name, version or None, location)


def load_repository(
    sources: Iterable[ModelSource],
    options: BackendOptions,
    *,
    trusted: Iterable[str] = (),
    work_dir: Path | None = None,
) -> ModelRepository:
    """Load every source; versions default to the registry's version or ``1``.

    Raises:
        InvalidParameter: a source that cannot be served (the message names the model).
        NotFound: a ``models:/`` URI the registry does not know.
    """
    trusted_names = set(trusted)
    work = work_dir or Path(tempfile.mkdtemp(prefix="shamal-serve-"))
    repository = ModelRepository()
    for source in sources:
        path, registry_version = _local_path(source, work)
        version = source.version or registry_version or "1"
        try:
            files = read_model_files(
                path, name=source.name, trusted=source.name in trusted_names, work_dir=work
            )
            backend = load_backend(source.name, files, options)
        except InvalidParameter as exc:
            if exc.message.startswith(f"Model '{source.name}'"):
                raise
            raise InvalidParameter(f"Model '{source.name}': {exc.message}") from None
        metadata = ModelMetadata(
            name=source.name,
            versions=(),
            platform=backend.platform,
            inputs=backend.inputs,
            outputs=backend.outputs,
        )
        repository.add(ServedModel(source.name, version, backend, metadata))
        logger.info("Loaded model %s version %s (%s)", source.name, version, backend.platform)
    _fill_versions(repository.models)
    return repository


def _fill_versions(models: Mapping[str, dict[str, ServedModel]]) -> None:
    for versions in models.values():
        names = tuple(versions)
        for served in versions.values():
            meta = served.metadata
            served.metadata = ModelMetadata(
                meta.name, names, meta.platform, meta.inputs, meta.outputs
            )


def _local_path(source: ModelSource, work: Path) -> tuple[Path, str | None]:
    """A local path for the source, downloading ``models:/`` URIs from the registry."""
    if not source.location.startswith("models:/"):
        return Path(source.location).expanduser(), None
    from shamal.client import ShamalClient

    client = ShamalClient()
    try:
        ref = client.resolve_model_uri(source.location)
        dest = work / "downloads" / f"{source.name}-{ref.version}"
        dest.mkdir(parents=True, exist_ok=True)
        path = client.download_model_version(ref.name, int(ref.version), dest)
    finally:
        client.close()
    return Path(path), str(ref.version)
