"""Two CPU processes (gloo) with the scheduler's torchrun-style env vs one process.

Both runs see the same global batch each step: rank r takes every other index of the
single run's batch (ResumableSampler), DDP averages the two ranks' mean-loss gradients,
so the update is mathematically the single process's. Floating-point summation order
differs (two partial means then an average), so equality holds up to float tolerance
(here within 1e-5 absolute after 30 AdamW steps), not bitwise.
"""

from __future__ import annotations

from pathlib import Path

from tests import needs
from tests.live import free_port
from tests.train._run import final_sha, run, run_two_ranks

needs.module("torch")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

ARGS = ["--steps", "30", "--checkpoint-every", "10", "--dropout", "0", "--accumulate", "2"]


def test_two_ranks_match_one_process_with_the_doubled_batch(tmp_path: Path) -> None:
    code, single = run(
        [
            *ARGS,
            "--checkpoint-dir",
            str(tmp_path / "one"),
            "--save-weights",
            str(tmp_path / "one.st"),
        ],
        tmp_path,
    )
    assert code == 0, single

    ckpt = tmp_path / "two"

    def args(rank: int) -> list[str]:
        return [
            *ARGS,
            "--checkpoint-dir",
            str(ckpt),
            "--save-weights",
            str(tmp_path / f"rank{rank}.st"),
        ]

    ranks = run_two_ranks(args, tmp_path, free_port())
    outputs = [r.stdout for r in ranks]
    assert [r.returncode for r in ranks] == [0, 0], outputs

    one = load_file(str(tmp_path / "one.st"))
    two = load_file(str(tmp_path / "rank0.st"))
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-5)
    assert final_sha(outputs[0]) == final_sha(outputs[1])  # ranks agree bitwise
    assert not (tmp_path / "rank1.st").exists()  # only rank 0 writes files
    saved = [o.count("checkpoint ckpt-") for o in outputs]
    assert saved[0] > 0
    assert saved[1] == 0
    assert sorted(p.name for p in ckpt.iterdir()) == ["ckpt-000000000020", "ckpt-000000000030"]
