"""MIG tables: which profiles a GPU offers and which combinations fit one GPU.

The expected combinations are NVIDIA's (MIG user guide, "Supported MIG Profiles" and
the placement diagrams): checked here by exhaustive search over allowed starts, so a
wrong start or span in a table shows up as a combination that wrongly fits or not.
"""

from __future__ import annotations

import pytest

from shamal.scheduler.core._mig import free_starts, profile_mask, profiles_for, table_for
from shamal.scheduler.core._resources import Gpu


def gpu(memory_mib: int, slices: int = 7, used: int = 0) -> Gpu:
    return Gpu(0, "X", memory_mib, mig_slices=slices, mig_used=used)


A100_40, A100_80, H100_NVL, H200, A30 = 40_960, 81_920, 95_830, 143_771, 24_576


def fits_together(memory_mib: int, names: list[str], slices: int = 7) -> bool:
    """Whether instances of ``names`` can all sit on one GPU at some allowed starts."""
    profiles = profiles_for(gpu(memory_mib, slices))

    def search(i: int, used: int) -> bool:
        if i == len(names):
            return True
        profile = profiles[names[i]]
        return any(
            search(i + 1, used | profile_mask(profile, s))
            for s in profile.starts
            if not used & profile_mask(profile, s)
        )

    return search(0, 0)


@pytest.mark.parametrize(
    ("memory", "slices", "expected"),
    [
        (A100_40, 7, 40),
        (A100_80, 7, 80),
        (H100_NVL, 7, 94),
        (H200, 7, 141),
        (A30, 4, 24),
    ],
)
def test_table_is_chosen_by_memory_size(memory: int, slices: int, expected: int) -> None:
    table = table_for(gpu(memory, slices))
    assert table is not None
    assert table.memory_gb == expected


def test_no_table_for_unpartitioned_or_unknown_gpus() -> None:
    assert table_for(gpu(A100_80, slices=0)) is None
    assert table_for(gpu(16_384)) is None
    assert table_for(gpu(A30, slices=7)) is None  # an A30 has 4 slices
    assert profiles_for(gpu(16_384)) == {}


@pytest.mark.parametrize(
    "combo",
    [
        ["1g.10gb"] * 7,
        ["1g.20gb"] * 4,
        ["2g.20gb"] * 3 + ["1g.10gb"],
        ["3g.40gb", "3g.40gb"],
        ["4g.40gb", "3g.40gb"],
        ["4g.40gb", "2g.20gb", "1g.10gb"],
        ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
        ["7g.80gb"],
        ["1g.10gb+me", "1g.10gb"],
    ],
)
def test_valid_80gb_combinations_fit(combo: list[str]) -> None:
    assert fits_together(A100_80, combo)


@pytest.mark.parametrize(
    "combo",
    [
        ["1g.10gb"] * 8,
        ["1g.20gb"] * 5,
        ["2g.20gb"] * 4,
        ["4g.40gb", "4g.40gb"],
        ["3g.40gb", "3g.40gb", "1g.10gb"],
        ["4g.40gb", "3g.40gb", "1g.10gb"],
        ["7g.80gb", "1g.10gb"],
    ],
)
def test_invalid_80gb_combinations_do_not(combo: list[str]) -> None:
    assert not fits_together(A100_80, combo)


def test_other_sizes_have_their_own_names() -> None:
    assert fits_together(A100_40, ["3g.20gb", "4g.20gb"])
    assert fits_together(A100_40, ["1g.5gb"] * 7)
    assert fits_together(H200, ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"])
    assert fits_together(H100_NVL, ["4g.47gb", "3g.47gb"])
    assert "3g.40gb" not in profiles_for(gpu(A100_40))


def test_a30_has_four_slices() -> None:
    assert fits_together(A30, ["1g.6gb"] * 4, slices=4)
    assert not fits_together(A30, ["1g.6gb"] * 5, slices=4)
    assert fits_together(A30, ["2g.12gb", "1g.6gb", "1g.6gb"], slices=4)
    assert not fits_together(A30, ["4g.24gb", "1g.6gb"], slices=4)


def test_free_starts_follow_the_used_mask() -> None:
    g = gpu(A100_80)
    assert free_starts(g, "3g.40gb") == [0, 4]
    g.mig_used = profile_mask(profiles_for(g)["3g.40gb"], 4)
    assert free_starts(g, "3g.40gb") == [0]
    assert free_starts(g, "4g.40gb") == [0]
    assert free_starts(g, "2g.20gb") == [0, 2]
    assert free_starts(g, "7g.80gb") == []
    assert free_starts(g, "no-such") == []


def test_a_start_outside_the_profile_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot start"):
        profile_mask(profiles_for(gpu(A100_80))["4g.40gb"], 4)
