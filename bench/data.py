"""Data: ingest + profile + validate a generated CSV, Shamal vs Great Expectations vs pandera.

One generated file, one 15-expectation suite written three ways, three tools, each in its own
process, one after the other, in the same run on the same machine:

- **Shamal**: ``DatasetService.ingest`` on an embedded platform (SQLite database, local
  artifact store, in-process, no HTTP): the CSV's bytes are spooled, read in Arrow batches
  (pyarrow's multi-threaded CSV reader), profiled as they stream by (counts, nulls, min/max,
  mean/std, quantile sketch, distinct estimate, top values of every column), written as one
  zstd Parquet part, stored content-addressed in the artifact store, validated by DuckDB in
  one scan of the part, and committed as a version with its profile and report.
- **Great Expectations** (GX Core, ``bench/.data-venv``): the file read by pandas' fastest CSV
  reader (``engine="pyarrow"``), then an ephemeral context, a pandas data source, a dataframe
  asset and its whole-dataframe batch definition, an expectation suite and a validation
  definition, run with ``result_format="BASIC"``. No profile: GX has no streaming profiler.
- **pandera** (its polars backend, ``bench/.data-venv``): the file read by ``polars.read_csv``
  (multi-threaded), validated by a ``pandera.polars.DataFrameSchema`` with ``lazy=True`` (every
  check runs and every failure is collected). No profile either.

The suite (``SUITE`` below) has 15 expectations: column types, not-null, uniqueness, ranges,
allowed sets, regexes, row-count bounds, freshness of the time column and a custom SQL check.
GX runs no SQL on pandas data and pandera runs none at all; there the SQL check is the
equivalent row condition (``discount <= amount``): GX's column-pair expectation, a pandera
dataframe check. The file holds a few deliberate violations (three expectations fail, as
warnings); the three tools must agree on which expectations pass, or the run says so.

Each tool's wall time is taken inside its process, from the first byte read to the report
(imports, and for Shamal the platform's start-up, before it; printed separately as the
process's whole wall time). Peak memory is the process's maximum resident set size, as
``wait4`` reports it when the process ends.

Run from the repository root with Shamal's venv::

    .venv/bin/python bench/data.py --rows 1000000    # a quicker run
    .venv/bin/python bench/data.py                   # the benchmark: 10,000,000 rows

The peer venv ``bench/.data-venv`` (git-ignored) is created when it is missing. Exit status: 0
once the benchmark ran, pass or fail; 2 when the peer venv could not be set up or a tool
failed. The last line sums it up: ``speedup_vs_ge X speedup_vs_pandera Y peak_mb_shamal A
peak_mb_ge B peak_mb_pandera C``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import _peers

REPO = Path(__file__).resolve().parent.parent
PEER_VENV = REPO / "bench" / ".data-venv"
PEER_PACKAGES = (
    "great_expectations==1.24.1",
    "pandera[polars]==0.35.0",
    "polars==2.1.0",
    "pandas==3.1.1",
    "pyarrow==26.0.1",
)
SEED = 20
CHUNK_ROWS = 500_000
TARGET_VS_GE = 10.0
TARGET_VS_PANDERA = 3.0
TARGET_MEMORY_SHARE = 0.25
#: The newest timestamp in the file; freshness is judged against the time of the run.
NEWEST = datetime(2026, 11, 1, tzinfo=UTC)
MAX_AGE_DAYS = 3650

COUNTRIES = ("AE", "SA", "QA", "OM", "KW", "BH", "EG", "JO", "IN", "GB")
STATUSES = ("new", "paid", "shipped", "delivered", "refunded", "cancelled")
CITIES = ("Dubai", "Abu Dhabi", "Sharjah", "Riyadh", "Doha", "Muscat", "Cairo", "Amman")
CHANNELS = ("web", "app", "store", "phone")
EMAIL_PATTERN = r"[a-z]+\.[0-9]+@(mail|post|inbox)\.(com|ae)"
SKU_PATTERN = r"SKU-[0-9]{6}"

#: The suite, one entry per expectation, in Shamal's YAML vocabulary; the GX and pandera
#: forms are made from it. Three are warnings: the file breaks them on purpose.
SUITE: list[dict[str, Any]] = [
    {"kind": "column_type", "column": "id", "arrow_type": "int64"},
    {"kind": "column_type", "column": "amount", "arrow_type": "double"},
    {"kind": "not_null", "column": "id"},
    {"kind": "not_null", "column": "ts"},
    {"kind": "unique", "columns": ["id"]},
    {"kind": "range", "column": "age", "min": 0, "max": 120, "severity": "warning"},
    {"kind": "range", "column": "amount", "min": 0.0, "max": 10000.0},
    {"kind": "range", "column": "quantity", "min": 1, "max": 50},
    {"kind": "in_set", "column": "country", "values": list(COUNTRIES)},
    {"kind": "in_set", "column": "status", "values": list(STATUSES)},
    {"kind": "regex", "column": "email", "pattern": EMAIL_PATTERN, "severity": "warning"},
    {"kind": "regex", "column": "sku", "pattern": SKU_PATTERN},
    {"kind": "row_count", "min": 1, "max": 100_000_000},
    {"kind": "freshness", "column": "ts", "max_age": f"{MAX_AGE_DAYS}d"},
    {
        "kind": "sql",
        "sql": "SELECT * FROM data WHERE discount > amount",
        "severity": "warning",
    },
]
#: Rows broken on purpose, per expectation index: (how many, which rows: every n-th).
BROKEN = {5: 7, 10: 3, 14: 4}


# ------------------------------------------------------------------------------ the file


def generate(path: Path, rows: int) -> None:
    """Write the benchmark's CSV: ``rows`` rows of 20 columns, seeded, in chunks."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    rng = np.random.default_rng(SEED)
    first = ("amal", "omar", "sara", "yousef", "lina", "khalid", "maya", "rami", "noor", "ali")
    words = ("late", "gift", "fragile", "urgent", "returned", "bulk", "express", "call first")
    newest_s = int(NEWEST.timestamp())
    span_s = 365 * 86400
    writer = None
    broken = {index: _broken_rows(rows, count) for index, count in BROKEN.items()}
    for start in range(0, rows, CHUNK_ROWS):
        n = min(CHUNK_ROWS, rows - start)
        ids = np.arange(start + 1, start + n + 1, dtype=np.int64)
        ts = newest_s - span_s + (ids * span_s) // rows
        age = rng.integers(18, 90, n)
        amount = np.round(rng.gamma(2.0, 150.0, n).clip(0, 10000), 2)
        discount = np.round(amount * rng.uniform(0, 0.5, n), 2)
        age_nulls = rng.random(n) < 0.02
        discount_nulls = rng.random(n) < 0.3
        who = np.asarray(first)[rng.integers(0, len(first), n)]
        email = pc.binary_join_element_wise(
            pa.array(who),
            ".",
            pc.cast(pa.array(rng.integers(1, 10**6, n)), pa.string()),
            "@",
            pa.array(np.asarray(("mail", "post", "inbox"))[rng.integers(0, 3, n)]),
            ".",
            pa.array(np.asarray(("com", "ae"))[rng.integers(0, 2, n)]),
            "",
        )
        age_arr = age.astype(np.int64)
        email_list = None
        local = {
            index: chosen[(chosen >= start) & (chosen < start + n)] - start
            for index, chosen in broken.items()
        }
        if len(local[5]):
            age_arr[local[5]] = 150
            age_nulls[local[5]] = False
        if len(local[10]):
            email_list = email.to_pylist()
            for row in local[10].tolist():
                email_list[row] = "not-an-email"
        if len(local[14]):
            discount[local[14]] = amount[local[14]] + 5.0
            discount_nulls[local[14]] = False
        columns = {
            "id": pa.array(ids),
            "ts": pa.array(ts.astype("datetime64[s]")),
            "customer_id": pa.array(rng.integers(1, rows // 10 + 2, n)),
            "age": pa.array(age_arr, mask=age_nulls),
            "quantity": pa.array(rng.integers(1, 51, n)),
            "rating": pa.array(rng.integers(1, 6, n)),
            "amount": pa.array(amount),
            "discount": pa.array(discount, mask=discount_nulls),
            "score": pa.array(rng.random(n)),
            "latitude": pa.array(np.round(rng.uniform(12.0, 32.0, n), 5)),
            "longitude": pa.array(np.round(rng.uniform(35.0, 60.0, n), 5)),
            "country": pa.array(np.asarray(COUNTRIES)[rng.integers(0, len(COUNTRIES), n)]),
            "status": pa.array(np.asarray(STATUSES)[rng.integers(0, len(STATUSES), n)]),
            "city": pa.array(
                np.asarray(CITIES)[rng.integers(0, len(CITIES), n)], mask=rng.random(n) < 0.05
            ),
            "channel": pa.array(np.asarray(CHANNELS)[rng.integers(0, len(CHANNELS), n)]),
            "email": pa.array(email_list) if email_list is not None else email,
            "sku": pc.binary_join_element_wise(
                "SKU-",
                pc.utf8_lpad(pc.cast(pa.array(rng.integers(0, 10**6, n)), pa.string()), 6, "0"),
                "",
            ),
            "name": pa.array(
                np.char.add(
                    np.char.add(who.astype(str), " "),
                    np.asarray(first)[::-1][rng.integers(0, len(first), n)].astype(str),
                )
            ),
            "note": pa.array(
                np.asarray(words)[rng.integers(0, len(words), n)], mask=rng.random(n) < 0.6
            ),
            "is_member": pa.array(rng.random(n) < 0.4),
        }
        table = pa.table(columns)
        if writer is None:
            writer = pacsv.CSVWriter(str(path), table.schema)
        writer.write_table(table)
    assert writer is not None
    writer.close()


def _broken_rows(rows: int, count: int) -> Any:
    """``count`` row numbers spread over the file (never in its first block, so that every
    reader infers the columns' types from clean rows)."""
    import numpy as np

    count = min(count, max(rows // 4, 1))
    return np.linspace(rows // 2, rows - 1, count).astype(np.int64)


# ------------------------------------------------------------------------------ the tools


def _now() -> datetime:
    return datetime.now(UTC)


def run_shamal(csv: Path, work: Path) -> dict[str, Any]:
    """DatasetService.ingest on an embedded platform: spool, read, profile, write, store,
    validate, commit."""
    import yaml

    from shamal.config import Settings
    from shamal.datasets import WriteMode
    from shamal.security import AuditContext
    from shamal.server import start_platform

    settings = Settings(
        home=work / "home", database_url=f"sqlite:///{work / 'shamal.db'}", allowed_hosts=("*",)
    )
    platform_ = start_platform(settings)
    try:
        assert platform_.admin_secret is not None
        admin = platform_.security.authenticate(platform_.admin_secret)
        ctx = AuditContext(action="bench", actor=admin.name, principal=admin)
        service = platform_.datasets
        started = time.perf_counter()
        service.create(ctx, "bench")
        service.set_suite(ctx, "bench", yaml.safe_dump({"version": 1, "expectations": SUITE}))

        def chunks() -> Any:
            with csv.open("rb") as handle:
                while chunk := handle.read(4 << 20):
                    yield chunk

        version = service.ingest(ctx, "bench", chunks(), "csv", mode=WriteMode.OVERWRITE)
        elapsed = time.perf_counter() - started
    finally:
        platform_.close()
    results = version.validation["results"]
    return {
        "work_s": elapsed,
        "rows": version.row_count,
        "passed": [r["passed"] for r in results],
        "failing": [r["failing"] for r in results],
        "profiled_columns": len(version.profile["columns"]),
        "status": version.status.value,
    }


def _gx_expectation(spec: dict[str, Any], now: datetime) -> Any:
    """The GX form of one of the suite's expectations."""
    import great_expectations.expectations as gxe

    column = spec.get("column")
    cutoff = (now - timedelta(days=MAX_AGE_DAYS)).replace(tzinfo=None)
    pandas_types = {"int64": "int64", "double": "float64"}
    forms = {
        "column_type": lambda: gxe.ExpectColumnValuesToBeOfType(
            column=column, type_=pandas_types[spec["arrow_type"]]
        ),
        "not_null": lambda: gxe.ExpectColumnValuesToNotBeNull(column=column),
        "unique": lambda: gxe.ExpectColumnValuesToBeUnique(column=spec["columns"][0]),
        "range": lambda: gxe.ExpectColumnValuesToBeBetween(
            column=column, min_value=spec["min"], max_value=spec["max"]
        ),
        "in_set": lambda: gxe.ExpectColumnValuesToBeInSet(column=column, value_set=spec["values"]),
        "regex": lambda: gxe.ExpectColumnValuesToMatchRegex(
            column=column, regex=f"^(?:{spec['pattern']})$"
        ),
        "row_count": lambda: gxe.ExpectTableRowCountToBeBetween(
            min_value=spec["min"], max_value=spec["max"]
        ),
        "freshness": lambda: gxe.ExpectColumnMaxToBeBetween(column=column, min_value=cutoff),
        # No SQL on pandas data: the same condition as a column-pair expectation.
        "sql": lambda: gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="amount",
            column_B="discount",
            or_equal=True,
            ignore_row_if="either_value_is_missing",
        ),
    }
    return forms[spec["kind"]]()


def run_ge(csv: Path, work: Path) -> dict[str, Any]:
    """GX Core 1.x: ephemeral context, pandas data source, dataframe asset, whole-dataframe
    batch definition, suite, validation definition."""
    import great_expectations as gx
    import pandas as pd

    now = _now()
    started = time.perf_counter()
    frame = pd.read_csv(csv, engine="pyarrow")
    context = gx.get_context(mode="ephemeral")
    source = context.data_sources.add_pandas("bench")
    asset = source.add_dataframe_asset(name="rows")
    batch = asset.add_batch_definition_whole_dataframe("all")
    suite = context.suites.add(gx.ExpectationSuite(name="bench"))
    for index, spec in enumerate(SUITE):
        expectation = _gx_expectation(spec, now)
        expectation.meta = {"index": index}
        suite.add_expectation(expectation)
    definition = context.validation_definitions.add(
        gx.ValidationDefinition(name="bench", data=batch, suite=suite)
    )
    outcome = definition.run(batch_parameters={"dataframe": frame}, result_format="BASIC")
    elapsed = time.perf_counter() - started
    # GX reports in an order of its own: put the results back in the suite's.
    results = sorted(outcome.results, key=lambda r: r.expectation_config.meta["index"])
    return {
        "work_s": elapsed,
        "rows": len(frame),
        "passed": [bool(r.success) for r in results],
        "failing": [int((r.result or {}).get("unexpected_count") or 0) for r in results],
        "ge_errors": [
            str(r.exception_info.get("exception_message"))
            for r in results
            if (r.exception_info or {}).get("raised_exception")
        ],
    }


def _pandera_schema(now: datetime) -> Any:
    import pandera.polars as pa
    import polars as pl

    types = {"int64": pl.Int64, "double": pl.Float64}
    columns: dict[str, dict[str, Any]] = {}
    checks: list[Any] = []

    def column(name: str) -> dict[str, Any]:
        return columns.setdefault(name, {"dtype": None, "nullable": True, "checks": []})

    for index, spec in enumerate(SUITE):
        kind, name = spec["kind"], f"e{index:02d}"
        if kind == "column_type":
            column(spec["column"])["dtype"] = types[spec["arrow_type"]]
        elif kind == "not_null":
            column(spec["column"])["nullable"] = False
        elif kind == "unique":
            column(spec["columns"][0])["unique"] = True
        elif kind == "range":
            column(spec["column"])["checks"].append(
                pa.Check.in_range(spec["min"], spec["max"], name=name)
            )
        elif kind == "in_set":
            column(spec["column"])["checks"].append(pa.Check.isin(spec["values"], name=name))
        elif kind == "regex":
            column(spec["column"])["checks"].append(
                pa.Check.str_matches(f"^(?:{spec['pattern']})$", name=name)
            )
        elif kind == "row_count":
            low, high = spec["min"], spec["max"]
            checks.append(
                pa.Check(
                    lambda data, low=low, high=high: data.lazyframe.select(
                        pl.len().is_between(low, high)
                    ),
                    name=name,
                )
            )
        elif kind == "freshness":
            cutoff = (now - timedelta(days=MAX_AGE_DAYS)).replace(tzinfo=None)
            checks.append(
                pa.Check(
                    lambda data, c=cutoff, col=spec["column"]: data.lazyframe.select(
                        pl.col(col).max() >= c
                    ),
                    name=name,
                )
            )
        elif kind == "sql":
            # pandera runs no SQL: the same condition as a dataframe check, row by row.
            checks.append(
                pa.Check(
                    lambda data: data.lazyframe.select(
                        pl.col("discount").is_null()
                        | pl.col("amount").is_null()
                        | (pl.col("discount") <= pl.col("amount"))
                    ),
                    name=name,
                )
            )
    schema_columns = {
        name: pa.Column(
            spec["dtype"],
            nullable=spec["nullable"],
            unique=spec.get("unique", False),
            checks=spec["checks"] or None,
        )
        for name, spec in columns.items()
    }
    return pa.DataFrameSchema(schema_columns, checks=checks)


def _pandera_index(check: str, column: str | None) -> int | None:
    """The suite index of a pandera failure: a dataframe check's name (e14), or the kind of
    check on that column (pandera names column checks by what they test)."""
    if check.startswith("e") and check[1:].isdigit():
        return int(check[1:])
    for index, spec in enumerate(SUITE):
        col = spec.get("column") or (spec.get("columns") or [None])[0]
        if col != column:
            continue
        if (
            (spec["kind"] == "range" and check.startswith("in_range"))
            or (spec["kind"] == "in_set" and check.startswith("isin"))
            or (spec["kind"] == "regex" and check.startswith("str_matches"))
            or (spec["kind"] == "column_type" and check.startswith("dtype"))
            or (spec["kind"] == "not_null" and "null" in check)
            or (spec["kind"] == "unique" and "unique" in check)
        ):
            return index
    return None


def run_pandera(csv: Path, work: Path) -> dict[str, Any]:
    """pandera's polars backend: polars' multi-threaded reader, a DataFrameSchema, lazy."""
    import pandera.errors
    import polars as pl

    now = _now()
    started = time.perf_counter()
    frame = pl.read_csv(csv, try_parse_dates=True)
    read_s = time.perf_counter() - started
    schema = _pandera_schema(now)
    failing = [0] * len(SUITE)
    unmatched: list[str] = []
    try:
        schema.validate(frame, lazy=True)
    except pandera.errors.SchemaErrors as errors:
        cases = errors.failure_cases
        for check, column, count in (
            cases.group_by(["check", "column"]).len().iter_rows()
            if isinstance(cases, pl.DataFrame)
            else []
        ):
            index = _pandera_index(str(check), column)
            if index is None:
                unmatched.append(f"{check} on {column}")
            else:
                failing[index] += int(count)
    elapsed = time.perf_counter() - started
    return {
        "work_s": elapsed,
        "read_s": read_s,
        "rows": frame.height,
        "passed": [count == 0 for count in failing],
        "failing": failing,
        "unmatched": unmatched,
    }


WORKERS = {"shamal": run_shamal, "ge": run_ge, "pandera": run_pandera}


def worker(tool: str, csv: Path, out: Path) -> int:
    with tempfile.TemporaryDirectory(prefix=f"bench-data-{tool}-") as work:
        result = WORKERS[tool](csv, Path(work))
    out.write_text(json.dumps(result))
    return 0


# ------------------------------------------------------------------------------ the parent


def ensure_peer_venv(say: Any) -> Path:
    """The peer venv with GX and pandera (its polars backend), created when missing."""
    probe = "import great_expectations, pandera.polars, polars"
    return _peers.ensure_venv(PEER_VENV, PEER_PACKAGES, probe, say)


def _versions(python: Path) -> str:
    code = (
        "import great_expectations, pandera, polars, pandas;"
        "print(f'great_expectations {great_expectations.__version__}, pandera "
        "{pandera.__version__}, polars {polars.__version__}, pandas {pandas.__version__}')"
    )
    return _peers.versions(python, code)


def measure(tool: str, python: Path, csv: Path, folder: Path) -> dict[str, Any]:
    """Run one tool in a process of its own: its result, its wall time, its peak RSS."""
    out = folder / f"{tool}.json"
    env = dict(os.environ)
    if tool == "shamal":
        env["PYTHONPATH"] = str(REPO / "src")
    command = [str(python), str(Path(__file__).resolve()), "--worker", tool, "--csv", str(csv)]
    started = time.perf_counter()
    process = subprocess.Popen([*command, "--out", str(out)], env=env, cwd=folder)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    if process.returncode != 0 or not out.exists():
        raise RuntimeError(f"{tool} failed with exit status {process.returncode}")
    result: dict[str, Any] = json.loads(out.read_text())
    result["process_s"] = wall
    result["peak_mb"] = usage.ru_maxrss / 1024  # Linux: kilobytes
    return result


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def report(rows: int, size: int, results: dict[str, dict[str, Any]]) -> list[str]:
    shamal, ge, pdr = results["shamal"], results["ge"], results["pandera"]
    lines = [
        f"{rows:,} rows x 20 columns, {size / 2**20:,.0f} MiB of CSV; "
        f"{len(SUITE)} expectations ({len(BROKEN)} broken on purpose, as warnings)",
        "",
        f"{'':34}{'Shamal':>12}{'GX':>12}{'pandera':>12}",
    ]

    def row(label: str, key: str, fmt: str) -> None:
        values = "".join(f"{format(results[t][key], fmt):>12}" for t in ("shamal", "ge", "pandera"))
        lines.append(f"{label:34}{values}")

    row("read + profile + validate, s", "work_s", ".2f")
    row("whole process (with imports), s", "process_s", ".2f")
    row("peak memory (max RSS), MiB", "peak_mb", ",.0f")
    lines.append(
        f"{'expectations failed':34}"
        + "".join(
            f"{sum(not p for p in results[t]['passed']):>12}" for t in ("shamal", "ge", "pandera")
        )
    )
    agree = shamal["passed"] == ge["passed"] == pdr["passed"]
    lines.append(
        f"{'same verdicts, all 15':34}{'yes' if agree else 'NO':>12}"
        + (
            ""
            if agree
            else f"  shamal {shamal['passed']} ge {ge['passed']} pandera {pdr['passed']}"
        )
    )
    lines.append(
        "failing rows per broken expectation: "
        + ", ".join(
            f"#{i} shamal {shamal['failing'][i]} ge {ge['failing'][i]} pandera {pdr['failing'][i]}"
            for i in sorted(BROKEN)
        )
    )
    for tool, key in (("ge", "ge_errors"), ("pandera", "unmatched")):
        if results[tool].get(key):
            lines.append(f"{tool}: {results[tool][key]}")
    vs_ge = ge["work_s"] / shamal["work_s"]
    vs_pdr = pdr["work_s"] / shamal["work_s"]
    share_ge = shamal["peak_mb"] / ge["peak_mb"]
    share_pdr = shamal["peak_mb"] / pdr["peak_mb"]

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    floor = pdr["read_s"]
    lines += [
        "",
        f"polars reading the file alone (the fastest reader here): {floor:.2f} s; 3x pandera "
        f"means {pdr['work_s'] / TARGET_VS_PANDERA:.2f} s, "
        f"10x GX {ge['work_s'] / TARGET_VS_GE:.2f} s for reading, profiling, validating, "
        "writing Parquet and storing it",
        "",
        f"speed-up vs GX       {vs_ge:6.1f}x   target >= {TARGET_VS_GE:.0f}x   "
        f"{verdict(vs_ge >= TARGET_VS_GE)}",
        f"speed-up vs pandera  {vs_pdr:6.1f}x   target >= {TARGET_VS_PANDERA:.0f}x   "
        f"{verdict(vs_pdr >= TARGET_VS_PANDERA)}",
        f"memory share of GX   {share_ge:6.2f}    target <= {TARGET_MEMORY_SHARE}   "
        f"{verdict(share_ge <= TARGET_MEMORY_SHARE)}",
        f"memory share of pandera {share_pdr:6.2f} target <= {TARGET_MEMORY_SHARE}   "
        f"{verdict(share_pdr <= TARGET_MEMORY_SHARE)}",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows of the CSV")
    parser.add_argument("--keep", action="store_true", help="keep the CSV and work folder")
    parser.add_argument("--dir", type=Path, default=None, help="where the CSV is written")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--csv", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.csv, args.out)
    if args.rows < 1000:
        parser.error("--rows must be at least 1000")

    def say(text: str) -> None:
        print(text, flush=True)

    try:
        peer = ensure_peer_venv(say)
    except (OSError, subprocess.CalledProcessError) as exc:
        say(f"cannot set up the peer venv {PEER_VENV}: {exc}")
        return 2
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    say(f"{_cpu()}, {os.cpu_count()} CPUs, load average at start {load}")
    say(f"Shamal: {sys.executable}; peers: {_versions(peer)}")
    folder = Path(tempfile.mkdtemp(prefix="bench-data-", dir=args.dir))
    try:
        csv = folder / "data.csv"
        started = time.perf_counter()
        _generate_in_child(csv, args.rows)
        say(f"generated {args.rows:,} rows in {time.perf_counter() - started:.1f} s")
        results: dict[str, dict[str, Any]] = {}
        for tool in ("shamal", "ge", "pandera"):
            python = Path(sys.executable) if tool == "shamal" else peer
            say(f"running {tool} ...")
            try:
                results[tool] = measure(tool, python, csv, folder)
            except RuntimeError as exc:
                say(str(exc))
                return 2
            say(
                f"  {tool}: {results[tool]['work_s']:.2f} s, "
                f"peak {results[tool]['peak_mb']:,.0f} MiB"
            )
        for line in report(args.rows, csv.stat().st_size, results):
            say(line)
        say(f"load average at end {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    finally:
        if args.keep:
            say(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    shamal, ge, pdr = results["shamal"], results["ge"], results["pandera"]
    say(
        f"speedup_vs_ge {ge['work_s'] / shamal['work_s']:.1f} "
        f"speedup_vs_pandera {pdr['work_s'] / shamal['work_s']:.1f} "
        f"peak_mb_shamal {shamal['peak_mb']:.0f} peak_mb_ge {ge['peak_mb']:.0f} "
        f"peak_mb_pandera {pdr['peak_mb']:.0f}"
    )
    return 0


def _generate_in_child(csv: Path, rows: int) -> None:
    """Generate in a process of its own, so this one stays small (a child's peak memory
    counts from what it inherits)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import data; "
        "data.generate(__import__('pathlib').Path(sys.argv[2]), int(sys.argv[3]))"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).resolve().parent), str(csv), str(rows)],
        check=True,
    )


if __name__ == "__main__":
    sys.exit(main())
