"""docs/architecture.md stays true: it describes every package and top-level module of
``src/shamal``, and every rule it states is a contract ``lint-imports`` checks."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "shamal"
DOC = ROOT / "docs" / "architecture.md"


def _described() -> set[str]:
    return set(re.findall(r"^### `(shamal(?:\.\w+)*)`$", DOC.read_text(encoding="utf-8"), re.M))


def _packages() -> set[str]:
    """Every public package (a folder with an ``__init__``, no ``_`` in its path) and every
    public top-level module."""
    found = set()
    for init in SRC.rglob("__init__.py"):
        parts = init.parent.relative_to(SRC).parts
        if not parts or any(p.startswith("_") for p in parts):
            continue
        if "migrations" in parts or (parts[0] == "db" and "models" in parts) or parts[-1] == "sim":
            continue  # parts of db and of the scheduler core, described there
        found.add(".".join(("shamal", *parts)))
    for module in SRC.glob("*.py"):
        if not module.name.startswith("_"):
            found.add(f"shamal.{module.stem}")
    return found


def test_every_package_is_described() -> None:
    missing = sorted(_packages() - _described())
    assert not missing, f"docs/architecture.md does not describe: {', '.join(missing)}"


def test_nothing_described_is_gone() -> None:
    gone = sorted(_described() - _packages())
    assert not gone, f"docs/architecture.md describes what no longer exists: {', '.join(gone)}"


def test_the_rules_it_states_are_contracts() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    kinds = {c["type"] for c in contracts}
    assert {"layers", "private_modules", "protected", "forbidden"} <= kinds
    private = next(c for c in contracts if c["type"] == "private_modules")
    assert private["packages_with_private_modules"] == ["shamal"]  # every package, not a list
    orm = next(c for c in contracts if c["type"] == "protected")
    assert orm["protected_modules"] == ["shamal.db.models"]
    assert all(i.startswith(("shamal.db", "shamal.**.")) for i in orm["allowed_importers"])
    domains = [c for c in contracts if c["type"] == "layers" and c.get("containers")]
    assert domains
    assert all(c.get("exhaustive") for c in domains)
    named = {c["containers"][0].removeprefix("shamal.") for c in domains}
    text = DOC.read_text(encoding="utf-8")
    for domain in named:
        assert domain in text
