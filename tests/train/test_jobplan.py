"""plan_for_job: the plan for this job's devices, from what the scheduler tells its workers."""

from __future__ import annotations

import pytest

from shamal import train

GIB = 1024**3


@pytest.fixture
def job_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("WORLD_SIZE", train.DEVICE_MEMORY_ENV, "SHAMAL_GPU_FRACTION"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_scheduler_s_device_memory_and_gang_size_decide(job_env: pytest.MonkeyPatch) -> None:
    job_env.setenv("WORLD_SIZE", "2")
    job_env.setenv(train.DEVICE_MEMORY_ENV, str(80 * 1024))  # two 80 GiB devices
    assert train.device_memory_bytes() == 80 * GIB
    assert train.plan_for_job(124_000_000).strategy == "ddp"
    stages = train.plan_for_job(5_000_000_000)  # 80 GB of state: 2 stages of 60 GiB usable
    assert (stages.strategy, stages.stages) == ("pipeline", 2)
    assert "pipeline stages" in stages.reason
    job_env.setenv("WORLD_SIZE", "8")
    assert train.plan_for_job(7_000_000_000).strategy == "fsdp"


def test_a_module_counts_its_parameters(job_env: pytest.MonkeyPatch) -> None:
    from torch import nn

    job_env.setenv(train.DEVICE_MEMORY_ENV, "1")  # 1 MiB: 0.75 MiB usable
    small = nn.Linear(100, 100)  # 10,100 parameters: 161,600 bytes of state
    assert train.plan_for_job(small).strategy == "ddp"
    with pytest.raises(ValueError, match="does not fit 1 device"):
        train.plan_for_job(nn.Linear(1000, 1000))


def test_arguments_win_over_the_environment(job_env: pytest.MonkeyPatch) -> None:
    job_env.setenv(train.DEVICE_MEMORY_ENV, "1")
    plan = train.plan_for_job(5_000_000_000, devices=2, memory_per_device=80 * GIB)
    assert (plan.strategy, plan.stages) == ("pipeline", 2)


def test_outside_the_scheduler_the_machine_s_memory_counts(job_env: pytest.MonkeyPatch) -> None:
    import os

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert train.device_memory_bytes() == ram  # this test machine has no GPU
    assert train.plan_for_job(1000).strategy == "ddp"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("SHAMAL_DEVICE_MEMORY_MIB", "-5", "must be > 0, not -5"),
        ("SHAMAL_DEVICE_MEMORY_MIB", "0", "must be > 0, not 0"),
        ("SHAMAL_DEVICE_MEMORY_MIB", "1.5", "'1.5' is not a whole number"),
        ("SHAMAL_DEVICE_MEMORY_MIB", "lots", "'lots' is not a whole number"),
        ("WORLD_SIZE", "0", "WORLD_SIZE must be > 0"),
        ("WORLD_SIZE", "two", "WORLD_SIZE='two' is not a whole number"),
    ],
)
def test_a_malformed_environment_is_refused_clearly(
    job_env: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    job_env.setenv(name, value)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        train.plan_for_job(1000, memory_per_device=GIB if name == "WORLD_SIZE" else None)


def test_something_without_parameters_is_refused(job_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError, match="a parameter count or a module"):
        train.plan_for_job("big")
