"""Run examples/pytorch/pipeline.py as real processes (shared by the pipeline tests)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from tests.live import free_port
from tests.train._run import gang_env, job_env, start

PIPELINE = Path(__file__).resolve().parents[2] / "examples" / "pytorch" / "pipeline.py"


def run_one(args: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The example in one process (``--unsplit`` for the reference)."""
    return subprocess.run(
        [sys.executable, str(PIPELINE), *args],
        cwd=cwd,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def run_ranks(
    args: Sequence[str], cwd: Path, *, world: int = 2, env: Mapping[str, str] | None = None
) -> list[subprocess.CompletedProcess[str]]:
    """``world`` ranks of the example with the torchrun-style env the executors set.

    A hung rank is killed, never leaked."""
    port = free_port()
    processes = []
    for rank in range(world):
        gang = {**gang_env(rank, world, port), **(env or {})}
        processes.append(start(args, cwd, gang, script=PIPELINE))
    try:
        outputs = [p.communicate(timeout=180)[0] for p in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    return [
        subprocess.CompletedProcess(p.args, p.returncode, out)
        for p, out in zip(processes, outputs, strict=True)
    ]


def expect_exits(ranks: Sequence[subprocess.CompletedProcess[str]], code: int = 0) -> list[str]:
    """Each rank's output, once every rank exited with ``code``; otherwise the test fails
    with every rank's exit status and the end of its output (an assertion's message would
    be cut to a line, and the rank that failed first is rarely rank 0)."""
    outputs = [r.stdout for r in ranks]
    if any(r.returncode != code for r in ranks):
        tails = "\n".join(
            f"--- rank {i} exited {r.returncode}, its last lines:\n"
            + "\n".join(r.stdout.splitlines()[-25:])
            for i, r in enumerate(ranks)
        )
        pytest.fail(f"every rank should exit {code}\n{tails}", pytrace=False)
    return outputs


def losses(output: str) -> list[float]:
    """The ``step N loss X`` values, in order."""
    return [
        float(line.split(" loss ")[1])
        for line in output.splitlines()
        if line.startswith("step ") and " loss " in line
    ]
