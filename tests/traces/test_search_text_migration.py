"""Migration 0028 fills each stored span's search text from its OTLP JSON (SQLite and
PostgreSQL): spans stored before it are found by ``trace.text`` as new ones are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import json_format
from sqlalchemy import text

from shamal.db import head_revision, open_database
from shamal.db import upgrade as migrate
from tests.traces.otlp import SpanSpec, mlflow_id, new_trace_id, request_of


def _otlp_json(spec: SpanSpec) -> str:
    """A span's OTLP JSON as Shamal stored it before 0028."""
    span = request_of(spec).resource_spans[0].scope_spans[0].spans[0]
    as_json = json_format.MessageToDict(span, preserving_proto_field_name=True)
    return json.dumps(as_json, ensure_ascii=False, separators=(",", ":"))


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_spans_stored_before_0028_get_mlflow_search_text(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path}/old.db"
        if backend == "sqlite"
        else request.getfixturevalue("empty_pg_url")
    )
    database = open_database(url)
    migrate(database, "0027")
    trace = new_trace_id()
    root = SpanSpec("root", trace, span_id=bytes.fromhex("00000000000000aa"))
    child = SpanSpec(
        "child",
        trace,
        span_id=bytes.fromhex("00000000000000bb"),
        parent=root.span_id,
        attributes={"note": "caf\u00e9 I like it"},
    )
    tid = mlflow_id(trace)
    # One batch of the migration is 500 spans: 501 more make it read a second one.
    extra = [SpanSpec(f"s{i}", trace, span_id=(1000 + i).to_bytes(8, "big")) for i in range(501)]
    spans = [root, child, *extra]
    with database.engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO experiments (experiment_id, name, artifact_location, "
                "lifecycle_stage, creation_time, last_update_time) "
                "VALUES (1, 'e', 'mlflow-artifacts:/1', 'active', 0, 0)"
            )
        )
        c.execute(
            text(
                "INSERT INTO traces (trace_id, experiment_id, request_time, state, "
                "span_count, span_bytes) VALUES (:t, 1, 0, 'OK', :n, 0)"
            ),
            {"t": tid, "n": len(spans)},
        )
        c.execute(
            text(
                "INSERT INTO trace_spans (trace_id, span_id, parent_span_id, name, status, "
                "start_time_ns, size, content) VALUES (:t, :s, :p, :name, 'OK', 1, 0, :c)"
            ),
            [
                {
                    "t": tid,
                    "s": spec.span_id.hex(),
                    "p": spec.parent.hex() or None,
                    "name": spec.name,
                    "c": _otlp_json(spec),
                }
                for spec in spans
            ],
        )
    assert migrate(database) == ("0027", head_revision())
    with database.engine.connect() as c:
        rows = c.execute(text("SELECT span_id, search_text FROM trace_spans")).all()
    database.dispose()
    assert all(found is not None for _, found in rows)
    stored = {str(span_id): str(found) for span_id, found in rows}
    assert len(stored) == len(spans)
    assert json.loads(stored["00000000000000bb"]) == {
        "trace_id": json.loads(_otlp_json(child))["trace_id"],
        "span_id": "AAAAAAAAALs=",
        "parent_span_id": "AAAAAAAAAKo=",
        "name": "child",
        "start_time_unix_nano": 1_700_000_000_000_000_000,
        "end_time_unix_nano": 1_700_000_000_500_000_000,
        "events": [],
        "status": {"code": "STATUS_CODE_OK", "message": ""},
        "attributes": {"note": '"caf\u00e9 I like it"'},
        "links": [],
    }
    assert "caf\u00e9" in stored["00000000000000bb"]  # searchable as written, not escaped
    assert all("value" not in t for t in stored.values())
    assert json.loads(stored["00000000000000aa"])["name"] == "root"
    assert json.loads(stored[extra[-1].span_id.hex()])["name"] == "s500"
