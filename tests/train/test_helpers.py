"""Loop helpers: precision, accumulation, clipping, schedules, early stopping, MFU, sampler."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from tests import needs

needs.module("torch")

import torch  # noqa: E402

from shamal.train import (  # noqa: E402
    EarlyStopping,
    ResumableSampler,
    Stepper,
    Throughput,
    WarmupCosine,
    peak_flops,
    transformer_flops_per_token,
)


def _linear(seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(6, 3)


def test_accumulated_micro_steps_equal_one_full_batch() -> None:
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    full, accumulated = _linear(), _linear()
    one = Stepper(full, torch.optim.SGD(full.parameters(), lr=0.1))
    with one.micro_step():
        loss = torch.nn.functional.mse_loss(full(x), y)
    assert one.backward(loss)
    two = Stepper(accumulated, torch.optim.SGD(accumulated.parameters(), lr=0.1), accumulate=4)
    stepped = []
    for part in range(4):
        rows = slice(2 * part, 2 * part + 2)
        with two.micro_step():
            loss = torch.nn.functional.mse_loss(accumulated(x[rows]), y[rows])
        stepped.append(two.backward(loss))
    assert stepped == [False, False, False, True]
    assert two.steps == 1
    torch.testing.assert_close(accumulated.weight, full.weight)
    assert not torch.equal(full.weight, _linear().weight)  # it did train


def test_clipping_bounds_the_update() -> None:
    model = _linear()
    before = [p.detach().clone() for p in model.parameters()]
    stepper = Stepper(model, torch.optim.SGD(model.parameters(), lr=1.0), clip_norm=0.01)
    with stepper.micro_step():
        loss = (model(torch.randn(4, 6)) * 1000).pow(2).mean()
    stepper.backward(loss)
    change = torch.cat(
        [(p.detach() - b).flatten() for p, b in zip(model.parameters(), before, strict=True)]
    )
    assert stepper.last_grad_norm is not None
    assert stepper.last_grad_norm > 1.0
    assert change.norm().item() == pytest.approx(0.01, rel=1e-3)


def test_bf16_autocast_runs_matmuls_in_bfloat16_on_cpu() -> None:
    model = _linear()
    stepper = Stepper(model, torch.optim.SGD(model.parameters(), lr=0.1), precision="bf16")
    with stepper.autocast():
        assert model(torch.randn(2, 6)).dtype == torch.bfloat16
    assert model(torch.randn(2, 6)).dtype == torch.float32


def test_fp16_without_a_gpu_falls_back_to_fp32_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = _linear()
    with caplog.at_level(logging.WARNING, logger="shamal.train._loop"):
        stepper = Stepper(model, torch.optim.SGD(model.parameters(), lr=0.1), precision="fp16")
    assert stepper.precision == "fp32"
    assert not stepper.scaler.is_enabled()
    assert "needs a GPU" in caplog.text


def test_warmup_then_cosine_decay() -> None:
    schedule = WarmupCosine(warmup_steps=4, total_steps=14, min_ratio=0.1)
    values = [schedule(step) for step in range(16)]
    assert values[:4] == [0.25, 0.5, 0.75, 1.0]
    assert values[4] == pytest.approx(1.0)
    assert values[9] == pytest.approx(0.55)  # halfway through the decay
    assert values[14] == pytest.approx(0.1)
    assert values[15] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(values[4:], values[5:], strict=False))


def test_early_stopping_waits_patience_checks_without_improvement() -> None:
    stopper = EarlyStopping(patience=2, mode="min", min_delta=0.05)
    decisions = [stopper.update(v) for v in [1.0, 0.9, 0.88, 0.87, 0.5, 0.6, 0.6]]
    assert decisions == [False, False, False, True, False, False, True]
    assert stopper.best == 0.5
    higher = EarlyStopping(patience=1, mode="max")
    assert [higher.update(v) for v in [1.0, 2.0, 1.5]] == [False, False, True]


def test_throughput_and_mfu_over_a_window() -> None:
    now = [100.0]
    meter = Throughput(flops_per_token=1e9, peak=1e12, clock=lambda: now[0])
    meter.update(samples=4, tokens=4096)
    meter.update(samples=4, tokens=4096)
    now[0] += 2.0
    rates = meter.report()
    assert rates["samples_per_s"] == pytest.approx(4.0)
    assert rates["tokens_per_s"] == pytest.approx(4096.0)
    assert rates["mfu"] == pytest.approx(4096 * 1e9 / 1e12)
    now[0] += 1.0
    assert meter.report()["samples_per_s"] == 0.0  # a new window
    assert "mfu" not in Throughput(flops_per_sample=10.0, peak=None).report()


def test_peak_table_prefers_the_specific_variant() -> None:
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    assert peak_flops("NVIDIA H200") == 989e12
    assert peak_flops("cpu") is None
    assert peak_flops(None) is None


def test_transformer_flops_counts_matmuls_and_attention() -> None:
    dense = transformer_flops_per_token(1000, 0, 0, 0)
    assert dense == 6000
    assert transformer_flops_per_token(1000, 2, 8, 16) - dense == 12 * 2 * 8 * 16
    assert transformer_flops_per_token(1000, 2, 8, 16, causal=True) - dense == 6 * 2 * 8 * 16


def test_sampler_covers_each_index_once_per_epoch_and_resumes() -> None:
    sampler = ResumableSampler(10, seed=3)
    epoch = sampler.next_batch(4) + sampler.next_batch(4)
    state = sampler.state_dict()
    following = [sampler.next_batch(4) for _ in range(2)]
    assert sampler.epoch == 1  # 2 left in epoch 0 < 4: rolled over
    again = ResumableSampler(10, seed=3)
    again.load_state_dict(state)
    assert [again.next_batch(4) for _ in range(2)] == following
    assert len(set(epoch)) == 8
    assert sorted(ResumableSampler(10, seed=3)) == list(range(10))
    with pytest.raises(ValueError, match="seed"):
        ResumableSampler(10, seed=4).load_state_dict(state)


def test_two_ranks_split_the_single_process_batches() -> None:
    single = ResumableSampler(40, seed=1)
    ranks = [ResumableSampler(40, seed=1, rank=r, world_size=2) for r in range(2)]
    for _ in range(4):
        together = ranks[0].next_batch(3) + ranks[1].next_batch(3)
        assert sorted(together) == sorted(single.next_batch(6))


def test_import_without_torch() -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # any import of torch now fails\n"
        "import shamal.train as t\n"
        "print(t.Tracker.__name__, t.LocalCheckpointStore.__name__, t.peak_flops('cpu'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["Tracker", "LocalCheckpointStore", "None"]
