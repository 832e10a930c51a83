"""The URIs lineage starts from, parsed (pure). Only the platform's own schemes are taken;
anything else (``file:``, ``http:``, ``s3:``, traversal, control characters) is refused with a
fixed message that echoes nothing: the URI is never fetched, only looked up."""

from __future__ import annotations

import re
from dataclasses import dataclass

from shamal.errors import InvalidParameter
from shamal.lineage._entities import NodeKind

__all__ = ["MAX_URI", "NodeRef", "parse_uri"]

MAX_URI = 600
_DATASET = r"(?P<name>[a-z0-9][a-z0-9._-]{0,127})"
_NUMBER = r"(?P<number>[1-9][0-9]{0,8})"
_ALIAS = r"(?P<alias>[A-Za-z0-9_-]{1,256})"
#: A registered model's name in a models:/ URI: no '/', ':' or control characters (and no
#: '@' before an alias).
_MODEL = r"(?P<name>[^/:\x00-\x1f\x7f]{1,256})"
_MODEL_BEFORE_ALIAS = r"(?P<name>[^/:@\x00-\x1f\x7f]{1,256})"
_PATTERNS: tuple[tuple[NodeKind, re.Pattern[str]], ...] = (
    (NodeKind.DATASET_VERSION, re.compile(rf"data:/{_DATASET}(?:/{_NUMBER}|@{_ALIAS})?")),
    (NodeKind.SOURCE, re.compile(rf"source:/{_DATASET}/{_NUMBER}")),
    # A run, or a path in its artifacts (``runs:/ID/model``, as model sources name them): the
    # path is dropped, never read, and must still be a plain relative one.
    (
        NodeKind.RUN,
        re.compile(r"runs:/(?P<name>[0-9a-f]{32})(?P<path>/[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*)?"),
    ),
    (NodeKind.LOGGED_MODEL, re.compile(r"models:/(?P<name>m-[0-9a-f]{32})")),
    (NodeKind.MODEL_VERSION, re.compile(rf"models:/{_MODEL}/{_NUMBER}")),
    (NodeKind.MODEL_VERSION, re.compile(rf"models:/{_MODEL_BEFORE_ALIAS}@{_ALIAS}")),
    (NodeKind.DEPLOYMENT, re.compile(r"deployments:/(?P<name>[a-z0-9][a-z0-9._-]{0,63})")),
)
_HELP = (
    "lineage starts from data:/NAME/N (or @alias), runs:/RUN_ID, models:/NAME/N (or @alias), "
    "models:/<logged model id>, deployments:/NAME or source:/NAME/N"
)


@dataclass(frozen=True, slots=True)
class NodeRef:
    """What a URI names: its kind, the object's name (or id), and the version number or
    alias that picks one of its versions (data and model versions)."""

    kind: NodeKind
    name: str
    version: int | None = None
    alias: str | None = None


def parse_uri(uri: str) -> NodeRef:
    """The object ``uri`` names.

    Raises:
        InvalidParameter: not one of the forms lineage takes (the message echoes nothing).
    """
    if not isinstance(uri, str) or not uri or len(uri) > MAX_URI:
        raise InvalidParameter(f"a lineage URI is 1 to {MAX_URI} characters; {_HELP}")
    for kind, pattern in _PATTERNS:
        match = pattern.fullmatch(uri)
        if match is None:
            continue
        parts = match.groupdict()
        name, number = parts["name"], parts.get("number")
        if kind is NodeKind.MODEL_VERSION and name.strip() in ("", ".", ".."):
            break
        if set((parts.get("path") or "").split("/")) & {".", ".."}:
            break
        return NodeRef(kind, name, int(number) if number else None, parts.get("alias"))
    raise InvalidParameter(f"not a URI lineage can start from; {_HELP}")
