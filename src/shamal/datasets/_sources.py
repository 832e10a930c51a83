"""Remote sources the server reads itself: an S3 object, or a SQL query on PostgreSQL or
MariaDB/MySQL, written as a dataset version through :meth:`DatasetService.ingest_batches`.

A user's own files upload (``/api/v1/dataset-uploads``); these are the sources that live
next to the platform, where a platform team wants the reading done by the platform, not by a
laptop. A server that reads what a user names is an SSRF hole, so:

- only the schemes ``s3``, ``postgresql`` (``postgres``), ``mysql`` and ``mariadb`` are
  sources; ``file:``, ``http:``, a path on the server and every other scheme are refused;
- the bucket, or the database's ``host:port`` exactly as written, must be on the operator's
  allow-list (``data_sources`` in the settings); nothing is resolved to decide it;
- a source text with control characters, backslashes, fragments, encoded or ``..``
  segments is refused before anything is parsed further.

A SQL query runs in a READ ONLY transaction under a statement timeout, as one statement (no
``;``), read in Arrow batches through a server-side cursor (a PostgreSQL named cursor, a
MariaDB/MySQL unbuffered cursor). The database user's grants bound what it may read: give the
platform a least-privilege user (the operator's job). The password of a connection string is
used to connect and nowhere else: the version's source record, errors and audit carry the URI
without it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

import pyarrow as pa

from shamal.datasets import _rules
from shamal.datasets._entities import DataVersion, StagedPart, WriteMode
from shamal.datasets._ingest import FORMATS, Limits, check_schema, read_batches
from shamal.datasets._service import DatasetService
from shamal.errors import InvalidParameter, NotFound, PermissionDenied
from shamal.security import AuditContext

__all__ = [
    "SOURCE_SCHEMES",
    "SourceIngestion",
    "SourcePolicy",
    "SourceSpec",
    "format_of",
    "parse_prefix",
    "parse_source",
    "partition_query",
]

SOURCE_SCHEMES = {
    "s3": "s3",
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "mysql": "mysql",
    "mariadb": "mysql",
}
_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306}
MAX_SOURCE = 2048
MAX_QUERY = 100_000
_BATCH_ROWS = 10_000
_CHUNK = 1 << 20
_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_IDENT = re.compile(r"^[A-Za-z0-9_.$-]{1,128}$")
#: A column a SQL source is partitioned by: a plain identifier (quoted where it is used).
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
#: The most objects under one S3 prefix a partitioned write reads.
MAX_KEYS = 100_000
_FIRST_WORD = re.compile(r"^\s*(select|with|values|table)\b", re.IGNORECASE)
_COMPRESSED = (".gz", ".zst", ".zstd")
_SUFFIXES = {
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".arrow": "arrow",
    ".feather": "arrow",
    ".ipc": "arrow",
}


@dataclass(frozen=True, slots=True)
class SourcePolicy:
    """What the server may read (from the settings' ``data_sources``): nothing by default."""

    s3_buckets: frozenset[str] = frozenset()
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    sql_hosts: frozenset[str] = frozenset()
    sql_timeout_s: float = 3600.0
    max_object_bytes: int = 50 << 30
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """A parsed source: ``kind`` (s3, postgresql, mysql), where it is, and the query."""

    kind: str
    host: str
    port: int
    path: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    query: str | None = None
    fmt: str | None = None
    sslmode: str | None = None

    @property
    def uri(self) -> str:
        """The source without its password: what a version, an error or a log may show."""
        if self.kind == "s3":
            return f"s3://{self.host}/{self.path}"
        user = f"{self.user}@" if self.user else ""
        return f"{self.kind}://{user}{self.host}:{self.port}/{self.path}"

    def record(self) -> dict[str, Any]:
        """The version's source record (never a credential)."""
        found: dict[str, Any] = {"kind": self.kind, "uri": self.uri}
        if self.query is not None:
            found["query"] = self.query
        if self.fmt is not None:
            found["format"] = self.fmt
        return found


def format_of(name: str, given: str | None = None) -> str:
    """The format of a source named ``name``: ``given``, else told by its suffix (a
    ``.gz``/``.zst`` after it is the compression of a CSV or JSON-lines file)."""
    if given:
        if given not in FORMATS:
            raise InvalidParameter(f"unknown format {given!r}; one of {', '.join(FORMATS)}")
        return given
    lowered = name.lower()
    for suffix in _COMPRESSED:
        lowered = lowered.removesuffix(suffix)
    found = next((fmt for sfx, fmt in _SUFFIXES.items() if lowered.endswith(sfx)), None)
    if found is None:
        raise InvalidParameter(
            f"cannot tell the format from the name's suffix ({', '.join(sorted(_SUFFIXES))}, "
            "optionally .gz or .zst); give the format"
        )
    return found


def _refuse(why: str) -> InvalidParameter:
    return InvalidParameter(
        f"{why}; a source is s3://BUCKET/KEY, postgresql://USER@HOST:PORT/DB or "
        "mysql://USER@HOST:PORT/DB (upload a local file instead)"
    )


def _check_text(text: str) -> str:
    if not text or len(text) > MAX_SOURCE:
        raise _refuse(f"a source is 1 to {MAX_SOURCE} characters")
    if _CONTROL.search(text) or "%" in text.split("@")[-1] or "#" in text:
        raise _refuse("the source holds control characters, backslashes, '#' or encodings")
    scheme, sep, _rest = text.partition("://")
    if not sep or scheme not in SOURCE_SCHEMES:
        raise _refuse("the server reads no such source (no files, paths or other schemes)")
    return SOURCE_SCHEMES[scheme]


def parse_source(text: str, query: str | None = None, fmt: str | None = None) -> SourceSpec:
    """Parse and check a source text (hostile-inputs §1, §2, §5), its query and format.

    Raises:
        InvalidParameter: anything but a well-formed s3 / postgresql / mysql source; a query
            for S3 or none for SQL; a query that is not one SELECT.
    """
    kind = _check_text(text)
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise _refuse("the source does not parse") from None
    if kind == "s3":
        return _s3_spec(parts, port, query, fmt)
    return _sql_spec(kind, parts, port, query, fmt)


def _s3_spec(
    parts: SplitResult, port: int | None, query: str | None, fmt: str | None
) -> SourceSpec:
    bucket = parts.netloc
    key = parts.path.removeprefix("/")
    if not _BUCKET.match(bucket) or port is not None or parts.query:
        raise _refuse("an S3 source names a bucket (no user, port or query) and a key")
    segments = key.split("/")
    if not key or any(s in ("", ".", "..") for s in segments) or ";" in key:
        raise _refuse("an S3 key is non-empty, without empty, '.' or '..' segments or ';'")
    if query is not None:
        raise InvalidParameter("--query is for SQL sources; an S3 object is read whole")
    return SourceSpec("s3", bucket, 0, key, fmt=format_of(key, fmt))


def _sql_spec(
    kind: str, parts: SplitResult, port: int | None, query: str | None, fmt: str | None
) -> SourceSpec:
    host = (parts.hostname or "").lower()
    database = parts.path.removeprefix("/")
    if not host or not _IDENT.match(database) or fmt is not None:
        raise _refuse(f"a {kind} source names a host and one database (and no format)")
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    if set(options) - {"sslmode"}:
        raise _refuse("a SQL source takes no options but sslmode")
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    return SourceSpec(
        kind,
        host,
        port or _DEFAULT_PORTS[kind],
        database,
        user=user,
        password=password,
        query=check_query(query),
        sslmode=options.get("sslmode"),
    )


def check_query(query: str | None) -> str:
    """A SQL source's query: one SELECT (or WITH, VALUES, TABLE), without ``;``.

    Raises:
        InvalidParameter: none given, too long, several statements, or another kind.
    """
    if query is None or not query.strip():
        raise InvalidParameter("a SQL source needs a query: --query 'SELECT ...'")
    text = query.strip().rstrip(";").strip()
    if len(text) > MAX_QUERY or "\x00" in text:
        raise InvalidParameter(f"the query is at most {MAX_QUERY:,} characters, without NUL")
    if ";" in text:
        raise InvalidParameter("the query must be one statement, without ';'")
    if not _FIRST_WORD.match(text):
        raise InvalidParameter("the query must be a SELECT (or WITH ... SELECT) statement")
    return text


def parse_prefix(text: str, query: str | None = None) -> tuple[str, str]:
    """``(bucket, prefix)`` of an S3 prefix source, ``s3://BUCKET/PREFIX/`` (the ``/`` at the
    end makes it a prefix; ``s3://BUCKET/`` is the whole bucket).

    Raises:
        InvalidParameter: not a well-formed S3 prefix (the checks of :func:`parse_source`).
    """
    if _check_text(text) != "s3" or not text.endswith("/"):
        raise _refuse("a prefix source is s3://BUCKET/PREFIX/, ending in '/'")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise _refuse("the source does not parse") from None
    bucket, prefix = parts.netloc, parts.path.removeprefix("/")
    if not _BUCKET.match(bucket) or port is not None or parts.query:
        raise _refuse("an S3 source names a bucket (no user, port or query) and a key")
    segments = prefix.removesuffix("/").split("/") if prefix else []
    if any(s in ("", ".", "..") for s in segments) or ";" in prefix:
        raise _refuse("an S3 prefix has no empty, '.' or '..' segments and no ';'")
    if query is not None:
        raise InvalidParameter("--query is for SQL sources; an S3 prefix is read whole")
    return bucket, prefix


def partition_query(
    kind: str, query: str, column: str | None, partition: int, partitions: int
) -> str:
    """``query`` narrowed to partition ``partition`` of ``partitions``: the rows whose
    ``column`` hashes to it (NULLs go to partition 0). ``column`` is a plain identifier,
    quoted; the numbers are checked integers; the query stays one read-only SELECT.

    Raises:
        InvalidParameter: no column for several partitions, or not a plain identifier.
    """
    if partitions == 1 and column is None:
        return query
    if column is None or not _COLUMN.match(column):
        raise InvalidParameter(
            "--partition-by names one column of the query's result: letters, digits and '_', "
            "not starting with a digit"
        )
    n, i = int(partitions), int(partition)
    if kind == "postgresql":
        hashed = f'coalesce(hashtext(q."{column}"::text)::bigint, 0)'
        test = f"(({hashed} % {n}) + {n}) % {n} = {i}"
    else:
        test = f"coalesce(crc32(cast(q.`{column}` as char)), 0) % {n} = {i}"
    # The query on lines of its own: a trailing comment in it cannot swallow the filter.
    return f"SELECT q.* FROM (\n{query}\n) AS q WHERE {test}"  # nosec B608


# ---------------------------------------------------------------------------- Arrow batches
Convert = Callable[[Any], Any]


def _same(value: Any) -> Any:
    return value


def _float(value: Any) -> Any:
    return None if value is None else float(value)


def _text(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidParameter("a text column holds bytes that are not UTF-8") from None
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return str(value)


_INT: tuple[pa.DataType, Convert] = (pa.int64(), _same)
_FLOAT: tuple[pa.DataType, Convert] = (pa.float64(), _float)
_TEXT: tuple[pa.DataType, Convert] = (pa.string(), _text)
_BOOL: tuple[pa.DataType, Convert] = (pa.bool_(), _same)
_DATE: tuple[pa.DataType, Convert] = (pa.date32(), _same)
_STAMP: tuple[pa.DataType, Convert] = (pa.timestamp("us"), _same)
_STAMP_TZ: tuple[pa.DataType, Convert] = (pa.timestamp("us", tz="UTC"), _same)
_BYTES: tuple[pa.DataType, Convert] = (pa.binary(), lambda v: None if v is None else bytes(v))

#: PostgreSQL type OIDs -> Arrow; numeric becomes float64 (values past 15 digits round).
_PG_TYPES = {
    16: _BOOL,
    17: _BYTES,
    20: _INT,
    21: _INT,
    23: _INT,
    26: _INT,
    700: _FLOAT,
    701: _FLOAT,
    1700: _FLOAT,
    1082: _DATE,
    1114: _STAMP,
    1184: _STAMP_TZ,
}
#: MariaDB/MySQL field types -> Arrow (pymysql's FIELD_TYPE numbers).
_MY_TYPES = {
    0: _FLOAT,
    1: _INT,
    2: _INT,
    3: _INT,
    4: _FLOAT,
    5: _FLOAT,
    7: _STAMP,
    8: _INT,
    9: _INT,
    10: _DATE,
    12: _STAMP,
    13: _INT,
    246: _FLOAT,
}


class _Batcher:
    """Rows of a cursor as Arrow batches of one schema, told by the cursor's column types."""

    def __init__(self, names: list[str], types: list[tuple[pa.DataType, Convert]]) -> None:
        self.schema = pa.schema([pa.field(n, t) for n, (t, _c) in zip(names, types, strict=True)])
        check_schema(self.schema, "SQL")
        self._convert = [c for _t, c in types]

    def batch(self, rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
        columns = list(zip(*rows, strict=True))
        arrays = []
        for index, (values, convert) in enumerate(zip(columns, self._convert, strict=True)):
            try:
                arrays.append(pa.array([convert(v) for v in values], self.schema.field(index).type))
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                raise InvalidParameter(
                    f"column #{index + 1} of the query's result does not convert to "
                    f"{self.schema.field(index).type} ({type(exc).__name__})"
                ) from None
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _clean(exc: BaseException, spec: SourceSpec) -> str:
    """A driver's error, first line, with the password taken out."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]
    if spec.password:
        text = text.replace(spec.password, "***")
    return text


def _postgres(spec: SourceSpec, timeout_s: float) -> Iterator[pa.RecordBatch]:
    import psycopg  # noqa: PLC0415 - the driver loads only for a PostgreSQL source

    try:
        conn = psycopg.connect(
            host=spec.host,
            port=spec.port,
            dbname=spec.path,
            user=spec.user,
            password=spec.password,
            sslmode=spec.sslmode or "prefer",
            connect_timeout=10,
            application_name="shamal-ingest",
        )
    except psycopg.Error as exc:
        raise InvalidParameter(f"cannot connect to {spec.uri}: {_clean(exc, spec)}") from None
    try:
        conn.execute("SET TRANSACTION READ ONLY")
        conn.execute(
            "SELECT set_config('statement_timeout', %s, true)", (str(int(timeout_s * 1000)),)
        )
        with conn.cursor(name=f"shamal_{uuid.uuid4().hex}") as cursor:
            cursor.execute(spec.query or "")
            description = cursor.description or []
            batcher = _Batcher(
                [c.name for c in description],
                [_PG_TYPES.get(c.type_code, _TEXT) for c in description],
            )
            while rows := cursor.fetchmany(_BATCH_ROWS):
                yield batcher.batch(rows)
    except psycopg.Error as exc:
        raise InvalidParameter(
            f"the query on {spec.uri} failed: {_clean(exc, spec)} (it runs read-only, as the "
            "source's database user)"
        ) from None
    finally:
        conn.rollback()
        conn.close()


def _mysql(spec: SourceSpec, timeout_s: float) -> Iterator[pa.RecordBatch]:
    import pymysql  # noqa: PLC0415 - the driver loads only for a MariaDB/MySQL source
    import pymysql.cursors  # noqa: PLC0415

    try:
        conn = pymysql.connect(
            host=spec.host,
            port=spec.port,
            user=spec.user or "",
            password=spec.password or "",
            database=spec.path,
            connect_timeout=10,
            read_timeout=int(timeout_s) + 10,
            cursorclass=pymysql.cursors.SSCursor,
            charset="utf8mb4",
            autocommit=False,
        )
    except pymysql.Error as exc:
        raise InvalidParameter(f"cannot connect to {spec.uri}: {_clean(exc, spec)}") from None
    try:
        with conn.cursor() as cursor:
            _mysql_timeout(cursor, timeout_s)
            cursor.execute("START TRANSACTION READ ONLY")
            cursor.execute(spec.query or "")
            description = cursor.description or ()
            batcher = _Batcher(
                [str(c[0]) for c in description],
                [_MY_TYPES.get(int(c[1]), _TEXT) for c in description],
            )
            while rows := cursor.fetchmany(_BATCH_ROWS):
                yield batcher.batch(list(rows))
    except pymysql.Error as exc:
        raise InvalidParameter(
            f"the query on {spec.uri} failed: {_clean(exc, spec)} (it runs read-only, as the "
            "source's database user)"
        ) from None
    finally:
        conn.close()  # an unfinished read-only transaction is rolled back with the session


def _mysql_timeout(cursor: Any, timeout_s: float) -> None:
    """MariaDB's ``max_statement_time`` (seconds), else MySQL's ``max_execution_time`` (ms)."""
    import pymysql  # noqa: PLC0415

    try:
        cursor.execute("SET SESSION max_statement_time = %s", (float(timeout_s),))
    except pymysql.Error:
        cursor.execute("SET SESSION max_execution_time = %s", (int(timeout_s * 1000),))


def _s3(spec: SourceSpec, policy: SourcePolicy, folder: Path) -> Iterator[pa.RecordBatch]:
    import boto3  # noqa: PLC0415
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

    client = boto3.session.Session().client(
        "s3", endpoint_url=policy.s3_endpoint_url, region_name=policy.s3_region
    )
    path = folder / "source"
    try:
        found = client.get_object(Bucket=spec.host, Key=spec.path)
        if int(found.get("ContentLength", 0)) > policy.max_object_bytes:
            raise InvalidParameter(
                f"{spec.uri} is larger than the {policy.max_object_bytes >> 20:,} MiB a source "
                "may be; split it"
            )
        with path.open("wb") as out:
            for chunk in found["Body"].iter_chunks(_CHUNK):
                out.write(chunk)
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", "error"))
        if code in ("NoSuchKey", "404", "NoSuchBucket"):
            raise NotFound(f"{spec.uri} does not exist (or the server may not see it)") from None
        raise InvalidParameter(f"cannot read {spec.uri}: {code}") from None
    except BotoCoreError as exc:
        raise InvalidParameter(f"cannot read {spec.uri}: {type(exc).__name__}") from None
    yield from read_batches(path, spec.fmt or "", policy.limits)


class SourceIngestion:
    """Writes dataset versions from the remote sources the policy allows."""

    def __init__(self, datasets: DatasetService, policy: SourcePolicy, work_dir: Path) -> None:
        self._datasets = datasets
        self._policy = policy
        self._work_dir = work_dir

    def check(self, spec: SourceSpec) -> None:
        """Refuse a source off the operator's allow-list.

        Raises:
            PermissionDenied: the bucket or ``host:port`` is not in ``data_sources``.
        """
        if spec.kind == "s3":
            if spec.host not in self._policy.s3_buckets:
                raise PermissionDenied(
                    f"the server does not read bucket {spec.host!r}: ask the operator to add it "
                    "to data_sources.s3_buckets"
                )
            return
        if f"{spec.host}:{spec.port}" not in self._policy.sql_hosts:
            raise PermissionDenied(
                f"the server does not connect to {spec.host}:{spec.port}: ask the operator to "
                "add it to data_sources.sql_hosts"
            )

    def ingest(
        self,
        ctx: AuditContext,
        name: str,
        source: str,
        *,
        query: str | None = None,
        fmt: str | None = None,
        mode: WriteMode = WriteMode.APPEND,
    ) -> DataVersion:
        """A new version of ``name`` from ``source`` (see the module's rules). The caller's
        right to write ``name`` is checked before the source is touched.

        Raises:
            InvalidParameter: a refused or malformed source, or one that fails to read.
            PermissionDenied: a source off the allow-list; not a member of the team.
        """
        spec = parse_source(source, query, fmt)
        self.check(spec)
        return self._datasets.ingest_batches(
            ctx, name, self._batches(spec), source=spec.record(), mode=mode
        )

    def _batches(self, spec: SourceSpec) -> Iterator[pa.RecordBatch]:
        if spec.kind == "postgresql":
            yield from _postgres(spec, self._policy.sql_timeout_s)
            return
        if spec.kind == "mysql":
            yield from _mysql(spec, self._policy.sql_timeout_s)
            return
        self._work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="source-", dir=self._work_dir))
        try:
            yield from _s3(spec, self._policy, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    # ------------------------------------------------------------------ partitions
    def stage(
        self,
        ctx: AuditContext,
        name: str,
        source: str,
        slot: tuple[str, int, int],
        *,
        query: str | None = None,
        fmt: str | None = None,
        partition_by: str | None = None,
    ) -> StagedPart:
        """Stage partition ``partition`` of ``partitions`` of ``source`` as a part of the
        caller's ``batch``, ``slot`` being ``(batch, partition, partitions)`` (see
        :meth:`DatasetService.stage_part`). Of an S3 prefix (``s3://BUCKET/PREFIX/``): the
        objects ``partition``, ``partition + partitions``, ... of its keys in order; of a SQL
        query: the rows whose ``partition_by`` column hashes to it. Checked as :meth:`ingest`
        checks, before the source is touched.

        Raises:
            InvalidParameter: a malformed source, partition numbers or column; an S3 object
                (not a prefix) split in several partitions; fewer objects than partitions.
            PermissionDenied: a source off the allow-list; not a member of the team.
        """
        batch, partition, partitions = slot
        _rules.staged_folder(batch)
        _rules.staged_name(partition, partitions)
        if source.startswith("s3://") and partition_by is not None:
            raise InvalidParameter(
                "--partition-by is for SQL sources; an S3 prefix's objects are shared out"
            )
        if source.startswith("s3://") and source.endswith("/"):
            bucket, prefix = parse_prefix(source, query)
            self.check(SourceSpec("s3", bucket, 0, prefix))
            record: dict[str, Any] = {"kind": "s3", "uri": source, "format": fmt}
            batches = self._prefix_batches(bucket, prefix, fmt, partition, partitions)
        else:
            spec = parse_source(source, query, fmt)
            self.check(spec)
            record = {**spec.record(), "partition_by": partition_by}
            if spec.kind == "s3" and partitions > 1:
                raise InvalidParameter(
                    "an S3 object is one partition: name a prefix ending in '/' (its objects "
                    "are shared out among the partitions)"
                )
            if spec.kind != "s3":
                narrowed = partition_query(
                    spec.kind, spec.query or "", partition_by, partition, partitions
                )
                spec = dataclasses.replace(spec, query=narrowed)
            batches = self._batches(spec)
        return self._datasets.stage_part(
            ctx,
            name,
            batches,
            source={**record, "partition": partition},
            batch=batch,
            partition=partition,
            partitions=partitions,
        )

    def _prefix_batches(
        self, bucket: str, prefix: str, fmt: str | None, partition: int, partitions: int
    ) -> Iterator[pa.RecordBatch]:
        keys = _s3_keys(bucket, prefix, self._policy)
        if len(keys) < partitions:
            raise InvalidParameter(
                f"s3://{bucket}/{prefix} holds {len(keys)} object(s): use at most that many "
                "partitions"
            )
        for key in keys[partition::partitions]:
            yield from self._batches(SourceSpec("s3", bucket, 0, key, fmt=format_of(key, fmt)))


def _s3_keys(bucket: str, prefix: str, policy: SourcePolicy) -> list[str]:
    """The keys under ``prefix`` (not its folder markers), in order."""
    import boto3  # noqa: PLC0415
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

    client = boto3.session.Session().client(
        "s3", endpoint_url=policy.s3_endpoint_url, region_name=policy.s3_region
    )
    keys: list[str] = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys += [o["Key"] for o in page.get("Contents", []) if not o["Key"].endswith("/")]
            if len(keys) > MAX_KEYS:
                raise InvalidParameter(
                    f"s3://{bucket}/{prefix} holds more than {MAX_KEYS:,} objects: name a "
                    "narrower prefix"
                )
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", "error"))
        if code in ("NoSuchBucket", "404"):
            raise NotFound(f"s3://{bucket} does not exist (or the server may not see it)") from None
        raise InvalidParameter(f"cannot list s3://{bucket}/{prefix}: {code}") from None
    except BotoCoreError as exc:
        raise InvalidParameter(
            f"cannot list s3://{bucket}/{prefix}: {type(exc).__name__}"
        ) from None
    if not keys:
        raise NotFound(f"s3://{bucket}/{prefix} holds no objects (or the server may not see them)")
    return sorted(keys)
