"""Loading definitions from a repository folder: YAML and Python files, merged and checked."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from shamal.errors import InvalidParameter
from shamal.features._definitions import Definitions, Feature
from shamal.features._repo import load_repo

ENTITIES_YAML = """
entities:
  - {name: customer, join_keys: [customer_id]}
"""

VIEWS_PY = """
from shamal.features._definitions import Feature, FeatureView

stats = FeatureView(
    name="customer_stats",
    entities=["customer"],
    source="customers@prod",
    timestamp_field="event_time",
    features=[Feature("total", "float64")],
    owner="risk",
    ttl_seconds=86400,
)
"""

SERVICES_PY = """
from shamal.features._definitions import Definitions, FeatureService
from helpers import TEAM
import views.stats

definitions = Definitions(services=[FeatureService("fraud", ["customer_stats:*"], TEAM)])
"""


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def _mixed(root: Path) -> Path:
    return _write(
        root,
        {
            "entities.yaml": ENTITIES_YAML,
            "views/stats.py": VIEWS_PY,
            "services.py": SERVICES_PY,
            "helpers.py": "TEAM = 'risk'\n",
            "docker-compose.yml": "services:\n  db: {image: postgres}\n",
            "README.md": "entities: not yaml here\n",
            "unrelated.py": "raise RuntimeError('never run: does not import the package')\n",
            ".hidden/bad.yaml": "entities: [oops]\n",
            ".venv/lib/x.py": "import shamal.features\nraise RuntimeError('never run')\n",
            "env/pyvenv.cfg": "home = /usr\n",
            "env/lib/y.py": "import shamal.features\nraise RuntimeError('never run')\n",
            "__pycache__/z.yaml": "entities: [oops]\n",
        },
    )


def test_a_mixed_folder_is_read_merged_and_validated(tmp_path: Path) -> None:
    path_before = list(sys.path)
    defs = load_repo(_mixed(tmp_path))
    assert [e.name for e in defs.entities] == ["customer"]
    stats = defs.view("customer_stats")
    assert stats.features == (Feature("total", "float64"),)
    assert stats.source == "data:customers@prod"
    assert defs.resolve_service("fraud") == (("customer_stats", "total"),)
    assert sys.path == path_before
    # the repository's own modules (and namespace packages) are forgotten
    assert "helpers" not in sys.modules
    assert "views" not in sys.modules
    assert not [m for m in sys.modules if m.startswith("_shamal_repo_")]


def test_loading_twice_gives_the_same_definitions(tmp_path: Path) -> None:
    first = load_repo(_mixed(tmp_path))
    assert load_repo(tmp_path).digest() == first.digest()


def test_one_file_may_be_named(tmp_path: Path) -> None:
    _write(tmp_path, {"defs.yml": ENTITIES_YAML})
    assert load_repo(tmp_path / "defs.yml") == Definitions.from_yaml(ENTITIES_YAML)
    _write(tmp_path, {"notes.txt": "x"})
    with pytest.raises(InvalidParameter, match=r"\.yaml, \.yml or \.py"):
        load_repo(tmp_path / "notes.txt")
    with pytest.raises(InvalidParameter, match="no such file or folder"):
        load_repo(tmp_path / "missing")


def test_a_python_file_that_raises_is_named_with_its_line(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "entities.yaml": ENTITIES_YAML,
            "broken.py": "import shamal.features\n\nx = 1\nraise ValueError('bad thing')\n",
        },
    )
    path_before = list(sys.path)
    with pytest.raises(InvalidParameter, match="broken.py: running it failed at line 4") as caught:
        load_repo(tmp_path)
    assert "ValueError: bad thing" in caught.value.message
    assert sys.path == path_before


def test_a_python_file_with_a_syntax_error_or_exit_is_named(tmp_path: Path) -> None:
    _write(tmp_path, {"a.py": "from shamal.features import Entity\ndef (:\n"})
    with pytest.raises(InvalidParameter, match="a.py: running it failed at line 2: SyntaxError"):
        load_repo(tmp_path)
    _write(tmp_path, {"a.py": "import sys\nimport shamal.features\nsys.exit(3)\n"})
    with pytest.raises(InvalidParameter, match="a.py: running it failed at line 3: SystemExit"):
        load_repo(tmp_path)


def test_a_yaml_error_names_the_file(tmp_path: Path) -> None:
    _write(tmp_path, {"sub/defs.yaml": "entities:\n  - {name: c, join_keys: [k], colour: red}\n"})
    with pytest.raises(
        InvalidParameter, match=r"sub/defs.yaml: entities\[0\].*unknown key 'colour'"
    ):
        load_repo(tmp_path)


def test_conflicting_definitions_across_files_name_both(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "a.yaml": ENTITIES_YAML,
            "b.yaml": "entities:\n  - {name: customer, join_keys: [id]}\n",
        },
    )
    with pytest.raises(
        InvalidParameter, match="entity 'customer' is declared differently in a.yaml and in b.yaml"
    ):
        load_repo(tmp_path)


def test_identical_definitions_across_files_count_once(tmp_path: Path) -> None:
    _write(tmp_path, {"a.yaml": ENTITIES_YAML, "b.yml": ENTITIES_YAML})
    assert len(load_repo(tmp_path).entities) == 1


def test_conflicts_inside_one_python_file_are_named(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "a.py": (
                "from shamal.features._definitions import Entity\n"
                "one = Entity('customer', ['id'])\n"
                "two = Entity('customer', ['other_id'])\n"
            )
        },
    )
    with pytest.raises(
        InvalidParameter, match="entity 'customer' is declared differently twice in a.py"
    ):
        load_repo(tmp_path)


def test_rule_problems_name_the_file_that_declares_the_object(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "entities.yaml": ENTITIES_YAML,
            "views.py": VIEWS_PY.replace('owner="risk"', 'owner="Risk Team"'),
        },
    )
    with pytest.raises(InvalidParameter) as caught:
        load_repo(tmp_path)
    assert "feature view 'customer_stats' (in views.py): owner 'Risk Team'" in caught.value.message
