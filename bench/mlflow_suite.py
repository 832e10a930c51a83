"""MLflow's own REST test suite, run against Shamal and against a stock ``mlflow server``.

MLflow's ``tests/tracking/test_rest_tracking.py`` and ``tests/tracking/test_model_registry.py``
are the judge of issue 26: they drive a tracking server through the stock client (and a few raw
requests) the way MLflow's own CI does. This script:

1. makes its own venv (``bench/.mlflow-suite-venv``) with the full ``mlflow`` client at
   ``--client-version`` and what the tests import (pytest, pytest-timeout, pytest-asyncio);
2. takes MLflow's ``tests`` folder and ``pyproject.toml`` at ``--commit`` out of a local copy of
   MLflow's git repository (``--mirror``) into a temporary folder, or uses ``--mlflow-src`` (a
   folder already holding them). MLflow's source never enters this repository;
3. runs pytest on the two files with ``bench/mlflow_suite_adapter.py`` as a plugin, which swaps
   the files' server fixtures for a fresh server process per test and adds its token, once
   against ``shamal server`` (this checkout's ``src``, a fresh home and SQLite database each test)
   and once against ``mlflow server`` from the same venv (a fresh SQLite database each test);
4. prints a table per category (passed / failed / not applicable / deliberate difference) side
   by side, the tests whose outcome differs, and a last line
   ``shamal_passed X stock_passed Y total Z``.

Run from the repository root::

    .venv/bin/python bench/mlflow_suite.py [--only shamal|stock] [-k EXPR] [--json OUT]

Exit status: 0 once the suite ran (whatever the outcome), 2 when the venv or the source could
not be set up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET  # nosec B405 - pytest's own junit report, written here
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / "bench" / ".mlflow-suite-venv"
# The last upstream commit (MLflow PR #18961, 2025-11-27) of the public OpenDataHub copy of
# MLflow's repository, before that fork's own commits; mlflow 3.7.0 was released from master a
# few days later, so its client is the closest installable match (see bench/RESULTS.md).
COMMIT = "28f34833b"
CLIENT_VERSION = "3.7.0"
MIRROR = Path(os.environ.get("MLFLOW_MIRROR", "/work/.mirror/opendatahub-io+mlflow/repo"))
# mlflow 3.7.0 imports a pool class that SQLAlchemy 2.1 no longer has.
PINS = ("sqlalchemy<2.1",)
FILES = ("tests/tracking/test_rest_tracking.py", "tests/tracking/test_model_registry.py")
# The adapter's one store was named after the server ([shamal], [stock]) before: one name.
_SERVER_ID = re.compile(r"\b(shamal|stock)\b")
CATEGORIES = (
    "tracking",
    "registry",
    "artifacts",
    "logged models",
    "traces",
    "GraphQL",
    "ajax-api/UI",
    "other",
)

# Tests that cannot apply to a third-party server, with the reason (they fail on a stock
# `mlflow server` started as a separate process as well, or test the server's own Python code).
NOT_APPLICABLE = {
    "test_get_metric_history_bulk_calls_optimized_impl_when_expected": (
        "calls the stock server's handler in the test process: no server is involved"
    ),
    "test_create_model_version_with_path_source": (
        "needs the file:// artifact root the in-process server hands out"
    ),
    "test_create_model_version_with_file_uri": (
        "needs the file:// artifact root the in-process server hands out"
    ),
    "test_logging_model_with_local_artifact_uri": (
        "marked xfail by MLflow itself; needs a file:// artifact root"
    ),
    "test_log_model": "marked xfail by MLflow itself",
    "test_artifacts": "needs the file:// artifact root the in-process server hands out",
    "test_create_model_version_with_validation_regex": (
        "starts its own stock `mlflow server` with a source regex"
    ),
}
_CLI = (
    "fails against a stock server too: the CLI it runs writes to the local SQLite tracking URI "
    "that MLflow's conftest sets for every test (tracking_uri_mock), not to the server"
)
NOT_APPLICABLE["test_delete_restore_experiment_cli"] = _CLI
NOT_APPLICABLE["test_rename_experiment_cli"] = _CLI
# Deliberate differences from a stock server (README, "Deliberate differences"), with why.
DELIBERATE = {
    "test_create_get_search_experiment": (
        "artifact_location is chosen by the server, never by the request"
    ),
    "test_create_run_all_args": "a run's user_id is the token's account, not the request's",
    "test_create_run_defaults": "a run's user_id is the token's account, not 'unknown'",
    "test_create_model_version_with_non_local_source": (
        "a version's source must be a location of this server (its first source is the run's "
        "artifact_uri cut as if it were a file:// URI)"
    ),
}


def _category(name: str, path: str) -> str:
    """The category of a test by its name (first matching rule)."""
    rules = (
        ("GraphQL", ("graphql",)),
        ("traces", ("trace", "span", "otel", "assessment")),
        ("logged models", ("logged_model", "log_outputs", "log_inputs_model", "log_metric_model")),
        (
            "ajax-api/UI",
            ("history_bulk", "search_dataset_handler", "upload_artifact", "promptlab", "gateway"),
        ),
        ("artifacts", ("artifact", "path_validation")),
        ("registry", ("model_version", "registered_model")),
        ("other", ("evaluation_dataset", "dataset_", "rest_tracking", "scorer")),
    )
    base = name.split("[")[0]
    for category, words in rules:
        if any(word in base for word in words):
            return category
    if "test_model_registry" in path:
        return "registry"
    if base == "test_log_model":
        return "logged models"
    return "tracking"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def ensure_venv(version: str) -> Path:
    """The suite's venv with ``mlflow==version``, pytest, pytest-timeout and pytest-asyncio (the
    suite's async tests, as in MLflow's own dev requirements); returns its python."""
    python = VENV / "bin" / "python"
    if not python.exists():
        _say(f"creating {VENV}")
        subprocess.run(["python3", "-m", "venv", str(VENV)], check=True)
    check = (
        "import mlflow.server, mlflow.store.db.utils, pytest, pytest_asyncio, pytest_timeout, sys; "
        f"sys.exit(mlflow.__version__ != {version!r})"
    )
    if subprocess.run([str(python), "-c", check], capture_output=True, check=False).returncode:
        _say(f"installing mlflow=={version} and pytest's plugins into {VENV} (minutes)")
        argv = [str(python), "-m", "pip", "install", "-q", f"mlflow=={version}"]
        plugins = ["pytest", "pytest-timeout", "pytest-asyncio"]
        subprocess.run([*argv, *PINS, *plugins], check=True)
    return python


def extract_source(mirror: Path, commit: str) -> Path:
    """MLflow's tests and pyproject.toml at ``commit``, in a new temporary folder."""
    target = Path(tempfile.mkdtemp(prefix="mlflow-src-"))
    _say(f"extracting MLflow's tests at {commit} from {mirror} into {target}")
    archive = subprocess.run(
        ["git", "-C", str(mirror), "archive", commit, "tests", "pyproject.toml"],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target


def node_ids(results: Path) -> list[str]:
    """The pytest node ids of the tests that did not pass in a ``--json`` file (any server)."""
    outcomes: dict[str, dict[str, str]] = json.loads(results.read_text())
    failed = {t for o in outcomes.values() for t, r in o.items() if r != "passed"}
    ids = []
    for test in sorted(failed):
        where, name = test.rsplit("::", 1)
        path = where if where.endswith(".py") else where.replace(".", "/") + ".py"
        ids.append(f"{path}::{_SERVER_ID.sub('server', name)}")
    return ids


def run_suite(
    python: Path,
    src: Path,
    server: str,
    selection: tuple[str | None, list[str]],
    out: Path,
    shamal_src: Path,
) -> dict[str, str]:
    """Run the two files against ``server``; returns test id -> outcome."""
    report = out / f"{server}.xml"
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO / 'bench'}{os.pathsep}{src}",
        "MLFLOW_SUITE_SERVER": server,
        "MLFLOW_SUITE_SHAMAL_PYTHON": sys.executable,
        "MLFLOW_SUITE_SHAMAL_SRC": str(shamal_src),
        "MLFLOW_SUITE_MLFLOW": str(python.parent / "mlflow"),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("MLFLOW_TRACKING_TOKEN", None)
    keyword, only = selection
    argv = [str(python), "-m", "pytest", *(only or FILES), "-p", "mlflow_suite_adapter"]
    argv += ["-p", "no:cacheprovider", "-o", "addopts=", "-v", "--tb=line", "-rN"]
    argv += [f"--junitxml={report}", "--timeout=600"]
    if keyword:
        argv += ["-k", keyword]
    started = time.monotonic()
    log = out / f"{server}.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            argv, cwd=src, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        done = 0
        for line in proc.stdout:
            sink.write(line)
            found = re.search(r"::(\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)", line)
            if found:
                done += 1
                took = time.monotonic() - started
                _say(f"[{server} {done} tests, {took:4.0f} s] {found[1]} {found[2]}")
        proc.wait()
    return _outcomes(report)


def _outcomes(report: Path) -> dict[str, str]:
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):  # nosec B314 - our own report
        name = _SERVER_ID.sub("server", case.get("name", ""))
        test = f"{case.get('file') or case.get('classname', '')}::{name}"
        kinds = {child.tag for child in case}
        if "failure" in kinds or "error" in kinds:
            outcome = "failed"
        elif "skipped" in kinds:
            outcome = "skipped"
        else:
            outcome = "passed"
        # A teardown error is reported as a second case of the same name: the worse one wins.
        if outcomes.get(test) != "failed":
            outcomes[test] = outcome
    return outcomes


def _column(outcome: str | None, base: str) -> str:
    """Which column a test's outcome counts in: a not-applicable test is n/a whatever its
    outcome (one that never talks to the server passes on any)."""
    if base in NOT_APPLICABLE or outcome == "skipped":
        return "n/a"
    if outcome == "passed":
        return "passed"
    if base in DELIBERATE:
        return "deliberate"
    return "failed"


def table(results: dict[str, dict[str, str]]) -> list[str]:
    """Lines of the grouped table: for each category and server, the four columns."""
    servers = list(results)
    tests = sorted({t for outcomes in results.values() for t in outcomes})
    counts = {s: {c: Counter[str]() for c in CATEGORIES} for s in servers}
    for test in tests:
        path, name = test.rsplit("::", 1)
        category, base = _category(name, path), name.split("[")[0]
        for server in servers:
            counts[server][category][_column(results[server].get(test), base)] += 1
    head = f"{'category':<14}{'tests':>6}"
    for server in servers:
        head += f" | {server + ' pass/fail/n-a/delib':>28}"
    lines = [head, "-" * len(head)]
    for category in (*CATEGORIES, "all"):
        row_counts = {
            s: (
                sum((counts[s][c] for c in CATEGORIES), Counter[str]())
                if category == "all"
                else counts[s][category]
            )
            for s in servers
        }
        total = sum(row_counts[servers[0]].values())
        row = f"{category:<14}{total:>6}"
        for server in servers:
            c = row_counts[server]
            cells = f"{c['passed']}/{c['failed']}/{c['n/a']}/{c['deliberate']}"
            row += f" | {cells:>28}"
        lines.append(row)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mlflow-src", type=Path, help="a folder with MLflow's tests/ already")
    parser.add_argument("--mirror", type=Path, default=MIRROR, help="MLflow's git repository")
    parser.add_argument("--commit", default=COMMIT)
    parser.add_argument("--client-version", default=CLIENT_VERSION)
    parser.add_argument("--only", choices=("shamal", "stock"))
    parser.add_argument(
        "--shamal-src", type=Path, default=REPO / "src", help="the src folder Shamal runs from"
    )
    parser.add_argument("-k", dest="keyword", help="pytest -k expression")
    parser.add_argument("--json", type=Path, help="write every outcome to this file")
    parser.add_argument(
        "--rerun", type=Path, help="run only the tests that did not pass in this --json file"
    )
    args = parser.parse_args()
    try:
        python = ensure_venv(args.client_version)
        src = args.mlflow_src or extract_source(args.mirror, args.commit)
    except (subprocess.CalledProcessError, OSError) as exc:
        _say(f"setup failed: {exc}")
        return 2
    out = Path(tempfile.mkdtemp(prefix="mlflow-suite-"))
    servers = [args.only] if args.only else ["shamal", "stock"]
    selection = (args.keyword, node_ids(args.rerun) if args.rerun else [])
    results = {s: run_suite(python, src, s, selection, out, args.shamal_src) for s in servers}
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    print(
        f"MLflow tests at {args.commit}, client mlflow=={args.client_version}, CPU {cpu} "
        f"x{os.cpu_count()}, logs in {out}"
    )
    print("\n".join(table(results)))
    tests = sorted({t for outcomes in results.values() for t in outcomes})
    print("\ntests that do not pass on every server:")
    for test in tests:
        outcomes = {s: results[s].get(test, "-") for s in servers}
        if set(outcomes.values()) != {"passed"}:
            path, name = test.rsplit("::", 1)
            cells = " ".join(f"{s}={o}" for s, o in outcomes.items())
            why = NOT_APPLICABLE.get(name.split("[")[0]) or DELIBERATE.get(name.split("[")[0]) or ""
            print(f"  [{_category(name, path)}] {name}: {cells}" + (f"  ({why})" if why else ""))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, sort_keys=True))
    passed = {s: sum(o == "passed" for o in results[s].values()) for s in servers}
    print(
        f"shamal_passed {passed.get('shamal', '-')} stock_passed {passed.get('stock', '-')} "
        f"total {len(tests)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
