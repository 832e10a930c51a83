"""Metric curves: sparklines and chart files, without a server."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from shamal.cli._curves import BLOCKS, Curve, plot_curves, sparkline, summarize
from shamal.cli._plotfile import plot_path


def test_a_rising_curve_climbs_from_the_lowest_block_to_the_highest() -> None:
    line = sparkline([float(v) for v in range(100)], width=8)
    assert line == BLOCKS
    assert sparkline([float(-v) for v in range(100)], width=8) == BLOCKS[::-1]


def test_each_block_is_the_mean_of_an_equal_share_of_the_points() -> None:
    # Two shares: means 1 and 3 -> lowest and highest; a spike inside a share is averaged.
    assert sparkline([0.0, 2.0, 2.0, 4.0], width=2) == BLOCKS[0] + BLOCKS[-1]
    assert sparkline([1.0, 1.0, 1.0, 100.0, 1.0, 1.0], width=3) == "▁█▁"


def test_fewer_points_than_the_width_give_one_block_each() -> None:
    assert len(sparkline([1.0, 2.0, 3.0], width=24)) == 3
    assert sparkline([], width=24) == ""


def test_flat_missing_and_special_values() -> None:
    assert sparkline([5.0] * 10, width=5) == BLOCKS[3] * 5
    # A share with only NaN/None is a gap; the others still scale.
    assert sparkline([0.0, None, math.nan, 1.0], width=4) == BLOCKS[0] + "  " + BLOCKS[-1]
    assert sparkline([None, math.inf], width=2) == "  "


def test_values_near_the_float_limit_do_not_overflow() -> None:
    line = sparkline([-1.7e308, 1.7e308], width=2)
    assert line == BLOCKS[0] + BLOCKS[-1]


def test_width_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least one character"):
        sparkline([1.0], width=0)


def test_summary_skips_values_json_cannot_carry() -> None:
    points = [
        {"step": 0, "timestamp": 0, "value": 0.5},
        {"step": 1, "timestamp": 1, "value": None, "special": "NaN"},
        {"step": 2, "timestamp": 2, "value": 0.25},
    ]
    summary = summarize(points)
    assert (summary.points, summary.low, summary.high) == (3, 0.25, 0.5)
    assert summary.curve == BLOCKS[-1] + " " + BLOCKS[0]


@pytest.mark.parametrize(("suffix", "magic"), [(".png", b"\x89PNG"), (".pdf", b"%PDF")])
def test_a_chart_is_written_in_the_format_its_name_asks(
    tmp_path: Path, suffix: str, magic: bytes
) -> None:
    points = [{"step": s, "timestamp": 1000 * s, "value": 1 / (1 + s)} for s in range(50)]
    curves = [Curve("loss", "a", points), Curve("loss", "b", points[:10]), Curve("acc", "a", [])]
    path = plot_path(tmp_path / "deep" / f"chart{suffix}", "--out")
    written = plot_curves(curves, path, x="time")
    assert written == path
    assert written.read_bytes().startswith(magic)


def test_a_chart_path_is_checked_with_the_option_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--out .* is a folder"):
        plot_path(tmp_path, "--out")
    with pytest.raises(ValueError, match="cannot draw a .txt file"):
        plot_path(tmp_path / "x.txt", "--out")
    assert plot_path(tmp_path / "curves", "--out") == tmp_path / "curves.png"


def test_names_are_drawn_as_written_not_read_as_tex(tmp_path: Path) -> None:
    points = [{"step": s, "timestamp": s, "value": float(s)} for s in range(5)]
    hostile = [r"$\frac$", "_hidden", "[red]x", "a$b", "\x00\u202e"]
    curves = [Curve(r"loss $\sqrt{$", name, points) for name in hostile]
    written = plot_curves(curves, tmp_path / "hostile.png", title=r"$\badcommand$")
    assert written.read_bytes().startswith(b"\x89PNG")
