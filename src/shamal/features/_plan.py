"""What applying a repository's feature definitions would change on the server (pure).

:func:`plan` compares the server's definitions with the user's and lists each object to
create, update or delete, and the reasons the change would break a feature service in use
(a model reads it). The server refuses an apply whose plan has any such reason; the CLI prints
them.

Deletion: by default an object on the server that the desired set lacks is **kept** (a
repository may declare a part of the definitions, as one team's folder does). With
``prune=True`` the desired set is the whole truth, as ``feast apply`` treats a repository:
what it lacks is deleted. :func:`applied` is the set the server holds after the apply; the
server validates it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from shamal.features._definitions import (
    Definitions,
    Entity,
    FeatureService,
    FeatureView,
)

__all__ = ["Change", "Plan", "applied", "plan"]

logger = logging.getLogger(__name__)

_VIEW_FIELDS = (
    "entities",
    "source",
    "timestamp_field",
    "owner",
    "ttl_seconds",
    "online",
    "sql",
    "description",
    "tags",
)


@dataclass(frozen=True, slots=True)
class Change:
    """One object to create, update or delete.

    ``kind`` is ``entity``, ``feature_view`` or ``feature_service``; ``action`` is ``create``,
    ``update`` or ``delete``. For an update, ``fields`` names what differs: a field
    (``ttl_seconds``), or a feature added (``features.+amount``), removed
    (``features.-age``), retyped (``features.~age:int64->float64``) or reordered
    (``features.order``); a service's features are ``features.+view:feature`` and the like.
    """

    kind: str
    name: str
    action: str
    fields: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "action": self.action,
            "fields": list(self.fields),
        }


@dataclass(frozen=True, slots=True)
class Plan:
    """The changes, entities first, then views, then services, each kind by name; and the
    reasons (full sentences) it would break a feature service in use. Any reason: the server
    refuses the apply."""

    changes: tuple[Change, ...]
    breaking: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """Nothing would change."""
        return not self.changes

    def to_json(self) -> dict[str, Any]:
        return {
            "changes": [c.to_json() for c in self.changes],
            "breaking": list(self.breaking),
            "empty": self.empty,
        }


def applied(current: Definitions, desired: Definitions, *, prune: bool = False) -> Definitions:
    """The definitions the server holds once ``desired`` is applied over ``current``: the
    desired objects, and (unless ``prune``) the current ones the desired set does not name."""
    if prune:
        return desired

    def kept(mine: Sequence[Any], theirs: Sequence[Any]) -> tuple[Any, ...]:
        names = {item.name for item in theirs}
        return (*theirs, *(item for item in mine if item.name not in names))

    return Definitions(
        kept(current.entities, desired.entities),
        kept(current.views, desired.views),
        kept(current.services, desired.services),
    )


def plan(
    current: Definitions,
    desired: Definitions,
    *,
    in_use: Collection[str] = (),
    prune: bool = False,
) -> Plan:
    """Compare the server's definitions with the desired ones.

    Args:
        current: what the server holds (valid).
        desired: what the repository declares.
        in_use: names of the feature services models read; only their breakage counts.
        prune: delete what ``desired`` lacks (default: keep it); see the module docstring.

    Returns:
        The :class:`Plan`; ``plan(a, a)`` is empty.
    """
    result = applied(current, desired, prune=prune)
    changes = [
        *_diff("entity", current.entities, result.entities, _entity_fields),
        *_diff("feature_view", current.views, result.views, _view_fields),
        *_diff("feature_service", current.services, result.services, _service_fields),
    ]
    breaking: list[str] = []
    for name in sorted(set(in_use)):
        breaking.extend(_service_breaks(name, current, result))
    return Plan(tuple(changes), tuple(dict.fromkeys(breaking)))


def _diff(
    kind: str,
    before: Iterable[Any],
    after: Iterable[Any],
    fields: Callable[[Any, Any], tuple[str, ...]],
) -> list[Change]:
    old = {item.name: item for item in before}
    new = {item.name: item for item in after}
    changes = []
    for name in sorted(old.keys() | new.keys()):
        if name not in old:
            changes.append(Change(kind, name, "create"))
        elif name not in new:
            changes.append(Change(kind, name, "delete"))
        elif old[name] != new[name]:
            changes.append(Change(kind, name, "update", fields(old[name], new[name])))
    return changes


def _entity_fields(old: Entity, new: Entity) -> tuple[str, ...]:
    return tuple(f for f in ("join_keys", "description") if getattr(old, f) != getattr(new, f))


def _membership(before: Sequence[str], after: Sequence[str]) -> list[str]:
    """``features.+NAME`` for each added, ``features.-NAME`` for each removed."""
    kept = set(before) & set(after)
    return [f"features.+{n}" for n in after if n not in kept] + [
        f"features.-{n}" for n in before if n not in kept
    ]


def _reordered(before: Sequence[str], after: Sequence[str]) -> list[str]:
    """``features.order`` when the names both lists hold are in another order."""
    kept = set(before) & set(after)
    same = [n for n in before if n in kept] == [n for n in after if n in kept]
    return [] if same else ["features.order"]


def _view_fields(old: FeatureView, new: FeatureView) -> tuple[str, ...]:
    before = {f.name: f.dtype for f in old.features}
    after = {f.name: f.dtype for f in new.features}
    retyped = [
        f"features.~{n}:{dtype}->{after[n]}"
        for n, dtype in before.items()
        if after.get(n, dtype) != dtype
    ]
    return (
        *(f for f in _VIEW_FIELDS if getattr(old, f) != getattr(new, f)),
        *_membership(list(before), list(after)),
        *retyped,
        *_reordered(list(before), list(after)),
    )


def _service_fields(old: FeatureService, new: FeatureService) -> tuple[str, ...]:
    return (
        *(f for f in ("owner", "description") if getattr(old, f) != getattr(new, f)),
        *_membership(old.features, new.features),
        *_reordered(old.features, new.features),
    )


# ---------------------------------------------------------------- what breaks a service in use


def _lookup(items: Iterable[Any], name: str) -> Any:
    return next((item for item in items if item.name == name), None)


def _pairs(defs: Definitions, service: FeatureService) -> list[tuple[str, str, bool]]:
    """The service's ``(view, feature, through_star)`` triples, resolved leniently: a view
    that is not defined contributes nothing."""
    pairs: dict[tuple[str, str], bool] = {}
    for ref in service.features:
        view_name, _, feature = ref.partition(":")
        view = _lookup(defs.views, view_name)
        if feature == "*":
            for f in view.features if view is not None else ():
                pairs.setdefault((view_name, f.name), True)
        else:
            pairs[(view_name, feature)] = False
    return [(v, f, star) for (v, f), star in pairs.items()]


def _keys(defs: Definitions, view: FeatureView) -> tuple[str, ...]:
    keys: list[str] = []
    for name in view.entities:
        entity = _lookup(defs.entities, name)
        keys.extend(entity.join_keys if entity is not None else (f"<{name}: undefined>",))
    return tuple(keys)


def _view_breaks(
    opening: str,
    old: FeatureView,
    new: FeatureView | None,
    current: Definitions,
    result: Definitions,
) -> list[str]:
    if new is None:
        return [f"{opening} reads feature view '{old.name}', which would be deleted."]
    if old.entities != new.entities:
        return [
            f"{opening} reads feature view '{old.name}', whose entities would change from "
            f"({', '.join(old.entities)}) to ({', '.join(new.entities)})."
        ]
    before, after = _keys(current, old), _keys(result, new)
    if before != after:
        return [
            f"{opening} reads feature view '{old.name}', whose join keys would change from "
            f"({', '.join(before)}) to ({', '.join(after)})."
        ]
    return []


def _service_breaks(name: str, current: Definitions, result: Definitions) -> list[str]:
    """Why applying ``result`` over ``current`` breaks the in-use service ``name``."""
    service = _lookup(current.services, name)
    if service is None:
        return []
    opening = f"Feature service '{name}' is in use and"
    new_service = _lookup(result.services, name)
    if new_service is None:
        return [f"{opening} would be deleted; remove it only when no model reads it."]
    old_pairs = _pairs(current, service)
    new_pairs = {(v, f) for v, f, _ in _pairs(result, new_service)}
    reasons: list[str] = []
    for view_name in dict.fromkeys(v for v, _, _ in old_pairs):
        old_view = _lookup(current.views, view_name)
        if old_view is not None:
            new_view = _lookup(result.views, view_name)
            reasons += _view_breaks(opening, old_view, new_view, current, result)
    for view_name, feature, star in old_pairs:
        old_view, new_view = _lookup(current.views, view_name), _lookup(result.views, view_name)
        if old_view is not None and new_view is not None:
            reasons += _feature_breaks(opening, old_view, new_view, feature, star, new_pairs)
    return reasons


def _feature_breaks(
    opening: str,
    old_view: FeatureView,
    new_view: FeatureView,
    feature: str,
    star: bool,
    new_pairs: Collection[tuple[str, str]],
) -> list[str]:
    old_feature, new_feature = old_view.feature(feature), new_view.feature(feature)
    if old_feature is None:
        return []
    view_name = old_view.name
    ref = f"'{view_name}:{feature}'" + (f" (through '{view_name}:*')" if star else "")
    if new_feature is None:
        return [f"{opening} reads {ref}, which would be removed from its view."]
    if new_feature.dtype != old_feature.dtype:
        return [
            f"{opening} reads {ref}, whose type would change from {old_feature.dtype} to "
            f"{new_feature.dtype}."
        ]
    if (view_name, feature) not in new_pairs:
        return [
            f"{opening} its new feature list drops {ref}; adding features is fine, "
            "removing one breaks the models that read it."
        ]
    return []
