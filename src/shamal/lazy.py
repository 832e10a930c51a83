"""Public faces that load their heavier names on first use (PEP 562).

A package whose light names (entities, rules) must import without its services (the data
plane, the CLI, code inside jobs) lists the heavy ones as ``{name: (module, attribute)}`` and
hands this module's :func:`attribute` to its ``__getattr__``; ``attribute`` None names the
module itself. Type checkers read the same names from an ``if TYPE_CHECKING:`` block.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, MutableMapping
from typing import Any

__all__ = ["attribute"]


def attribute(
    package: str,
    where: Mapping[str, tuple[str, str | None]],
    name: str,
    namespace: MutableMapping[str, Any],
) -> Any:
    """``package``'s attribute ``name``, loaded from the module ``where`` says and kept in
    ``namespace`` (the package's globals) so that later reads cost nothing.

    Raises:
        AttributeError: ``package`` has no such name.
    """
    found = where.get(name)
    if found is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module = importlib.import_module(f"{package}.{found[0]}")
    value = module if found[1] is None else getattr(module, found[1])
    namespace[name] = value
    return value
