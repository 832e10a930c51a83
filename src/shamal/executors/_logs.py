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
        # The last output was a cut piece that took the whole pending line: a newline that
        # comes next ends that line, not an empty one.
        self._cut_at_end = False

    def feed(self, data: bytes) -> bytes:
        """Complete lines in ``pending + data``, prefixed; keeps the unfinished rest."""
        buf = self._pending + data
        if self._cut_at_end and buf:
            buf = buf.removeprefix(b"\n")
            self._cut_at_end = False
        cut = buf.rfind(b"\n") + 1
        head, self._pending = buf[:cut], buf[cut:]
        out = [
            self._prefix + piece + b"\n"
            for line in (head.split(b"\n")[:-1] if head else [])
            for piece in _pieces(line)
        ]
        while len(self._pending) >= MAX_LINE:
            out.append(self._prefix + self._pending[:MAX_LINE] + b"\n")
            self._pending = self._pending[MAX_LINE:]
            self._cut_at_end = not self._pending
        return b"".join(out)

    def flush(self) -> bytes:
        """The unfinished last line, terminated, when the stream has ended."""
        rest, self._pending = self._pending, b""
        self._cut_at_end = False
        return self._prefix + rest + b"\n" if rest else b""


def _pieces(line: bytes) -> list[bytes]:
    """``line`` cut every :data:`MAX_LINE` bytes (one piece when it fits; an empty line is
    one empty piece): a long line is cut the same way whether it came in one read or in
    several."""
    return [line[i : i + MAX_LINE] for i in range(0, len(line), MAX_LINE)] or [b""]
