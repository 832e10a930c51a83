"""choose_parallelism: DDP when a replica fits, FSDP when a shard fits, else stages."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shamal.train._plan import choose_parallelism

GIB = 1024**3


def test_small_model_is_ddp() -> None:
    plan = choose_parallelism(124_000_000, 8, 80 * GIB)
    assert plan.strategy == "ddp"
    assert plan.stages == 1
    assert "DDP" in plan.reason


def test_model_too_big_for_one_device_is_fsdp() -> None:
    plan = choose_parallelism(7_000_000_000, 8, 80 * GIB)  # 112 GB of state
    assert plan.strategy == "fsdp"
    assert "1/8 shard" in plan.reason


def test_fsdp_not_possible_falls_back_to_stages() -> None:
    # 2 devices: a half shard doubled for gathering does not fit, two stages do.
    plan = choose_parallelism(5_000_000_000, 2, 80 * GIB)  # 80 GB of state, 60 GiB usable
    assert plan.strategy == "pipeline"
    assert plan.stages == 2


def test_no_fit_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="does not fit 2 device"):
        choose_parallelism(70_000_000_000, 2, 80 * GIB)


@pytest.mark.parametrize(
    ("params", "devices", "memory"), [(0, 1, GIB), (1, 0, GIB), (1, 1, 0), (-5, 1, GIB)]
)
def test_impossible_inputs_refused(params: int, devices: int, memory: int) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        choose_parallelism(params, devices, memory)


@given(
    params=st.integers(1, 10**12),
    devices=st.integers(1, 64),
    memory=st.integers(GIB, 200 * GIB),
)
def test_a_plan_always_fits_what_it_claims(params: int, devices: int, memory: int) -> None:
    usable = int(memory * 0.75)
    state = params * 16
    try:
        plan = choose_parallelism(params, devices, memory)
    except ValueError:
        assert state > usable * devices
        return
    if plan.strategy == "ddp":
        assert state <= usable
    elif plan.strategy == "fsdp":
        assert state > usable
        assert 2 * -(-state // devices) <= usable
    else:
        assert 1 < plan.stages <= devices
        assert state <= plan.stages * usable
