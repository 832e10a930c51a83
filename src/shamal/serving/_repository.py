"""The model repository: served name -> versions -> loaded backend and its metadata.

Models given with ``--model`` are loaded once at start-up (a source that fails its checks stops
the server with a message that says what to fix). A deployment's versions come and go while the
server runs: :class:`VersionLoader` loads them on a thread of its own and hands each to a
:class:`VersionHost` (the inference core) that publishes it, and unloads the versions the
deployment no longer lists.

The repository is copy-on-write: a change builds a new mapping and swaps the reference, so
request handlers read it without locks and never see a half-made change.
"""

from __future__ import annotations

import enum
import logging
import math
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

import numpy as np

from shamal.errors import InvalidParameter, NotFound, ShamalError
from shamal.serving._backends import Backend, BackendOptions, load_backend
from shamal.serving._datatypes import numpy_dtype
from shamal.serving._modelfiles import read_model_files
from shamal.serving._types import ModelMetadata

__all__ = [
    "LoadState",
    "ModelRepository",
    "ModelSource",
    "ServedModel",
    "VersionHost",
    "VersionLoader",
    "VersionStatus",
    "discard_download",
    "load_repository",
    "load_version",
    "parse_model_option",
]

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
#: Largest input (elements per tensor) a warm-up inference is run with.
_WARM_UP_ELEMENTS = 65536
#: Characters of a failed load's reason that are kept (and reported to the control plane).
MAX_REASON = 300

Models = Mapping[str, Mapping[str, "ServedModel"]]


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
    #: Output name -> class names by index (the classification extension's labels).
    labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


class ModelRepository:
    """Loaded models by name and version.

    Readers (request handlers) take :attr:`models` without a lock: it is an immutable snapshot
    that a change replaces whole. Changes (:meth:`add`, :meth:`withdraw`) are serialized by a
    lock and may come from any thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: Models = MappingProxyType({})

    @property
    def models(self) -> Models:
        """The current snapshot: name -> version -> served model, in load order."""
        return self._models

    def add(self, served: ServedModel) -> None:
        """Publish a loaded version (the metadata of its siblings then lists it too).

        Raises:
            InvalidParameter: that version of that name is already served.
        """
        with self._lock:
            versions = dict(self._models.get(served.name, {}))
            if served.version in versions:
                raise InvalidParameter(
                    f"Model '{served.name}' version {served.version} is given twice; use "
                    "NAME:VERSION=... to serve several versions."
                )
            versions[served.version] = served
            self._swap(served.name, versions)

    def withdraw(self, name: str, version: str) -> ServedModel | None:
        """Stop serving a version; returns it (None if it was not served)."""
        with self._lock:
            versions = dict(self._models.get(name, {}))
            served = versions.pop(version, None)
            if served is not None:
                self._swap(name, versions)
            return served

    def _swap(self, name: str, versions: dict[str, ServedModel]) -> None:
        names = tuple(versions)
        fresh = {
            key: replace(served, metadata=replace(served.metadata, versions=names))
            for key, served in versions.items()
        }
        models = dict(self._models)
        if fresh:
            models[name] = MappingProxyType(fresh)
        else:
            models.pop(name, None)
        self._models = MappingProxyType(models)

    def get(self, name: str, version: str) -> ServedModel:
        """The loaded version.

        Raises:
            NotFound: no such model or version.
        """
        models = self._models
        try:
            return models[name][version]
        except KeyError:
            if name in models:
                raise NotFound(f"Model '{name}' has no version '{version}' here.") from None
            raise NotFound(f"Model '{name}' is not served here.") from None

    def versions(self, name: str) -> list[str]:
        """The loaded versions of ``name``, in load order.

        Raises:
            NotFound: no such model.
        """
        try:
            return list(self._models[name])
        except KeyError:
            raise NotFound(f"Model '{name}' is not served here.") from None

    def version_map(self) -> dict[str, list[str]]:
        return {name: list(versions) for name, versions in self._models.items()}

    def all(self) -> Iterable[ServedModel]:
        for versions in self._models.values():
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
        backend, labels = _backend(source.name, path, options, source.name in trusted_names, work)
        repository.add(_served(source.name, version, backend, labels))
        logger.info("Loaded model %s version %s (%s)", source.name, version, backend.platform)
    return repository


def load_version(
    source: ModelSource, options: BackendOptions, *, trusted: bool, work_dir: Path
) -> ServedModel:
    """Download (for a ``models:/`` URI), check and load one version, then warm it up with
    one small inference when that is cheap (a failed warm-up is logged, not fatal: the
    model's own errors then show in its error rate). Blocks; call it off the event loop.

    Raises:
        InvalidParameter: files that cannot be served (the message names the model).
        NotFound: a ``models:/`` URI the registry does not know.
        ShamalError: the registry could not be reached.
    """
    path, registry_version = _local_path(source, work_dir)
    version = source.version or registry_version or "1"
    backend, labels = _backend(source.name, path, options, trusted, work_dir)
    _warm_up(source.name, version, backend)
    logger.info("Loaded model %s version %s (%s)", source.name, version, backend.platform)
    return _served(source.name, version, backend, labels)


def open_model(
    path: Path, options: BackendOptions | None = None, *, name: str = "model"
) -> Backend:
    """A local model (file, model folder or variant set) loaded as the server would load it,
    for scripts and benchmarks: ``backend.run(inputs)`` answers one batch. Pickled formats are
    refused. Close it with ``backend.close()``.

    Raises:
        InvalidParameter: files that cannot be served.
    """
    with tempfile.TemporaryDirectory(prefix="shamal-open-") as work:
        backend, _ = _backend(name, Path(path), options or BackendOptions(), False, Path(work))
    return backend


def _backend(
    name: str, path: Path, options: BackendOptions, trusted: bool, work: Path
) -> tuple[Backend, Mapping[str, tuple[str, ...]]]:
    """The loaded backend and the class names its manifest gives its outputs."""
    try:
        files = read_model_files(path, name=name, trusted=trusted, work_dir=work)
        backend = load_backend(name, files, options)
    except InvalidParameter as exc:
        if exc.message.startswith(f"Model '{name}'"):
            raise
        raise InvalidParameter(f"Model '{name}': {exc.message}") from None
    unknown = set(files.labels) - {spec.name for spec in backend.outputs}
    if unknown:
        backend.close()
        raise InvalidParameter(
            f"Model '{name}': its manifest gives labels to {sorted(unknown)[:8]}, which are "
            "not outputs of the model."
        )
    return backend, files.labels


def _served(
    name: str, version: str, backend: Backend, labels: Mapping[str, tuple[str, ...]]
) -> ServedModel:
    metadata = ModelMetadata(
        name=name,
        versions=(version,),
        platform=backend.platform,
        inputs=backend.inputs,
        outputs=backend.outputs,
    )
    return ServedModel(name, version, backend, metadata, labels=labels)


def _warm_up(name: str, version: str, backend: Backend) -> None:
    """One inference on zeros (one row where a dim is variable), so the first caller does not
    pay for lazy initialisation; skipped for text inputs and large tensors."""
    feed: dict[str, np.ndarray] = {}
    for spec in backend.inputs:
        shape = tuple(1 if dim < 0 else dim for dim in spec.shape)
        if spec.datatype == "BYTES" or math.prod(shape) > _WARM_UP_ELEMENTS:
            return
        feed[spec.name] = np.zeros(shape, dtype=numpy_dtype(spec.datatype))
    try:
        backend.run(feed)
    except Exception:  # noqa: BLE001 - the model's own failure shows in its error rate
        logger.warning("Model %s version %s failed its warm-up inference", name, version)


def _local_path(source: ModelSource, work: Path) -> tuple[Path, str | None]:
    """A local path for the source, downloading ``models:/`` URIs from the registry."""
    if not source.location.startswith("models:/"):
        return Path(source.location).expanduser(), None
    from shamal.client import ShamalClient

    client = ShamalClient()
    try:
        ref = client.resolve_model_uri(source.location)
        dest = _download_dir(work, source.name, str(ref.version))
        shutil.rmtree(dest, ignore_errors=True)  # a retry starts from nothing
        dest.mkdir(parents=True, exist_ok=True)
        path = client.download_model_version(ref.name, int(ref.version), dest)
    finally:
        client.close()
    return Path(path), str(ref.version)


def _download_dir(work: Path, name: str, version: str) -> Path:
    return work / "downloads" / f"{name}-{version}"


def discard_download(work_dir: Path, name: str, version: str) -> None:
    """Remove what :func:`load_version` downloaded for a version (once it is unloaded)."""
    shutil.rmtree(_download_dir(work_dir, name, version), ignore_errors=True)


# ---------------------------------------------------------------------- loading while serving
class LoadState(enum.StrEnum):
    LOADING = "loading"
    LOADED = "loaded"
    FAILED = "failed"


@dataclass(frozen=True)
class VersionStatus:
    """Where one version stands in a :class:`VersionLoader`; ``reason`` says why it failed."""

    state: LoadState
    reason: str = ""


class VersionHost(Protocol):
    """Where loaded versions go: the inference core.

    Both methods block until done and are called from the loader's thread (or from the main
    thread before serving starts), never from the event loop.
    """

    def install(self, served: ServedModel) -> None:
        """Make ``served`` answer requests (its batcher runs; the repository lists it)."""
        ...

    def retire(self, name: str, version: str, grace_s: float) -> None:
        """Stop routing to the version, let its in-flight requests finish (waiting at most
        ``grace_s`` here), then stop its batcher and close its backend."""
        ...


Loader = Callable[[ModelSource], ServedModel]


class VersionLoader:
    """Keeps the loaded versions of one served name equal to the wanted ones, off the request
    path: :meth:`want` records the wish and returns at once; a thread of the loader's own
    loads (download, format checks, backend, warm-up) and unloads, one version at a time.

    A version that fails to load stays failed (and gets no traffic) until :meth:`want` is
    called with ``retry_failed``. Listeners (:meth:`subscribe`) are called, outside every lock,
    after each change of a version's state. Thread-safe.

    Args:
        name: the served name (the deployment's).
        host: installs and retires versions.
        load: builds a served version from a source (:func:`load_version` in production).
        grace_s: the most a retire waits for in-flight requests before the loader moves on.
    """

    def __init__(
        self, name: str, host: VersionHost, load: Loader, *, grace_s: float = 30.0
    ) -> None:
        self.name = name
        self._host = host
        self._load = load
        self._grace_s = grace_s
        self._lock = threading.Lock()
        self._wanted: dict[str, str] = {}
        self._status: dict[str, VersionStatus] = {}
        self._listeners: list[Callable[[], None]] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def subscribe(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def statuses(self) -> dict[str, VersionStatus]:
        """Version -> its state, for every version loading, loaded or failed."""
        with self._lock:
            return dict(self._status)

    def loaded(self) -> frozenset[str]:
        with self._lock:
            return frozenset(v for v, s in self._status.items() if s.state is LoadState.LOADED)

    def want(self, versions: Mapping[str, str], *, retry_failed: bool = False) -> None:
        """Load these versions (version -> location) and unload every other; returns at once."""
        with self._lock:
            changed = dict(versions) != self._wanted
            self._wanted = dict(versions)
            if retry_failed:
                for version in versions:
                    if self._status.get(version, _LOADED).state is LoadState.FAILED:
                        del self._status[version]
                        changed = True
        if changed:
            self._wake.set()

    def run_pending(self) -> None:
        """Do every load and unload now wanted, on the calling thread; then return."""
        while (job := self._next_job()) is not None:
            kind, version, location = job
            if kind == "load":
                self._do_load(version, location)
            else:
                self._do_unload(version)
            for listener in list(self._listeners):
                try:
                    listener()
                except Exception:  # a listener's failure never stops loading
                    logger.exception("A version-load listener failed")

    def _next_job(self) -> tuple[str, str, str] | None:
        with self._lock:
            for version, location in self._wanted.items():
                if version not in self._status:
                    self._status[version] = VersionStatus(LoadState.LOADING)
                    return "load", version, location
            for version, status in list(self._status.items()):
                if version in self._wanted:
                    continue
                if status.state is LoadState.LOADED:
                    del self._status[version]
                    return "unload", version, ""
                del self._status[version]  # failed and no longer wanted: forget it
            return None

    def _do_load(self, version: str, location: str) -> None:
        source = ModelSource(self.name, version, location)
        served: ServedModel | None = None
        try:
            served = self._load(source)
            self._host.install(served)
        except Exception as exc:
            if served is not None:
                served.backend.close()
            if isinstance(exc, ShamalError):
                self._fail(version, exc.message)
            else:  # never a runtime's own words: they may hold paths or data
                logger.exception("Loading %s version %s failed", self.name, version)
                self._fail(version, "the serve process failed to load it (see its log)")
            return
        with self._lock:
            self._status[version] = VersionStatus(LoadState.LOADED)
        logger.info("Serving %s version %s", self.name, version)

    def _fail(self, version: str, reason: str) -> None:
        logger.warning("%s version %s could not be loaded: %s", self.name, version, reason)
        with self._lock:
            clean = reason.replace("\x00", "").strip() or "failed to load"
            self._status[version] = VersionStatus(LoadState.FAILED, clean[:MAX_REASON])

    def _do_unload(self, version: str) -> None:
        try:
            self._host.retire(self.name, version, self._grace_s)
        except Exception:  # the version is out of the repository whatever happened here
            logger.exception("Unloading %s version %s failed", self.name, version)
        logger.info("Unloaded %s version %s", self.name, version)

    def start(self) -> None:
        """Start the loader's thread (it first does what is already wanted)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._wake.set()
        self._thread = threading.Thread(
            target=self._run, name=f"version-loader-{self.name}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            if self._stop.is_set():
                return
            self._wake.clear()
            try:
                self.run_pending()
            except Exception:  # noqa: BLE001 - the loader must outlive any one failure
                logger.exception("The version loader of %s failed a round", self.name)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread after the load or unload it is doing."""
        thread, self._thread = self._thread, None
        self._stop.set()
        self._wake.set()
        if thread is not None:
            thread.join(timeout_s)


_LOADED = VersionStatus(LoadState.LOADED)
