"""The server-drawn pictures: text escaped, layers in dependency order, empty charts said."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from shamal.webui._svg import Node, Rule, Series, dag, line_chart, split_bar

HOSTILE = '<img src=x onerror="alert(1)">'
SVG = "{http://www.w3.org/2000/svg}"


def _parse(markup: str) -> ET.Element:
    svg = markup.split("<ul", 1)[0]
    return ET.fromstring(svg)


def test_a_line_chart_draws_each_series_and_its_rules_with_names_escaped() -> None:
    chart = line_chart(
        [Series(HOSTILE, [0, 1, 2], [0.1, 0.5, 0.2]), Series("b", [0, 2], [1.0, float("nan")])],
        "drift of " + HOSTILE,
        rules=[Rule("threshold", 0.3)],
    )
    assert "<img" not in chart
    assert "&lt;img" in chart
    root = _parse(chart)
    lines = root.findall(f"{SVG}polyline")
    assert len(lines) == 2
    assert len(lines[0].get("points", "").split()) == 3
    assert len(lines[1].get("points", "").split()) == 1  # the NaN point is left out
    assert len(root.findall(f"{SVG}line")) == 1
    assert root.get("aria-label") == "drift of " + HOSTILE
    assert '<ul class="legend">' in chart


def test_a_chart_with_no_points_says_so_and_a_long_series_is_thinned() -> None:
    assert "no data yet" in line_chart([Series("x", [], [])], "empty")
    many = line_chart(
        [Series("x", list(range(10_000)), [float(i % 7) for i in range(10_000)])], "t"
    )
    points = _parse(many).findall(f"{SVG}polyline")[0].get("points", "").split()
    assert 1000 <= len(points) <= 1200


def test_a_split_bar_gives_each_part_its_share() -> None:
    bar = split_bar([("v1", 75), ("v2 " + HOSTILE, 25)], "traffic")
    assert "&lt;img" in bar
    assert "<img" not in bar
    widths = [float(r.get("width", "0")) for r in _parse(bar).findall(f"{SVG}rect")]
    assert widths == [480.0, 160.0]
    assert "75%" in bar
    assert "25%" in bar


def test_a_dag_puts_each_node_after_all_its_parents() -> None:
    nodes = [
        Node(n, n, "succeeded") for n in ("train", "ingest", "validate", "register", "features")
    ]
    edges = [
        ("ingest", "validate"),
        ("validate", "features"),
        ("features", "train"),
        ("ingest", "train"),
        ("train", "register"),
    ]
    graph = dag(nodes, edges, "pipeline")
    xs = {}
    for group in _parse(graph).iter(f"{SVG}g"):
        texts = group.findall(f"{SVG}text")
        xs[texts[0].text] = float(group.find(f"{SVG}rect").get("x"))  # type: ignore[union-attr]
    assert xs["ingest"] < xs["validate"] < xs["features"] < xs["train"] < xs["register"]
    assert len(_parse(graph).findall(f"{SVG}path")) == len(edges)


def test_a_dag_survives_a_cycle_and_escapes_labels_states_and_links() -> None:
    nodes = [Node("a", HOSTILE, 'x" onload="y', href="/ui/jobs/1"), Node("b", "b")]
    graph = dag(nodes, [("a", "b"), ("b", "a")], "cycle")
    root = _parse(graph)
    assert len(root.findall(f"{SVG}a")) == 1
    assert not re.search(r'<img|onload="', graph)
    assert root.find(f".//{SVG}g").get("class") == "node state-xonloady"  # type: ignore[union-attr]
