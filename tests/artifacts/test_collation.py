"""A folder of the artifact store is exactly the paths under "<folder>/", on SQLite and on
a PostgreSQL database with a language's collation (ICU en-US), where "A/y" sorts between
"a/" and "a/" + the last code point, and "ab" or "a-b/z" may too."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from shamal.artifacts import _store
from shamal.db import Database, open_database, upgrade
from shamal.db.models import ArtifactFileRow

NS = "team:vision"
PATHS = [
    "a/x",
    "a/\U0001f600.png",  # above U+FFFF
    "A/y",
    "ab",
    "a-b/z",
    "a.txt",
    "d/e.txt",
    "d/Sub/q",
    "d/sub-b.txt",
    "d/sub/a",
    "d/sub/z",
    "d/sub.txt",
    "d/\u00e9t\u00e9/f",
]


@pytest.fixture(params=["sqlite", pytest.param("postgres-icu", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'shamal.db'}"
    else:
        url = request.getfixturevalue("icu_pg_url")
    database = open_database(url)
    upgrade(database)
    with database.unit_of_work() as s:
        for path in PATHS:
            _store.upsert_file(s, NS, path, "0" * 64, 1, datetime.now(UTC), "admin")
    yield database
    database.dispose()


def _all(db: Database) -> set[str]:
    with db.unit_of_work(write=False) as s:
        return set(s.scalars(select(ArtifactFileRow.path)))


def test_a_prefix_lists_exactly_its_paths(db: Database) -> None:
    with db.unit_of_work(write=False) as s:
        under_a = [f.path for f in _store.list_files(s, NS, "a/", 100)]
        under_d_sub = [f.path for f in _store.list_files(s, NS, "d/sub/", 100)]
    assert under_a == ["a/x", "a/\U0001f600.png"]
    assert under_d_sub == ["d/sub/a", "d/sub/z"]


def test_a_folder_shows_each_child_once_in_code_point_order(db: Database) -> None:
    with db.unit_of_work(write=False) as s:
        shown = [f.path for f in _store.folder_files(s, NS, "d", 100)]
        top = [f.path for f in _store.folder_files(s, NS, "", 100)]
    # Each file directly in d, and the first file of each subfolder.
    assert shown == [
        "d/Sub/q",
        "d/e.txt",
        "d/sub-b.txt",
        "d/sub.txt",
        "d/sub/a",
        "d/\u00e9t\u00e9/f",
    ]
    assert top == ["A/y", "a-b/z", "a.txt", "a/x", "ab", "d/Sub/q"]


def test_deleting_a_folder_deletes_exactly_its_files(db: Database) -> None:
    with db.unit_of_work() as s:
        assert _store.delete_tree(s, NS, "a") == 2
        assert _store.delete_tree(s, NS, "d/sub") == 2
    assert _all(db) == set(PATHS) - {"a/x", "a/\U0001f600.png", "d/sub/a", "d/sub/z"}
