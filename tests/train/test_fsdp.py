"""FSDP2 training with sharded checkpoints across real gloo processes on CPU.

"Continues correctly" on another number of workers means, precisely: the run saved by 2
workers at step 4 is resumed by 1, 2 and 3 workers (each takes its ``1/W`` of the same
12-row global batch); right after loading, the full parameters and AdamW moments equal,
bitwise, those at the save; the next steps' losses equal those of the run that never
stopped: bitwise with the same 2 workers, within 1e-6 with 1 or 3 (gradients are then
averaged from a different number of partial means, a different float summation order).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests import needs
from tests.live import free_port
from tests.train._run import gang_env, start

needs.module("torch")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

WORKER = Path(__file__).with_name("_fsdp_worker.py")
STEPS = ["--steps", "8"]
FILES = {".metadata", "__0_0.distcp", "__1_0.distcp", "state-0.pt", "state-1.pt"}


def start_workers(
    world: int, args: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None
) -> list[subprocess.Popen[str]]:
    """``world`` workers with the torchrun-style environment the scheduler sets."""
    port = free_port()
    processes = []
    for rank in range(world):
        gang = {**gang_env(rank, world, port), **(env or {})}
        processes.append(start(args, cwd, gang, script=WORKER))
    return processes


def finish(processes: list[subprocess.Popen[str]], timeout: float = 240) -> list[str]:
    """Every worker's output once all exited 0; a hung worker is killed, never leaked."""
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert [p.returncode for p in processes] == [0] * len(processes), outputs
    return outputs


def report(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "report.json").read_text())
    return data


def same_state(one: Path, two: Path) -> bool:
    """Whether two dumps hold bitwise the same parameters and AdamW moments."""
    a, b = load_file(str(one)), load_file(str(two))
    assert a.keys() == b.keys()
    assert any(k.startswith("optim.") and k.endswith("exp_avg_sq") for k in a)
    return all(torch.equal(a[name], b[name]) for name in a)


def test_a_run_saved_by_two_workers_continues_on_one_two_and_three(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ref = tmp_path / "ref"
    finish(
        start_workers(
            2, [*STEPS, "--save-at", "4", "--out", str(ref), "--store", str(store)], tmp_path
        )
    )
    reference = report(ref)
    assert reference["start"] == 0
    assert sorted(reference["losses"]) == [str(s) for s in range(8)]

    manifest = json.loads((store / "ckpt-000000000004" / "manifest.json").read_text())
    assert (manifest["kind"], manifest["step"], manifest["world_size"]) == ("sharded", 4, 2)
    assert set(manifest["files"]) == FILES
    assert manifest["metrics"] == {"loss": reference["losses"]["3"]}
    # each file was put once, by the worker that owns it; the manifest last, by rank 0
    puts = [(ref / f"puts-{r}.txt").read_text().split() for r in range(2)]
    folder = "ckpt-000000000004/"
    assert sorted(puts[0]) == sorted(
        folder + f for f in (".metadata", "__0_0.distcp", "state-0.pt", "manifest.json")
    )
    assert puts[0][-1] == folder + "manifest.json"
    assert sorted(puts[1]) == [folder + "__1_0.distcp", folder + "state-1.pt"]

    groups = {
        world: start_workers(
            world,
            [*STEPS, "--resume", "--out", str(tmp_path / f"w{world}"), "--store", str(store)],
            tmp_path,
        )
        for world in (1, 2, 3)
    }
    for processes in groups.values():
        finish(processes)
    for world in (1, 2, 3):
        out = tmp_path / f"w{world}"
        resumed = report(out)
        assert (resumed["world"], resumed["start"], resumed["saved_world"]) == (world, 4, 2)
        assert resumed["data_state"] == {"rank": 0, "next_step": 4}
        assert not same_state(ref / "saved.st", out / "before.st")
        assert same_state(ref / "saved.st", out / "loaded.st")
        assert sorted(resumed["losses"]) == [str(s) for s in range(4, 8)]
        for step, loss in resumed["losses"].items():
            expected = reference["losses"][step]
            if world == 2:
                assert loss == expected, (step, loss, expected)
            else:
                assert loss == pytest.approx(expected, rel=0, abs=1e-6), (world, step)
    assert not (tmp_path / "w1" / "puts-0.txt").exists()  # resuming writes nothing


@pytest.mark.slow
def test_a_tampered_shard_is_refused_by_every_worker_and_changes_nothing(tmp_path: Path) -> None:
    store = tmp_path / "store"
    args = ["--steps", "4", "--save-at", "4", "--store", str(store)]
    finish(start_workers(2, [*args, "--out", str(tmp_path / "ref")], tmp_path))
    shard = store / "ckpt-000000000004" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))

    out = tmp_path / "resumed"
    outputs = finish(start_workers(2, [*args, "--resume", "--out", str(out)], tmp_path))
    # worker 1 verifies its own shard and says why; worker 0 learns that a peer refused
    assert report(out)["error"] == (
        "another worker refused checkpoint ckpt-000000000004; its log says why"
    )
    assert (
        "refused: checkpoint ckpt-000000000004: __1_0.distcp does not match the sha256 in its "
        "manifest (it changed after the checkpoint was written); refusing to load it"
    ) in outputs[1]
    assert "Traceback" not in "".join(outputs)
    assert "losses" not in report(out)  # no step was trained
    assert same_state(out / "before.st", out / "refused.st")


@pytest.mark.slow
def test_shards_go_through_the_artifact_store_and_reshard_on_resume(tmp_path: Path) -> None:
    """The platform's artifact store (a live server): 2 workers save, 1 resumes."""
    from shamal.client import ShamalClient
    from tests.live import LiveServer

    home = tmp_path / "home"
    home.mkdir()
    with LiveServer(home) as server, ShamalClient(server.url, server.token) as api:
        api.create_team("ml")
        env = {
            "SHAMAL_URL": server.url,
            "SHAMAL_TOKEN": server.token,
            "SHAMAL_TEAM": "ml",
            "CKPT_PREFIX": "runs/fsdp",
        }
        ref = tmp_path / "ref"
        finish(start_workers(2, [*STEPS, "--save-at", "4", "--out", str(ref)], tmp_path, env))
        listed = api.list_artifacts("ml", prefix="runs/fsdp/")
        assert sorted(str(item["path"]) for item in listed) == sorted(
            f"runs/fsdp/ckpt-000000000004/{f}" for f in (*FILES, "manifest.json")
        )
        out = tmp_path / "w1"
        finish(start_workers(1, [*STEPS, "--resume", "--out", str(out)], tmp_path, env))
    reference, resumed = report(ref), report(out)
    assert (resumed["start"], resumed["saved_world"]) == (4, 2)
    assert same_state(ref / "saved.st", out / "loaded.st")
    for step, loss in resumed["losses"].items():
        assert loss == pytest.approx(reference["losses"][step], rel=0, abs=1e-6), step
