"""Turning a worker's output stream into whole, rank-prefixed log lines."""

from __future__ import annotations

__all__ = ["MAX_LINE", "LineFramer"]

MAX_LINE = 64 * 1024
"""A line longer than this (a progress bar that never ends one) is cut into pieces."""


class LineFramer:
    """Splits a byte stream into lines and prefixes each (``b"[rank 1] "`` or ``b""``).

    Output is emitted only as whole lines, so lines of several workers written to one
    file never interleave mid-line. Not thread-safe: one framer per stream.
    """

    def __init__(self, prefix: bytes = b"") -> None:
        self._prefix = prefix
        self._pending = b""

    def feed(self, data: bytes) -> bytes:
        """Complete lines in ``pending + data``, prefixed; keeps the unfinished rest."""
        buf = self._pending + data
        cut = buf.rfind(b"\n") + 1
        head, self._pending = buf[:cut], buf[cut:]
        out = [self._prefix + line + b"\n" for line in head.splitlines()] if head else []
        while len(self._pending) >= MAX_LINE:
            out.append(self._prefix + self._pending[:MAX_LINE] + b"\n")
            self._pending = self._pending[MAX_LINE:]
        return b"".join(out)

    def flush(self) -> bytes:
        """The unfinished last line, terminated, when the stream has ended."""
        rest, self._pending = self._pending, b""
        return self._prefix + rest + b"\n" if rest else b""
