"""Privacy through DatasetService on SQLite and PostgreSQL: a policy transforms personal columns
before any byte is stored (every stored byte is scanned for the raw values), tokens join across
datasets, only privacy officers reveal, key rotation keeps old tokens revealable, and erasure
removes a subject's rows from every version, for good."""

from __future__ import annotations

import datetime as dt
import io
import logging
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import MetaData, select

from shamal.datasets import NAMESPACE, VersionStatus, WriteMode
from shamal.datasets._service import DatasetService
from shamal.errors import InvalidParameter, NotFound, PermissionDenied
from shamal.security import AuditContext, Principal
from shamal.server import Platform
from tests.registry.conftest import People, people

__all__ = ["people"]

#: Raw personal values: none may reach storage.
RAW = ("amal.secret@example.ae", "badr.hidden@example.ae", "+971501234567", "Zaynab Qasimi")

SOURCE = (
    b"id,email,phone,name,born,income,city\n"
    b"1,amal.secret@example.ae,+971501234567,Zaynab Qasimi,1990-05-17,12345,Dubai\n"
    b"2,badr.hidden@example.ae,+971509999999,Omar Farouq,1985-12-01,999,Sharjah\n"
    b"3,amal.secret@example.ae,+971501234567,Zaynab Qasimi,1990-05-17,12345,Dubai\n"
    b"4,carim.c@example.ae,,Layla N,2001-01-31,70000,Ajman\n"
)

POLICY = """
version: 1
columns:
  email: {action: hmac, purpose: crm}
  phone: {action: tokenize, purpose: support}
  name: {action: drop}
  born: {action: generalize, to: year}
  income: {action: generalize, width: 10000}
"""

#: Fails on the personal column email (tokens are not addresses), so samples would show it.
SUITE = """
version: 1
expectations:
  - {kind: regex, column: email, pattern: '[^@]+@[^@]+'}
  - {kind: in_set, column: city, values: [Dubai]}
"""


@pytest.fixture
def service(platform: Platform) -> DatasetService:
    return platform.datasets


def _officer(platform: Platform, people: People, who: str = "otto") -> Principal:
    admin = people.principals["admin"]
    ctx = AuditContext(action="user.grant", actor=admin.name, principal=admin)
    platform.security.set_privacy_officer(ctx, who, True)
    return platform.security.authenticate(people.secrets[who])


def _as(principal: Principal, action: str = "test") -> AuditContext:
    return AuditContext(action=action, actor=principal.name, principal=principal)


def _rows(service: DatasetService, principal: Principal, ref: str) -> pa.Table:
    version = service.version(principal, ref)
    tables = [
        pq.read_table(io.BytesIO(b"".join(service.open_part(principal, ref, index))))
        for index in range(len(version.parts))
    ]
    return pa.concat_tables(tables)


def _setup(service: DatasetService, people: People, name: str = "customers") -> None:
    service.create(people.ctx("mo"), name, "red")
    service.set_privacy(people.ctx("rita"), name, POLICY)


def test_a_policy_transforms_personal_columns_before_they_are_stored(
    service: DatasetService, people: People
) -> None:
    _setup(service, people)
    version = service.ingest(people.ctx("mo"), "customers", [SOURCE], "csv")
    assert [c["name"] for c in version.schema] == ["id", "email", "phone", "born", "income", "city"]
    assert {t["column"]: t["action"] for t in version.transformations} == {
        "email": "hmac",
        "phone": "tokenize",
        "name": "drop",
        "born": "generalize",
        "income": "generalize",
    }
    rows = _rows(service, people.principals["vi"], "customers").to_pylist()
    assert rows[0]["email"] == rows[2]["email"] != rows[1]["email"]
    assert rows[0]["phone"] == rows[2]["phone"] != rows[1]["phone"]
    assert [r["income"] for r in rows] == [10000, 0, 10000, 70000]
    assert str(rows[0]["born"]) == "1990-01-01"
    # The profile of a personal column has counts only, never values (tokens neither).
    profile = {c["name"]: c for c in version.profile["columns"]}
    for column in ("email", "phone", "born", "income"):
        assert profile[column]["personal"] is True
        assert profile[column]["top_values"] == []
        assert profile[column]["min"] is None
    assert profile["city"]["top_values"][0]["value"] == "Dubai"
    policy = service.privacy(people.principals["vi"], "customers")
    assert policy is not None
    assert policy.personal == ("email", "phone", "born", "income")


def _scan_database(platform: Platform) -> str:
    """Every row of every table, as text."""
    metadata = MetaData()
    metadata.reflect(platform.db.engine)
    seen = []
    with platform.db.engine.connect() as connection:
        for table in metadata.sorted_tables:
            for row in connection.execute(select(table)):
                seen.append(repr(tuple(row)))
    return "\n".join(seen)


def _scan_files(root: Path) -> Iterator[tuple[Path, bytes, str]]:
    """Every file under ``root``: its raw bytes and, if it is Parquet, its rows as text."""
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            raw = path.read_bytes()
            text = ""
            if raw[:4] == b"PAR1":
                text = repr(pq.read_table(io.BytesIO(raw)).to_pylist())
            yield path, raw, text


def test_no_raw_personal_value_reaches_any_stored_byte(
    service: DatasetService, people: People, platform: Platform, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    _setup(service, people)
    service.set_suite(people.ctx("rita"), "customers", SUITE)
    version = service.ingest(people.ctx("mo"), "customers", [SOURCE], "csv")
    # The suite failed on the personal column: its samples are redacted.
    assert version.status is VersionStatus.QUARANTINED
    assert version.validation is not None
    regex = version.validation["results"][0]
    assert not regex["passed"]
    assert {s["email"] for s in regex["samples"]} == {"<redacted>"}
    more = SOURCE + b"5,badr.hidden@example.ae,+971501234567,Zaynab Qasimi,1999-01-01,5,Dubai\n"
    appended = service.ingest(people.ctx("mo"), "customers", [more], "csv")
    assert appended.row_count == 5  # the quarantined version is not appended to
    parquet_files = 0
    for path, raw, text in _scan_files(platform.settings.home):
        parquet_files += bool(text)
        for value in RAW:
            assert value.encode() not in raw, path
            assert value not in text, path
    assert parquet_files >= 2  # the parts were read back, decompressed
    dumped = _scan_database(platform)
    assert "data:/customers/1" in dumped or "customers" in dumped
    for value in RAW:
        assert value not in dumped
    # Nor the logs, nor the error of a source that breaks mid-file.
    broken = SOURCE + b"6,zz@example.ae\n"
    with pytest.raises(InvalidParameter) as caught:
        service.ingest(people.ctx("mo"), "customers", [broken], "csv")
    for value in RAW:
        assert value not in caplog.text
        assert value not in str(caught.value)
    # The source did not stay in the work folder either.
    work = service._work_dir
    assert not work.exists() or not any(work.iterdir())


def test_same_value_and_purpose_join_across_datasets(
    service: DatasetService, people: People
) -> None:
    _setup(service, people, "customers")
    _setup(service, people, "orders")
    service.create(people.ctx("mo"), "marketing", "red")
    service.set_privacy(
        people.ctx("rita"), "marketing", "columns: {email: {action: hmac, purpose: ads}}"
    )
    for name in ("customers", "orders", "marketing"):
        service.ingest(people.ctx("mo"), name, [SOURCE], "csv")
    vi = people.principals["vi"]
    customers = _rows(service, vi, "customers").column("email").to_pylist()
    orders = _rows(service, vi, "orders").column("email").to_pylist()
    ads = _rows(service, vi, "marketing").column("email").to_pylist()
    assert customers == orders
    assert set(customers).isdisjoint(ads)


def test_only_a_privacy_officer_reveals_and_rotation_keeps_old_tokens(
    service: DatasetService, people: People, platform: Platform
) -> None:
    _setup(service, people)
    service.ingest(people.ctx("mo"), "customers", [SOURCE], "csv")
    old = _rows(service, people.principals["vi"], "customers").column("phone").to_pylist()
    with pytest.raises(PermissionDenied, match="privacy-officer"):
        service.reveal(people.ctx("rita"), "customers", "phone", [old[0]])
    with pytest.raises(PermissionDenied):
        service.reveal(people.ctx("admin"), "customers", "phone", [old[0]])
    with pytest.raises(PermissionDenied):
        service.rotate_privacy_key(people.ctx("rita"))
    new_key = service.rotate_privacy_key(people.ctx("admin"))
    service.ingest(people.ctx("mo"), "customers", [SOURCE], "csv", mode=WriteMode.OVERWRITE)
    new = _rows(service, people.principals["vi"], "customers").column("phone").to_pylist()
    assert new[0] != old[0]
    assert new[0].startswith(f"{new_key}:")
    officer = _officer(platform, people)  # otto: in no team
    shown = service.reveal(_as(officer), "customers", "phone", [old[0], new[1], "nonsense"])
    assert shown == ["+971501234567", "+971509999999", None]
    with pytest.raises(InvalidParameter, match="not tokenized"):
        service.reveal(_as(officer), "customers", "email", [old[0]])
    # A job acting for the officer never reveals: that takes the officer's own token.
    job = platform.security.issue_job_token("otto", "job-1", timedelta(minutes=5))
    as_job = platform.security.authenticate(job.secret)
    with pytest.raises(PermissionDenied, match="job's token"):
        service.reveal(_as(as_job), "customers", "phone", [old[0]])
    entries = platform.audit.entries(limit=1000)
    reveals = [e for e in entries if e.target == "dataset/customers" and "revealed" in e.detail]
    assert reveals
    assert reveals[-1].detail["revealed"] == 2
    assert "+971" not in repr([e.detail for e in entries])


def test_erasure_removes_a_subject_from_every_version_for_good(
    service: DatasetService, people: People, platform: Platform
) -> None:
    _setup(service, people)
    first = service.ingest(people.ctx("mo"), "customers", [SOURCE], "csv")
    service.rotate_privacy_key(people.ctx("admin"))  # the next write's tokens differ
    second = service.ingest(people.ctx("mo"), "customers", [SOURCE], "csv")
    service.set_privacy(people.ctx("rita"), "customers", None)
    plain = b"id,email\n9,amal.secret@example.ae\n"
    third = service.ingest(people.ctx("mo"), "customers", [plain], "csv", mode=WriteMode.OVERWRITE)
    service.set_privacy(people.ctx("rita"), "customers", POLICY)
    with pytest.raises(PermissionDenied):
        service.erase(people.ctx("mo"), "customers", "email", "amal.secret@example.ae")
    done = service.erase(people.ctx("rita"), "customers", "email", "amal.secret@example.ae")
    assert done.rows_removed == 2 + 4 + 1  # v1: 2; v2: v1's part and its own; v3: 1
    assert [v["version"] for v in done.versions] == [1, 2, 3]
    assert "amal" not in done.subject_hash
    vi = people.principals["vi"]
    for number, rows in ((1, 2), (2, 4), (3, 0)):
        version = service.version(vi, f"customers/{number}")
        assert version.row_count == rows
        table = _rows(service, vi, f"customers/{number}")
        assert table.num_rows == rows
        assert version.transformations[-1]["action"] == "erasure"
        assert version.profile["rows"] == rows
    assert service.version(vi, "customers/1").digest != first.digest
    # The old parts' bytes are gone from the store.
    for part in (*first.parts, *second.parts, *third.parts):
        assert not platform.blobs.exists(part.digest)
        with pytest.raises(NotFound):
            platform.artifacts.file_info(NAMESPACE, part.path)
    # An erasure whose process died before its purge is purged by the next one.
    (leftover, *_rest) = done.versions[0]["parts_replaced"]
    stored = platform.artifacts.store_file(None, NAMESPACE, leftover, [b"the old bytes"])
    # Nothing of the subject remains: not the value, not its tokens.
    again = service.erase(people.ctx("rita"), "customers", "email", "amal.secret@example.ae")
    assert again.rows_removed == 0
    assert not platform.blobs.exists(stored.digest)
    assert again.subject_hash == done.subject_hash
    (record, _second) = service.erasures(people.principals["rita"], "customers")
    assert record.column == "email"
    erased = [e for e in platform.audit.entries(limit=1000) if "erasure" in e.detail]
    assert erased
    assert "amal" not in repr([e.detail for e in erased])


def test_who_may_erase_and_what_is_refused(
    service: DatasetService, people: People, platform: Platform
) -> None:
    _setup(service, people)
    service.ingest(people.ctx("mo"), "customers", [SOURCE], "csv")
    with pytest.raises(NotFound):  # another team's dataset does not exist for bo
        service.erase(people.ctx("bo"), "customers", "email", "x")
    officer = _officer(platform, people, "bo")  # a privacy officer reaches every dataset
    assert service.erase(_as(officer), "customers", "id", "4").rows_removed == 1
    with pytest.raises(InvalidParameter, match="generalized"):
        service.erase(people.ctx("rita"), "customers", "born", "1990")
    with pytest.raises(NotFound, match="no version"):
        service.erase(people.ctx("rita"), "customers", "nope", "x")
    with pytest.raises(InvalidParameter, match="subject"):
        service.erase(people.ctx("rita"), "customers", "email", "")
    assert service.version(people.principals["vi"], "customers").row_count == 3


def test_policies_are_checked_and_a_source_without_its_columns_writes_nothing(
    service: DatasetService, people: People
) -> None:
    service.create(people.ctx("mo"), "t", "red")
    with pytest.raises(PermissionDenied):
        service.set_privacy(people.ctx("mo"), "t", POLICY)
    with pytest.raises(InvalidParameter, match="unknown key 'salt'"):
        service.set_privacy(
            people.ctx("rita"), "t", "columns: {email: {action: hmac, purpose: c, salt: x}}"
        )
    assert service.privacy(people.principals["vi"], "t") is None
    service.set_privacy(people.ctx("rita"), "t", POLICY)
    headerless = b"amal.secret@example.ae,+971501234567\nb@x,+9715\n"
    with pytest.raises(InvalidParameter) as caught:
        service.ingest(people.ctx("mo"), "t", [headerless], "csv")
    assert "amal" not in str(caught.value)
    assert "+971" not in str(caught.value)
    assert service.versions(people.principals["mo"], "t") == []


def test_batches_from_any_source_are_pseudonymized_the_same_way(
    service: DatasetService, people: People
) -> None:
    _setup(service, people)
    service.ingest(people.ctx("mo"), "customers", [SOURCE], "csv")
    from_file = _rows(service, people.principals["vi"], "customers").to_pylist()[0]
    batch = pa.record_batch(
        {
            "id": [1],
            "email": ["amal.secret@example.ae"],
            "phone": ["+971501234567"],
            "name": ["Zaynab Qasimi"],
            "born": [dt.date(1990, 5, 17)],
            "income": [12345],
            "city": ["Dubai"],
        }
    )
    version = service.ingest_batches(
        people.ctx("mo"), "customers", [batch], source={"kind": "sql"}, mode=WriteMode.OVERWRITE
    )
    assert "name" not in {c["name"] for c in version.schema}
    (row,) = _rows(service, people.principals["vi"], "customers").to_pylist()
    assert row == from_file
