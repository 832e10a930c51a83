"""Reference profiles: built from a dataset version in batches, uploaded as sketch JSON,
read and changed only by the model's readers and team members."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from shamal.db.models import MonitorReferenceRow
from shamal.errors import InvalidParameter, NotFound, PermissionDenied
from shamal.monitoring import ColumnRole, ReferenceService
from shamal.server import Platform
from tests.monitoring.conftest import MODEL, ROWS, People, training_table


def _count(platform: Platform) -> int:
    with platform.db.unit_of_work(write=False) as s:
        return int(s.scalar(select(func.count()).select_from(MonitorReferenceRow)) or 0)


def test_a_reference_is_built_from_every_batch_of_the_dataset_version(
    references: ReferenceService, people: People
) -> None:
    profile = references.build(people.ctx("mo"), MODEL, 1, "txns/1", label="is_fraud")
    assert (profile.dataset, profile.dataset_version, profile.rows) == ("txns", 1, ROWS)
    roles = {name: c.role for name, c in profile.columns.items()}
    assert roles == {
        "amount": ColumnRole.FEATURE,
        "country": ColumnRole.FEATURE,
        "is_fraud": ColumnRole.LABEL,
    }
    # Read 300 rows at a time, yet every row is in the sketch.
    table = training_table()
    amount = profile.columns["amount"].sketch
    assert amount.count == ROWS
    assert amount.mean == pytest.approx(float(table["amount"].to_numpy().mean()), rel=1e-9)
    assert sum((profile.columns["country"].sketch.counts or {}).values()) == ROWS
    # Ten reference chunks of 200 rows: their distances from the whole give each band.
    assert profile.chunks is not None
    assert profile.chunks["rows_per_chunk"] == ROWS // 10
    bands = profile.chunks["columns"]
    assert set(bands) == {"amount", "country", "is_fraud"}
    assert len(bands["amount"]["distances"]) == 10
    assert bands["amount"]["band"]["upper"] > max(bands["amount"]["distances"]) * 0.5
    # What is stored reads back the same.
    again = references.get(people.principals["vi"], MODEL, 1)
    assert again.columns["amount"].sketch == amount


def test_uploaded_prediction_sketches_join_the_profile_and_survive_a_rebuild(
    references: ReferenceService, people: People
) -> None:
    references.build(people.ctx("mo"), MODEL, 1, "txns/1", label="is_fraud")
    amount = references.get(people.principals["mo"], MODEL, 1).columns["amount"].sketch
    raw = amount.to_json()
    raw["name"] = "score"
    profile = references.upload(people.ctx("mo"), MODEL, 1, {"score": raw})
    assert profile.columns["score"].role is ColumnRole.PREDICTION
    rebuilt = references.build(people.ctx("mo"), MODEL, 1, "txns/1", columns=["amount"])
    assert set(rebuilt.columns) == {"amount", "score"}


@pytest.mark.parametrize(
    "sketches",
    [
        {},
        {"score": "not json of a sketch"},
        {"score": {"name": "score", "kind": "numeric", "count": -5}},
        {"score": {"name": "score", "kind": "exotic", "count": 1}},
        {"score": {"name": "other", "kind": "numeric", "count": 0}},
        {"score": {"kind": "numeric"}},
        {"bad\x00name": {"name": "bad\x00name", "kind": "numeric", "count": 0}},
    ],
)
def test_bad_sketch_json_is_refused_and_nothing_is_stored(
    references: ReferenceService, people: People, platform: Platform, sketches: dict[str, object]
) -> None:
    with pytest.raises(InvalidParameter):
        references.upload(people.ctx("mo"), MODEL, 1, sketches)
    assert _count(platform) == 0


def test_access_follows_the_model_and_its_team(
    references: ReferenceService, people: People, platform: Platform
) -> None:
    references.build(people.ctx("mo"), MODEL, 1, "txns/1")
    with pytest.raises(NotFound):  # another team: the model is not there for them
        references.get(people.principals["bo"], MODEL, 1)
    with pytest.raises(NotFound):
        references.build(people.ctx("bo"), MODEL, 1, "txns/1")
    with pytest.raises(PermissionDenied):  # a viewer reads but does not build
        references.build(people.ctx("vi"), MODEL, 1, "txns/1")
    with pytest.raises(NotFound):
        references.build(people.ctx("mo"), MODEL, 99, "txns/1")
    with pytest.raises(NotFound):  # no profile for version 2 yet
        references.get(people.principals["mo"], MODEL, 2)
    with pytest.raises(InvalidParameter):
        references.build(people.ctx("mo"), MODEL, 2, "txns/1", columns=["nope"])
    assert _count(platform) == 1
    references.delete(people.ctx("mo"), MODEL, 1)
    assert _count(platform) == 0
