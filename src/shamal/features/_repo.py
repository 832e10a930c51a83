"""Loading feature definitions from a user's repository folder (client side).

A repository declares its definitions in YAML files and in Python files; :func:`load_repo`
reads them all, merges them and validates the result. **Python files are executed**, as
``feast apply`` executes a feature repository: this runs the user's own code, from their own
repository, on their own machine, with their rights. Never point it at a folder you do not
trust, and never call it on the server.
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import os
import re
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shamal.errors import InvalidParameter
from shamal.features._definitions import (
    MAX_YAML_BYTES,
    Definitions,
    Entity,
    FeatureService,
    FeatureView,
    format_problems,
    problems,
    subject_of,
)

__all__ = ["MAX_REPO_FILES", "load_repo"]

logger = logging.getLogger(__name__)

#: The most definition files (YAML and Python) one repository is read from.
MAX_REPO_FILES = 2000
#: The largest Python file read (for the import check).
MAX_PYTHON_BYTES = 4 * 1024 * 1024
YAML_SUFFIXES = (".yaml", ".yml")
#: Folders never searched besides hidden ones: virtual environments and caches.
SKIPPED_FOLDERS = frozenset({"__pycache__", "venv", "node_modules", "site-packages"})
# A Python file is a definitions file when it imports the features package.
_IMPORTS_FEATURES = re.compile(
    r"\bshamal\.features\b|\bfrom\s+shamal\s+import\s+[^\n]*\bfeatures\b"
)
# A YAML file is a definitions file when it has one of the three top-level lists (a
# repository holds other YAML too: CI, compose files, configs).
_DECLARES = re.compile(r"^(?:entities|feature_views|feature_services)\s*:", re.MULTILINE)
_MODULES = itertools.count()
_KINDS = (("entity", "entities"), ("feature view", "views"), ("feature service", "services"))


def load_repo(path: Path) -> Definitions:
    """Read, merge and validate the definitions of a repository.

    ``path`` is a file (``.yaml``, ``.yml`` or ``.py``, read whatever it holds) or a folder,
    searched recursively (hidden folders, virtual environments and ``__pycache__`` skipped):

    - a YAML file with a top-level ``entities``, ``feature_views`` or ``feature_services``
      list is read with :meth:`Definitions.from_yaml` (other YAML files are not definitions);
    - a Python file that imports ``shamal.features`` is executed as a module (the folder on
      ``sys.path`` meanwhile) and its module-level :class:`Entity`, :class:`FeatureView`,
      :class:`FeatureService` and :class:`Definitions` objects are collected.

    The same object declared identically in two places counts once.

    Args:
        path: the repository folder, or one file.

    Returns:
        The merged, valid definitions.

    Raises:
        InvalidParameter: a file that does not parse or whose code fails (naming the file and
            line), an object declared differently in two places (naming both), or broken
            rules (each problem naming the file that declares the object).
    """
    path = Path(path)
    if path.is_dir():
        root, files = path, list(_repo_files(path))
    elif path.is_file():
        if path.suffix not in (*YAML_SUFFIXES, ".py"):
            raise InvalidParameter(f"{path}: definitions are .yaml, .yml or .py files.")
        root, files = path.parent, [path]
    else:
        raise InvalidParameter(f"{path}: no such file or folder.")
    explicit = path.is_file()
    merged, origins = Definitions(), dict[str, str]()
    for file in files:
        label = file.relative_to(root).as_posix()
        declared = _read_file(file, label, root, explicit=explicit)
        merged = _merge(merged, declared, label, origins)
    found = problems(merged)
    if found:
        placed = [
            (f"{what} (in {origins[what]})" if what in origins else what, why)
            for what, why in found
        ]
        raise InvalidParameter(format_problems(placed))
    logger.debug("read %d definition files from %s", len(files), path)
    return merged


def _repo_files(root: Path) -> Iterator[Path]:
    count = 0
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = sorted(
            d
            for d in subfolders
            if not d.startswith(".")
            and d not in SKIPPED_FOLDERS
            and not (Path(folder, d) / "pyvenv.cfg").exists()
        )
        for name in sorted(names):
            if name.startswith(".") or not name.endswith((*YAML_SUFFIXES, ".py")):
                continue
            count += 1
            if count > MAX_REPO_FILES:
                raise InvalidParameter(
                    f"{root}: more than {MAX_REPO_FILES} YAML and Python files; point at the "
                    "folder that holds the feature definitions."
                )
            yield Path(folder, name)


def _read_text(file: Path, label: str, limit: int) -> str:
    if file.stat().st_size > limit:
        raise InvalidParameter(f"{label}: larger than {limit // (1024 * 1024)} MiB.")
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InvalidParameter(f"{label}: not UTF-8 text.") from None


def _read_file(file: Path, label: str, root: Path, *, explicit: bool) -> Definitions:
    """The definitions one file declares (none when it is not a definitions file)."""
    if file.suffix in YAML_SUFFIXES:
        text = _read_text(file, label, MAX_YAML_BYTES)
        if not explicit and not _DECLARES.search(text):
            return Definitions()
        try:
            return Definitions.from_yaml(text)
        except InvalidParameter as exc:
            raise InvalidParameter(f"{label}: {exc.message}") from None
    text = _read_text(file, label, MAX_PYTHON_BYTES)
    if not explicit and not _IMPORTS_FEATURES.search(text):
        return Definitions()
    return _collect(_run_module(file, label, root))


def _run_module(file: Path, label: str, root: Path) -> dict[str, Any]:
    """Execute ``file`` as a fresh module, ``root`` first on ``sys.path``; return its
    namespace. ``sys.path`` is restored after, and the modules it imported from the
    repository are forgotten (another load reads them afresh)."""
    name = f"_shamal_repo_{next(_MODULES)}_{re.sub(r'[^A-Za-z0-9_]', '_', file.stem)}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise InvalidParameter(f"{label}: cannot be loaded as a Python module.")
    module = importlib.util.module_from_spec(spec)
    saved_path, known = list(sys.path), set(sys.modules)
    sys.path.insert(0, str(root.resolve()))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # the user's code: any failure is theirs to fix
        raise InvalidParameter(
            f"{label}: running it failed{_line(exc, file)}: {_said(exc)}"
        ) from None
    finally:
        sys.path[:] = saved_path
        _forget_modules(known, root.resolve())
    return vars(module)


def _forget_modules(known: set[str], root: Path) -> None:
    for added in set(sys.modules) - known:
        module = sys.modules[added]
        # A namespace package (a folder without __init__.py) has a __path__ but no __file__.
        where = getattr(module, "__file__", None) or next(
            iter(getattr(module, "__path__", [])), None
        )
        if added.startswith("_shamal_repo_") or (
            where and Path(where).resolve().is_relative_to(root)
        ):
            del sys.modules[added]


def _line(exc: BaseException, file: Path) -> str:
    if isinstance(exc, SyntaxError) and exc.lineno is not None:
        return f" at line {exc.lineno}"
    lines = [
        lineno
        for frame, lineno in traceback.walk_tb(exc.__traceback__)
        if Path(frame.f_code.co_filename) == file
    ]
    return f" at line {lines[-1]}" if lines else ""


def _said(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "..."


def _collect(namespace: dict[str, Any]) -> Definitions:
    """The module-level definitions objects of a module, in the order it defines them."""
    found = Definitions()
    loose: dict[type, list[Any]] = {Entity: [], FeatureView: [], FeatureService: []}
    for value in namespace.values():
        if isinstance(value, Definitions):
            found = _merge_quietly(found, value)
        elif type(value) in loose:
            loose[type(value)].append(value)
    single = Definitions(
        tuple(loose[Entity]), tuple(loose[FeatureView]), tuple(loose[FeatureService])
    )
    return _merge_quietly(found, single)


def _merge_quietly(first: Definitions, second: Definitions) -> Definitions:
    """Both sets, all objects kept (conflicts are reported by :func:`_merge`, with files)."""
    return Definitions(
        (*first.entities, *second.entities),
        (*first.views, *second.views),
        (*first.services, *second.services),
    )


def _merge(
    merged: Definitions, declared: Definitions, label: str, origins: dict[str, str]
) -> Definitions:
    """Add one file's objects; ``origins`` maps each object (``feature view 'x'``) to the
    file that declared it first."""
    parts: list[tuple[Any, ...]] = []
    for kind, attribute in _KINDS:
        kept = list(getattr(merged, attribute))
        index = {getattr(item, "name", None): item for item in kept}
        for item in getattr(declared, attribute):
            name = getattr(item, "name", None)
            subject = subject_of(kind, name)
            earlier = index.get(name)
            if earlier is None or not isinstance(name, str):
                kept.append(item)
                index[name] = item
                origins.setdefault(subject, label)
            elif earlier != item:
                first = origins.get(subject, label)
                where = f"twice in {label}" if first == label else f"in {first} and in {label}"
                raise InvalidParameter(f"{subject} is declared differently {where}; keep one.")
        parts.append(tuple(kept))
    return Definitions(*parts)
