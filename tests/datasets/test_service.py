"""DatasetService on SQLite and PostgreSQL: datasets, versions from every format, append and
overwrite, gapless numbers under concurrent writers, aliases, access, hostile sources."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.ipc as paipc
import pyarrow.parquet as pq
import pytest

from shamal.datasets import NAMESPACE, VersionStatus, WriteMode
from shamal.datasets._service import DatasetService
from shamal.errors import AlreadyExists, Conflict, InvalidParameter, NotFound, PermissionDenied
from shamal.server import Platform
from tests.registry.conftest import People, people

__all__ = ["people"]

TABLE = pa.table({"id": [1, 2, 3], "city": ["Dubai", "Abu Dhabi", "Sharjah"], "x": [0.5, 1.5, 2.5]})


@pytest.fixture
def service(platform: Platform) -> DatasetService:
    return platform.datasets


def _csv(table: pa.Table = TABLE) -> bytes:
    sink = io.BytesIO()
    pacsv.write_csv(table, sink)
    return sink.getvalue()


def _parquet(table: pa.Table = TABLE) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def _arrow(table: pa.Table = TABLE) -> bytes:
    sink = io.BytesIO()
    with paipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _jsonl(table: pa.Table = TABLE) -> bytes:
    import json

    return b"".join(json.dumps(row).encode() + b"\n" for row in table.to_pylist())


def _chunks(data: bytes, size: int = 7) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def _read(service: DatasetService, people: People, ref: str) -> pa.Table:
    version = service.version(people.principals["vi"], ref)
    tables = []
    for index in range(len(version.parts)):
        data = b"".join(service.open_part(people.principals["vi"], ref, index))
        tables.append(pq.read_table(io.BytesIO(data)))
    return pa.concat_tables(tables)


@pytest.mark.parametrize(
    ("fmt", "encode"), [("csv", _csv), ("parquet", _parquet), ("arrow", _arrow), ("jsonl", _jsonl)]
)
def test_a_version_from_each_format_reads_back_as_the_same_rows(
    service: DatasetService, people: People, fmt: str, encode: object
) -> None:
    service.create(people.ctx("mo"), "customers", "red")
    data = encode(TABLE)  # type: ignore[operator]
    version = service.ingest(people.ctx("mo"), "customers", _chunks(data), fmt)
    assert (version.version, version.row_count, version.status) == (1, 3, VersionStatus.VALID)
    assert [c["name"] for c in version.schema] == ["id", "city", "x"]
    assert version.uri == "data:/customers/1"
    assert _read(service, people, "customers").to_pylist() == TABLE.to_pylist()
    # The part is a plain Parquet file in the artifact store, named by its content.
    (part,) = version.parts
    stored = service._artifacts.file_info(NAMESPACE, part.path)
    assert stored.size == part.size
    assert part.path.endswith(f"{part.digest}.parquet")


def test_append_keeps_earlier_rows_and_overwrite_replaces_them(
    service: DatasetService, people: People
) -> None:
    service.create(people.ctx("mo"), "events", "red")
    first = service.ingest(people.ctx("mo"), "events", [_csv()], "csv")
    second = service.ingest(people.ctx("mo"), "events", [_parquet()], "parquet")
    assert (second.version, second.row_count, len(second.parts)) == (2, 6, 2)
    assert second.parts[0] == first.parts[0]
    assert len(_read(service, people, "events/2")) == 6
    third = service.ingest(
        people.ctx("mo"), "events", [_csv(TABLE.slice(0, 1))], "csv", mode=WriteMode.OVERWRITE
    )
    assert (third.version, third.row_count, third.mode) == (3, 1, WriteMode.OVERWRITE)
    assert _read(service, people, "events").to_pylist() == TABLE.slice(0, 1).to_pylist()
    # Versions are immutable: the first still reads as it was written.
    assert len(_read(service, people, "events/1")) == 3
    assert [v.version for v in service.versions(people.principals["vi"], "events")] == [3, 2, 1]


def test_the_same_rows_give_the_same_digest(service: DatasetService, people: People) -> None:
    service.create(people.ctx("mo"), "a", "red")
    service.create(people.ctx("mo"), "b", "red")
    one = service.ingest(people.ctx("mo"), "a", [_parquet()], "parquet")
    two = service.ingest(people.ctx("mo"), "b", [_parquet()], "parquet")
    assert one.digest == two.digest
    other = service.ingest(
        people.ctx("mo"), "b", [_parquet(TABLE.slice(1))], "parquet", mode=WriteMode.OVERWRITE
    )
    assert other.digest != one.digest


def test_appending_other_columns_is_refused_and_leaves_no_version(
    service: DatasetService, people: People
) -> None:
    service.create(people.ctx("mo"), "t", "red")
    service.ingest(people.ctx("mo"), "t", [_csv()], "csv")
    with pytest.raises(InvalidParameter, match="columns differ"):
        service.ingest(people.ctx("mo"), "t", [_csv(TABLE.drop(["x"]))], "csv")
    assert [v.version for v in service.versions(people.principals["mo"], "t")] == [1]
    # The refused write took no number: the next one is 2.
    assert service.ingest(people.ctx("mo"), "t", [_csv()], "csv").version == 2


def test_concurrent_writers_get_gapless_distinct_numbers(
    service: DatasetService, people: People
) -> None:
    service.create(people.ctx("mo"), "busy", "red")
    numbers: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def write() -> None:
        start.wait()
        try:
            numbers.append(service.ingest(people.ctx("mo"), "busy", [_csv()], "csv").version)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(numbers) == [1, 2, 3, 4, 5, 6]
    assert service.version(people.principals["mo"], "busy").row_count == 18


def test_aliases_name_versions_and_never_a_quarantined_one(
    service: DatasetService, people: People
) -> None:
    service.create(people.ctx("mo"), "customers", "red")
    service.ingest(people.ctx("mo"), "customers", [_csv()], "csv")
    service.ingest(people.ctx("mo"), "customers", [_csv()], "csv")
    with pytest.raises(PermissionDenied):
        service.set_alias(people.ctx("mo"), "customers", "prod", 1)
    service.set_alias(people.ctx("rita"), "customers", "prod", 1)
    assert service.version(people.principals["vi"], "customers@prod").version == 1
    assert service.get(people.principals["vi"], "customers").aliases == {"prod": 1}
    service.set_alias(people.ctx("rita"), "customers", "prod", 2)
    assert service.version(people.principals["vi"], "data:/customers@prod").version == 2
    service.delete_alias(people.ctx("rita"), "customers", "prod")
    with pytest.raises(NotFound, match="alias"):
        service.version(people.principals["vi"], "customers@prod")
    for bad in ("latest", "3", "Prod", ""):
        with pytest.raises(InvalidParameter):
            service.set_alias(people.ctx("rita"), "customers", bad, 1)
    with pytest.raises(NotFound):
        service.set_alias(people.ctx("rita"), "customers", "old", 9)


def test_quarantined_versions_are_not_read_by_default(
    service: DatasetService, people: People, platform: Platform
) -> None:
    service.create(people.ctx("mo"), "q", "red")
    service.ingest(people.ctx("mo"), "q", [_csv()], "csv")
    bad = service.ingest(people.ctx("mo"), "q", [_csv()], "csv")
    from sqlalchemy import update

    from shamal.db.models import DataVersionRow

    with platform.db.unit_of_work() as s:  # as a failed validation leaves it
        s.execute(
            update(DataVersionRow).where(DataVersionRow.id == bad.id).values(status="quarantined")
        )
    assert service.version(people.principals["vi"], "q").version == 1
    assert service.version(people.principals["vi"], "q/2").status is VersionStatus.QUARANTINED
    with pytest.raises(Conflict, match="quarantined"):
        service.set_alias(people.ctx("rita"), "q", "prod", 2)


def test_other_teams_see_nothing_and_roles_hold(service: DatasetService, people: People) -> None:
    service.create(people.ctx("mo"), "secret", "red")
    service.ingest(people.ctx("mo"), "secret", [_csv()], "csv")
    for outsider in ("bo", "otto"):
        with pytest.raises(NotFound):
            service.version(people.principals[outsider], "secret")
        assert service.list_datasets(people.principals[outsider]) == []
    with pytest.raises(PermissionDenied):
        service.ingest(people.ctx("vi"), "secret", [_csv()], "csv")
    with pytest.raises(NotFound):
        service.ingest(people.ctx("bo"), "secret", [_csv()], "csv")
    with pytest.raises(AlreadyExists):
        service.create(people.ctx("bo"), "secret", "blue")
    assert [d.name for d in service.list_datasets(people.principals["vi"])] == ["secret"]
    assert service.get(people.principals["admin"], "secret").latest_version == 1


@pytest.mark.parametrize(
    ("fmt", "data", "message"),
    [
        ("csv", b"a,b\n1,2\n3\n", "ragged row"),
        ("csv", b"a,a\n1,2\n", "repeated column names"),
        ("csv", b"", "cannot be read|no readable rows"),
        ("parquet", b"PAR1 not really", "parquet source cannot be read"),
        ("arrow", b"\xff" * 64, "arrow source cannot be read"),
        ("jsonl", b'{"a": 1}\n{"a": \n', "jsonl source cannot be read"),
        ("csv", ",".join(f"c{i}" for i in range(5000)).encode() + b"\n", "5,000 columns"),
        ("xlsx", b"x", "unknown format"),
    ],
)
def test_hostile_sources_are_clear_errors_and_write_nothing(
    service: DatasetService, people: People, fmt: str, data: bytes, message: str
) -> None:
    service.create(people.ctx("mo"), "h", "red")
    with pytest.raises(InvalidParameter, match=message):
        service.ingest(people.ctx("mo"), "h", [data], fmt)
    assert service.versions(people.principals["mo"], "h") == []
    work = service._work_dir
    assert not work.exists() or not any(work.iterdir())  # nothing left in the work folder


def test_errors_never_show_the_values_they_read(service: DatasetService, people: People) -> None:
    service.create(people.ctx("mo"), "p", "red")
    rows = b"id,email\n" + b"".join(b"%d,user%d@example.com\n" % (i, i) for i in range(5))
    rows += b"oops,alice.secret@example.com,extra\n"
    with pytest.raises(InvalidParameter) as caught:
        service.ingest(people.ctx("mo"), "p", [rows], "csv")
    assert "alice" not in str(caught.value)
    assert "example.com" not in str(caught.value)


@pytest.mark.parametrize(
    "ref", ["", "UPPER", "a/0", "a/-1", "a/1.5", "a@", "../x", "a/99999999999", "a@b@c"]
)
def test_malformed_references_are_refused(
    service: DatasetService, people: People, ref: str
) -> None:
    with pytest.raises(InvalidParameter):
        service.version(people.principals["mo"], ref)


def test_the_profile_is_computed_as_the_rows_stream_in(
    service: DatasetService, people: People
) -> None:
    service.create(people.ctx("mo"), "prof", "red")
    first = service.ingest(people.ctx("mo"), "prof", [_csv()], "csv")
    assert first.profile["scope"] == "version"
    columns = {c["name"]: c for c in first.profile["columns"]}
    assert columns["x"]["count"] == 3
    assert columns["x"]["min"] == 0.5
    assert columns["x"]["max"] == 2.5
    appended = service.ingest(people.ctx("mo"), "prof", [_csv(TABLE.slice(2, 1))], "csv")
    assert appended.profile["scope"] == "version"  # the earlier rows and the new one
    column = {c["name"]: c for c in appended.profile["columns"]}["x"]
    assert (column["count"], column["min"], column["max"]) == (4, 0.5, 2.5)
    assert column["mean"] == pytest.approx((0.5 + 1.5 + 2.5 + 2.5) / 4)


SUITE = """
version: 1
expectations:
  - {kind: not_null, column: id}
  - {kind: range, column: x, min: 0, max: 2}
  - {kind: in_set, column: city, values: [Dubai, Abu Dhabi, Sharjah], severity: warning}
"""


UNKNOWN_KEY = "version: 1\nexpectations: [{kind: not_null, col: id}]"


def test_a_version_failing_its_suite_is_quarantined_with_its_report(
    service: DatasetService, people: People
) -> None:
    service.create(people.ctx("mo"), "checked", "red")
    with pytest.raises(PermissionDenied):
        service.set_suite(people.ctx("mo"), "checked", SUITE)
    with pytest.raises(InvalidParameter):
        service.set_suite(
            people.ctx("rita"), "checked", "version: 1\nexpectations: [{kind: not_null, col: id}]"
        )
    assert service.suite(people.principals["vi"], "checked") is None
    service.set_suite(people.ctx("rita"), "checked", SUITE)
    good = service.ingest(people.ctx("mo"), "checked", [_csv(TABLE.slice(0, 2))], "csv")
    assert good.status is VersionStatus.VALID
    assert good.validation is not None
    assert good.validation["ok"] is True
    bad = service.ingest(people.ctx("mo"), "checked", [_csv()], "csv")  # x = 2.5 is out of range
    assert bad.status is VersionStatus.QUARANTINED
    assert bad.validation is not None
    assert bad.validation["ok"] is False
    # Quarantined: kept with its report, but not read by default and never aliased.
    assert service.version(people.principals["vi"], "checked").version == good.version
    with pytest.raises(Conflict):
        service.set_alias(people.ctx("rita"), "checked", "prod", bad.version)
    service.set_suite(people.ctx("rita"), "checked", None)
    assert service.ingest(people.ctx("mo"), "checked", [_csv()], "csv").validation is None


def test_an_append_is_validated_with_the_rows_it_joins(
    service: DatasetService, people: People
) -> None:
    service.create(people.ctx("mo"), "uniq", "red")
    service.set_suite(
        people.ctx("rita"), "uniq", "version: 1\nexpectations: [{kind: unique, columns: [id]}]"
    )
    assert service.ingest(people.ctx("mo"), "uniq", [_csv()], "csv").status is VersionStatus.VALID
    # Each write alone has unique ids; together they repeat 1, 2 and 3.
    again = service.ingest(people.ctx("mo"), "uniq", [_csv()], "csv")
    assert again.status is VersionStatus.QUARANTINED
    assert again.validation is not None
    assert again.validation["scope"] == "version"
    assert again.validation["rows"] == 6
