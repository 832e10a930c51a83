"""Object store in a directory of this machine."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import uuid
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from shamal.artifacts._objects import (
    DEFAULT_READ_CHUNK,
    check_key,
    check_prefix,
    check_read_args,
    primed,
)
from shamal.artifacts._paths import contained_path
from shamal.errors import Conflict, IntegrityCheckFailed, InvalidParameter, NotFound

if TYPE_CHECKING:
    from shamal.config import Settings

__all__ = ["LocalObjectStore"]

logger = logging.getLogger(__name__)

_TMP_DIR = ".tmp"
_DIR_MODE = 0o700
_FILE_MODE = 0o600
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def _make_dirs(base: Path, parts: Iterable[str]) -> None:
    """Create ``base/parts...`` one level at a time, each new directory 0700.

    ``Path.mkdir(parents=True)`` would give the parents the umask's mode instead.
    """
    current = base
    for part in parts:
        current = current / part
        with contextlib.suppress(FileExistsError):
            current.mkdir(mode=_DIR_MODE)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    except OSError:  # not supported on every platform; durability only
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalObjectStore:
    """:class:`~shamal.artifacts.ObjectStore` over a local directory.

    Objects are files under ``root`` (mode 0600, directories 0700). A write goes
    to a fresh file in ``root/.tmp``, is fsynced and moved into place with
    ``os.replace``, so readers never see partial objects. Every key is mapped
    through :func:`~shamal.artifacts.contained_path`: no symbolic link inside
    the root is ever followed, and a file with a second hard link (which this
    store never makes) is refused on read. The key prefix ``.tmp`` is reserved.
    """

    def __init__(self, root: Path) -> None:
        """Open (and create, with mode 0700) the store rooted at ``root``."""
        root = Path(root).absolute()
        missing = [p for p in (root, *root.parents) if not p.exists()]
        for path in reversed(missing):
            with contextlib.suppress(FileExistsError):
                path.mkdir(mode=_DIR_MODE)
        self._root = root.resolve()
        self._tmp = self._root / _TMP_DIR

    @classmethod
    def from_settings(cls, settings: Settings) -> LocalObjectStore:
        """The store at ``settings.artifact_root``."""
        return cls(settings.artifact_root)

    @property
    def root(self) -> Path:
        """The resolved root directory."""
        return self._root

    def __repr__(self) -> str:
        return f"LocalObjectStore({str(self._root)!r})"

    # ------------------------------------------------------------------ helpers
    def _path(self, key: str) -> Path:
        check_key(key)
        if key.split("/", 1)[0] == _TMP_DIR:
            raise InvalidParameter("Invalid object key: reserved prefix")
        return contained_path(self._root, key)

    def _new_temp(self) -> tuple[Path, int]:
        _make_dirs(self._root, [_TMP_DIR])
        path = self._tmp / uuid.uuid4().hex
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
        return path, os.open(path, flags, _FILE_MODE)

    def _publish(self, src: Path, key: str) -> None:
        """Move ``src`` into place under ``key`` (re-checked: the tree may have changed)."""
        dst = self._path(key)
        _make_dirs(self._root, key.split("/")[:-1])
        try:
            os.replace(src, dst)
        except IsADirectoryError:
            raise Conflict("Object key names a prefix of other objects") from None
        _fsync_dir(dst.parent)

    # ------------------------------------------------------------------ protocol
    def write(self, key: str, chunks: Iterable[bytes]) -> int:
        """See :meth:`ObjectStore.write`."""
        self._path(key)  # fail before consuming the stream
        tmp, fd = self._new_temp()
        written = 0
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    written += out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            self._publish(tmp, key)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        return written

    def read(
        self, key: str, chunk_size: int = DEFAULT_READ_CHUNK, *, limit: int | None = None
    ) -> Iterator[bytes]:
        """See :meth:`ObjectStore.read`."""
        check_read_args(chunk_size, limit)
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise NotFound("Object not found") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise NotFound("Object not found")
        if st.st_nlink != 1:
            # This store never links files; a second link may lead out of the root.
            os.close(fd)
            logger.warning("refused to read object %s: it has %d hard links", key, st.st_nlink)
            raise IntegrityCheckFailed("The stored object has unexpected hard links")
        return primed(self._stream(fd, chunk_size, limit))

    @staticmethod
    def _stream(fd: int, chunk_size: int, limit: int | None) -> Generator[bytes, None, None]:
        remaining = limit
        with os.fdopen(fd, "rb", buffering=0) as f:
            yield b""
            while remaining is None or remaining > 0:
                chunk = f.read(chunk_size if remaining is None else min(chunk_size, remaining))
                if not chunk:
                    return
                if remaining is not None:
                    remaining -= len(chunk)
                yield chunk

    def exists(self, key: str) -> bool:
        """See :meth:`ObjectStore.exists`."""
        try:
            return stat.S_ISREG(os.lstat(self._path(key)).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def size(self, key: str) -> int:
        """See :meth:`ObjectStore.size`."""
        try:
            st = os.lstat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound("Object not found") from None
        if not stat.S_ISREG(st.st_mode):
            raise NotFound("Object not found")
        return st.st_size

    def delete(self, key: str) -> bool:
        """See :meth:`ObjectStore.delete`."""
        path = self._path(key)
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                return False
            path.unlink()
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def rename(self, src: str, dst: str) -> None:
        """See :meth:`ObjectStore.rename`."""
        src_path = self._path(src)
        self._path(dst)
        try:
            if not stat.S_ISREG(os.lstat(src_path).st_mode):
                raise NotFound("Object not found")
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound("Object not found") from None
        try:
            self._publish(src_path, dst)
        except FileNotFoundError:  # removed by another thread after the check
            raise NotFound("Object not found") from None

    def list(self, prefix: str = "") -> Iterator[str]:
        """See :meth:`ObjectStore.list`. Symbolic links and ``.tmp`` are never listed."""
        check_prefix(prefix)
        base_rel = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        if base_rel.split("/", 1)[0] == _TMP_DIR:
            return iter(())
        if base_rel:
            try:
                base = contained_path(self._root, base_rel)
            except InvalidParameter:
                return iter(())
        else:
            base = self._root
        return self._walk(base, prefix)

    def _walk(self, base: Path, prefix: str) -> Iterator[str]:
        for dirpath, dirnames, filenames in os.walk(base):
            here = Path(dirpath)
            rel_dir = here.relative_to(self._root).as_posix()
            if rel_dir == ".":
                rel_dir = ""
                dirnames[:] = [d for d in dirnames if d != _TMP_DIR]
            dirnames[:] = sorted(d for d in dirnames if not (here / d).is_symlink())
            for name in sorted(filenames):
                key = f"{rel_dir}/{name}" if rel_dir else name
                if key.startswith(prefix) and stat.S_ISREG(os.lstat(here / name).st_mode):
                    yield key
