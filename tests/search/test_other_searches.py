"""Experiment, registry and logged-model search semantics on real rows, on both backends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Select
from sqlalchemy.orm import Session

from shamal.db import Database
from shamal.db.models import (
    LoggedModelParamRow,
    LoggedModelRow,
    LoggedModelTagRow,
    MetricRow,
    ModelVersionRow,
    ModelVersionTagRow,
    RegisteredModelRow,
    RegisteredModelTagRow,
)
from shamal.registry._search import model_versions_query, registered_models_query
from shamal.tracking._filters import (
    EXPERIMENTS,
    LOGGED_MODELS,
    MODEL_VERSIONS,
    REGISTERED_MODELS,
    parse_filter,
    parse_order_by,
    parse_order_by_objects,
)
from shamal.tracking._search import experiments_query, logged_models_query
from tests.search._data import add_experiment, add_run, fetch, migrated


def _experiments(s: Session) -> None:
    add_experiment(s, 1, "Alpha", created=1000, updated=5000, tags={"team": "vision"})
    add_experiment(s, 2, "alpha-2", created=2000, updated=4000, tags={"team": "Vision"})
    add_experiment(s, 3, "beta", created=2000, updated=3000)
    add_experiment(s, 4, "gamma", created=3000, updated=3000, stage="deleted", tags={"team": "nlp"})


def _registry(s: Session) -> None:
    for i, (name, stage) in enumerate(
        [("Alpha", "prod"), ("alpha-2", "Prod"), ("beta", None), ("gamma_1", None)], start=1
    ):
        s.add(
            RegisteredModelRow(
                id=f"rm{i}", name=name, creation_timestamp=i, last_updated_timestamp=10 - i
            )
        )
        if stage:
            s.add(RegisteredModelTagRow(model_id=f"rm{i}", key="stage", value=stage))
    s.flush()
    versions = [
        ("rm1", 1, "r1", "models:/m-1"),
        ("rm1", 2, "r2", "mlflow-artifacts:/x"),
        ("rm1", 3, None, "models:/m-3"),
        ("rm3", 1, "r1", "models:/m-9"),
        ("rm3", 2, "r3", "Models:/m-10"),
    ]
    for model_id, version, run_id, source in versions:
        s.add(
            ModelVersionRow(
                model_id=model_id,
                version=version,
                run_id=run_id,
                source=source,
                creation_timestamp=version * 10,
                last_updated_timestamp=0,
            )
        )
    s.flush()
    s.add(ModelVersionTagRow(model_id="rm1", version=1, key="k", value="v"))


def _logged_models(s: Session) -> None:
    add_run(s, "r01", 1)
    models = [
        ("m-a", 1, "model-a", "sklearn", "r01", 100, "active"),
        ("m-b", 1, "model-b", None, None, 200, "active"),
        ("m-c", 1, "model-c", None, None, 300, "deleted"),
        ("m-d", 2, "model-d", None, None, 400, "active"),
    ]
    for model_id, experiment, name, kind, run, created, stage in models:
        s.add(
            LoggedModelRow(
                model_id=model_id,
                experiment_id=experiment,
                name=name,
                artifact_location="x",
                creation_timestamp_ms=created,
                last_updated_timestamp_ms=created,
                status="LOGGED_MODEL_READY",
                lifecycle_stage=stage,
                model_type=kind,
                source_run_id=run,
            )
        )
    s.flush()
    s.add(LoggedModelParamRow(model_id="m-a", key="alpha", value="0.5"))
    s.add(LoggedModelTagRow(model_id="m-b", key="t", value="x"))
    for model_id, value, nan, step in [
        ("m-a", 0.2, False, 0),
        ("m-b", 0.8, False, 0),
        ("m-b", 0.0, True, 1),
        ("m-c", 0.1, False, 0),
    ]:
        s.add(
            MetricRow(
                run_id="r01",
                key="loss",
                step=step,
                timestamp=0,
                value=value,
                is_nan=nan,
                model_id=model_id,
            )
        )


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    with migrated(database_url) as database:
        with database.unit_of_work() as s:
            _experiments(s)
            _registry(s)
            _logged_models(s)
        yield database


def _mismatches(
    db: Database, build: Any, attribute: str, table: list[tuple[Any, Any, list[Any]]]
) -> list[tuple[Any, ...]]:
    failures = []
    for filter_text, order_by, want in table:
        query: Select[Any] = build(filter_text, order_by)
        got = fetch(db, query, attribute)
        if got != want:
            failures.append((filter_text, order_by, got, want))
    return failures


def test_experiment_search(db: Database) -> None:
    def build(f: str | None, o: list[str] | None, view: Any = "active") -> Select[Any]:
        return experiments_query(parse_filter(f, EXPERIMENTS), parse_order_by(o, EXPERIMENTS), view)

    # Default "0" was created now: it is the newest. Ties in creation_time: id DESC.
    table: list[tuple[Any, Any, list[Any]]] = [
        (None, None, [0, 3, 2, 1]),
        ("name = 'Alpha'", None, [1]),
        ("name LIKE 'alpha%'", None, [2]),
        ("name ILIKE 'alpha%'", None, [2, 1]),
        ("name != 'beta'", None, [0, 2, 1]),
        ("tags.team = 'vision'", None, [1]),
        ("tags.team ILIKE 'VISION'", None, [2, 1]),
        ("tags.team != 'vision'", None, [2]),
        ("tags.missing = 'x'", None, []),
        ("creation_time >= 2000 AND creation_time < 3000", None, [3, 2]),
        ("last_update_time > 3500", None, [0, 2, 1]),
        ("creation_time < 10000", ["name"], [1, 2, 3]),
        ("creation_time < 10000", ["name DESC"], [3, 2, 1]),
        (None, ["creation_time ASC"], [1, 3, 2, 0]),
        (None, ["last_update_time DESC"], [0, 1, 2, 3]),
        (None, ["experiment_id"], [0, 1, 2, 3]),
        ("experiment_id = '2'", None, [2]),
        ("experiment_id = '002'", None, [2]),
        ("experiment_id != '2'", None, [0, 3, 1]),
        ("experiment_id IN ('1', '3', '4')", None, [3, 1]),
        ("experiment_id NOT IN ('0', '1')", None, [3, 2]),
        ("experiment_id IN ('2') AND tags.team = 'Vision'", None, [2]),
        ("tags.team IS NULL", None, [0, 3]),
        ("tags.team IS NOT NULL", None, [2, 1]),
    ]
    assert _mismatches(db, build, "experiment_id", table) == []
    assert fetch(db, build(None, None, "deleted"), "experiment_id") == [4]
    assert fetch(db, build(None, None, "all"), "experiment_id") == [0, 4, 3, 2, 1]
    assert fetch(db, build("tags.team = 'nlp'", None, "all"), "experiment_id") == [4]


def test_registered_model_search(db: Database) -> None:
    def build(f: str | None, o: list[str] | None) -> Select[Any]:
        return registered_models_query(
            parse_filter(f, REGISTERED_MODELS), parse_order_by(o, REGISTERED_MODELS)
        )

    table: list[tuple[Any, Any, list[Any]]] = [
        (None, None, ["Alpha", "alpha-2", "beta", "gamma_1"]),
        ("name = 'Alpha'", None, ["Alpha"]),
        ("name LIKE 'alpha%'", None, ["alpha-2"]),
        ("name ILIKE 'alpha%'", None, ["Alpha", "alpha-2"]),
        ("name LIKE 'gamma\\_%'", None, ["gamma_1"]),
        ("name LIKE 'gamma_'", None, []),
        ("name != 'beta'", None, ["Alpha", "alpha-2", "gamma_1"]),
        ("tags.stage = 'prod'", None, ["Alpha"]),
        ("tags.stage ILIKE 'PROD'", None, ["Alpha", "alpha-2"]),
        ("tags.stage LIKE 'P%' AND name ILIKE 'a%'", None, ["alpha-2"]),
        (None, ["creation_timestamp DESC"], ["gamma_1", "beta", "alpha-2", "Alpha"]),
        (None, ["timestamp"], ["gamma_1", "beta", "alpha-2", "Alpha"]),
        (None, ["name DESC"], ["gamma_1", "beta", "alpha-2", "Alpha"]),
    ]
    assert _mismatches(db, build, "name", table) == []


def test_model_version_search(db: Database) -> None:
    def build(f: str | None, o: list[str] | None) -> Select[Any]:
        return model_versions_query(
            parse_filter(f, MODEL_VERSIONS), parse_order_by(o, MODEL_VERSIONS)
        )

    a1, a2, a3, b1, b2 = ("rm1", 1), ("rm1", 2), ("rm1", 3), ("rm3", 1), ("rm3", 2)
    table: list[tuple[Any, Any, list[Any]]] = [
        (None, None, [a3, a2, a1, b2, b1]),
        ("name = 'Alpha'", None, [a3, a2, a1]),
        ("name ILIKE 'ALPHA'", None, [a3, a2, a1]),
        ("version_number > 1", None, [a3, a2, b2]),
        ("version_number IN (1, '3')", None, [a3, a1, b1]),
        ("version_number = 2", None, [a2, b2]),
        ("run_id IN ('r1', 'R2')", None, [a1, b1]),
        ("run_id = 'r2'", None, [a2]),
        ("run_id != 'r1'", None, [a2, b2]),
        ("run_id NOT IN ('r1')", None, [a2, b2]),
        ("source_path LIKE 'models:/%'", None, [a3, a1, b1]),
        ("source_path ILIKE 'models:/%'", None, [a3, a1, b2, b1]),
        ("source_path = 'mlflow-artifacts:/x'", None, [a2]),
        ("tags.k = 'v'", None, [a1]),
        ("name = 'Alpha' AND version_number <= 2", None, [a2, a1]),
        (None, ["version_number ASC"], [a1, b1, a2, b2, a3]),
        (None, ["creation_timestamp DESC"], [a3, a2, b2, a1, b1]),
        (None, ["name DESC"], [b2, b1, a3, a2, a1]),
    ]
    failures = []
    for f, o, want in table:
        with db.unit_of_work(write=False) as s:
            rows = list(s.scalars(build(f, o)))
        assert all(isinstance(r, ModelVersionRow) for r in rows)
        got = [(r.model_id, r.version) for r in rows]
        if got != want:
            failures.append((f, o, got, want))
    assert failures == []


def test_logged_model_search(db: Database) -> None:
    def build(f: str | None, o: list[str] | None, experiments: list[int] | None = None) -> Any:
        filters, order = parse_filter(f, LOGGED_MODELS), parse_order_by(o, LOGGED_MODELS)
        return logged_models_query(experiments or [1], filters, order)

    table: list[tuple[Any, Any, list[Any]]] = [
        (None, None, ["m-b", "m-a"]),
        ("metrics.loss < 0.5", None, ["m-a"]),
        ("metrics.loss > 0.5", None, ["m-b"]),
        ("metrics.loss != 0.2", None, ["m-b"]),
        ("params.alpha = '0.5'", None, ["m-a"]),
        ("tags.t = 'x'", None, ["m-b"]),
        ("name LIKE 'model-%'", None, ["m-b", "m-a"]),
        ("name LIKE 'MODEL-%'", None, []),
        ("creation_timestamp > 150", None, ["m-b"]),
        ("creation_time <= 150", None, ["m-a"]),
        ("model_type = 'sklearn'", None, ["m-a"]),
        ("source_run_id = 'r01'", None, ["m-a"]),
        ("status = 'LOGGED_MODEL_READY'", None, ["m-b", "m-a"]),
        (None, ["name"], ["m-a", "m-b"]),
        (None, ["creation_timestamp"], ["m-a", "m-b"]),
        # m-b's latest loss (step 1) is NaN: it sorts as missing, last both ways.
        (None, ["metrics.loss"], ["m-a", "m-b"]),
        (None, ["metrics.loss DESC"], ["m-a", "m-b"]),
        # Without a value both tie: creation_timestamp DESC, then model_id.
        (None, ["metrics.missing"], ["m-b", "m-a"]),
        # Any column, as on a stock server; NULLs last both ways.
        (None, ["model_type"], ["m-a", "m-b"]),
        (None, ["model_type DESC"], ["m-a", "m-b"]),
        (None, ["source_run_id DESC"], ["m-a", "m-b"]),
        (None, ["experiment_id", "creation_timestamp_ms"], ["m-a", "m-b"]),
        (None, ["status", "name DESC"], ["m-b", "m-a"]),
    ]
    assert _mismatches(db, build, "model_id", table) == []
    assert fetch(db, build(None, None, [1, 2]), "model_id") == ["m-d", "m-b", "m-a"]


def test_logged_model_metric_order_reads_the_latest_point(db: Database) -> None:
    """The latest point is the newest timestamp, then the highest step, then the first
    run id; an item naming a dataset reads only that dataset's points."""
    with db.unit_of_work() as s:
        add_run(s, "r02", 1)
        points = [
            # model, run, timestamp, step, value, dataset
            ("m-a", "r01", 5, 0, 0.9, "eval"),
            ("m-a", "r01", 9, 0, 0.1, "train"),  # newest: m-a's latest is 0.1
            ("m-b", "r01", 9, 3, 0.6, None),  # same time as below, higher step: 0.6
            ("m-b", "r01", 9, 2, 0.05, None),
            ("m-b", "r02", 9, 3, 0.01, None),  # same time and step, later run id
        ]
        for model_id, run_id, timestamp, step, value, dataset in points:
            s.add(
                MetricRow(
                    run_id=run_id,
                    key="acc",
                    step=step,
                    timestamp=timestamp,
                    value=value,
                    is_nan=False,
                    model_id=model_id,
                    dataset_name=dataset,
                    dataset_digest=dataset and f"{dataset}-digest",
                )
            )

    def order(*items: dict[str, object]) -> list[str]:
        query = logged_models_query([1], [], parse_order_by_objects(list(items), LOGGED_MODELS))
        return fetch(db, query, "model_id")

    assert order({"field_name": "metrics.acc"}) == ["m-a", "m-b"]
    assert order({"field_name": "metrics.acc", "ascending": False}) == ["m-b", "m-a"]
    eval_desc = {"field_name": "metrics.acc", "ascending": False, "dataset_name": "eval"}
    assert order(eval_desc) == ["m-a", "m-b"]
    assert order({**eval_desc, "dataset_digest": "eval-digest"}) == ["m-a", "m-b"]
    assert order({**eval_desc, "dataset_digest": "other"}) == ["m-b", "m-a"]  # no value: ties
    assert order(
        {"field_name": "metrics.acc", "ascending": True, "dataset_digest": "train-digest"}
    ) == [
        "m-a",
        "m-b",
    ]
