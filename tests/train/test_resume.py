"""Exact resume through real processes: SIGTERM (checkpoint + exit 75) and SIGKILL.

The example trains with dropout (so the torch RNG matters), AdamW, a warmup/cosine LR,
accumulation and clipping, drawing batches from a seeded sampler whose position is
checkpointed. An interrupted-and-resumed run must end with weights bitwise equal to an
uninterrupted one (same sha256 of every tensor's bytes).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests import needs
from tests.train._run import final_sha, run, start

needs.module("torch")

ARGS = ["--steps", "60", "--checkpoint-every", "20"]


def _wait_for_manifest(folder: Path, step: int, deadline_s: float = 90.0) -> None:
    manifest = folder / f"ckpt-{step:012d}" / "manifest.json"
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if manifest.exists():
            return
        time.sleep(0.02)  # polling with a deadline
    raise AssertionError(f"no checkpoint {step} in {folder}")


@pytest.mark.parametrize(("sig", "precision"), [(signal.SIGTERM, "fp32"), (signal.SIGKILL, "bf16")])
def test_interrupted_run_resumes_to_bitwise_equal_weights(
    tmp_path: Path, sig: signal.Signals, precision: str
) -> None:
    args = [*ARGS, "--precision", precision]
    code, reference = run([*args, "--checkpoint-dir", str(tmp_path / "ref")], tmp_path)
    assert code == 0, reference

    ckpt = tmp_path / "ckpt"
    slow = [*args, "--checkpoint-dir", str(ckpt), "--step-delay", "0.05"]
    process = start(slow, tmp_path)
    _wait_for_manifest(ckpt, 20)
    process.send_signal(sig)
    out, _ = process.communicate(timeout=60)
    if sig == signal.SIGTERM:
        assert process.returncode == 75, out
        assert "preempted at step" in out
        stopped = int(out.split("preempted at step ")[1].split(":")[0])
        assert 20 <= stopped < 60  # interrupted mid-run, then checkpointed at that step
    else:
        assert process.returncode == -signal.SIGKILL
        assert "weights sha256" not in out
        stopped = 20  # at least; the newest complete checkpoint may be 40

    code, resumed = run([*args, "--checkpoint-dir", str(ckpt)], tmp_path)
    assert code == 0, resumed
    resumed_at = int(resumed.split("resumed from step ")[1].split(" ")[0])
    assert stopped <= resumed_at < 60
    assert final_sha(resumed) == final_sha(reference)


def test_a_different_seed_gives_different_weights(tmp_path: Path) -> None:
    """The comparison above can fail: the digest does depend on the training."""
    short = ["--steps", "4", "--checkpoint-every", "4"]
    _, one = run([*short, "--checkpoint-dir", str(tmp_path / "a")], tmp_path)
    _, two = run([*short, "--seed", "1", "--checkpoint-dir", str(tmp_path / "b")], tmp_path)
    assert final_sha(one) != final_sha(two)
