"""Sources the server reads itself (``POST /api/v1/datasets/NAME/ingestions``): an S3 object
(moto's server), a query on PostgreSQL and on MariaDB (the machine's real servers).

What is tested: a version from each; the allow-list (buckets, ``host:port``) and every path
and URI case of hostile-inputs §1, §2 and §5 refused before anything is read; SQL that tries
to write (plain, via a CTE, a sequence, a side-effect function), sleeps past the timeout or
reads another schema fails with a clear 400 and changes nothing, in the source database or in
the dataset; a connection string's password is in no answer and no stored version.
"""

from __future__ import annotations

import gzip
import io
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pymysql
import pytest
from fastapi.testclient import TestClient

from shamal.config import DataSourceSettings, Settings
from tests.artifacts.conftest import s3_client, s3_endpoint
from tests.conftest import _pg_connect
from tests.registry.conftest import People, people

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

__all__ = ["people", "s3_client", "s3_endpoint"]

BUCKET = f"shamal-src-{uuid.uuid4().hex[:12]}"
PG_HOST = "127.0.0.1:5432"
MY_HOST = "127.0.0.1:3306"


@pytest.fixture
def settings(tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str) -> Settings:
    """SQLite platform (the reading does not depend on the platform's database) that may read
    one bucket and the machine's PostgreSQL and MariaDB, with a 2 s statement timeout."""
    home = tmp_path_factory.mktemp("home")
    return Settings(
        home=home,
        allowed_hosts=("*",),
        data_sources=DataSourceSettings(
            s3_buckets=(BUCKET,),
            s3_endpoint_url=s3_endpoint,
            s3_region="us-east-1",
            sql_hosts=(PG_HOST, MY_HOST),
            sql_timeout_s=2.0,
        ),
    )


def _csv(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pacsv.write_csv(table, sink)
    return sink.getvalue()


def _versions(api: TestClient, people: People, name: str) -> list[dict[str, object]]:
    found = api.get(f"/api/v1/datasets/{name}/versions", headers=people.headers("mo"))
    assert found.status_code == 200, found.text
    rows: list[dict[str, object]] = found.json()
    return rows


def _ingest(api: TestClient, people: People, name: str, **body: object) -> tuple[int, str]:
    answer = api.post(
        f"/api/v1/datasets/{name}/ingestions", json=body, headers=people.headers("mo")
    )
    assert "Traceback" not in answer.text
    return answer.status_code, answer.text


@pytest.fixture
def dataset(api: TestClient, people: People) -> str:
    made = api.post(
        "/api/v1/datasets", json={"name": "src", "team": "red"}, headers=people.headers("mo")
    )
    assert made.status_code == 201, made.text
    return "src"


# ------------------------------------------------------------------------------------- S3
@pytest.fixture
def bucket(s3_client: S3Client) -> str:
    s3_client.create_bucket(Bucket=BUCKET)
    return BUCKET


def test_an_s3_object_becomes_a_version(
    api: TestClient, people: People, dataset: str, bucket: str, s3_client: S3Client
) -> None:
    table = pa.table({"id": list(range(500)), "city": ["dubai", "abu dhabi"] * 250})
    s3_client.put_object(Bucket=bucket, Key="raw/cities.csv.gz", Body=gzip.compress(_csv(table)))
    code, text = _ingest(api, people, dataset, source=f"s3://{bucket}/raw/cities.csv.gz")
    assert code == 201, text
    (version,) = _versions(api, people, dataset)
    assert version["row_count"] == 500
    assert version["source"] == {
        "kind": "s3",
        "uri": f"s3://{bucket}/raw/cities.csv.gz",
        "format": "csv",
    }
    part = api.get(f"/api/v1/datasets/{dataset}/versions/1/parts/0", headers=people.headers("mo"))
    assert pq.read_table(io.BytesIO(part.content)).to_pylist() == table.to_pylist()


def test_s3_refusals_change_nothing(
    api: TestClient, people: People, dataset: str, bucket: str, s3_client: S3Client
) -> None:
    s3_client.put_object(Bucket=bucket, Key="bomb.csv.gz", Body=gzip.compress(b"a\n" * 1))
    other = f"shamal-other-{uuid.uuid4().hex[:8]}"
    s3_client.create_bucket(Bucket=other)
    s3_client.put_object(Bucket=other, Key="x.csv", Body=b"a\n1\n")
    assert _ingest(api, people, dataset, source=f"s3://{other}/x.csv")[0] == 403
    assert _ingest(api, people, dataset, source=f"s3://{bucket}/missing.csv")[0] == 404
    assert _ingest(api, people, dataset, source=f"s3://{bucket}/x.xlsx")[0] == 400
    code, text = _ingest(api, people, dataset, source=f"s3://{bucket}/bomb.csv.gz", query="x")
    assert code == 400
    assert "--query is for SQL" in text
    # Someone outside the team cannot use the server to read the bucket.
    outsider = api.post(
        f"/api/v1/datasets/{dataset}/ingestions",
        json={"source": f"s3://{bucket}/bomb.csv.gz"},
        headers=people.headers("bo"),
    )
    assert outsider.status_code == 404
    assert _versions(api, people, dataset) == []


HOSTILE_SOURCES = (
    # §1 paths and traversal, §2 stored URIs, §5 SSRF: none is a source the server reads.
    "../../etc/passwd",
    "/etc/passwd",
    "//etc/passwd",
    "C:/Windows/win.ini",
    "\\\\server\\share\\x",
    "..\\..\\etc\\passwd",
    "%2e%2e/%2e%2e/etc",
    "file:///etc/passwd",
    "file:/etc/passwd",
    "//proc/self/root/etc",
    "~root/.ssh/id_rsa",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00:ec2::254]/",
    "https://metadata.google.internal/",
    "gopher://127.0.0.1:6379/_SET",
    "dict://127.0.0.1:6379/",
    "ftp://x/y",
    "dbfs:/x",
    "jar:file:///x!/",
    "netdoc:///etc/passwd",
    "HTTP://X/../../",
    "S3://bucket/x.csv",
    "s3:/bucket/models/../../other.csv",
    f"s3://{BUCKET}/models/../../other.csv",
    f"s3://{BUCKET}/a/%2e%2e/b.csv",
    f"s3://{BUCKET}/a%252e%252e/b.csv",
    f"s3://{BUCKET}/a;/../x.csv",
    f"s3://{BUCKET}/a#/../x.csv",
    f"s3://{BUCKET}/a?/x.csv",
    f"s3://{BUCKET}/a\x00.csv",
    f"s3://{BUCKET}/a\n../x.csv",
    f"s3://{BUCKET}/a\r\nX-Injected: 1",
    f"s3://user@{BUCKET}/x.csv",
    f"s3://{BUCKET}:9000/x.csv",
    f"s3://{BUCKET}/",
    f"s3://{BUCKET}//x.csv",
    "postgresql://u@127.0.0.1#@good.example:5432/db",
    "postgresql://u@127.0.0.1:5432/db?options=-c%20default_transaction_read_only%3Doff",
    "postgresql://u@127.0.0.1:5432/db?application_name=x",
    "postgresql://u@127.0.0.1:5432/",
    "postgresql://u@127.0.0.1:5432/a/b",
    "postgresql://u@127.0.0.1:99999/db",
    "a" * 3000,
    "",
)
OFF_THE_LIST = (
    # Well-formed, but not hosts or buckets the operator listed: 403, nothing connected to.
    "postgresql://u@10.0.0.1:5432/db",
    "postgresql://u@localhost:5432/db",
    "postgresql://u@[::1]:5432/db",
    "postgresql://u@[::ffff:127.0.0.1]:5432/db",
    "postgresql://u@2130706433:5432/db",
    "postgresql://u@0x7f000001:5432/db",
    "postgresql://u@127.1:5432/db",
    "postgresql://u@0.0.0.0:5432/db",
    "postgresql://u@127.0.0.1:6379/db",
    "postgresql://u@169.254.169.254:80/db",
    "mysql://u@127.0.0.1:5432/db#",
    "mariadb://u@192.168.0.1:3306/db",
    "s3://other-tenant-bucket/x.csv",
)


def test_hostile_and_unlisted_sources_are_refused_and_change_nothing(
    api: TestClient, people: People, dataset: str
) -> None:
    for source in HOSTILE_SOURCES:
        code, text = _ingest(api, people, dataset, source=source, query="SELECT 1")
        assert code == 400, (source, text)
    for source in OFF_THE_LIST:
        query = None if source.startswith("s3") else "SELECT 1"
        code, text = _ingest(api, people, dataset, source=source, query=query)
        assert code in (400, 403), (source, text)
        assert code == 403 or "#" in source, (source, text)
    assert _versions(api, people, dataset) == []


# ------------------------------------------------------------------------------ PostgreSQL
@pytest.fixture
def pg_source() -> Iterator[tuple[str, str, str]]:
    """A database with public.orders (the reader may select, insert, update, delete and
    create: only the read-only transaction stops its writes), a sequence it may use, and a
    schema ``secret`` it has no grant on. Yields (database, reader, password)."""
    tag = uuid.uuid4().hex[:10]
    database, reader, password = f"shamal_src_{tag}", f"shamal_reader_{tag}", f"pw-{tag}-Z9"
    with _pg_connect() as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
        admin.execute(f"CREATE ROLE {reader} LOGIN PASSWORD '{password}'")
    try:
        with psycopg.connect(
            host="127.0.0.1", user="postgres", dbname=database, autocommit=True
        ) as conn:
            conn.execute(
                "CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2), placed date, "
                "note text, paid boolean, meta jsonb)"
            )
            conn.execute(
                "INSERT INTO orders SELECT i, i * 1.5, DATE '2026-01-01' + i, 'n' || i, "
                "i % 2 = 0, jsonb_build_object('i', i) FROM generate_series(1, 2500) i"
            )
            conn.execute("CREATE SEQUENCE seq")
            conn.execute("CREATE SCHEMA secret")
            conn.execute("CREATE TABLE secret.salaries (who text, amount int)")
            conn.execute("INSERT INTO secret.salaries VALUES ('x', 1)")
            conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON orders TO {reader}")
            conn.execute(f"GRANT USAGE ON SEQUENCE seq TO {reader}")
            conn.execute(f"GRANT CREATE ON SCHEMA public TO {reader}")
        yield database, reader, password
    finally:
        with _pg_connect() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            admin.execute(f"DROP ROLE IF EXISTS {reader}")


def _pg_state(database: str) -> tuple[object, ...]:
    with psycopg.connect(host="127.0.0.1", user="postgres", dbname=database) as conn:
        row = conn.execute(
            "SELECT count(*), sum(amount), (SELECT last_value FROM seq), "
            "(SELECT count(*) FROM pg_tables WHERE schemaname = 'public') FROM orders"
        ).fetchone()
    assert row is not None
    return tuple(row)


def test_a_postgres_query_becomes_a_version_without_the_password(
    api: TestClient, people: People, dataset: str, pg_source: tuple[str, str, str]
) -> None:
    database, reader, password = pg_source
    source = f"postgresql://{reader}:{password}@127.0.0.1:5432/{database}"
    query = "SELECT id, amount, placed, note, paid, meta FROM orders WHERE id <= 2400;"
    code, text = _ingest(api, people, dataset, source=source, query=query, mode="overwrite")
    assert code == 201, text
    assert password not in text
    (version,) = _versions(api, people, dataset)
    assert version["row_count"] == 2400
    assert version["source"] == {
        "kind": "postgresql",
        "uri": f"postgresql://{reader}@127.0.0.1:5432/{database}",
        "query": query.rstrip(";"),
    }
    columns = {c["name"]: c["type"] for c in version["columns"]}  # type: ignore[attr-defined]
    assert columns == {
        "id": "int64",
        "amount": "double",
        "placed": "date32[day]",
        "note": "string",
        "paid": "bool",
        "meta": "string",
    }
    part = api.get(f"/api/v1/datasets/{dataset}/versions/1/parts/0", headers=people.headers("mo"))
    rows = pq.read_table(io.BytesIO(part.content)).to_pylist()
    assert rows[0]["amount"] == 1.5
    assert rows[0]["meta"] == '{"i": 1}'
    nowhere = source.replace(database, "no_such_database")
    code, text = _ingest(api, people, dataset, source=nowhere, query="SELECT 1")
    assert code == 400
    assert "cannot connect" in text
    assert password not in text


PG_WRITES = (
    "INSERT INTO orders VALUES (99999, 1)",
    "UPDATE orders SET amount = 0",
    "DELETE FROM orders",
    "CREATE TABLE stolen AS SELECT * FROM orders",
    "SELECT 1; DELETE FROM orders",
    "SELECT 1;DROP TABLE orders;",
    "WITH gone AS (DELETE FROM orders RETURNING *) SELECT count(*) FROM gone",
    "WITH added AS (INSERT INTO orders VALUES (99999, 1) RETURNING id) SELECT * FROM added",
    "SELECT nextval('seq')",
    "SELECT set_config('transaction_read_only', 'off', true), nextval('seq')",
    "SELECT pg_sleep(30)",
    "SELECT lo_import('/etc/passwd')",
    "SELECT pg_read_file('/etc/passwd')",
    "SELECT * FROM secret.salaries",
    "COPY orders TO STDOUT",
    "/* hidden */ DELETE FROM orders",
)


def test_postgres_queries_that_write_sleep_or_reach_out_fail_and_change_nothing(
    api: TestClient, people: People, dataset: str, pg_source: tuple[str, str, str]
) -> None:
    database, reader, password = pg_source
    source = f"postgresql://{reader}:{password}@127.0.0.1:5432/{database}"
    before = _pg_state(database)
    for query in PG_WRITES:
        code, text = _ingest(api, people, dataset, source=source, query=query)
        assert code == 400, (query, text)
        assert password not in text
    assert _pg_state(database) == before
    assert _versions(api, people, dataset) == []
    # The grants bound what is read: the error says so, and names nothing of the data.
    _code, text = _ingest(
        api, people, dataset, source=source, query="SELECT * FROM secret.salaries"
    )
    assert "permission denied for schema secret" in text
    _code, text = _ingest(api, people, dataset, source=source, query="SELECT pg_sleep(30)")
    assert "statement timeout" in text


# ------------------------------------------------------------------------------ MariaDB
@pytest.fixture
def my_source() -> Iterator[tuple[str, str, str]]:
    tag = uuid.uuid4().hex[:10]
    database, reader, password = f"shamal_src_{tag}", f"rd_{tag}", f"pw-{tag}-Z9"
    admin = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
    try:
        with admin.cursor() as c:
            c.execute(f"CREATE DATABASE {database}")
            c.execute(f"USE {database}")
            c.execute(
                f"CREATE TABLE {database}.orders (id int PRIMARY KEY, amount decimal(10,2), "
                "placed date, note varchar(40), stamp datetime)"
            )
            c.execute(
                f"INSERT INTO {database}.orders SELECT seq, seq * 1.5, '2026-01-01', "
                "CONCAT('n', seq), '2026-01-01 10:00:00' FROM seq_1_to_1500"
            )
            c.execute(f"CREATE TABLE {database}.secret (who text)")
            c.execute(f"CREATE SEQUENCE {database}.seq")
            c.execute(f"CREATE USER '{reader}'@'%' IDENTIFIED BY '{password}'")
            c.execute(
                f"GRANT SELECT, INSERT, UPDATE, DELETE ON {database}.orders TO '{reader}'@'%'"
            )
            c.execute(f"GRANT INSERT, SELECT ON {database}.seq TO '{reader}'@'%'")
        yield database, reader, password
    finally:
        with admin.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS {database}")
            c.execute(f"DROP USER IF EXISTS '{reader}'@'%'")
        admin.close()


def _my_count(database: str) -> tuple[object, ...]:
    conn = pymysql.connect(host="127.0.0.1", user="root", database=database)
    try:
        with conn.cursor() as c:
            c.execute(
                "SELECT count(*), sum(amount), (SELECT next_not_cached_value FROM seq) FROM orders"
            )
            row = c.fetchone()
    finally:
        conn.close()
    assert row is not None
    return tuple(row)


def test_a_mariadb_query_becomes_a_version_and_writes_fail(
    api: TestClient, people: People, dataset: str, my_source: tuple[str, str, str]
) -> None:
    database, reader, password = my_source
    source = f"mariadb://{reader}:{password}@127.0.0.1:3306/{database}"
    before = _my_count(database)
    for query in (
        "DELETE FROM orders",
        "SELECT 1; DELETE FROM orders",
        "SELECT sleep(30)",
        "SELECT nextval(seq)",
        "SELECT * FROM secret",
        "SELECT * FROM orders INTO OUTFILE '/tmp/x'",
    ):
        code, text = _ingest(api, people, dataset, source=source, query=query)
        assert code == 400, (query, text)
        assert password not in text
    assert _my_count(database) == before
    assert _versions(api, people, dataset) == []
    code, text = _ingest(api, people, dataset, source=source, query="SELECT * FROM orders")
    assert code == 201, text
    (version,) = _versions(api, people, dataset)
    assert version["row_count"] == 1500
    assert version["source"]["uri"] == f"mysql://{reader}@127.0.0.1:3306/{database}"  # type: ignore[index]
    columns = {c["name"]: c["type"] for c in version["columns"]}  # type: ignore[attr-defined]
    assert columns == {
        "id": "int64",
        "amount": "double",
        "placed": "date32[day]",
        "note": "string",
        "stamp": "timestamp[us]",
    }


def test_refused_bodies_do_not_echo_the_password(
    api: TestClient, people: People, dataset: str
) -> None:
    secret = "S3cret-Pw-4f1c"
    source = f"postgresql://u:{secret}@127.0.0.1:5432/db"
    for body in (
        {"source": source, "query": "SELECT 1", "extra": 1},
        {"source": source + "/" + "x" * 3000, "query": "SELECT 1"},
        {"source": source, "query": "SELECT 1", "format": "xlsx"},
        {"source": source, "query": "SELECT 1", "mode": "sideways"},
        {"source": source.replace("127.0.0.1", "10.9.9.9"), "query": "SELECT 1"},
        {"source": source, "query": "DELETE FROM t"},
    ):
        answer = api.post(
            f"/api/v1/datasets/{dataset}/ingestions", json=body, headers=people.headers("mo")
        )
        assert answer.status_code in (400, 403), answer.text
        assert secret not in answer.text


def test_nothing_is_read_without_an_allow_list(tmp_path: Path) -> None:
    """The default settings let the server read no source at all."""
    found = Settings(home=tmp_path).data_sources
    assert (found.s3_buckets, found.sql_hosts) == ((), ())
