"""The sketches on their own: accuracy on generated data, merging, determinism, hashing."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from shamal.datasets._profile import _offsets_and_data
from shamal.datasets._sketches import (
    DistinctSketch,
    QuantileSketch,
    TopValues,
    hash_bytes,
    hash_words,
)

RANKS = np.array([0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99])


def _rank_errors(values: np.ndarray, sketch: QuantileSketch) -> np.ndarray:
    """How far, in normalized rank, each answered quantile lies from the asked rank."""
    ordered = np.sort(values)
    answers = sketch.quantiles(RANKS)
    low = np.searchsorted(ordered, answers, side="left") / len(ordered)
    high = np.searchsorted(ordered, answers, side="right") / len(ordered)
    # A value repeated in the data spans a range of ranks: the error is the distance to it.
    return np.maximum(0.0, np.maximum(low - RANKS, RANKS - high))


@pytest.mark.parametrize("distribution", ["normal", "lognormal", "uniform_ints", "bimodal"])
def test_quantiles_lie_within_one_percent_of_rank_on_a_million_values(distribution: str) -> None:
    rng = np.random.default_rng(7)
    n = 1_000_000
    values = {
        "normal": lambda: rng.normal(0, 1, n),
        "lognormal": lambda: rng.lognormal(0, 2, n),
        "uniform_ints": lambda: rng.integers(-(10**12), 10**12, n),
        "bimodal": lambda: np.concatenate([rng.normal(-5, 1, n // 2), rng.normal(5, 0.1, n // 2)]),
    }[distribution]()
    rng.shuffle(values)
    sketch = QuantileSketch(dtype=values.dtype, seed=1)
    for batch in np.array_split(values, 37):  # uneven batches, as files deliver them
        sketch.update(batch)
    assert sketch.count == n
    errors = _rank_errors(values, sketch)
    assert errors.max() < 0.01, errors
    assert sum(len(level) for level in sketch.levels) < 4 * sketch.k  # bounded memory


def test_quantile_sketches_of_partitions_merge_into_the_whole() -> None:
    rng = np.random.default_rng(3)
    parts = [rng.exponential(1 + i, 200_000) for i in range(5)]
    merged = QuantileSketch(seed=0)
    for i, part in enumerate(parts):
        piece = QuantileSketch(seed=i)
        piece.update(part)
        merged.merge(piece)
    assert merged.count == 1_000_000
    assert _rank_errors(np.concatenate(parts), merged).max() < 0.01


def test_quantile_sketch_is_deterministic_for_a_seed_and_varies_with_it() -> None:
    values = np.random.default_rng(0).normal(size=100_000)

    def answers(seed: int) -> np.ndarray:
        sketch = QuantileSketch(k=50, seed=seed)
        for batch in np.array_split(values, 10):
            sketch.update(batch)
        return sketch.quantiles(RANKS)

    assert np.array_equal(answers(5), answers(5))
    assert not np.array_equal(answers(5), answers(6))


def test_quantile_sketch_keeps_int64_exact_and_answers_nothing_when_empty() -> None:
    big = np.array([2**62 + 1, 2**62 + 3, 2**62 + 5], dtype=np.int64)
    sketch = QuantileSketch(dtype=np.int64)
    assert sketch.quantiles(RANKS).size == 0
    sketch.update(big)
    assert sketch.quantiles(np.array([0.0, 0.5, 1.0])).tolist() == big.tolist()


@pytest.mark.parametrize("cardinality", [10, 1_000, 30_000, 200_000, 2_000_000])
def test_distinct_estimate_lies_within_three_percent(cardinality: int) -> None:
    rng = np.random.default_rng(cardinality)
    ids = rng.permutation(np.arange(cardinality, dtype=np.int64) * 7919 + 13)
    values = np.concatenate([ids, rng.choice(ids, size=min(cardinality, 500_000))])
    sketch = DistinctSketch()
    for batch in np.array_split(values, 9):
        sketch.update(hash_words(batch, seed=0))
    estimate = sketch.estimate()
    assert abs(estimate - cardinality) <= max(1, 0.03 * cardinality), estimate


def test_distinct_sketches_merge_exactly_and_empty_is_zero() -> None:
    assert DistinctSketch().estimate() == 0
    values = np.arange(100_000, dtype=np.int64)
    whole, left, right = DistinctSketch(), DistinctSketch(), DistinctSketch()
    whole.update(hash_words(values, 0))
    left.update(hash_words(values[:60_000], 0))
    right.update(hash_words(values[40_000:], 0))
    left.merge(right)
    assert np.array_equal(left.registers, whole.registers)
    with pytest.raises(ValueError, match="precision"):
        left.merge(DistinctSketch(precision=10))


def test_top_values_find_the_heavy_hitters_of_a_skewed_stream() -> None:
    rng = np.random.default_rng(11)
    values = rng.zipf(1.3, 1_000_000) % 50_000
    exact_values, exact_counts = np.unique(values, return_counts=True)
    truth = dict(zip(exact_values.tolist(), exact_counts.tolist(), strict=True))
    top = TopValues(capacity=100)
    for batch in np.array_split(values, 20):
        found, counts = np.unique(batch, return_counts=True)
        top.update(found.tolist(), counts)
    expected = sorted(truth, key=lambda v: -truth[v])[:10]
    answered = top.top(10)
    assert [v for v, _, _ in answered] == expected
    for value, estimate, error in answered:
        assert estimate - error <= truth[value] <= estimate  # the summary's guarantee


def test_top_values_given_a_batch_trimmed_by_the_caller_end_as_given_the_whole_batch() -> None:
    # The profiler keeps only the values the summary can hold before making Python objects of
    # them, and passes the highest count it left out as the floor.
    rng = np.random.default_rng(3)
    whole, trimmed = TopValues(capacity=50), TopValues(capacity=50)
    for _ in range(6):
        found, counts = np.unique(rng.zipf(1.4, 20_000) % 5_000, return_counts=True)
        whole.update(found.tolist(), counts)
        kept = np.argpartition(-counts, 50)[:50]
        left_out = np.ones(len(counts), dtype=bool)
        left_out[kept] = False
        trimmed.update(found[kept].tolist(), counts[kept], floor=int(counts[left_out].max()))
    assert trimmed.top(50) == whole.top(50)
    assert (trimmed.floor, trimmed.errors) == (whole.floor, whole.errors)


def test_top_values_are_independent_of_the_order_partitions_merge_in() -> None:
    rng = np.random.default_rng(5)
    parts = [rng.zipf(1.5, 50_000) for _ in range(4)]

    def summary(order: list[int]) -> list[tuple[object, int, int]]:
        top = TopValues(capacity=20)
        for i in order:
            found, counts = np.unique(parts[i], return_counts=True)
            piece = TopValues(capacity=20)
            piece.update(found.tolist(), counts)
            top.merge(piece)
        return top.top(5)

    assert summary([0, 1, 2, 3])[:3] == summary([3, 2, 1, 0])[:3]


def test_string_hashes_depend_on_content_only() -> None:
    texts = ["", "a", "abcdefgh", "abcdefghi", "x" * 127, "x" * 128, "x" * 129, "y" * 5000]
    array = pa.array(texts + [None] + texts)
    whole = hash_bytes(*_offsets_and_data(array.drop_null()), seed=1)
    n = len(texts)
    assert np.array_equal(whole[:n], whole[n:])  # same text, same hash, wherever it sits
    assert len(set(whole[:n].tolist())) == n  # different texts, different hashes
    sliced = array.slice(n + 1)
    assert np.array_equal(hash_bytes(*_offsets_and_data(sliced), seed=1), whole[:n])
    large = pa.array(texts, pa.large_string())
    assert np.array_equal(hash_bytes(*_offsets_and_data(large), seed=1), whole[:n])
    assert not np.array_equal(hash_bytes(*_offsets_and_data(large), seed=2), whole[:n])


def test_string_hashes_do_not_collide_on_a_million_keys() -> None:
    keys = pa.array([f"user-{i:08d}@example.org" for i in range(1_000_000)])
    hashes = hash_bytes(*_offsets_and_data(keys), seed=0)
    assert len(np.unique(hashes)) == len(keys)
