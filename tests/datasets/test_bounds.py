"""Memory stays bounded whatever the source's size, and a crash mid-ingest leaves nothing
visible.

The memory bound is measured, not imposed: RLIMIT_AS is impractical with Arrow's and
DuckDB's allocators (they reserve address space far beyond what they touch), so the test
states the bound as the growth of the peak resident set (``ru_maxrss``) of a fresh process
over its baseline. The baseline is taken after the process has imported everything and
ingested a 1 MB file of the same shape (suite, profile and Parquet writer warmed up); then a
CSV ten times larger than the bound is ingested through :meth:`DatasetService.ingest`, the
path an upload takes (spooled, read in 1 MiB blocks, profiled, written, validated by DuckDB
under its own memory limit, stored), and its peak may grow by at most the bound.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.polling import wait_for

pytestmark = pytest.mark.slow

#: The bound: the most the peak resident set may grow while a file 10x this size ingests.
BOUND_MIB = 48

SCRIPT = textwrap.dedent(
    """
    import resource, sys, time
    from pathlib import Path
    from shamal.config import Settings
    from shamal.security import AuditContext
    from shamal.server import start_platform

    home, source, warm = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    platform = start_platform(Settings(home=home))
    admin = platform.security.authenticate(platform.admin_secret)

    def ctx(action):
        return AuditContext(action=action, actor=admin.name, principal=admin)

    def chunks(path):
        with path.open("rb") as handle:
            while block := handle.read(1 << 20):
                yield block

    suite = (
        "version: 1\\nexpectations:\\n  - kind: not_null\\n    column: id\\n"
        "  - kind: range\\n    column: id\\n    min: 0\\n"
    )
    svc = platform.datasets
    for name in ("warm", "big"):
        svc.create(ctx("dataset.create"), name)
        svc.set_suite(ctx("dataset.suite"), name, suite)
    svc.ingest(ctx("dataset.ingest"), "warm", chunks(warm), "csv")
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if sys.argv[4] == "crash":
        print("started", flush=True)
    version = svc.ingest(ctx("dataset.ingest"), "big", chunks(source), "csv")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(base // 1024, peak // 1024, version.row_count, version.status.value)
    """
)


def _write_csv(path: Path, size: int) -> int:
    """A CSV of about ``size`` bytes: an id and a 200-character text; returns its rows."""
    words = [f"{i:04d}" + "abcdefghij" * 19 + "abcdef" for i in range(1000)]
    block = "".join(f"{i},{words[i % 1000]}\n" for i in range(20_000)).encode()
    rows = 0
    with path.open("wb") as out:
        out.write(b"id,text\n")
        while out.tell() < size:
            out.write(block)
            rows += 20_000
    return rows


def _run(tmp_path: Path, source: Path, mode: str) -> subprocess.Popen[str]:
    warm = tmp_path / "warm.csv"
    _write_csv(warm, 1 << 20)
    home = tmp_path / "home"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    return subprocess.Popen(  # noqa: S603 - our own interpreter and script
        [sys.executable, "-c", SCRIPT, str(home), str(source), str(warm), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_a_csv_ten_times_the_bound_ingests_within_it(tmp_path: Path) -> None:
    source = tmp_path / "big.csv"
    rows = _write_csv(source, 10 * BOUND_MIB << 20)
    process = _run(tmp_path, source, "measure")
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-2000:]
    base, peak, ingested, status = out.split()
    assert (int(ingested), status) == (rows, "valid")
    assert source.stat().st_size >= 10 * BOUND_MIB << 20
    assert int(peak) - int(base) <= BOUND_MIB, f"peak {peak} MiB over a baseline of {base} MiB"


def test_a_crash_mid_ingest_leaves_no_version_and_no_visible_files(tmp_path: Path) -> None:
    """Killed (SIGKILL) while it writes: no version, and nothing where a reader would look;
    only the server's private work folder may hold leftovers (swept by a later ingestion's
    folder of its own, never read)."""
    source = tmp_path / "big.csv"
    _write_csv(source, 64 << 20)
    process = _run(tmp_path, source, "crash")
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "started"
    home = tmp_path / "home"
    work = home / "artifacts" / ".tmp" / "datasets"

    def visible() -> set[Path]:
        return {p for p in (home / "artifacts").rglob("*") if ".tmp" not in p.parts}

    before = visible()

    def writing() -> bool:
        return any(work.glob("ingest-*/part.parquet"))

    wait_for(writing, "the ingestion to write its part", deadline_s=120)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)  # reaps it and closes its pipes

    with sqlite3.connect(home / "shamal.db") as db:
        versions = db.execute(
            "SELECT d.name, v.version FROM data_versions v JOIN data_sets d ON d.id = v.dataset_id"
        ).fetchall()
    assert versions == [("warm", 1)]
    assert visible() == before  # nothing of the killed ingestion outside the work folder
