"""The classification extension's ranking and text, in-process (the served path is in the
REST and gRPC conformance tests)."""

from __future__ import annotations

import numpy as np
import pytest

from shamal.errors import InvalidParameter
from shamal.serving._classification import check_classifiable, class_count, top_classes


def _text(array: np.ndarray) -> list[str] | list[list[str]]:
    decoded: list[str] | list[list[str]] = np.vectorize(bytes.decode, otypes=[object])(
        array
    ).tolist()
    return decoded


def test_rows_are_ranked_largest_first_with_labels() -> None:
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]], dtype=np.float32)
    top = top_classes(scores, 2, batched=True, labels=("cat", "dog", "owl"))
    assert top.shape == (2, 2)
    assert _text(top) == [
        ["0.700000:1:dog", "0.200000:2:owl"],
        ["0.500000:0:cat", "0.250000:1:dog"],  # a tie goes to the lower index
    ]


def test_ties_keep_index_order_and_a_count_past_the_classes_gives_every_class() -> None:
    scores = np.array([[3, 1, 3, 3, 2]], dtype=np.int64)
    assert _text(top_classes(scores, 10, batched=True)) == [["3:0", "3:2", "3:3", "2:4", "1:1"]]


def test_integers_keep_every_digit_and_missing_labels_are_left_out() -> None:
    extremes = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max], dtype=np.int64)
    top = top_classes(extremes, 2, batched=False, labels=("only-the-first",))
    assert top.shape == (2,)
    assert _text(top) == [
        f"{np.iinfo(np.int64).max}:1",
        f"{np.iinfo(np.int64).min}:0:only-the-first",
    ]


def test_a_model_without_batch_ranks_the_whole_tensor() -> None:
    grid = np.array([[0.0, 9.5], [4.25, -1.0]], dtype=np.float64)
    assert _text(top_classes(grid, 3, batched=False)) == [
        "9.500000:1",
        "4.250000:2",
        "0.000000:0",
    ]


def test_batched_rows_of_more_dimensions_are_flattened_per_row() -> None:
    cube = np.arange(12, dtype=np.float16).reshape(2, 2, 3)
    assert _text(top_classes(cube, 1, batched=True)) == [["5.000000:5"], ["11.000000:5"]]


def test_class_count_is_read_from_the_output_parameters() -> None:
    assert class_count({}, "out") == 0
    assert class_count({"classification": 3, "binary_data": True}, "out") == 3


@pytest.mark.parametrize("value", [0, -1, 2.5, "3", True])
def test_class_count_must_be_a_positive_integer(value: object) -> None:
    with pytest.raises(InvalidParameter, match="classification"):
        class_count({"classification": value}, "out")


def test_text_and_booleans_cannot_be_ranked() -> None:
    for datatype in ("BYTES", "BOOL"):
        with pytest.raises(InvalidParameter, match="numeric"):
            check_classifiable("out", datatype)
    check_classifiable("out", "FP16")
