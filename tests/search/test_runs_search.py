"""Run search semantics on real rows, on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import pytest
from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from shamal.db import Database
from shamal.db.models import RunRow
from shamal.tracking._filters import (
    RUNS,
    decode_page_token,
    encode_page_token,
    parse_filter,
    parse_order_by,
)
from shamal.tracking._search import runs_query
from tests.search._data import add_experiment, add_input, add_run, fetch, migrated

INF = float("inf")
NAN = float("nan")
ACTIVE = ["r06", "r05", "r04", "r03", "r02", "r01"]  # the default order: start_time DESC


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    with migrated(database_url) as database:
        with database.unit_of_work() as s:
            _populate(s)
        yield database


def _populate(s: Session) -> None:
    add_experiment(s, 1, "exp-one")
    add_experiment(s, 2, "exp-two")
    add_run(
        s,
        "r01",
        1,
        start=1000,
        end=2000,
        name="Alpha run",
        user="ana",
        params={"p": "alpha", "lr": "0.01", "q": "b"},
        tags={"t": "Alpha"},
        metrics={"m": 1.0, "acc": 0.95},
    )
    add_run(
        s,
        "r02",
        1,
        start=2000,
        end=2500,
        name="alpha run",
        status="FAILED",
        user="bob",
        params={"p": "Alpha", "q": "a"},
        tags={"t": "alpha"},
        metrics={"m": 2.0, "acc": 0.5},
    )
    add_run(
        s,
        "r03",
        1,
        start=3000,
        name="ALPHA_x",
        params={"p": "ALPHA_x"},
        tags={"t": "a*b"},
        metrics={"m": NAN},
    )
    add_run(
        s,
        "r04",
        1,
        start=4000,
        name="beta",
        params={"p": "100%", "q": "c"},
        tags={"t": "a[b"},
        metrics={"m": INF},
    )
    add_run(
        s,
        "r05",
        1,
        start=5000,
        name="gamma",
        params={"p": "1000"},
        tags={"t": "a?b"},
        metrics={"m": -INF},
    )
    add_run(s, "r06", 1, start=6000, name="delta", status="RUNNING")
    add_run(s, "r07", 1, start=3000, stage="deleted", metrics={"m": 1.5})
    add_run(s, "r08", 2, start=7000, name="x' OR 1=1 --", metrics={"m": 1.0})
    add_input(s, "r01", 1, "ds-a", "d1", "train")
    add_input(s, "r02", 1, "ds-b", "d2", "eval")
    add_input(s, "r03", 1, "ds-a", "d1", None)
    add_input(s, "r04", 1, "DS-A", "d3", "Train")


def _search(
    db: Database,
    filter_text: str | None = None,
    order_by: list[str] | None = None,
    lifecycle: Literal["active", "deleted", "all"] = "active",
    experiments: tuple[int, ...] = (1,),
) -> list[str]:
    query = runs_query(
        list(experiments),
        parse_filter(filter_text, RUNS),
        parse_order_by(order_by, RUNS),
        lifecycle,
    )
    return fetch(db, query, "run_id")


METRIC_FILTERS = [
    ("metrics.m > 1.5", ["r04", "r02"]),
    ("metrics.m < 1.5", ["r05", "r01"]),
    ("metrics.m != 1", ["r05", "r04", "r02"]),
    ("metrics.m = 2", ["r02"]),
    ("metrics.m >= 1e308", ["r04"]),
    ("metrics.m <= -1.0E+308", ["r05"]),
    ("metrics.m >= -1e308", ["r04", "r02", "r01"]),
    ("metrics.m > -0.5e1 AND metrics.m < 1.5e0", ["r01"]),
    ("metrics.acc >= 0.9 AND params.lr = '0.01'", ["r01"]),
    ("metrics.missing > 0", []),
    ("metrics.`m` = 1", ["r01"]),
]


PARAM_AND_TAG_FILTERS = [
    ("params.p = 'alpha'", ["r01"]),
    ("params.p != 'alpha'", ["r05", "r04", "r03", "r02"]),
    ("params.p LIKE 'al%'", ["r01"]),
    ("params.p LIKE 'Al%'", ["r02"]),
    ("params.p ILIKE 'al%'", ["r03", "r02", "r01"]),
    ("params.p ILIKE 'ALPHA'", ["r02", "r01"]),
    ("params.p LIKE 'alph_'", ["r01"]),
    ("params.p LIKE '100\\%'", ["r04"]),
    ("params.p LIKE '100%'", ["r05", "r04"]),
    ("params.p ILIKE 'alpha\\_%'", ["r03"]),
    ("parameters.\"p\" = 'Alpha'", ["r02"]),
    ("tags.t = 'Alpha'", ["r01"]),
    ("tags.`t` = 'alpha'", ["r02"]),
    ("tags.t ILIKE 'ALPHA'", ["r02", "r01"]),
    ("tags.t LIKE 'a*%'", ["r03"]),
    ("tags.t LIKE 'a[%'", ["r04"]),
    ("tags.t LIKE 'a?b'", ["r05"]),
    ("tags.t LIKE 'a_b'", ["r05", "r04", "r03"]),
    ("tags.t LIKE '%%%%%%%%'", ["r05", "r04", "r03", "r02", "r01"]),
    ("tags.t != 'Alpha'", ["r05", "r04", "r03", "r02"]),
    # IS [NOT] NULL: whether the run has the key at all.
    ("params.q IS NULL", ["r06", "r05", "r03"]),
    ("params.q is not null", ["r04", "r02", "r01"]),
    ("tags.t IS NULL", ["r06"]),
    ("tags.t IS NOT NULL AND params.q IS NULL", ["r05", "r03"]),
    ("tags.missing IS NULL", ACTIVE),
    ("tags.missing IS NOT NULL", []),
    ("params.`lr` IS NOT NULL AND params.lr = '0.01'", ["r01"]),
]


ATTRIBUTE_FILTERS = [
    ("attributes.run_id IN ('r01', 'r03', 'R02')", ["r03", "r01"]),
    ("attributes.run_id IN ('R01')", []),
    ("run_id NOT IN ('r01', 'r03')", ["r06", "r05", "r04", "r02"]),
    ("run_id = 'r04'", ["r04"]),
    ("run_name LIKE 'alpha%'", ["r02"]),
    ("attributes.`run name` ILIKE 'alpha%'", ["r03", "r02", "r01"]),
    ("attr.run_name = 'Alpha run'", ["r01"]),
    ("status = 'FAILED'", ["r02"]),
    ("status != 'FINISHED'", ["r06", "r02"]),
    ("user_id = 'ana'", ["r01"]),
    ("start_time >= 2000 AND start_time < 5000", ["r04", "r03", "r02"]),
    ("attributes.created > 4000", ["r06", "r05"]),
    ("run.start_time = 1000.0", ["r01"]),
    ("end_time <= 2000", ["r01"]),
    ("end_time > 0", ["r02", "r01"]),
    ("artifact_uri LIKE '%/r01/%'", ["r01"]),
    ("run_name LIKE '%%%%%%%%'", ACTIVE),
    ("run_name = 'x\\' OR 1=1 --'", []),
]


DATASET_FILTERS = [
    ("datasets.name = 'ds-a'", ["r03", "r01"]),
    ("datasets.name LIKE 'ds-%'", ["r03", "r02", "r01"]),
    ("datasets.name ILIKE 'ds-a'", ["r04", "r03", "r01"]),
    ("datasets.digest IN ('d1', 'd2')", ["r03", "r02", "r01"]),
    ("dataset.digest NOT IN ('d1')", ["r04", "r02"]),
    ("datasets.context = 'train'", ["r01"]),
    ("datasets.context ILIKE 'train'", ["r04", "r01"]),
    ("datasets.context LIKE 'T%'", ["r04"]),
    ("datasets.context IN ('eval', 'train')", ["r02", "r01"]),
    ("datasets.context != 'train'", ["r04", "r02"]),
    ("datasets.name = 'ds-a' AND datasets.context = 'train'", ["r01"]),
]


ORDERS: list[tuple[list[str], list[str]]] = [
    (["metrics.m ASC"], ["r05", "r01", "r02", "r04", "r03", "r06"]),
    (["metrics.m DESC"], ["r04", "r02", "r01", "r05", "r03", "r06"]),
    (["metrics.`m`"], ["r05", "r01", "r02", "r04", "r03", "r06"]),
    (["params.q"], ["r02", "r01", "r04", "r06", "r05", "r03"]),
    (["params.q DESC"], ["r04", "r01", "r02", "r06", "r05", "r03"]),
    (["start_time ASC"], ["r01", "r02", "r03", "r04", "r05", "r06"]),
    (["attributes.created asc"], ["r01", "r02", "r03", "r04", "r05", "r06"]),
    (["end_time DESC"], ["r02", "r01", "r06", "r05", "r04", "r03"]),
    (["end_time"], ["r01", "r02", "r06", "r05", "r04", "r03"]),
    (["run_id DESC"], ["r06", "r05", "r04", "r03", "r02", "r01"]),
    (["metrics.acc DESC", "metrics.m DESC"], ["r01", "r02", "r04", "r05", "r03", "r06"]),
]


def test_filters_match_the_documented_semantics(db: Database) -> None:
    """Metrics (NaN, ±inf), params and tags (LIKE case-sensitive, ILIKE not), attributes
    and datasets (name, digest, the context input tag)."""
    table = METRIC_FILTERS + PARAM_AND_TAG_FILTERS + ATTRIBUTE_FILTERS + DATASET_FILTERS
    failures = [(f, got, want) for f, want in table if (got := _search(db, f)) != want]
    assert failures == []


def test_ordering_puts_nan_then_missing_metrics_and_nulls_last(db: Database) -> None:
    """As a stock server orders: a metric's numbers, then its NaN, then runs without it."""
    failures = [(o, got, want) for o, want in ORDERS if (got := _search(db, order_by=o)) != want]
    assert failures == []


def test_lifecycle_views_experiments_and_ties(db: Database) -> None:
    assert _search(db) == ACTIVE
    assert _search(db, lifecycle="deleted") == ["r07"]
    # r03 and r07 start together: run_id breaks the tie.
    assert _search(db, lifecycle="all") == ["r06", "r05", "r04", "r03", "r07", "r02", "r01"]
    assert _search(db, "metrics.m = 1", experiments=(1, 2)) == ["r08", "r01"]
    assert _search(db, experiments=()) == []


def test_hostile_looking_values_are_plain_data(db: Database) -> None:
    assert _search(db, "run_name = 'x\\' OR 1=1 --'", experiments=(2,)) == ["r08"]
    assert _search(db, "run_name = 'x'' OR 1=1 --'", experiments=(2,)) == ["r08"]
    assert _search(db, "run_name = '; DROP TABLE runs; --'", experiments=(1, 2)) == []
    with db.unit_of_work(write=False) as s:
        assert s.scalar(select(func.count()).select_from(RunRow)) == 8


def test_page_tokens_walk_25_runs_without_gaps_or_duplicates(database_url: str) -> None:
    """Ties in start_time, NULL and NaN sort keys: the tie-break keeps pages disjoint."""
    with migrated(database_url) as db:
        with db.unit_of_work() as s:
            add_experiment(s, 1, "paged")
            for i in range(25):
                add_run(
                    s,
                    f"run{i:02d}",
                    1,
                    start=i // 4,
                    end=i if i % 3 else None,
                    params={"p": f"v{i % 5}"} if i % 2 else {},
                    metrics={"m": [1.0, NAN, 2.0][i % 3]} if i % 4 else {},
                )
        for order_by in ([], ["metrics.m DESC"], ["params.p"], ["end_time"], ["run_name"]):
            query = runs_query([1], [], parse_order_by(order_by, RUNS), "active")
            pages = _walk(db, query, page_size=7)
            assert [len(p) for p in pages] == [7, 7, 7, 4], order_by
            walked = [run for page in pages for run in page]
            assert walked == fetch(db, query, "run_id"), order_by
            assert sorted(walked) == [f"run{i:02d}" for i in range(25)], order_by


def _walk(db: Database, query: Select[Any], page_size: int) -> list[list[str]]:
    """Fetch page after page as the service does: ``page_size + 1`` rows, then a token."""
    pages: list[list[str]] = []
    token: str | None = None
    while True:
        offset = decode_page_token(token)
        rows = fetch(db, query.offset(offset).limit(page_size + 1), "run_id")
        pages.append(rows[:page_size])
        if len(rows) <= page_size:
            return pages
        token = encode_page_token(offset + page_size)
