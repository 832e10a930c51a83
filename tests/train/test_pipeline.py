"""Pipeline stages on two CPU processes (gloo) against the unsplit model in one.

One pipeline step cuts the batch into microbatches, runs them through the stages with a
1F1B (or interleaved 1F1B) schedule and averages the microbatches' mean losses; PyTorch
scales the gradients by 1/microbatches. With equal microbatches that is the unsplit
model's mean loss and gradient on the whole batch, up to float summation order: the
tests allow 1e-6 absolute on the first step's loss and gradients, 1e-5 on losses after
20 AdamW steps.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests import needs
from tests.train._pipe import expect_exits, losses, run_one, run_ranks
from tests.train._run import final_sha

needs.module("torch")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch import nn  # noqa: E402

from shamal import train  # noqa: E402

STEPS = ["--steps", "20", "--checkpoint-every", "10"]


@pytest.fixture(scope="module")
def unsplit(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("unsplit")
    done = run_one([*STEPS, "--unsplit", "--dump", "dump", "--checkpoint-dir", "ckpt"], folder)
    assert done.returncode == 0, done.stdout + done.stderr
    return folder, done.stdout


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """An uninterrupted two-stage 1F1B run: its folder and both ranks' output."""
    folder = tmp_path_factory.mktemp("pipe")
    outputs = expect_exits(
        run_ranks([*STEPS, "--dump", "dump", "--checkpoint-dir", "ckpt"], folder)
    )
    return folder, outputs


def _compare_with_unsplit(folder: Path, outputs: list[str], unsplit: tuple[Path, str]) -> None:
    one = load_file(str(unsplit[0] / "dump" / "rank0.safetensors"))
    stages = [load_file(str(folder / "dump" / f"rank{r}.safetensors")) for r in (0, 1)]
    loss = one.pop("__loss__")
    for stage in stages:  # every stage reports the same (broadcast) loss
        torch.testing.assert_close(stage.pop("__loss__"), loss, rtol=0, atol=1e-6)
    assert not stages[0].keys() & stages[1].keys()  # each parameter lives on one stage
    gathered = {**stages[0], **stages[1]}
    assert sorted(gathered) == sorted(one)  # every parameter of the model has a gradient
    for name, grad in one.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(gathered[name], grad, rtol=0, atol=1e-6)
    expected = losses(unsplit[1])
    assert len(expected) == 20
    for output in outputs:
        assert losses(output) == pytest.approx(expected, abs=1e-5)


def test_two_stage_1f1b_matches_the_unsplit_loss_and_gradients(
    reference: tuple[Path, list[str]], unsplit: tuple[Path, str]
) -> None:
    folder, outputs = reference
    assert "stage(s) [0] of 2" in outputs[0]
    assert "stage(s) [1] of 2" in outputs[1]
    _compare_with_unsplit(folder, outputs, unsplit)
    assert final_sha(outputs[0]) != final_sha(outputs[1])  # different stages
    for stage in ("stage-00", "stage-01"):  # every rank saved its own stages
        names = sorted(p.name for p in (folder / "ckpt" / stage).iterdir())
        assert names == ["ckpt-000000000010", "ckpt-000000000020"]


def test_interleaved_schedule_matches_the_unsplit_loss_and_gradients(
    tmp_path: Path, unsplit: tuple[Path, str]
) -> None:
    args = [*STEPS, "--schedule", "interleaved", "--stages-per-rank", "2"]
    outputs = expect_exits(
        run_ranks([*args, "--dump", "dump", "--checkpoint-dir", "ckpt"], tmp_path)
    )
    assert "stage(s) [0, 2] of 4" in outputs[0]
    assert "stage(s) [1, 3] of 4" in outputs[1]
    _compare_with_unsplit(tmp_path, outputs, unsplit)


def test_preempted_pipeline_resumes_to_the_same_weights(
    tmp_path: Path, reference: tuple[Path, list[str]]
) -> None:
    expected = [final_sha(o) for o in reference[1]]
    args = [*STEPS, "--checkpoint-dir", "ckpt"]
    first = run_ranks([*args, "--preempt-at", "13"], tmp_path)
    expect_exits(first, 75)
    for ran in first:
        assert "preempted at step 13: checkpointed, exiting 75" in ran.stdout
        assert "weights sha256" not in ran.stdout
    for stage in ("stage-00", "stage-01"):
        names = sorted(p.name for p in (tmp_path / "ckpt" / stage).iterdir())
        assert names == ["ckpt-000000000010", "ckpt-000000000013"]
    second = expect_exits(run_ranks(args, tmp_path, env={"SHAMAL_ATTEMPT": "2"}))
    for output in second:
        assert "resumed from step 13 (attempt 2)" in output
        assert losses(output)[0] == losses(reference[1][0])[13]
    assert [final_sha(o) for o in second] == expected


def test_resume_takes_the_newest_step_every_stage_has(
    tmp_path: Path, reference: tuple[Path, list[str]]
) -> None:
    """Stage 1 was killed while writing step 20 (no manifest): both stages go back to 10."""
    shutil.copytree(reference[0] / "ckpt", tmp_path / "ckpt")
    (tmp_path / "ckpt" / "stage-01" / "ckpt-000000000020" / "manifest.json").unlink()
    outputs = expect_exits(run_ranks([*STEPS, "--checkpoint-dir", "ckpt"], tmp_path))
    for output in outputs:
        assert "resumed from step 10" in output
        assert len(losses(output)) == 10
    assert [final_sha(o) for o in outputs] == [final_sha(o) for o in reference[1]]


def test_a_corrupt_stage_checkpoint_sends_every_stage_back_to_one_they_share(
    tmp_path: Path, reference: tuple[Path, list[str]]
) -> None:
    """Stage 1's step 20 does not match its manifest: stage 0 loads 20, stage 1 falls back
    to 10, and they agree on 10 (both load it again) before training on."""
    shutil.copytree(reference[0] / "ckpt", tmp_path / "ckpt")
    (tmp_path / "ckpt" / "stage-01" / "ckpt-000000000020" / "model.safetensors").write_bytes(b"x")
    outputs = expect_exits(run_ranks([*STEPS, "--checkpoint-dir", "ckpt"], tmp_path))
    for output in outputs:
        assert "resumed from step 10" in output
    assert [final_sha(o) for o in outputs] == [final_sha(o) for o in reference[1]]


def test_stages_with_no_intact_step_in_common_stop_instead_of_mixing_states(
    tmp_path: Path, reference: tuple[Path, list[str]]
) -> None:
    shutil.copytree(reference[0] / "ckpt", tmp_path / "ckpt")
    for step in ("10", "20"):
        folder = tmp_path / "ckpt" / "stage-01" / f"ckpt-0000000000{step}"
        (folder / "model.safetensors").write_bytes(b"x")
    ranks = run_ranks([*STEPS, "--checkpoint-dir", "ckpt"], tmp_path)
    for ran in ranks:
        assert ran.returncode == 1, ran.stdout
        assert "stages have no intact checkpoint step in common" in ran.stdout
        assert "step 1 loss" not in ran.stdout


def test_a_batch_that_does_not_split_into_microbatches_is_refused(tmp_path: Path) -> None:
    ranks = run_ranks(["--steps", "2", "--batch-size", "30", "--microbatches", "4"], tmp_path)
    for ran in ranks:
        assert ran.returncode == 1
        assert "does not split into 4 equal microbatches" in ran.stdout
    assert not (tmp_path / "checkpoints").exists() or not any(
        (tmp_path / "checkpoints").rglob("manifest.json")
    )


# ------------------------------------------------------------------ in-process checks


def _mlp(layers: int = 5) -> nn.Sequential:
    torch.manual_seed(0)
    widths = [nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 2)]
    return nn.Sequential(*widths[:layers])


def test_split_sequential_balances_parameters_and_keeps_names() -> None:
    model = _mlp()
    parts = train.split_sequential(model, 2)
    assert [list(dict(p.named_children())) for p in parts] == [["0", "1", "2"], ["3", "4"]]
    keys = [k for p in parts for k in p.state_dict()]
    assert keys == list(model.state_dict())
    assert parts[0][0] is model[0]  # shared, not copied
    x = torch.randn(4, 8)
    torch.testing.assert_close(parts[1](parts[0](x)), model(x), rtol=0, atol=0)
    four = train.split_sequential(model, 4)
    assert [len(p) for p in four] == [2, 1, 1, 1]
    assert [len(p) for p in train.split_sequential(model, 5)] == [1, 1, 1, 1, 1]


@pytest.mark.parametrize("parts", [0, -1, 6])
def test_split_sequential_refuses_impossible_cuts(parts: int) -> None:
    with pytest.raises(ValueError, match="at least one layer per stage"):
        train.split_sequential(_mlp(), parts)


def test_a_pipeline_needs_a_gang() -> None:
    with pytest.raises(ValueError, match="at least 2 ranks"):
        train.pipeline_stages(_mlp(), n_microbatches=2, loss_fn=nn.MSELoss())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"schedule": "gpipe"}, "unknown schedule"),
        ({"n_microbatches": 0}, "n_microbatches must be >= 1"),
        ({"stages_per_rank": 2}, "1f1b schedule runs one stage per rank"),
        ({"schedule": "interleaved"}, "stages_per_rank >= 2"),
    ],
)
def test_pipeline_arguments_are_checked_before_anything_runs(
    options: dict[str, object], message: str
) -> None:
    kwargs: dict[str, object] = {"n_microbatches": 2, "loss_fn": nn.MSELoss(), **options}
    with pytest.raises(ValueError, match=message):
        train.pipeline_stages(_mlp(), **kwargs)  # type: ignore[arg-type]
