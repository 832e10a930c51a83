"""Drift: Shamal's streaming sketches against Evidently's DataDriftPreset, same Parquet files.

Two parts, one run, each tool in a process of its own reading the same files:

- **Speed and memory.** A generated reference and a generated current data set of ``--rows``
  rows each (1,000,000 by default) and 50 columns: 30 numeric (float64: normal, uniform,
  lognormal, scale-changed normal, Poisson and binomial counts, a 0/1 flag, a normal with 10%
  nulls and some +-inf) and 20 categorical (strings, 2 to 30 categories, some with nulls);
  every third column of each kind is shifted in the current set. Written once as Parquet
  (row groups of 100,000 rows), then:

  - **Shamal**: ``pyarrow.parquet.ParquetFile.iter_batches`` streams the row groups of each
    file through a ``SketchBuilder`` (strings read as dictionaries), then ``compare`` tests
    the 50 columns with the default tests. Timed from the first byte read to the report,
    both profiles included (a monitor builds the reference profile once and keeps it: the
    compare-only time is printed as well).
  - **Evidently** (its current release, ``bench/.evidently-venv``, see ``PEER_PACKAGES``):
    ``pandas.read_parquet`` of both files, then ``Report([DataDriftPreset()],
    include_tests=True).run`` on ``Dataset.from_pandas`` with a ``DataDefinition`` naming the
    numeric and categorical columns, as its users do. Timed from the first byte read to the
    snapshot's dictionary.

  Peak memory is each worker process's maximum resident set size, as ``wait4`` reports it
  when the process ends (imports included).
- **Agreement.** ``CASES`` labelled cases (drift / no drift per column): 12 pairs of sizes,
  reference from 200 to 200,000 rows (both sides of Evidently's 1,000-row switch from p-value
  tests to distances), each with 20 columns of the families above and shifts from none
  through near-threshold to large (``SHIFTS``). Each tool runs its default tests on each
  pair (Shamal: sketches and ``compare``; Evidently: ``DataDriftPreset``) and the per-column
  verdicts are compared; every disagreement is printed with both statistics. The statistics
  of the 50 big columns are compared too.

Run from the repository root with Shamal's venv::

    .venv/bin/python bench/drift.py --rows 100000   # a quicker run
    .venv/bin/python bench/drift.py                 # the benchmark: 1,000,000 rows a side

The peer venv ``bench/.evidently-venv`` (git-ignored) is created when it is missing. Exit
status: 0 once the benchmark ran, pass or fail; 2 when the peer venv could not be set up or
a tool failed. The last line: ``speedup X memory_ratio Y agreement Z`` (Evidently's time over
Shamal's; Shamal's peak memory over Evidently's; the share of case columns with the same
verdict). Targets: speedup >= 10, memory_ratio <= 0.5, agreement >= 0.99.
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
from pathlib import Path
from typing import Any

import _peers

REPO = Path(__file__).resolve().parent.parent
PEER_VENV = REPO / "bench" / ".evidently-venv"
PEER_SCRIPT = REPO / "bench" / "_drift_peers" / "evidently_drift.py"
EVIDENTLY_VERSION = "0.7.23"
# Evidently 0.7.23 imports a pandas internal that pandas 3 removed: pandas 2 it is.
PEER_PACKAGES = (f"evidently=={EVIDENTLY_VERSION}", "pandas==2.3.3", "pyarrow==26.0.1")
SEED = 23
ROW_GROUP = 100_000
NUMERIC = 30
CATEGORICAL = 20
TARGET_SPEEDUP = 10.0
TARGET_MEMORY = 0.5
TARGET_AGREEMENT = 0.99
#: (reference rows, current rows) of the agreement cases; 20 columns each.
SIZE_PAIRS = (
    (200, 200),
    (500, 2_000),
    (800, 800),
    (1_000, 300),
    (1_000, 50_000),
    (600, 100_000),
    (1_001, 1_001),
    (3_000, 3_000),
    (5_000, 20_000),
    (20_000, 5_000),
    (50_000, 50_000),
    (200_000, 200_000),
)
CASE_COLUMNS = 20
CASES = len(SIZE_PAIRS) * CASE_COLUMNS
NUMERIC_FAMILIES = (
    "normal",
    "uniform",
    "lognormal",
    "scale",
    "poisson",
    "binomial",
    "flag",
    "holes",
)
CATEGORY_SIZES = (2, 3, 8, 30)
#: The shift of each family at each level: none, tiny, near the distance thresholds, clear,
#: large. The numeric ones move a location (in standard deviations, near 0.1 is where the
#: normed Wasserstein threshold lies), a scale, a rate or a share; the categorical ones mix
#: that much of the reversed distribution in.
SHIFTS: dict[str, tuple[float, ...]] = {
    "normal": (0.0, 0.02, 0.09, 0.11, 0.2, 1.0),
    "uniform": (0.0, 0.005, 0.027, 0.031, 0.06, 0.3),
    "lognormal": (0.0, 0.01, 0.08, 0.12, 0.2, 0.8),
    "scale": (0.0, 0.02, 0.1, 0.15, 0.3, 1.0),
    "poisson": (0.0, 0.05, 0.18, 0.22, 0.4, 2.0),
    "binomial": (0.0, 0.01, 0.04, 0.06, 0.1, 0.3),
    "flag": (0.0, 0.01, 0.04, 0.05, 0.1, 0.3),
    "holes": (0.0, 0.02, 0.09, 0.11, 0.2, 1.0),
    "category": (0.0, 0.02, 0.1, 0.15, 0.3, 0.8),
}
LEVELS = len(SHIFTS["normal"])


# ---- the data ------------------------------------------------------------------------------


def big_specs() -> list[dict[str, Any]]:
    """The 50 columns of the speed data: every third column of each kind is shifted."""
    specs = []
    for i in range(NUMERIC):
        family = NUMERIC_FAMILIES[i % len(NUMERIC_FAMILIES)]
        level = 4 if i % 3 == 0 else 0
        specs.append({"name": f"num_{i:02}", "kind": "numeric", "family": family, "level": level})
    for i in range(CATEGORICAL):
        k = CATEGORY_SIZES[i % len(CATEGORY_SIZES)]
        level = 4 if i % 3 == 0 else 0
        specs.append(
            {
                "name": f"cat_{i:02}",
                "kind": "categorical",
                "family": "category",
                "k": k,
                "level": level,
                "holes": i % 5 == 4,
            }
        )
    for spec in specs:
        spec["shift"] = SHIFTS[spec["family"]][spec["level"]]
    return specs


def case_specs(pair: int) -> list[dict[str, Any]]:
    """The 20 columns of one pair of sizes: families and shift levels cycled."""
    specs = []
    for i in range(CASE_COLUMNS):
        level = (i * 5 + pair) % LEVELS
        if i < 13:
            family = NUMERIC_FAMILIES[(i + pair) % len(NUMERIC_FAMILIES)]
            spec = {"name": f"n{i:02}", "kind": "numeric", "family": family}
        else:
            k = CATEGORY_SIZES[(i + pair) % len(CATEGORY_SIZES)]
            spec = {
                "name": f"c{i:02}",
                "kind": "categorical",
                "family": "category",
                "k": k,
                "holes": (i + pair) % 4 == 0,
            }
        spec["level"] = level
        spec["shift"] = SHIFTS[spec["family"]][level]
        specs.append(spec)
    return specs


def column(spec: dict[str, Any], current: bool, rows: int, rng: Any) -> Any:
    """One column's values: a numpy float array or a pyarrow string array."""
    import numpy as np
    import pyarrow as pa

    shift = spec["shift"] if current else 0.0
    family = spec["family"]
    if family == "category":
        k = spec["k"]
        p = 1.0 / np.arange(1, k + 1)
        p /= p.sum()
        p = (1 - shift) * p + shift * p[::-1]
        words = pa.array([f"v{j:02}" for j in range(k)])
        picks = rng.choice(k, rows, p=p)
        mask = rng.random(rows) < 0.05 if spec.get("holes") else None
        return words.take(pa.array(picks, mask=mask))
    draws = {
        "normal": lambda: rng.normal(shift, 1.0, rows),
        "uniform": lambda: rng.random(rows) + shift,
        "lognormal": lambda: rng.lognormal(shift, 0.5, rows),
        "scale": lambda: rng.normal(0.0, 1.0 + shift, rows),
        "poisson": lambda: rng.poisson(4.0 + shift, rows).astype(np.float64),
        "binomial": lambda: rng.binomial(4, 0.5 + shift, rows).astype(np.float64),
        "flag": lambda: (rng.random(rows) < 0.3 + shift).astype(np.float64),
    }
    if family in draws:
        return draws[family]()
    values = rng.normal(shift, 1.0, rows)  # holes: nulls and infinities
    values[rng.random(rows) < 0.1] = np.nan
    values[rng.random(rows) < 0.001] = np.inf
    return values


def write(path: Path, specs: list[dict[str, Any]], current: bool, rows: int, seed: int) -> None:
    """A Parquet file of the columns, generated and written a row group at a time."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    try:
        for group, start in enumerate(range(0, rows, ROW_GROUP)):
            size = min(ROW_GROUP, rows - start)
            arrays = {}
            for index, spec in enumerate(specs):
                rng = np.random.default_rng([seed, int(current), group, index])
                arrays[spec["name"]] = column(spec, current, size, rng)
            table = pa.table(arrays)
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema)
            writer.write_table(table, row_group_size=ROW_GROUP)
    finally:
        if writer is not None:
            writer.close()


def generate(folder: Path, rows: int) -> None:
    """The speed data and the agreement cases, under ``folder`` (with their specs as JSON)."""
    specs = big_specs()
    (folder / "big.json").write_text(json.dumps(specs))
    write(folder / "big_ref.parquet", specs, False, rows, SEED)
    write(folder / "big_cur.parquet", specs, True, rows, SEED)
    pairs = []
    for pair, (n_ref, n_cur) in enumerate(SIZE_PAIRS):
        specs = case_specs(pair)
        pairs.append({"pair": pair, "ref_rows": n_ref, "cur_rows": n_cur, "columns": specs})
        write(folder / f"case{pair:02}_ref.parquet", specs, False, n_ref, SEED + 1000 + pair)
        write(folder / f"case{pair:02}_cur.parquet", specs, True, n_cur, SEED + 2000 + pair)
    (folder / "cases.json").write_text(json.dumps(pairs))


# ---- the Shamal side -----------------------------------------------------------------------


def shamal_profile(path: Path, kinds: dict[str, Any]) -> Any:
    """Sketches of a Parquet file, its row groups streamed once."""
    import pyarrow.parquet as pq

    from shamal.monitoring.core import SketchBuilder

    categorical = [name for name, kind in kinds.items() if kind == "categorical"]
    builder = SketchBuilder(kinds)
    for batch in pq.ParquetFile(path, read_dictionary=categorical).iter_batches(ROW_GROUP):
        builder.update(batch)
    return builder.result()


def shamal_columns(report: Any) -> dict[str, dict[str, Any]]:
    return {
        c.column: {"test": c.test, "statistic": c.statistic, "drifted": c.drifted}
        for c in report.columns
    }


def shamal_worker(task: str, folder: Path, out: Path) -> int:
    # Imported before the clock starts, as Evidently's imports are.
    import pyarrow.parquet  # noqa: F401

    from shamal.monitoring.core import compare

    if task == "big":
        specs = json.loads((folder / "big.json").read_text())
        kinds = {s["name"]: s["kind"] for s in specs}
        started = time.perf_counter()
        reference = shamal_profile(folder / "big_ref.parquet", kinds)
        current = shamal_profile(folder / "big_cur.parquet", kinds)
        compared = time.perf_counter()
        report = compare(reference, current)
        done = time.perf_counter()
        result = {
            "work_s": done - started,
            "compare_s": done - compared,
            "columns": shamal_columns(report),
            "share": report.share,
        }
    else:
        result = {"pairs": []}
        for pair in json.loads((folder / "cases.json").read_text()):
            kinds = {s["name"]: s["kind"] for s in pair["columns"]}
            name = f"case{pair['pair']:02}"
            reference = shamal_profile(folder / f"{name}_ref.parquet", kinds)
            current = shamal_profile(folder / f"{name}_cur.parquet", kinds)
            result["pairs"].append(shamal_columns(compare(reference, current)))
    out.write_text(json.dumps(result))
    return 0


# ---- running and reporting -----------------------------------------------------------------


def ensure_peer_venv(say: Any) -> Path:
    probe = (
        "import evidently, pandas, sys; "
        f"sys.exit(evidently.__version__ != {EVIDENTLY_VERSION!r} "
        "or not pandas.__version__.startswith('2.'))"
    )
    return _peers.ensure_venv(PEER_VENV, PEER_PACKAGES, probe, say)


def measure(tool: str, task: str, python: Path, folder: Path) -> dict[str, Any]:
    """Run one tool's task in a process of its own: its result, wall time and peak RSS."""
    out = folder / f"{tool}-{task}.json"
    env = dict(os.environ)
    if tool == "shamal":
        env["PYTHONPATH"] = str(REPO / "src")
        command = [str(python), str(Path(__file__).resolve()), "--worker", task]
    else:
        command = [str(python), str(PEER_SCRIPT), "--task", task]
    command += ["--folder", str(folder), "--out", str(out)]
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, cwd=folder)
    _, status, usage = os.wait4(process.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    if code != 0 or not out.exists():
        raise RuntimeError(f"{tool} ({task}) failed with exit status {code}")
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


def _stat(result: dict[str, Any]) -> str:
    return f"{result['test']} {result['statistic']:.6g}"


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(a["drifted"] == b["drifted"])


#: Evidently's default thresholds, to count the cases that land near them.
THRESHOLDS = {"ks": 0.05, "chisquare": 0.05, "z": 0.05, "wasserstein": 0.1, "jensenshannon": 0.1}


def near_threshold(result: dict[str, Any]) -> bool:
    """A p-value within a factor 2 of alpha, or a distance within 20% of its threshold."""
    ratio = result["statistic"] / THRESHOLDS.get(result["test"], 0.1)
    return (
        0.5 <= ratio <= 2.0 if result["test"] in ("ks", "chisquare", "z") else 0.8 <= ratio <= 1.25
    )


def agreement(
    cases: list[dict[str, Any]], shamal: dict[str, Any], evidently: dict[str, Any]
) -> tuple[int, int, list[str], dict[str, int]]:
    """(same verdicts, cases, lines for the disagreements, verdicts matching the labels)."""
    same, total, lines = 0, 0, []
    right = {"shamal": 0, "evidently": 0, "near": 0}
    for pair, ours, theirs in zip(cases, shamal["pairs"], evidently["pairs"], strict=True):
        for spec in pair["columns"]:
            a, b = ours[spec["name"]], theirs[spec["name"]]
            total += 1
            label = spec["level"] > 0
            right["shamal"] += a["drifted"] == label
            right["evidently"] += b["drifted"] == label
            right["near"] += near_threshold(b)
            if _same(a, b):
                same += 1
                continue
            lines.append(
                f"  pair {pair['pair']:2} ({pair['ref_rows']:,} vs {pair['cur_rows']:,} rows) "
                f"{spec['name']} {spec['family']} shift {spec['shift']}: "
                f"shamal {a['test']} {a['statistic']:.6g} drift={a['drifted']}, "
                f"evidently {b['test']} {b['statistic']:.6g} drift={b['drifted']}"
            )
    return same, total, lines, right


def report(
    rows: int, results: dict[str, dict[str, Any]], cases: list[dict[str, Any]]
) -> tuple[list[str], float, float, float]:
    shamal, evid = results["shamal-big"], results["evidently-big"]
    lines = [
        f"{rows:,} current rows vs {rows:,} reference rows x {NUMERIC + CATEGORICAL} columns "
        f"({NUMERIC} numeric, {CATEGORICAL} categorical), default tests",
        "",
        f"{'':40}{'Shamal':>12}{'Evidently':>12}",
    ]

    def row(label: str, a: str, b: str) -> None:
        lines.append(f"{label:40}{a:>12}{b:>12}")

    row("read + profile + test, s", f"{shamal['work_s']:.2f}", f"{evid['work_s']:.2f}")
    row("  of which compare (sketches ready), s", f"{shamal['compare_s']:.3f}", "-")
    row("whole process (with imports), s", f"{shamal['process_s']:.2f}", f"{evid['process_s']:.2f}")
    row("peak memory (max RSS), MiB", f"{shamal['peak_mb']:,.0f}", f"{evid['peak_mb']:,.0f}")
    drifted_a = sum(c["drifted"] for c in shamal["columns"].values())
    drifted_b = sum(c["drifted"] for c in evid["columns"].values())
    row("columns drifted", f"{drifted_a}", f"{drifted_b}")
    big_same = sum(_same(shamal["columns"][n], evid["columns"][n]) for n in shamal["columns"])
    row("same verdicts, big data", f"{big_same}/{len(shamal['columns'])}", "")
    worst = max(
        (abs(shamal["columns"][n]["statistic"] - evid["columns"][n]["statistic"]), n)
        for n in shamal["columns"]
    )
    lines.append(
        f"largest statistic difference, big data: {worst[0]:.2e} ({worst[1]}: shamal "
        f"{_stat(shamal['columns'][worst[1]])}, evidently {_stat(evid['columns'][worst[1]])})"
    )
    tests = sorted({c["test"] for c in shamal["columns"].values()})
    mismatched = [
        n for n in shamal["columns"] if shamal["columns"][n]["test"] != evid["columns"][n]["test"]
    ]
    lines.append(f"tests chosen: {', '.join(tests)}; different choices: {mismatched or 'none'}")
    same, total, disagreements, right = agreement(
        cases, results["shamal-cases"], results["evidently-cases"]
    )
    lines += [
        "",
        f"agreement cases: {total} columns in {len(SIZE_PAIRS)} pairs of sizes; same verdict "
        f"{same}/{total}; verdicts matching the labels: shamal {right['shamal']}/{total}, "
        f"evidently {right['evidently']}/{total}; near a threshold (Evidently's statistic "
        f"within a factor 2 of alpha, or 20% of a distance threshold): {right['near']}",
        *(disagreements or ["  no disagreement"]),
    ]
    speedup = evid["work_s"] / shamal["work_s"]
    memory = shamal["peak_mb"] / evid["peak_mb"]
    share = same / total

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    lines += [
        "",
        f"speedup      {speedup:7.1f}x  target >= {TARGET_SPEEDUP:.0f}x   "
        f"{verdict(speedup >= TARGET_SPEEDUP)}",
        f"memory_ratio {memory:7.3f}   target <= {TARGET_MEMORY}  "
        f"{verdict(memory <= TARGET_MEMORY)}",
        f"agreement    {share:7.4f}   target >= {TARGET_AGREEMENT}  "
        f"{verdict(share >= TARGET_AGREEMENT)}",
    ]
    return lines, speedup, memory, share


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of each data set")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--dir", type=Path, default=None, help="where the files are written")
    parser.add_argument("--worker", choices=("big", "cases"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return shamal_worker(args.worker, args.folder, args.out)
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
    versions = _peers.versions(
        peer,
        "import evidently, pandas, scipy; print(f'evidently {evidently.__version__}, "
        "pandas {pandas.__version__}, scipy {scipy.__version__}')",
    )
    say(f"Shamal: {sys.executable}; peer: {versions}")
    folder = Path(tempfile.mkdtemp(prefix="bench-drift-", dir=args.dir))
    results: dict[str, dict[str, Any]] = {}
    try:
        started = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; sys.path.insert(0, sys.argv[1]); import drift; "
                "drift.generate(__import__('pathlib').Path(sys.argv[2]), int(sys.argv[3]))",
                str(Path(__file__).resolve().parent),
                str(folder),
                str(args.rows),
            ],
            check=True,
        )
        say(f"generated the data in {time.perf_counter() - started:.1f} s")
        for task in ("big", "cases"):
            for tool in ("shamal", "evidently"):
                python = Path(sys.executable) if tool == "shamal" else peer
                say(f"running {tool} ({task}) ...")
                try:
                    results[f"{tool}-{task}"] = measure(tool, task, python, folder)
                except RuntimeError as exc:
                    say(str(exc))
                    return 2
                done = results[f"{tool}-{task}"]
                say(f"  {tool}: {done['process_s']:.2f} s, peak {done['peak_mb']:,.0f} MiB")
        cases = json.loads((folder / "cases.json").read_text())
        lines, speedup, memory, share = report(args.rows, results, cases)
        for line in lines:
            say(line)
        say(f"load average at end {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    finally:
        if args.keep:
            say(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    say(f"speedup {speedup:.1f} memory_ratio {memory:.3f} agreement {share:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
