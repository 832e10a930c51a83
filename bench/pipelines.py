"""Pipelines: a 100-step fan-out of no-op Python steps, Shamal vs Prefect vs Dagster.

The same DAG in each tool, one after the other on the same machine, in one run: a step that
makes a list of N items, N no-op steps mapped over it (fan-out), one step that gathers their
results (N + 2 steps). Every step runs in a process other than the orchestrator's, as Shamal's
local executor runs each step in a process of its own:

- **Shamal**: a server on a fresh ``SHAMAL_HOME`` (SQLite, the local executor), ready and
  quiet before anything is timed; the pipeline file below (:data:`PIPELINE_SOURCE`), run with
  ``shamal pipeline run <file>.py:fanout --param n=N --wait --json``.
- **Prefect** (``bench/.prefect-venv``, ``prefect==PREFECT_VERSION``):
  ``bench/_pipeline_peers/prefect_fanout.py``: tasks ``items.submit(n)``, ``noop.map(...)``,
  ``gather.submit(...)`` in a flow on Prefect's ``ProcessPoolTaskRunner(max_workers=W)``,
  against a local ``prefect server start`` on loopback (SQLite in a fresh ``PREFECT_HOME``),
  started, ready and quiet before the run, like Shamal's. Prefect 3 has no process-per-task
  runner; its pool keeps ``W`` processes and runs task after task in them. For the issue's
  comparison ("each step in its own process as Shamal's are") the pool retires each worker
  after one task (``max_tasks_per_child=1``): every task gets a new process, at most ``W`` at
  once, with everything else Prefect's own.
- **Prefect (pool)**: the same flow on Prefect's pool as it comes (``W`` processes reused for
  every task). Shown beside the comparison as what a Prefect user gets by default, not part
  of the verdict: its steps do not each get a process.
- **Dagster** (``bench/.dagster-venv``, ``dagster==DAGSTER_VERSION``):
  ``bench/_pipeline_peers/dagster_fanout.py``: ``DynamicOut`` + ``.map()`` + ``.collect()``
  on the ``multiprocess_executor`` (a process per step, its default ``spawn``, at most ``W``
  at once), by ``execute_job`` on an instance in a fresh ``DAGSTER_HOME`` (SQLite).

``W`` (``--workers``) defaults to the machine's CPU count, which is both peers' own default
(``max_workers`` and ``max_concurrent``): each may run as many steps at once as it has CPUs,
and neither is asked to run more processes than the machine can run. Shamal's steps ask for
1 CPU each, so its scheduler runs as many at once as the machine has CPUs, as the peers do.

What is measured, per tool:

- **total wall time**: from submitting the run to its end. Prefect: the call of the flow to
  its return; Dagster: ``execute_job`` to its return; Shamal: the ``wall_s`` its CLI reports
  (the run's submission to its end), the CLI's own process time printed beside it. Interpreter
  start and imports are outside every figure; each tool's server is up before.
- **ready -> running overhead** per step: the instant the step's process started running it
  minus the instant its inputs were ready, median and p95 over the N + 2 steps. "Running":
  Prefect's task run ``start_time`` (the Running state, set in the pool process), Dagster's
  ``STEP_START`` event (sent by the step's process), Shamal's ``started_at``. "Ready": Shamal's
  ``ready_at``; for the peers, which record no such instant, the run's submission for the first
  step, the first step's end (``end_time``, ``STEP_SUCCESS``) for each no-op, the last no-op's
  end for the gathering step.
- Each run's answer is checked: the gathering step returns N, and N + 2 steps completed.

``--repeat K`` runs every tool K times, in a rotating order (the machine's speed drifts over
minutes), and reports each one's median run. Run from the repository root with Shamal's venv::

    .venv/bin/python bench/pipelines.py                     # the benchmark, 100 steps
    .venv/bin/python bench/pipelines.py --steps 10 --only prefect,dagster

The peer venvs (git-ignored) are created when missing (a few minutes). Exit status: 0 once the
benchmark ran, pass or fail; 2 when a peer venv could not be set up. The last line:
``speedup X peer NAME steps N``, X being the smaller of the two ratios peer wall / Shamal wall
(2 decimals) and NAME that peer; ``speedup n/a ...`` when a tool failed or did not run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import _peers
from _servers import ServerProcess, free_port

REPO = Path(__file__).resolve().parent.parent
PEER_SCRIPTS = REPO / "bench" / "_pipeline_peers"
PREFECT_VERSION = "3.9.1"
DAGSTER_VERSION = "1.13.29"
TARGET = 3.0
TOOLS = ("shamal", "prefect", "dagster", "prefect-pool")
NAMES = {
    "shamal": "Shamal",
    "prefect": "Prefect",
    "dagster": "Dagster",
    "prefect-pool": "Prefect (pool)",
}
#: The peers the verdict is about: each runs every step in a process of its own.
JUDGED = ("prefect", "dagster")
#: The venv each peer tool runs in.
VENV_OF = {"prefect": "prefect", "prefect-pool": "prefect", "dagster": "dagster"}
#: Nothing leaves the machine: no usage telemetry from any tool.
QUIET = {"DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}

#: The pipeline Shamal runs, written with its SDK (``shamal.pipelines``).
PIPELINE_SOURCE = '''\
"""The benchmark's fan-out: one step lists n items, n no-op steps, one step gathers them."""

from shamal.pipelines import pipeline, step


@step(cpus=1, memory_mib=256)
def items(n: int) -> list[int]:
    return list(range(n))


@step(cpus=1, memory_mib=256)
def noop(i: int) -> int:
    return i


@step(cpus=1, memory_mib=256)
def gather(values: list[int]) -> int:
    return len(values)


@pipeline
def fanout(n: int = 100) -> None:
    gather(noop.map(items(n)))
'''

Say = Callable[[str], None]


@dataclass(frozen=True)
class Peer:
    """A peer tool: its venv, what is installed there, and its script."""

    key: str
    venv: Path
    packages: tuple[str, ...]
    probe: str
    versions: str
    script: Path


PEERS = {
    "prefect": Peer(
        "prefect",
        REPO / "bench" / ".prefect-venv",
        (f"prefect=={PREFECT_VERSION}",),
        "import prefect; from prefect.task_runners import ProcessPoolTaskRunner; "
        f"assert prefect.__version__ == {PREFECT_VERSION!r}",
        "import prefect; print(f'prefect {prefect.__version__}')",
        PEER_SCRIPTS / "prefect_fanout.py",
    ),
    "dagster": Peer(
        "dagster",
        REPO / "bench" / ".dagster-venv",
        (f"dagster=={DAGSTER_VERSION}",),
        f"import dagster; assert dagster.__version__ == {DAGSTER_VERSION!r}",
        "import dagster; print(f'dagster {dagster.__version__}')",
        PEER_SCRIPTS / "dagster_fanout.py",
    ),
}


# ------------------------------------------------------------------------------ running


def _last_json(text: str) -> dict[str, Any] | None:
    """The JSON object on the last line of ``text`` that holds one."""
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                found: dict[str, Any] = json.loads(line)
            except json.JSONDecodeError:
                continue
            return found
    return None


def _last_words(log: Path) -> str:
    """The last line of ``log`` with words in it, without a rich error box's frame."""
    for line in reversed(log.read_text(errors="replace").splitlines()):
        words = line.strip(" \t\u2502\u256d\u256e\u256f\u2570\u2500")
        if any(c.isalnum() for c in words):
            return words[:300]
    return "(no output)"


def _run_json(
    argv: Sequence[str], env: dict[str, str], work: Path, log: Path, timeout_s: float
) -> dict[str, Any]:
    """Run ``argv``; its last JSON line, with ``process_s``; ``failed`` when it does not end
    well (its stderr goes to ``log``)."""
    started = time.perf_counter()
    with log.open("ab") as err:
        try:
            done = subprocess.run(
                list(argv),
                env={**os.environ, **QUIET, **env},
                cwd=work,
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.DEVNULL,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return {"failed": f"no end after {timeout_s:.0f} s", "process_s": timeout_s}
    seconds = time.perf_counter() - started
    result = _last_json(done.stdout.decode(errors="replace"))
    if done.returncode != 0 or result is None:
        return {
            "failed": f"exit status {done.returncode}: {_last_words(log)}",
            "process_s": seconds,
        }
    result["process_s"] = seconds
    return result


def run_prefect(
    python: Path, steps: int, workers: int, work: Path, timeout_s: float, mode: str = "per-task"
) -> dict[str, Any]:
    """The fan-out in Prefect against a local ``prefect server start``, started here; ``mode``
    ``per-task`` (a process per task) or ``pool`` (Prefect's pool as it comes)."""
    home = work / "prefect-home"
    home.mkdir(parents=True)
    env = {"PREFECT_HOME": str(home), "PREFECT_UI_ENABLED": "false", **QUIET}
    port = free_port()
    server = ServerProcess(
        name="Prefect",
        argv=[str(python.parent / "prefect"), "server", "start", "--host", "127.0.0.1"]
        + ["--port", str(port)],
        env=env,
        log=work / "prefect-server.log",
        port=port,
        ready_path="/api/health",
    )
    try:
        server.start()
        server.settle()
        env["PREFECT_API_URL"] = server.url + "/api"
        argv = [str(python), str(PEERS["prefect"].script), str(steps), str(workers), mode]
        return _run_json(argv, env, work, work / "prefect.log", timeout_s)
    except RuntimeError as exc:
        return {"failed": str(exc).splitlines()[0], "process_s": 0.0}
    finally:
        server.stop()


def run_dagster(
    python: Path, steps: int, workers: int, work: Path, timeout_s: float
) -> dict[str, Any]:
    """The fan-out in Dagster: ``execute_job`` on an instance in a fresh ``DAGSTER_HOME``."""
    home = work / "dagster-home"
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {"DAGSTER_HOME": str(home), "BENCH_PIPELINE_WORKERS": str(workers)}
    argv = [str(python), str(PEERS["dagster"].script), str(steps)]
    return _run_json(argv, env, work, work / "dagster.log", timeout_s)


def run_shamal(steps: int, work: Path, timeout_s: float = 900.0) -> dict[str, Any]:
    """The fan-out in Shamal: a server (local executor) on a fresh home, the pipeline file
    :data:`PIPELINE_SOURCE`, and ``shamal pipeline run <file>.py:fanout --param n=<steps>
    --wait --json``.

    Returns:
        What the CLI's ``--json`` prints (``run_id``, ``state``, ``wall_s``, ``steps``: each
        with ``name``, ``state``, ``ready_at``, ``started_at``, ``finished_at``), with
        ``process_s`` (the CLI's process, start to end); or ``failed`` and ``process_s``.
    """
    home = work / "shamal-home"
    home.mkdir(parents=True)
    port = free_port()
    env = {
        "SHAMAL_HOME": str(home),
        "SHAMAL_DATABASE_URL": f"sqlite:///{home / 'shamal.db'}",
        "SHAMAL_SCHEDULER__EXECUTOR": "local",
        "SHAMAL_ACCESS_LOG": "false",
        "PYTHONPATH": str(REPO / "src"),
    }
    server = ServerProcess(
        name="Shamal",
        argv=[sys.executable, "-m", "shamal", "server", "--host", "127.0.0.1"]
        + ["--port", str(port), "--workers", "1"],
        env=env,
        log=work / "shamal-server.log",
        port=port,
        ready_path="/ready",
        token_file=home / "token",
    )
    pipeline_file = work / "fanout_pipeline.py"
    pipeline_file.write_text(PIPELINE_SOURCE)
    try:
        server.start()
        server.settle()
        client_env = {**env, "SHAMAL_URL": server.url, "SHAMAL_TOKEN": server.token or ""}
        # stdout: {"run_id", "state", "wall_s", "steps": [{"name", "state", "ready_at",
        # "started_at", "finished_at"}, ...]}.
        argv = [sys.executable, "-m", "shamal", "pipeline", "run", f"{pipeline_file}:fanout"]
        argv += ["--param", f"n={steps}", "--wait", "--json"]
        result = _run_json(argv, client_env, work, work / "shamal-cli.log", timeout_s)
        result.setdefault("version", _commit())
        return result
    except RuntimeError as exc:
        return {"failed": str(exc).splitlines()[0], "process_s": 0.0}
    finally:
        server.stop()


def _commit() -> str:
    """The checkout's commit, short: what the table calls Shamal's version."""
    done = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or "-"


# ------------------------------------------------------------------------------ figures


def _instant(value: Any) -> float | None:
    """An epoch-seconds float from a float or an ISO 8601 string (None stays None)."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _kind(step: dict[str, Any]) -> str:
    """``items``, ``noop``, ``gather`` or ``flow``, whatever the tool's suffix (``noop[3]``,
    ``noop-1a2``, ``noop.3``)."""
    name = str(step.get("name", ""))
    for kind in ("items", "noop", "gather", "flow"):
        if name.startswith(kind):
            return kind
    return name


def overheads(result: dict[str, Any]) -> list[float]:
    """Seconds from each step's inputs being ready to its process running it.

    A step's ``ready_at`` is used where the tool gives one (Shamal); otherwise it is derived
    from the DAG: the run's submission (the ``flow`` entry) for ``items``, ``items``' end for
    each no-op, the last no-op's end for ``gather``.
    """
    steps = [s for s in result.get("steps", []) if _kind(s) != "flow"]
    submitted = next(
        (_instant(s.get("started_at")) for s in result.get("steps", []) if _kind(s) == "flow"),
        None,
    )
    ends: dict[str, list[float]] = {}
    for step in steps:
        end = _instant(step.get("finished_at"))
        if end is not None:
            ends.setdefault(_kind(step), []).append(end)
    derived = {
        "items": submitted,
        "noop": min(ends["items"]) if ends.get("items") else None,
        "gather": max(ends["noop"]) if ends.get("noop") else None,
    }
    found = []
    for step in steps:
        ready = _instant(step.get("ready_at")) or derived.get(_kind(step))
        started = _instant(step.get("started_at"))
        if ready is not None and started is not None:
            found.append(started - ready)
    return found


def check(result: dict[str, Any], steps: int) -> str | None:
    """What is wrong with a run's answer, or None: N + 2 completed steps, and N gathered."""
    done = [
        s
        for s in result.get("steps", [])
        if _kind(s) != "flow"
        and str(s.get("state", "")).upper() in ("COMPLETED", "SUCCEEDED", "SUCCESS", "STEP_SUCCESS")
    ]
    if len(done) != steps + 2:
        return f"{len(done)} steps completed, not {steps + 2}"
    if "result" in result and result["result"] != steps:
        return f"gathered {result['result']}, not {steps}"
    return None


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median wall time among those that did not fail (else the first failure)."""
    good = sorted((r for r in runs if "failed" not in r), key=lambda r: r["wall_s"])
    return good[(len(good) - 1) // 2] if good else runs[0]


def ratios(best: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Per peer that ran, its wall time over Shamal's (empty when Shamal did not run)."""
    shamal = best.get("shamal")
    if not shamal or "failed" in shamal or shamal["wall_s"] <= 0:
        return {}
    return {
        tool: best[tool]["wall_s"] / shamal["wall_s"]
        for tool in TOOLS[1:]
        if tool in best and "failed" not in best[tool]
    }


def report(best: dict[str, dict[str, Any]], steps: int, repeat: int) -> list[str]:
    """The table, the checks and the last line."""
    lines = [f"fan-out of {steps} no-op steps ({steps + 2} in all), median of {repeat} run(s)"]
    head = f"{'tool':<15}{'version':>10}{'wall, s':>10}{'process, s':>12}"
    head += f"{'ready->running p50, s':>23}{'p95, s':>9}{'peer/Shamal':>13}"
    lines.append(head)
    by_peer = ratios(best)
    for tool, result in best.items():
        name = NAMES[tool]
        if "failed" in result:
            lines.append(f"{name:<15}FAILED after {result['process_s']:.1f} s: {result['failed']}")
            continue
        waits = overheads(result)
        p50 = f"{statistics.median(waits):.3f}" if waits else "n/a"
        p95 = f"{percentile(waits, 0.95):.3f}" if waits else "n/a"
        ratio = f"{by_peer[tool]:.2f}" if tool in by_peer else ("1.00" if by_peer else "n/a")
        lines.append(
            f"{name:<15}{result.get('version', '-'):>10}{result['wall_s']:>10.2f}"
            f"{result['process_s']:>12.2f}{p50:>23}{p95:>9}{ratio:>13}"
        )
        wrong = check(result, steps)
        if wrong:
            lines.append(f"  {name}'s answer is WRONG: {wrong}")
    judged = {tool: ratio for tool, ratio in by_peer.items() if tool in JUDGED}
    if "prefect-pool" in by_peer:
        lines.append(
            "Prefect (pool) reuses its processes for every task: shown for reference, not judged"
        )
    if len(judged) == len(JUDGED) and not any(check(best[t], steps) for t in best):
        peer = min(judged, key=lambda t: judged[t])
        verdict = "met" if judged[peer] >= TARGET else "NOT met"
        lines.append(
            f"target: Shamal's wall time at least {TARGET:.0f}x lower than each: {verdict}"
        )
        lines.append(f"speedup {judged[peer]:.2f} peer {NAMES[peer]} steps {steps}")
    else:
        lines.append(f"speedup n/a peer n/a steps {steps}")
    return lines


# ------------------------------------------------------------------------------ the parent


def _say(text: str) -> None:
    print(text, flush=True)


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="no-op steps in the fan-out")
    parser.add_argument("--repeat", type=int, default=1, help="runs per tool (median reported)")
    parser.add_argument("--only", default=",".join(TOOLS), help="tools, comma-separated")
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="the peers' concurrent step processes (default: the CPU count, their default)",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("--keep", action="store_true", help="keep the work folder and logs")
    args = parser.parse_args(argv)
    args.tools = [t.strip() for t in args.only.split(",") if t.strip()]
    unknown = set(args.tools) - set(TOOLS)
    if unknown or not args.tools:
        parser.error(f"--only takes some of {', '.join(TOOLS)}")
    if args.steps < 1 or args.repeat < 1 or args.workers < 1:
        parser.error("--steps, --repeat and --workers take 1 or more")
    return args


def run_one(
    tool: str, args: argparse.Namespace, pythons: dict[str, Path], work: Path
) -> dict[str, Any]:
    work.mkdir(parents=True)
    if tool == "shamal":
        return run_shamal(args.steps, work, args.timeout)
    if tool in ("prefect", "prefect-pool"):
        mode = "per-task" if tool == "prefect" else "pool"
        return run_prefect(pythons[tool], args.steps, args.workers, work, args.timeout, mode)
    return run_dagster(pythons[tool], args.steps, args.workers, work, args.timeout)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    say = _say
    pythons: dict[str, Path] = {}
    for tool in args.tools:
        if tool in VENV_OF:
            peer = PEERS[VENV_OF[tool]]
            try:
                pythons[tool] = _peers.ensure_venv(peer.venv, peer.packages, peer.probe, say)
            except (OSError, subprocess.CalledProcessError) as exc:
                say(f"cannot set up the peer venv {peer.venv}: {exc}")
                return 2
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    say(f"{_cpu()}, {os.cpu_count()} CPUs, load average at start {load}")
    versions = sorted({_peers.versions(pythons[t], PEERS[VENV_OF[t]].versions) for t in pythons})
    say(f"Shamal: {sys.executable}; peers: {', '.join(versions) or 'none'}; W = {args.workers}")
    folder = Path(tempfile.mkdtemp(prefix="bench-pipelines-"))
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in args.tools}
    try:
        for round_ in range(args.repeat):
            order = args.tools[round_ % len(args.tools) :] + args.tools[: round_ % len(args.tools)]
            for tool in order:
                say(f"round {round_ + 1}: {NAMES[tool]} ...")
                result = run_one(tool, args, pythons, folder / f"{tool}-{round_}")
                runs[tool].append(result)
                shown = result.get("failed") or f"{result['wall_s']:.2f} s"
                say(f"  {NAMES[tool]}: {shown} (process {result['process_s']:.1f} s)")
    finally:
        if args.keep:
            say(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    say(f"load average at end {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    best = {tool: median_run(found) for tool, found in runs.items()}
    for line in report(best, args.steps, args.repeat):
        say(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
