"""The curve downsampler: every bucket's minimum and maximum survive, so do the first and
the last point, and no answer holds more points than asked for."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shamal.webui import bucket_edges, downsample

values_lists = st.lists(
    st.floats(allow_nan=False, allow_infinity=False, width=64, min_value=-1e12, max_value=1e12),
    min_size=0,
    max_size=3000,
)


@given(values=values_lists, points=st.integers(min_value=4, max_value=500))
def test_extremes_of_every_bucket_and_the_ends_survive(values: list[float], points: int) -> None:
    steps = np.arange(len(values), dtype=np.int64) * 3
    array = np.asarray(values, dtype=np.float64)
    kept_steps, kept_values = downsample(steps, array, points)
    assert len(kept_steps) == len(kept_values)
    if len(values) > points:
        assert len(kept_steps) <= points
    else:
        assert len(kept_steps) == len(values)  # nothing cut when it fits
    if not values:
        assert len(kept_steps) == 0
        return
    assert list(np.diff(kept_steps) > 0) == [True] * (len(kept_steps) - 1)  # curve order
    assert kept_steps[0] == steps[0]
    assert kept_steps[-1] == steps[-1]
    kept = dict(zip(kept_steps.tolist(), kept_values.tolist(), strict=True))
    assert all(kept[s] == array[s // 3] for s in kept)  # points, never made-up values
    edges = bucket_edges(len(values), points)
    if not edges:
        assert len(kept_steps) == len(values)
    for start, end in edges:
        bucket = array[start:end]
        inside = [kept[s] for s in steps[start:end].tolist() if s in kept]
        assert min(inside) == bucket.min()
        assert max(inside) == bucket.max()


@given(count=st.integers(min_value=0, max_value=100_000), points=st.integers(4, 5000))
def test_the_buckets_cover_every_inner_point_once(count: int, points: int) -> None:
    edges = bucket_edges(count, points)
    if count <= points:
        assert edges == []
        return
    assert edges[0][0] == 1
    assert edges[-1][1] == count - 1
    assert all(a[1] == b[0] for a, b in zip(edges, edges[1:], strict=False))
    assert 2 + 2 * len(edges) <= points


def test_a_million_points_come_back_as_a_few_thousand_with_the_spike() -> None:
    steps = np.arange(1_000_000, dtype=np.int64)
    values = np.sin(steps / 5000.0)
    values[612_345] = 40.0  # one divergent step, which an average would hide
    values[77_777] = -40.0
    kept_steps, kept_values = downsample(steps, values, 2000)
    assert len(kept_steps) <= 2000
    assert 612_345 in kept_steps
    assert 77_777 in kept_steps
    assert kept_values.max() == 40.0
    assert kept_values.min() == -40.0


def test_too_few_points_or_uneven_arrays_are_refused() -> None:
    steps = np.arange(10, dtype=np.int64)
    with pytest.raises(ValueError, match="at least 4"):
        downsample(steps, steps.astype(np.float64), 3)
    with pytest.raises(ValueError, match="differ in length"):
        downsample(steps, np.zeros(9), 100)
