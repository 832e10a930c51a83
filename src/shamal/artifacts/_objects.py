"""The object store protocol: a dumb, streaming key -> bytes store.

Backends are named in :data:`OBJECT_STORE_BACKENDS` (name -> ``module:attribute``)
and imported only when :func:`open_object_store` picks them, so the local
default never imports an S3 client library.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Generator, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

from shamal.artifacts._paths import safe_relpath
from shamal.errors import InvalidParameter

if TYPE_CHECKING:
    from pathlib import Path

    from shamal.config import LocalArtifactSettings, S3ArtifactSettings, Settings

__all__ = [
    "DEFAULT_READ_CHUNK",
    "OBJECT_STORE_BACKENDS",
    "ObjectStore",
    "ObjectStoreFactory",
    "check_key",
    "check_prefix",
    "check_read_args",
    "open_object_store",
    "open_store_objects",
    "primed",
]

logger = logging.getLogger(__name__)

DEFAULT_READ_CHUNK = 1024 * 1024

OBJECT_STORE_BACKENDS: Mapping[str, str] = {
    "local": "shamal.artifacts._local:LocalObjectStore",
    "s3": "shamal.artifacts._s3:S3ObjectStore",
}


@runtime_checkable
class ObjectStore(Protocol):
    """A flat store of immutable-once-written byte objects under string keys.

    Contract, for every implementation:

    * **Keys** are store-internal, ``/``-separated relative paths that the caller
      has already made safe (they are in the normal form of
      :func:`~shamal.artifacts.safe_relpath`); implementations still refuse
      anything else with :class:`~shamal.errors.InvalidParameter`. A key must not
      be a ``/``-prefix of another key (a file system cannot hold both ``a`` and
      ``a/b``).
    * **Thread safety**: one instance may be used from many threads at once.
    * **Atomic writes**: :meth:`write` publishes an object all at once; a reader
      sees the old object, the new one, or no object, never a partial one. A
      write that fails (including because the chunk iterable raised) leaves no
      object and no temporary data behind.
    * **Streaming**: neither :meth:`write` nor :meth:`read` holds a whole object
      in memory; memory use is bounded by one part or chunk.
    * **Errors**: a missing object raises :class:`~shamal.errors.NotFound` where
      a method says so; backend failures are mapped to Shamal errors and logged,
      never passed through.
    """

    def write(self, key: str, chunks: Iterable[bytes]) -> int:
        """Store the concatenation of ``chunks`` under ``key``, replacing any object.

        Returns:
            The number of bytes written.

        Raises:
            InvalidParameter: the key is not a safe relative path.
        """
        ...

    def read(
        self, key: str, chunk_size: int = DEFAULT_READ_CHUNK, *, limit: int | None = None
    ) -> Iterator[bytes]:
        """Stream the object in chunks of at most ``chunk_size`` bytes.

        The object is opened before this returns, so a missing key raises here,
        not on the first ``next()``. Close the iterator (or exhaust it) to free
        the underlying file or connection.

        Args:
            key: the object.
            chunk_size: the largest chunk to yield (>= 1).
            limit: if given (>= 1), read only the first ``limit`` bytes (a ranged
                read: the rest is never fetched).

        Raises:
            NotFound: no object under ``key``.
            InvalidParameter: ``chunk_size`` or ``limit`` is below 1.
        """
        ...

    def exists(self, key: str) -> bool:
        """True when an object is stored under ``key``."""
        ...

    def size(self, key: str) -> int:
        """Size of the object in bytes.

        Raises:
            NotFound: no object under ``key``.
        """
        ...

    def delete(self, key: str) -> bool:
        """Remove the object; True when it existed. Deleting a missing key is no error."""
        ...

    def rename(self, src: str, dst: str) -> None:
        """Move the object at ``src`` to ``dst``, replacing any object at ``dst``.

        Atomic where the backend allows (local: ``os.replace``); on S3 it is a
        server-side copy followed by a delete, so a crash in between can leave
        ``src`` behind, but ``dst`` is always complete.

        Raises:
            NotFound: no object under ``src``.
        """
        ...

    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys that start with ``prefix`` (a plain string prefix), in no set order."""
        ...


class ObjectStoreFactory(Protocol):
    """What a backend named in :data:`OBJECT_STORE_BACKENDS` must provide."""

    def from_settings(self, settings: Settings) -> ObjectStore:
        """Build the store the settings describe."""
        ...


def check_key(key: str) -> str:
    """Return ``key`` when it is a safe, normalized relative path.

    Raises:
        InvalidParameter: anything else.
    """
    if safe_relpath(key) != key:
        raise InvalidParameter("Invalid object key: not in normal form")
    return key


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` when it is empty or a safe key, optionally ending in ``/``.

    Raises:
        InvalidParameter: anything else.
    """
    if prefix:
        check_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


def check_read_args(chunk_size: int, limit: int | None) -> None:
    """Validate the sizes passed to :meth:`ObjectStore.read`.

    Raises:
        InvalidParameter: ``chunk_size`` or ``limit`` is below 1.
    """
    if chunk_size < 1 or (limit is not None and limit < 1):
        raise InvalidParameter("Read sizes must be positive")


def primed(stream: Generator[bytes, None, None]) -> Iterator[bytes]:
    """Run ``stream`` to its first ``yield`` (which must yield ``b""``) and return it.

    Generators that open a file or a response inside ``try``/``with`` are
    primed so that the resource is held by a *started* generator: closing or
    garbage-collecting the iterator then always releases it, even when the
    caller never reads a chunk.
    """
    next(stream)
    return stream


def open_object_store(settings: Settings) -> ObjectStore:
    """Build the object store named by ``settings.artifacts.type``.

    The backend module is imported only now, from :data:`OBJECT_STORE_BACKENDS`.

    Raises:
        InvalidParameter: the type names no known backend.
    """
    target = OBJECT_STORE_BACKENDS.get(settings.artifacts.type)
    if target is None:
        raise InvalidParameter("Unknown artifact store type")
    module_name, _, attribute = target.partition(":")
    factory = cast(ObjectStoreFactory, getattr(importlib.import_module(module_name), attribute))
    store = factory.from_settings(settings)
    logger.debug("opened %s artifact object store", settings.artifacts.type)
    return store


def open_store_objects(
    config: LocalArtifactSettings | S3ArtifactSettings, default_root: Path
) -> ObjectStore:
    """The object store one store's settings describe (a data store of
    ``settings.data_stores``); a local one without a root lives at ``default_root``."""
    module_name, _, attribute = OBJECT_STORE_BACKENDS[config.type].partition(":")
    backend = getattr(importlib.import_module(module_name), attribute)
    if config.type == "local":
        return cast(ObjectStore, backend(config.root if config.root is not None else default_root))
    return cast(ObjectStore, backend.from_artifact_settings(config))
