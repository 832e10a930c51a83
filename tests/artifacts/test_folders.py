"""Listing one folder of the artifact index: each child once, whatever lies below it, in
few queries (one per large subfolder, a few dozen for thousands of small ones)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event, insert

from shamal.artifacts import _store
from shamal.db import Database, open_database, upgrade
from shamal.db.models import ArtifactFileRow

_EXAMPLES = itertools.count()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    home: Path = tmp_path_factory.mktemp("folders")
    database = open_database(f"sqlite:///{home / 'shamal.db'}")
    upgrade(database)
    yield database
    database.dispose()


def _store_paths(db: Database, namespace: str, paths: list[str]) -> None:
    now = datetime.now(UTC)
    rows = [
        {
            "namespace": namespace,
            "path": p,
            "digest": "0" * 64,
            "size": 1,
            "created_at": now,
            "created_by": "admin",
        }
        for p in paths
    ]
    if rows:
        with db.unit_of_work() as s:
            s.execute(insert(ArtifactFileRow), rows)


def _expected(paths: list[str], folder: str, limit: int) -> list[str]:
    """The listing by its definition: the folder's own file, else each direct file and the
    first file of each subfolder, in code point order."""
    if folder in paths:
        return [folder]
    prefix = f"{folder}/" if folder else ""
    shown: list[str] = []
    heads: set[str] = set()
    for path in sorted(p for p in paths if p.startswith(prefix)):
        head, sep, _ = path[len(prefix) :].partition("/")
        if sep and head in heads:
            continue
        if sep:
            heads.add(head)
        shown.append(path)
    return shown[:limit]


def _listed(db: Database, namespace: str, folder: str, limit: int) -> tuple[list[str], int]:
    """The listing and the number of statements it took."""
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(db.engine, "before_cursor_execute", count)
    try:
        with db.unit_of_work(write=False) as s:
            listed = [f.path for f in _store.folder_files(s, namespace, folder, limit)]
    finally:
        event.remove(db.engine, "before_cursor_execute", count)
    return listed, sum(1 for sql in statements if sql.lstrip().upper().startswith("SELECT"))


@pytest.mark.parametrize("files_each", [1, 4, 10])
def test_thousands_of_small_subfolders_list_in_few_queries(db: Database, files_each: int) -> None:
    """Per-step folders (step-N/{model,optim,...}) beside a few files and one large
    subfolder: a few dozen queries, where one per subfolder would be over 2,000."""
    namespace = f"team:steps-{files_each}"
    paths = [f"run/steps/{i:05d}/f{j}" for i in range(2_000) for j in range(files_each)]
    paths += [f"run/steps/00042-{i:04d}.txt" for i in range(3)]  # files beside them
    paths += [f"run/steps/big/{i:05d}.bin" for i in range(20_000)]  # one large subfolder
    _store_paths(db, namespace, paths)
    listed, queries = _listed(db, namespace, "run/steps", 100_000)
    assert listed == _expected(paths, "run/steps", 100_000)
    assert len(listed) == 2_000 + 3 + 1
    assert queries < 50, queries
    first, _ = _listed(db, namespace, "run/steps", 7)
    assert first == listed[:7]


def test_each_large_subfolder_costs_one_short_query(db: Database) -> None:
    namespace = "team:large"
    paths = [f"ckpt/{name}/{i:05d}" for name in ("a", "b", "c", "d") for i in range(5_000)]
    _store_paths(db, namespace, paths)
    listed, queries = _listed(db, namespace, "ckpt", 100)
    assert listed == ["ckpt/a/00000", "ckpt/b/00000", "ckpt/c/00000", "ckpt/d/00000"]
    # Whether "ckpt" is a file, then one query per subfolder, then the one that finds the end.
    assert queries <= 6, queries


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    paths=st.sets(
        st.lists(
            st.sampled_from(["a", "b", "a-b", "a.b", "é", "\U0001f600"]), min_size=1, max_size=4
        ).map("/".join),
        max_size=60,
    ),
    folder=st.sampled_from(["", "a", "a/b", "b", "a-b"]),
    limit=st.integers(min_value=1, max_value=30),
    batches=st.sampled_from([(1, 4), (2, 8), (3, 48), (32, 1024)]),
)
def test_a_listing_is_its_definition(
    db: Database, paths: set[str], folder: str, limit: int, batches: tuple[int, int]
) -> None:
    """Any tree (files beside folders, names sorting around "/"), any limit, batches of
    any size (small ones make a few dozen paths take many turns of the loop)."""
    namespace = f"team:prop-{next(_EXAMPLES)}"  # every example in a namespace of its own
    # A file may not also be a folder in the store: keep the leaves only.
    files = sorted(p for p in paths if not any(q.startswith(p + "/") for q in paths))
    _store_paths(db, namespace, files)
    peek, most = batches
    with patch.object(_store, "_FOLDER_PEEK", peek), patch.object(_store, "_FOLDER_BATCH", most):
        listed, _ = _listed(db, namespace, folder, limit)
    assert listed == _expected(files, folder, limit)
