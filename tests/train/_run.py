"""Run examples/pytorch/train.py as a real subprocess (shared by the train tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pytorch" / "train.py"


def job_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean environment for the example: no tracking, no platform, no gang."""
    drop = ("MLFLOW_", "SHAMAL_", "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONUNBUFFERED"] = "1"
    return {**env, **(extra or {})}


def gang_env(rank: int, world: int, port: int) -> dict[str, str]:
    """The torchrun-style variables the executors set for one rank of a gang."""
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(world),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world),
    }


def start(
    args: Sequence[str],
    cwd: Path,
    env: Mapping[str, str] | None = None,
    *,
    script: Path = EXAMPLE,
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=cwd,
        env=job_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run(args: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None) -> tuple[int, str]:
    process = start(args, cwd, env)
    out, _ = process.communicate(timeout=120)
    return process.returncode, out


def run_two_ranks(
    args: Callable[[int], Sequence[str]], cwd: Path, port: int
) -> list[subprocess.CompletedProcess[str]]:
    """Two ranks of the example with the torchrun-style env the local executor sets;
    ``args(rank)`` is each rank's command line. A hung rank is killed, never leaked."""
    processes = []
    for rank in range(2):
        processes.append(start(args(rank), cwd, gang_env(rank, 2, port)))
    try:
        outputs = [p.communicate(timeout=120)[0] for p in processes]
    finally:
        for process in processes:  # a hung rank must not outlive the test (nor its pipes)
            if process.poll() is None:
                process.kill()
                process.communicate()
    return [
        subprocess.CompletedProcess(p.args, p.returncode, out)
        for p, out in zip(processes, outputs, strict=True)
    ]


def final_sha(output: str) -> str:
    """The hex digest on the required last line ``weights sha256 <hex>``.

    Lines the platform adds to a job's log (``[shamal] ...``) are not the job's.
    """
    lines = [line for line in output.strip().splitlines() if not line.startswith("[shamal]")]
    last = lines[-1]
    prefix = "weights sha256 "
    assert last.startswith(prefix), output[-2000:]
    return last[len(prefix) :]
