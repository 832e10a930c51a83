"""Partitioned writes (``POST /api/v1/datasets/NAME/ingestions/parts`` then ``.../commits``):
each worker of a gang job has the server read and stage its own partition of a source (an S3
prefix's objects, or a SQL query's rows by a hashed column); the staged parts are committed
as one version, profiled and validated as a whole.

What is tested, on SQLite with moto's S3 server and the machine's PostgreSQL and MariaDB:
three partitions of a prefix and of a query commit as one version with every row once, the
merged profile and a validation over all parts (a row-count bound no single part meets, a
duplicate that only the whole shows); a retried partition replaces its staged part; the
refusals change nothing: an incomplete batch, another member's or another team's batch,
parts of different columns, a partition out of range, a partition column that is not an
identifier, more partitions than objects, a batch committed twice.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pymysql
import pytest
from fastapi.testclient import TestClient

from shamal.datasets import _sources
from shamal.errors import InvalidParameter
from tests.datasets.test_sources import (
    bucket,
    dataset,
    my_source,
    pg_source,
    s3_client,
    s3_endpoint,
    settings,
)
from tests.registry.conftest import People, people

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

__all__ = [
    "bucket",
    "dataset",
    "my_source",
    "people",
    "pg_source",
    "s3_client",
    "s3_endpoint",
    "settings",
]

SUITE = """expectations:
  - kind: unique
    columns: [id]
  - kind: row_count
    min: 500
"""


def _csv(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pacsv.write_csv(table, sink)
    return sink.getvalue()


def _stage(api: TestClient, people: People, name: str, who: str = "mo", **body: Any) -> Any:
    answer = api.post(
        f"/api/v1/datasets/{name}/ingestions/parts", json=body, headers=people.headers(who)
    )
    assert "Traceback" not in answer.text
    return answer


def _commit(api: TestClient, people: People, name: str, who: str = "mo", **body: Any) -> Any:
    answer = api.post(
        f"/api/v1/datasets/{name}/ingestions/commits", json=body, headers=people.headers(who)
    )
    assert "Traceback" not in answer.text
    return answer


def _versions(api: TestClient, people: People, name: str) -> list[dict[str, Any]]:
    found = api.get(f"/api/v1/datasets/{name}/versions", headers=people.headers("mo"))
    assert found.status_code == 200, found.text
    rows: list[dict[str, Any]] = found.json()
    return rows


def _rows(api: TestClient, people: People, name: str, version: dict[str, Any]) -> list[Any]:
    rows: list[Any] = []
    for index in range(len(version["parts"])):
        part = api.get(
            f"/api/v1/datasets/{name}/versions/{version['version']}/parts/{index}",
            headers=people.headers("mo"),
        )
        assert part.status_code == 200, part.text
        rows += pq.read_table(io.BytesIO(part.content)).to_pylist()
    return rows


def _objects(s3: S3Client, bucket: str, prefix: str, ids: list[range]) -> None:
    for number, chunk in enumerate(ids):
        table = pa.table({"id": list(chunk), "city": ["dubai"] * len(chunk)})
        s3.put_object(Bucket=bucket, Key=f"{prefix}{number:02d}.csv", Body=_csv(table))


def test_three_partitions_of_a_prefix_commit_as_one_validated_version(
    api: TestClient, people: People, dataset: str, bucket: str, s3_client: S3Client
) -> None:
    _objects(s3_client, bucket, "events/", [range(i * 100, i * 100 + 100) for i in range(5)])
    s3_client.put_object(Bucket=bucket, Key="events/", Body=b"")  # a folder marker
    assert api.put(
        f"/api/v1/datasets/{dataset}/suite", json={"yaml": SUITE}, headers=people.headers("rita")
    ).is_success
    source = f"s3://{bucket}/events/"
    staged = []
    for partition in range(3):
        answer = _stage(
            api, people, dataset, source=source, batch="job-1", partition=partition, partitions=3
        )
        assert answer.status_code == 201, answer.text
        staged.append(answer.json())
    # Objects 0, 3 | 1, 4 | 2: each part is profiled on its own as it is staged.
    assert [s["rows"] for s in staged] == [200, 200, 100]
    assert [s["profile"]["rows"] for s in staged] == [200, 200, 100]
    assert _versions(api, people, dataset) == []  # staged parts are not a version
    listed = api.get(
        f"/api/v1/datasets/{dataset}/ingestions/parts",
        params={"batch": "job-1"},
        headers=people.headers("mo"),
    )
    assert [p["partition"] for p in listed.json()] == [0, 1, 2]
    # A retried worker stages its partition again: it replaces the first, it is not a 4th.
    again = _stage(api, people, dataset, source=source, batch="job-1", partition=2, partitions=3)
    assert again.status_code == 201, again.text
    answer = _commit(api, people, dataset, batch="job-1", partitions=3)
    assert answer.status_code == 201, answer.text
    version = answer.json()
    assert version["status"] == "valid"
    assert version["row_count"] == 500
    assert [p["digest"] for p in version["parts"]] == [s["digest"] for s in staged]
    assert version["profile"]["scope"] == "version"
    assert version["profile"]["rows"] == 500
    (ids,) = [c for c in version["profile"]["columns"] if c["name"] == "id"]
    assert (ids["min"], ids["max"]) == (0, 499)
    results = version["validation"]["results"]
    assert version["validation"]["ok"] is True
    assert version["validation"]["rows"] == 500
    assert [r["passed"] for r in results] == [True, True]
    assert version["source"] == {
        "kind": "s3",
        "uri": source,
        "format": None,
        "partitions": 3,
        "batch": "job-1",
    }
    assert sorted(r["id"] for r in _rows(api, people, dataset, version)) == list(range(500))
    # The batch cannot be committed twice (its parts would be appended again).
    twice = _commit(api, people, dataset, batch="job-1", partitions=3)
    assert twice.status_code == 409, twice.text
    assert len(_versions(api, people, dataset)) == 1


def test_the_whole_is_validated_a_duplicate_across_partitions_quarantines(
    api: TestClient, people: People, dataset: str, bucket: str, s3_client: S3Client
) -> None:
    _objects(s3_client, bucket, "dup/", [range(250), range(249, 499)])
    suite = api.put(
        f"/api/v1/datasets/{dataset}/suite", json={"yaml": SUITE}, headers=people.headers("rita")
    )
    assert suite.is_success, suite.text
    for partition in range(2):
        answer = _stage(
            api,
            people,
            dataset,
            source=f"s3://{bucket}/dup/",
            batch="b",
            partition=partition,
            partitions=2,
        )
        assert answer.status_code == 201, answer.text
    answer = _commit(api, people, dataset, batch="b", partitions=2, mode="overwrite")
    assert answer.status_code == 201, answer.text
    version = answer.json()
    assert version["status"] == "quarantined"
    failed = [r for r in version["validation"]["results"] if not r["passed"]]
    assert [r["kind"] for r in failed] == ["unique"]


def test_commits_of_what_is_not_the_callers_staged_batch_are_refused(
    api: TestClient, people: People, dataset: str, bucket: str, s3_client: S3Client
) -> None:
    _objects(s3_client, bucket, "p/", [range(10), range(10, 20), range(20, 30)])
    source = f"s3://{bucket}/p/"
    for partition in (0, 1):
        answer = _stage(
            api, people, dataset, source=source, batch="j", partition=partition, partitions=3
        )
        assert answer.status_code == 201, answer.text
    incomplete = _commit(api, people, dataset, batch="j", partitions=3)
    assert incomplete.status_code == 409
    assert "2 of the 3 partitions" in incomplete.json()["message"]
    assert _commit(api, people, dataset, batch="unknown", partitions=3).status_code == 409
    assert _commit(api, people, dataset, batch="j", partitions=2).status_code == 409
    answer = _stage(api, people, dataset, source=source, batch="j", partition=2, partitions=3)
    assert answer.status_code == 201, answer.text
    # Another member of the team cannot commit (or list) mo's staged parts ...
    assert _commit(api, people, dataset, "rita", batch="j", partitions=3).status_code == 409
    listed = api.get(
        f"/api/v1/datasets/{dataset}/ingestions/parts",
        params={"batch": "j"},
        headers=people.headers("rita"),
    )
    assert listed.json() == []
    # ... another team does not see the dataset, a viewer may not write it.
    assert _commit(api, people, dataset, "bo", batch="j", partitions=3).status_code == 404
    assert _commit(api, people, dataset, "vi", batch="j", partitions=3).status_code == 403
    assert (
        _stage(
            api, people, dataset, "bo", source=source, batch="j", partition=0, partitions=3
        ).status_code
        == 404
    )
    assert _versions(api, people, dataset) == []
    assert _commit(api, people, dataset, batch="j", partitions=3).status_code == 201


@pytest.mark.parametrize(
    "body",
    [
        {"partition": 3, "partitions": 3},
        {"partition": -1, "partitions": 3},
        {"partition": 0, "partitions": 0},
        {"partition": 0, "partitions": 5000},
        {"partition": 0, "partitions": 2, "batch": "../x"},
        {"partition": 0, "partitions": 2, "batch": ""},
        {"partition": 0, "partitions": 2, "partition_by": "id"},  # no query: an S3 source
        {"partition": 0, "partitions": 2, "source": "s3://BUCKET/p/00.csv"},  # one object
        {"partition": 0, "partitions": 4},  # three objects
        {"partition": 0, "partitions": 2, "source": "s3://BUCKET/p/../"},
        {"partition": 0, "partitions": 2, "source": "s3://BUCKET/p//"},
        {"partition": 0, "partitions": 2, "source": "s3://BUCKET/p/", "query": "SELECT 1"},
    ],
)
def test_malformed_partitions_are_refused_and_stage_nothing(
    api: TestClient,
    people: People,
    dataset: str,
    bucket: str,
    s3_client: S3Client,
    body: dict[str, Any],
) -> None:
    _objects(s3_client, bucket, "p/", [range(10), range(10, 20), range(20, 30)])
    sent = {"source": f"s3://{bucket}/p/", "batch": "j", **body}
    sent["source"] = sent["source"].replace("BUCKET", bucket)
    answer = _stage(api, people, dataset, **sent)
    assert answer.status_code in (400, 422), answer.text
    assert "error_code" in answer.json()
    listed = api.get(
        f"/api/v1/datasets/{dataset}/ingestions/parts",
        params={"batch": "j"},
        headers=people.headers("mo"),
    )
    assert listed.json() == []


def test_partitions_of_different_columns_do_not_commit(
    api: TestClient, people: People, dataset: str, bucket: str, s3_client: S3Client
) -> None:
    s3_client.put_object(Bucket=bucket, Key="mixed/a.csv", Body=b"id,city\n1,x\n")
    s3_client.put_object(Bucket=bucket, Key="mixed/b.csv", Body=b"id,town\n2,y\n")
    for partition in (0, 1):
        answer = _stage(
            api,
            people,
            dataset,
            source=f"s3://{bucket}/mixed/",
            batch="m",
            partition=partition,
            partitions=2,
        )
        assert answer.status_code == 201, answer.text
    answer = _commit(api, people, dataset, batch="m", partitions=2)
    assert answer.status_code == 400
    assert "columns differ" in answer.json()["message"]
    assert _versions(api, people, dataset) == []


def test_a_partition_column_is_a_quoted_identifier() -> None:
    narrowed = _sources.partition_query("postgresql", "SELECT * FROM t -- x", "id", 1, 3)
    assert narrowed.startswith("SELECT q.* FROM (\nSELECT * FROM t -- x\n) AS q WHERE")
    assert 'q."id"' in narrowed
    assert "q.`id`" in _sources.partition_query("mysql", "SELECT 1", "id", 0, 2)
    assert _sources.partition_query("mysql", "SELECT 1", None, 0, 1) == "SELECT 1"
    for column in ('id"; DROP TABLE t; --', "a b", "1a", "", "a.b", "x`y", None):
        with pytest.raises(InvalidParameter, match="--partition-by"):
            _sources.partition_query("postgresql", "SELECT 1", column, 0, 2)


def _sql_partitions(
    api: TestClient, people: People, dataset: str, source: str, query: str, column: str
) -> dict[str, Any]:
    for partition in range(3):
        answer = _stage(
            api,
            people,
            dataset,
            source=source,
            query=query,
            partition_by=column,
            batch="sql",
            partition=partition,
            partitions=3,
        )
        assert answer.status_code == 201, answer.text
        assert answer.json()["source"]["partition"] == partition
    answer = _commit(api, people, dataset, batch="sql", partitions=3, mode="overwrite")
    assert answer.status_code == 201, answer.text
    version: dict[str, Any] = answer.json()
    return version


def test_a_postgres_query_in_three_partitions_reads_every_row_once(
    api: TestClient, people: People, dataset: str, pg_source: tuple[str, str, str]
) -> None:
    database, reader, password = pg_source
    with psycopg.connect(host="127.0.0.1", user="postgres", dbname=database) as conn:
        conn.execute("UPDATE orders SET note = NULL WHERE id % 7 = 0")  # NULL keys: partition 0
    source = f"postgresql://{reader}:{password}@127.0.0.1:5432/{database}"
    bad = _stage(
        api,
        people,
        dataset,
        source=source,
        query="SELECT id FROM orders",
        partition_by='id"--',
        batch="sql",
        partition=0,
        partitions=3,
    )
    assert bad.status_code in (400, 422)
    version = _sql_partitions(api, people, dataset, source, "SELECT id, note FROM orders", "note")
    assert password not in str(version)
    assert version["row_count"] == 2500
    assert len(version["parts"]) == 3
    assert all(p["rows"] > 0 for p in version["parts"])
    assert sorted(r["id"] for r in _rows(api, people, dataset, version)) == list(range(1, 2501))
    assert version["source"]["partition_by"] == "note"
    assert version["source"]["query"] == "SELECT id, note FROM orders"


def test_a_mariadb_query_in_three_partitions_reads_every_row_once(
    api: TestClient, people: People, dataset: str, my_source: tuple[str, str, str]
) -> None:
    database, reader, password = my_source
    conn = pymysql.connect(host="127.0.0.1", user="root", database=database, autocommit=True)
    try:
        with conn.cursor() as c:
            c.execute("UPDATE orders SET note = NULL WHERE id % 7 = 0")
    finally:
        conn.close()
    source = f"mariadb://{reader}:{password}@127.0.0.1:3306/{database}"
    version = _sql_partitions(api, people, dataset, source, "SELECT id, note FROM orders", "note")
    assert version["row_count"] == 1500
    assert all(p["rows"] > 0 for p in version["parts"])
    assert sorted(r["id"] for r in _rows(api, people, dataset, version)) == list(range(1, 1501))
