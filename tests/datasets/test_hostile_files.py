"""Hostile source files (hostile-inputs.md §14: malformed text, type confusion, bombs),
uploaded over HTTP: each is a 400 that says where it failed (row, column) without the values,
and leaves no version and nothing in the work folder.

The platform here lets a compressed source expand 10x past 1 MiB, so the bombs stay small.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as paipc
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from shamal.config import DataSourceSettings, Settings
from shamal.server import Platform
from tests.registry.conftest import People, people

__all__ = ["people"]


@pytest.fixture
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(
        home=tmp_path_factory.mktemp("home"),
        allowed_hosts=("*",),
        data_sources=DataSourceSettings(max_expansion=10, expansion_allowance_mib=1),
    )


def _zstd(data: bytes) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as out:
        out.write(data)
    return bytes(sink.getvalue().to_pybytes())


def _parquet(table: pa.Table, *, dictionary: bool = True) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", use_dictionary=dictionary)
    return sink.getvalue()


def _lying_ipc() -> bytes:
    """An Arrow IPC stream whose record batch claims a body far longer than it carries."""
    table = pa.table({"a": list(range(1000))})
    sink = io.BytesIO()
    with paipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    data = sink.getvalue()
    return data[: len(data) // 2]


def _dictionary_bomb() -> bytes:
    """A Parquet file of a few KiB whose one 100 KiB value repeats a million times (~100 GB
    decoded)."""
    values = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(1_000_000, dtype=np.int32)), pa.array(["x" * (100 << 10)])
    )
    return _parquet(pa.table({"s": values}))


def _type_change() -> bytes:
    return b"a,b\n" + b"1,2\n" * 1_200_000 + b"x,3\n"  # past the first 1 MiB block


HOSTILE: list[tuple[str, str, bytes, str]] = [
    ("ragged", "csv", b"a,b\n1,2\n3\n", "a row of 1 cells, not 2"),
    ("unterminated quote", "csv", b'a,b\n1,"abc\n2,3\n', "line break inside a cell"),
    ("invalid utf-8", "csv", b"a,b\n1,\xff\xfe\n", "not UTF-8 \\(at column #2"),
    ("utf-16 without bom", "csv", "a,b\n1,2\n".encode("utf-16-le"), "not UTF-8 text"),
    ("utf-16 with bom", "csv", "a,b\n1,2\n".encode("utf-16"), "not UTF-8 text"),
    ("nul in a cell", "csv", b"a,b\n1,x\x00y\n", "NUL bytes in a cell \\(at column #2"),
    ("10 MB cell", "csv", b"a,b\n1," + b"x" * (10 << 20) + b"\n", "row longer than 1 MiB"),
    (
        "10,000 columns",
        "csv",
        ",".join(f"c{i}" for i in range(10_000)).encode() + b"\n",
        "10,000 columns",
    ),
    ("duplicate names", "csv", b"a,a\n1,2\n", "repeated column names"),
    ("empty name", "csv", b"a,\n1,2\n", "empty or repeated column names"),
    ("type change", "csv", _type_change(), "after row [0-9,]+.*column #0"),
    ("gzip bomb", "csv", gzip.compress(b"a\n" + b"0\n" * (8 << 20)), "decompression bomb"),
    ("zstd bomb", "jsonl", _zstd(b'{"a": 0}\n' * (2 << 20)), "decompression bomb"),
    ("deep json", "jsonl", b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"\n", "deeper than 64"),
    ("json bad", "jsonl", b'{"a": 1}\n{"a": \n', "jsonl source cannot be read"),
    ("lying ipc", "arrow", _lying_ipc(), "arrow source cannot be read"),
    ("parquet dictionary bomb", "parquet", _dictionary_bomb(), "dictionary bomb"),
    (
        "parquet pages that expand",
        "parquet",
        _parquet(pa.table({"s": ["y" * 4096] * 4096}), dictionary=False),
        "decompression bomb",
    ),
    ("parquet footer", "parquet", b"PAR1" + b"\x00" * 64 + b"PAR1", "parquet source cannot"),
    (
        "deep arrow struct",
        "parquet",
        _parquet(pa.table({"s": [json.loads('{"a":' * 70 + "1" + "}" * 70)]})),
        "nests deeper than 64",
    ),
]


@pytest.mark.parametrize(
    ("fmt", "data", "message"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE]
)
def test_hostile_files_are_clear_400s_and_leave_nothing(
    api: TestClient, people: People, platform: Platform, fmt: str, data: bytes, message: str
) -> None:
    mo = people.headers("mo")
    api.post("/api/v1/datasets", json={"name": "h", "team": "red"}, headers=mo)
    answer = api.post("/api/v1/dataset-uploads/h", params={"format": fmt}, content=data, headers=mo)
    assert answer.status_code == 400, answer.text[:300]
    body = answer.json()
    assert body["error_code"] == "INVALID_PARAMETER_VALUE"
    assert re.search(message, body["message"]), body["message"]
    assert "Traceback" not in answer.text
    assert api.get("/api/v1/datasets/h/versions", headers=mo).json() == []
    work: Path = platform.settings.resolved_upload_spool_dir / "datasets"
    assert not work.exists() or not any(work.iterdir())


def test_compressed_sources_ingest(api: TestClient, people: People) -> None:
    """gzip and zstd CSV / JSON lines are told by their first bytes and read as streams."""
    mo = people.headers("mo")
    api.post("/api/v1/datasets", json={"name": "z", "team": "red"}, headers=mo)
    rows = b"a,b\n" + b"".join(b"%d,%d\n" % (i, i * 2) for i in range(10_000))
    for fmt, data in (
        ("csv", gzip.compress(rows)),
        ("csv", _zstd(rows)),
        (
            "jsonl",
            gzip.compress(b"".join(b'{"a": %d, "b": %d}\n' % (i, 2 * i) for i in range(10_000))),
        ),
    ):
        answer = api.post(
            "/api/v1/dataset-uploads/z",
            params={"format": fmt, "mode": "overwrite"},
            content=data,
            headers=mo,
        )
        assert answer.status_code == 201, answer.text
        assert answer.json()["row_count"] == 10_000
