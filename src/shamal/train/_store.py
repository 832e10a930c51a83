"""Where checkpoints live: a small key/bytes store over a folder or the artifact API.

A :class:`CheckpointStore` holds flat files named by ``/``-separated keys. It knows nothing
about checkpoints; :mod:`shamal.train._checkpoint` gives the files their meaning (the
manifest written last marks a checkpoint complete). Every ``put`` is atomic per key: a
reader sees the old bytes, the new bytes, or no file, never a torn one.
"""

from __future__ import annotations

import io
import logging
import os
import tempfile
from pathlib import Path
from typing import Protocol

__all__ = ["ArtifactCheckpointStore", "CheckpointStore", "LocalCheckpointStore"]

logger = logging.getLogger(__name__)


class CheckpointStore(Protocol):
    """Flat key -> bytes storage with atomic puts.

    Contract: ``put`` replaces the key atomically; ``get`` raises :class:`KeyError` for
    an absent key; ``keys(prefix)`` lists present keys starting with ``prefix`` (any
    order); ``delete`` of an absent key is a no-op.
    """

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def keys(self, prefix: str = "") -> list[str]: ...

    def delete(self, key: str) -> None: ...


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid checkpoint key {key!r}")
    return key


class LocalCheckpointStore:
    """A folder on a local (or shared) file system; puts are write-temp, fsync, rename."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def put(self, key: str, data: bytes) -> None:
        target = self.root / _check_key(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def get(self, key: str) -> bytes:
        try:
            return (self.root / _check_key(key)).read_bytes()
        except FileNotFoundError:
            raise KeyError(key) from None

    def keys(self, prefix: str = "") -> list[str]:
        found = []
        for path in self.root.rglob("*"):
            if path.is_file() and not path.name.startswith(".tmp-"):
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    found.append(key)
        return found

    def delete(self, key: str) -> None:
        path = self.root / _check_key(key)
        path.unlink(missing_ok=True)
        parent = path.parent
        while parent != self.root and parent.exists() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent


class ArtifactCheckpointStore:
    """The platform's artifact store, under ``prefix`` in ``team``'s tree.

    Each put is one streamed PUT, which the server commits atomically. By default the
    URL, token and team come from the job's environment (``SHAMAL_URL``,
    ``SHAMAL_TOKEN``, ``SHAMAL_TEAM``).
    """

    def __init__(
        self,
        prefix: str,
        *,
        team: str | None = None,
        url: str | None = None,
        token: str | None = None,
    ) -> None:
        from shamal.client import ShamalClient

        self.team = team if team is not None else os.environ.get("SHAMAL_TEAM", "")
        if not self.team:
            raise ValueError("ArtifactCheckpointStore needs a team (SHAMAL_TEAM is empty)")
        self.prefix = _check_key(prefix.strip("/"))
        self._client = ShamalClient(
            url or os.environ["SHAMAL_URL"], token or os.environ["SHAMAL_TOKEN"]
        )

    def _path(self, key: str) -> str:
        return f"{self.prefix}/{_check_key(key)}"

    def put(self, key: str, data: bytes) -> None:
        self._client.upload_artifact(self.team, self._path(key), io.BytesIO(data))

    def get(self, key: str) -> bytes:
        from shamal.errors import NotFound

        try:
            return b"".join(self._client.download_artifact(self.team, self._path(key)))
        except NotFound:
            raise KeyError(key) from None

    def keys(self, prefix: str = "") -> list[str]:
        listed = self._client.list_artifacts(self.team, prefix=f"{self.prefix}/{prefix}")
        cut = len(self.prefix) + 1
        return [str(item["path"])[cut:] for item in listed]

    def delete(self, key: str) -> None:
        from shamal.errors import NotFound

        try:
            self._client.delete_artifact(self.team, self._path(key))
        except NotFound:
            logger.debug("checkpoint file %s was already gone", key)

    def close(self) -> None:
        self._client.close()
