"""`shamal lineage URI`: where an object came from and what was made of it, as a tree.

`shamal lineage data:/customers/3` shows the source the version was ingested from (upstream)
and the runs that read it, the models they made, the versions registered and the deployments
serving them (downstream); `shamal lineage deployments:/fraud-api --direction up` walks back to
the data. `--json` prints the graph (nodes and edges) as the API answers it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any

import typer
from rich.tree import Tree

from shamal.cli._common import JsonOption, client, console, escape, handle_errors
from shamal.errors import InvalidParameter

_DIRECTIONS = ("up", "down", "both")
_KINDS = {
    "source": "source",
    "dataset_version": "data",
    "input": "input",
    "run": "run",
    "logged_model": "logged model",
    "model_version": "model version",
    "deployment": "deployment",
}


def _describe(node: Mapping[str, Any]) -> str:
    kind = _KINDS.get(node["kind"], node["kind"])
    if node["redacted"]:
        return f"[dim]{escape(kind)}: (hidden: not yours to see, or gone)[/]"
    attrs = node["attributes"]
    label = f" {escape(node['label'])}" if node["label"] and node["label"] != node["id"] else ""
    extra = ""
    if node["kind"] == "dataset_version":
        extra = f" {attrs.get('rows', 0):,} rows, {escape(str(attrs.get('status')))}"
    elif node["kind"] == "run":
        extra = f" {escape(str(attrs.get('status')))}"
    elif node["kind"] == "deployment":
        extra = f" team {escape(str(attrs.get('team')))}, {escape(str(attrs.get('phase')))}"
    return f"[dim]{escape(kind)}[/] [bold]{escape(node['id'])}[/]{label}{extra}"


def _edge_note(edge: Mapping[str, Any]) -> str:
    attrs = edge["attributes"]
    note = edge["relation"]
    if attrs.get("digest_matches") is False:
        note += ", [yellow]digest differs[/]"
    if attrs.get("roles"):
        note += f" as {escape(', '.join(attrs['roles']))}"
    return f"[dim]({note})[/]"


def _grow(
    branch: Tree,
    node_id: str,
    nodes: Mapping[str, Mapping[str, Any]],
    links: Mapping[str, list[tuple[str, Mapping[str, Any]]]],
    seen: set[str],
) -> None:
    for other, edge in links.get(node_id, []):
        shown = f"{_describe(nodes[other])} {_edge_note(edge)}"
        if other in seen:
            branch.add(f"{shown} [dim](above)[/]")
            continue
        seen.add(other)
        _grow(branch.add(shown), other, nodes, links, seen)


def lineage_tree(graph: Mapping[str, Any]) -> Tree:
    """The graph as a tree: the start, then what it came from, then what was made of it."""
    nodes = {n["id"]: n for n in graph["nodes"]}
    up: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    down: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for edge in graph["edges"]:
        up.setdefault(edge["target"], []).append((edge["source"], edge))
        down.setdefault(edge["source"], []).append((edge["target"], edge))
    start = graph["start"]
    tree = Tree(_describe(nodes[start]))
    if graph["direction"] in ("up", "both"):
        _grow(tree.add("[bold]upstream[/] (where it came from)"), start, nodes, up, {start})
    if graph["direction"] in ("down", "both"):
        _grow(tree.add("[bold]downstream[/] (what was made of it)"), start, nodes, down, {start})
    return tree


def print_lineage(graph: Mapping[str, Any]) -> None:
    """The graph as a tree, and a word when a bound cut it short."""
    console.print(lineage_tree(graph))
    if graph["truncated"]:
        console.print(
            "[yellow]cut short by a bound (nodes, or neighbours of one node): "
            "narrow it with --direction or --depth[/]"
        )


@handle_errors
def lineage(
    uri: Annotated[
        str,
        typer.Argument(
            help="data:/NAME/N (or NAME@alias), runs:/RUN_ID, models:/NAME/N, "
            "models:/<logged model id>, deployments:/NAME or source:/NAME/N."
        ),
    ],
    direction: Annotated[str, typer.Option(help="up, down or both.")] = "both",
    depth: Annotated[int, typer.Option(min=1, max=20, help="Hops each way.")] = 6,
    max_nodes: Annotated[int, typer.Option(min=1, max=1000, help="Nodes at most.")] = 200,
    as_json: bool = JsonOption,
) -> None:
    """Where URI came from (source, data, runs) and what was made of it (models, versions,
    deployments), as far as you may see: others' objects are left out or shown hidden."""
    if direction not in _DIRECTIONS:
        raise InvalidParameter(f"--direction is up, down or both, not {direction!r}")
    graph = client().lineage(uri, direction=direction, depth=depth, max_nodes=max_nodes)
    if as_json:
        typer.echo(json.dumps(graph))
        return
    print_lineage(graph)
