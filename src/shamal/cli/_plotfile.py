"""Where a plot goes: the file a ``--plot``/``--out`` option names, checked before the work.

Shared by the simulator's timeline (``shamal sim --plot``) and the metric curves of
``shamal runs plot``: both check the path first, so a long computation never ends on
"cannot write", and both draw with matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from shamal.errors import InvalidParameter

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["PLOT_FORMATS", "checked_plot_path", "plot_path", "pyplot", "save_figure"]

PLOT_FORMATS = (".png", ".svg", ".pdf")
"""The file extensions a plot may be written as."""


def checked_plot_path(path: str | Path | None, option: str = "--plot") -> Path | None:
    """:func:`plot_path` for a CLI option that may be left out (None), its errors as the
    CLI's: checked before the work, so a long command never ends on "cannot write".

    Raises:
        InvalidParameter: what :func:`plot_path` refuses, with its message.
    """
    if path is None:
        return None
    try:
        return plot_path(path, option)
    except ValueError as exc:
        raise InvalidParameter(str(exc)) from None


def plot_path(path: str | Path, option: str = "--plot") -> Path:
    """The file a plot will be written to for ``path``. A path without an extension gets
    ``.png``; missing folders are created when the plot is written.

    Args:
        path: what the user gave.
        option: the flag it came from, named in every error.

    Raises:
        ValueError: a folder, an extension other than :data:`PLOT_FORMATS`, or a place
            that cannot be written (the message says which).
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path} is a folder; give a file name, e.g. {path / 'plot.png'}")
    if not path.suffix:
        path = path.with_name(path.name + ".png")
    if path.suffix.lower() not in PLOT_FORMATS:
        raise ValueError(
            f"{option} {path}: cannot draw a {path.suffix} file; use {', '.join(PLOT_FORMATS)}"
        )
    if path.is_dir():
        raise ValueError(f"{option} {path} is a folder; give a file name")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent  # the folders missing are created when the plot is written
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: cannot write in {parent}")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{option} {path}: the file exists and cannot be written")
    return path


def pyplot() -> ModuleType:
    """matplotlib's pyplot on the Agg backend (files only, no display), imported late: the
    CLI starts without paying for matplotlib unless it draws."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Figure, path: Path) -> Path:
    """Write ``fig`` to ``path`` (checked by :func:`plot_path`) in the format its
    extension names, creating missing folders, and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(path, dpi=100, format=path.suffix.lower().lstrip("."))
    finally:
        pyplot().close(fig)
    return path
