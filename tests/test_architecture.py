"""docs/architecture.md stays true: it describes every package and top-level module of
``src/shamal``, and every rule it states is a contract ``lint-imports`` checks."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path
from typing import Any

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


# ------------------------------------------------- the contracts cover every package by rule


def _contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _named(layers: list[str]) -> set[str]:
    return {name.strip() for layer in layers for name in re.split(r"[|:]", layer)}


def _all_packages() -> list[Path]:
    """Every package folder of ``src/shamal`` outside a private one and the migrations."""
    found = []
    for init in sorted(SRC.rglob("__init__.py")):
        parts = init.parent.relative_to(SRC).parts
        if any(p.startswith("_") for p in parts) or "migrations" in parts:
            continue
        found.append(init.parent)
    return found


def _children(package: Path) -> set[str]:
    """A package's own modules and subpackages, private ones included."""
    modules = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    return modules | {p.parent.name for p in package.glob("*/__init__.py")}


def _dotted(package: Path) -> str:
    return ".".join(("shamal", *package.relative_to(SRC).parts))


def test_every_package_has_its_place_in_the_platform_layers() -> None:
    (platform,) = [c for c in _contracts() if c["type"] == "layers" and not c.get("containers")]
    named = _named(platform["layers"])
    tops = [p for p in _all_packages() if p.parent == SRC]
    tops_named = {_dotted(p) for p in tops}
    tops_named |= {f"shamal.{m.stem}" for m in SRC.glob("*.py") if not m.stem.startswith("_")}
    missing = []
    for name in sorted(tops_named):
        # A package is placed when it is named, or when each of its parts is (the scheduler).
        parts = {f"{name}.{child}" for child in _children(SRC / name.removeprefix("shamal."))}
        if name not in named and not (parts and parts <= named):
            missing.append(name)
    assert not missing, f"not in the layers contract of pyproject.toml: {', '.join(missing)}"


def test_every_package_of_several_modules_has_exhaustive_layers_of_its_own() -> None:
    containers = {
        c["containers"][0]: c for c in _contracts() if c["type"] == "layers" and c.get("containers")
    }
    missing, partial = [], []
    for package in _all_packages():
        name, children = _dotted(package), _children(package)
        if package == SRC or len(children) < 2:
            continue
        contract = containers.get(name)
        if contract is None:
            missing.append(name)
        elif not contract.get("exhaustive") or _named(contract["layers"]) != children:
            partial.append(name)
    assert not missing, f"no layers contract with this container: {', '.join(missing)}"
    assert not partial, f"layers contract not exhaustive, or naming gone modules: {partial}"


def test_every_package_has_a_public_face_with_all() -> None:
    faceless = []
    for package in _all_packages():
        tree = ast.parse((package / "__init__.py").read_text(encoding="utf-8"))
        names = {
            target.id
            for node in tree.body
            if isinstance(node, ast.Assign | ast.AnnAssign)
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name)
        }
        if "__all__" not in names:
            faceless.append(_dotted(package))
    assert not faceless, f"no __all__ in: {', '.join(faceless)}"


_PRIVATE_PATH = re.compile(r"^shamal(?:\.\w+)*\._[a-z]\w*(?:\.\w+)*(?::\w+)?$")


def test_no_string_names_another_packages_private_module() -> None:
    """What ``lint-imports`` cannot see: modules loaded by name (``importlib``, entry tables
    such as ``"shamal.executors._local:LocalExecutor"``) stay inside their package too."""
    found, reached = [], 0
    for path in sorted(SRC.rglob("*.py")):
        module = ".".join(("shamal", *path.relative_to(SRC).with_suffix("").parts))
        module = module.removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if not _PRIVATE_PATH.match(node.value):
                continue
            reached += 1
            parts = node.value.partition(":")[0].split(".")
            innermost = max(i for i, part in enumerate(parts) if part.startswith("_"))
            owner = ".".join(parts[:innermost])
            if module != owner and not module.startswith(f"{owner}."):
                found.append(f"{module}:{node.lineno} names {node.value}")
    assert reached > 5  # the policies and executors tables are read
    assert not found, "\n".join(found)


def _forbidden_to(source: str) -> set[str]:
    return {
        module
        for c in _contracts()
        if c["type"] == "forbidden" and source in c["source_modules"]
        for module in c["forbidden_modules"]
    }


#: The user's side (code in a job, scripts, the CLI's HTTP client) and the neutral leaves
#: every package may use; everything else in the layers is the server's side.
_USER_SIDE = {"shamal.client", "shamal.data", "shamal.train"}
_NEUTRAL = {"shamal.errors", "shamal.clock", "shamal.config", "shamal.lazy"}


def test_the_users_side_is_forbidden_every_server_package() -> None:
    (platform,) = [c for c in _contracts() if c["type"] == "layers" and not c.get("containers")]
    server_side = _named(platform["layers"]) - _USER_SIDE - _NEUTRAL - {"shamal.jobs"}
    for source in sorted(_USER_SIDE):
        forbidden = _forbidden_to(source)
        open_to = {
            p for p in server_side if not any(p == f or p.startswith(f"{f}.") for f in forbidden)
        }
        assert not open_to, f"{source} may import server packages: {sorted(open_to)}"
    # jobs' code snapshots are the client's (a standard-library module); the rest of jobs is
    # private to it, and the training runtime may not import jobs at all.
    assert "shamal.jobs" in _forbidden_to("shamal.train")


def test_the_scheduler_halves_and_jobs_are_held_apart() -> None:
    assert "shamal.scheduler.live" in _forbidden_to("shamal.jobs")
    assert "shamal.scheduler.live" in _forbidden_to("shamal.scheduler.core")


def test_the_picture_shows_every_row_of_the_layers_contract() -> None:
    (platform,) = [c for c in _contracts() if c["type"] == "layers" and not c.get("containers")]
    text = DOC.read_text(encoding="utf-8")
    picture = text.split("## The picture", 1)[1].split("```")[1]
    rows = [line.split("  ")[0].strip() for line in picture.strip().splitlines()]
    layers = [
        " | ".join(n.strip().removeprefix("shamal.") for n in layer.split("|"))
        for layer in platform["layers"]
    ]
    assert rows == layers, "docs/architecture.md's picture is not the layers contract's order"
