"""Feature definitions as code: entities, feature views and feature services (pure).

Users declare them in Python or YAML in their repository; the server holds the applied set.
This module holds the frozen objects, their canonical JSON (the wire and storage form, sorted
by name, so equal definitions have equal digests), the YAML reader and every rule a set of
definitions obeys (:meth:`Definitions.validate`). No database, web framework, DuckDB or
pyarrow here; the SQL check loads DuckDB on first use through the datasets package.

YAML form (one document; every list optional)::

    entities:
      - {name: customer, join_keys: [customer_id], description: ""}
    feature_views:
      - name: customer_stats
        entities: [customer]
        source: customers@prod          # or data:customers/3, or view:other_view
        timestamp_field: event_time
        ttl_seconds: 86400              # null: no expiry
        online: true
        owner: risk
        sql: SELECT customer_id, event_time, sum(amount) AS total FROM source GROUP BY ALL
        features:
          - {name: total, dtype: float64}
        tags: {tier: gold}
    feature_services:
      - {name: fraud_model, features: ["customer_stats:total", "other_view:*"], owner: risk}
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from shamal.datasets import parse_ref
from shamal.errors import InvalidParameter, NotFound

__all__ = [
    "FEATURE_TYPES",
    "MAX_ENTITIES",
    "MAX_FEATURES",
    "MAX_SERVICES",
    "MAX_SQL_BYTES",
    "MAX_TTL_SECONDS",
    "MAX_VIEWS",
    "MAX_YAML_BYTES",
    "TEAM_PATTERN",
    "Definitions",
    "Entity",
    "Feature",
    "FeatureService",
    "FeatureView",
    "Tags",
    "check_name",
    "normalize_source",
]

logger = logging.getLogger(__name__)

FEATURE_TYPES = ("int64", "float64", "string", "bool", "timestamp")
MAX_ENTITIES = 1000
MAX_VIEWS = 1000
MAX_FEATURES = 1000  # per view, and per service
MAX_SERVICES = 100
MAX_SQL_BYTES = 64 * 1024
MAX_YAML_BYTES = 4 * 1024 * 1024
MAX_TTL_SECONDS = 10 * 366 * 86_400
MAX_DESCRIPTION = 5000
MAX_TAGS, MAX_TAG_KEY, MAX_TAG_VALUE = 64, 128, 1024
#: Entities one view may be keyed by.
MAX_VIEW_ENTITIES = 16
#: The most problems one error lists.
MAX_PROBLEMS = 20
#: The most values (mappings, lists, scalars) a YAML document may expand to, aliases counted
#: each time they are used: what 4 MiB of plain YAML can hold, and a bound on alias bombs.
MAX_YAML_VALUES = 2_000_000
MAX_YAML_DEPTH = 12
#: Team names, as the security package checks them (shamal.security.NAME_PATTERN; a test
#: keeps the two equal). Copied rather than imported: the security package loads the database.
TEAM_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_TEAM = re.compile(TEAM_PATTERN)
_READS_SOURCE = re.compile(r"\bsource\b", re.IGNORECASE)


def _shown(value: object) -> str:
    """A value for an error message, never long."""
    text = repr(value)
    return text if len(text) <= 70 else text[:60] + "...'"


def _name_problem(kind: str, name: object) -> str | None:
    if isinstance(name, str) and _NAME.fullmatch(name):
        return None
    return (
        f"{kind} name {_shown(name)} is not valid: a name is a lowercase letter followed by up "
        "to 62 lowercase letters, digits or '_' (names are used as identifiers)"
    )


def check_name(kind: str, name: str) -> None:
    """Check the name of an entity, feature view, feature, feature service or column.

    Args:
        kind: what is named, for the message (``"feature view"``).
        name: the name: ``[a-z][a-z0-9_]{0,62}``.

    Raises:
        InvalidParameter: the name breaks the rule; the message states it.
    """
    problem = _name_problem(kind, name)
    if problem is not None:
        raise InvalidParameter(problem)


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list | tuple) else value


@dataclass(frozen=True, slots=True)
class Entity:
    """What features describe (a customer, a driver), and the columns that identify one."""

    name: str
    join_keys: tuple[str, ...]
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "join_keys", _tuple(self.join_keys))


@dataclass(frozen=True, slots=True)
class Feature:
    """One feature of a view: a column name and its type, one of :data:`FEATURE_TYPES`."""

    name: str
    dtype: str


def normalize_source(source: Any) -> Any:
    """``view:NAME`` as is; a dataset reference as ``data:NAME``, ``data:NAME@alias`` or
    ``data:NAME/3`` (a bare ``NAME`` and the URI form ``data:/NAME`` included). A reference
    that does not parse is returned as written, for :meth:`Definitions.validate` to report."""
    if not isinstance(source, str) or source.startswith("view:"):
        return source
    body = source.removeprefix("data:/") if source.startswith("data:/") else source
    body = body.removeprefix("data:")
    try:
        return f"data:{parse_ref(body)}"
    except InvalidParameter:
        return source


class Tags(dict[str, str]):
    """A feature view's tags: a dict (JSON encoders and ``dataclasses.asdict`` take it as
    one) that refuses changes, as the frozen view around it does; hashable and picklable."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("a feature view's tags are read-only; use dataclasses.replace")

    __setitem__ = __delitem__ = _refuse
    clear = pop = popitem = setdefault = update = __ior__ = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))

    def __reduce__(self) -> tuple[type[Tags], tuple[dict[str, str]]]:
        return (Tags, (dict(self),))


@dataclass(frozen=True, slots=True)
class FeatureView:
    """Features computed from one source, keyed by its entities' join keys, as of a time.

    ``source`` is a dataset reference (normalized to ``data:NAME``, ``data:NAME@alias`` or
    ``data:NAME/3``) or ``view:OTHER``, another view. ``sql``, when given, is one SELECT over
    a relation named ``source``. ``tags`` is kept as read-only :class:`Tags`, sorted by key.
    """

    name: str
    entities: tuple[str, ...]
    source: str
    timestamp_field: str
    features: tuple[Feature, ...]
    owner: str
    ttl_seconds: int | None = None
    online: bool = True
    sql: str | None = None
    description: str = ""
    tags: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "entities", _tuple(self.entities))
        object.__setattr__(self, "features", _tuple(self.features))
        object.__setattr__(self, "source", normalize_source(self.source))
        if isinstance(self.tags, Mapping):
            items = sorted(self.tags.items(), key=lambda kv: str(kv[0]))
            object.__setattr__(self, "tags", Tags(items))

    def feature(self, name: str) -> Feature | None:
        """The feature called ``name``, or None."""
        return next((f for f in self.features if f.name == name), None)

    @property
    def upstream_view(self) -> str | None:
        """The view this one reads from (``view:OTHER``), or None for a dataset."""
        if isinstance(self.source, str) and self.source.startswith("view:"):
            return self.source.removeprefix("view:")
        return None


@dataclass(frozen=True, slots=True)
class FeatureService:
    """A named set of features a model reads: ``view:feature`` or ``view:*`` (all of them)."""

    name: str
    features: tuple[str, ...]
    owner: str
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", _tuple(self.features))


# ---------------------------------------------------------------- field rules (JSON and objects)


@dataclass(frozen=True, slots=True)
class _Field:
    check: Callable[[Any], bool]
    expected: str
    required: bool = False


def _is_text(v: Any) -> bool:
    return isinstance(v, str)


def _is_texts(v: Any) -> bool:
    return isinstance(v, list | tuple) and all(isinstance(x, str) for x in v)


def _is_list(v: Any) -> bool:
    return isinstance(v, list | tuple)


def _is_ttl(v: Any) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool))


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _is_sql(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _is_tags(v: Any) -> bool:
    return isinstance(v, Mapping) and all(
        isinstance(k, str) and isinstance(x, str) for k, x in v.items()
    )


_TEXT = _Field(_is_text, "text", required=True)
_DESCRIPTION = _Field(_is_text, "text")
_ENTITY_FIELDS = {
    "name": _TEXT,
    "join_keys": _Field(_is_texts, "a list of column names", required=True),
    "description": _DESCRIPTION,
}
_FEATURE_FIELDS = {"name": _TEXT, "dtype": _TEXT}
_VIEW_FIELDS = {
    "name": _TEXT,
    "entities": _Field(_is_texts, "a list of entity names", required=True),
    "source": _TEXT,
    "timestamp_field": _TEXT,
    "features": _Field(_is_list, "a list of features", required=True),
    "owner": _TEXT,
    "ttl_seconds": _Field(_is_ttl, "a whole number of seconds, or null for no expiry"),
    "online": _Field(_is_bool, "true or false"),
    "sql": _Field(_is_sql, "one SELECT statement, or null"),
    "description": _DESCRIPTION,
    "tags": _Field(_is_tags, "a mapping of text to text"),
}
_SERVICE_FIELDS = {
    "name": _TEXT,
    "features": _Field(_is_texts, "a list of 'view:feature' or 'view:*'", required=True),
    "owner": _TEXT,
    "description": _DESCRIPTION,
}
_SECTIONS = ("entities", "feature_views", "feature_services")
_LIMITS = {"entities": MAX_ENTITIES, "feature_views": MAX_VIEWS, "feature_services": MAX_SERVICES}


def _where(section: str, index: int, raw: Any) -> str:
    name = raw.get("name") if isinstance(raw, Mapping) else None
    return f"{section}[{index}]" + (f" ({_shown(name)})" if isinstance(name, str) else "")


def _fields(where: str, raw: Any, spec: Mapping[str, _Field]) -> dict[str, Any]:
    """``raw``'s keys and values, checked against ``spec``: no unknown key, every required
    one, each value of the right JSON type."""
    if not isinstance(raw, Mapping):
        raise InvalidParameter(f"{where}: expected a mapping with the keys {', '.join(spec)}.")
    for key in raw:
        if key not in spec:
            raise InvalidParameter(
                f"{where}: unknown key {_shown(key)}; the keys are {', '.join(spec)}."
            )
    missing = [key for key, rule in spec.items() if rule.required and key not in raw]
    if missing:
        raise InvalidParameter(f"{where}: missing {', '.join(missing)}.")
    for key, value in raw.items():
        if not spec[key].check(value):
            raise InvalidParameter(f"{where}: {key} must be {spec[key].expected}.")
    return dict(raw)


def _entity_from(where: str, raw: Any) -> Entity:
    return Entity(**_fields(where, raw, _ENTITY_FIELDS))


def _view_from(where: str, raw: Any) -> FeatureView:
    values = _fields(where, raw, _VIEW_FIELDS)
    if len(values["features"]) > MAX_FEATURES:
        raise InvalidParameter(f"{where}: at most {MAX_FEATURES} features per view.")
    values["features"] = tuple(
        Feature(**_fields(f"{where}.features[{i}]", f, _FEATURE_FIELDS))
        for i, f in enumerate(values["features"])
    )
    return FeatureView(**values)


def _service_from(where: str, raw: Any) -> FeatureService:
    return FeatureService(**_fields(where, raw, _SERVICE_FIELDS))


_READERS: dict[str, Callable[[str, Any], Any]] = {
    "entities": _entity_from,
    "feature_views": _view_from,
    "feature_services": _service_from,
}


def _entity_json(entity: Entity) -> dict[str, Any]:
    return {
        "name": entity.name,
        "join_keys": list(entity.join_keys),
        "description": entity.description,
    }


def _view_json(view: FeatureView) -> dict[str, Any]:
    return {
        "name": view.name,
        "entities": list(view.entities),
        "source": view.source,
        "timestamp_field": view.timestamp_field,
        "features": [{"name": f.name, "dtype": f.dtype} for f in view.features],
        "owner": view.owner,
        "ttl_seconds": view.ttl_seconds,
        "online": view.online,
        "sql": view.sql,
        "description": view.description,
        "tags": dict(sorted(view.tags.items())),
    }


def _service_json(service: FeatureService) -> dict[str, Any]:
    return {
        "name": service.name,
        "features": list(service.features),
        "owner": service.owner,
        "description": service.description,
    }


# ---------------------------------------------------------------- YAML


def _yaml_size(value: Any, depth: int, sizes: dict[int, int], open_: set[int]) -> int:
    """How many values ``value`` expands to, aliases counted at each use; computed once per
    distinct object, so an alias bomb is measured without being expanded."""
    if not isinstance(value, dict | list):
        return 1
    key = id(value)
    if key in sizes:
        return sizes[key]
    if key in open_:
        raise InvalidParameter("the YAML refers to itself (a recursive alias); remove it.")
    if depth > MAX_YAML_DEPTH:
        raise InvalidParameter(f"the YAML nests deeper than {MAX_YAML_DEPTH} levels.")
    open_.add(key)
    children = list(value.items()) if isinstance(value, dict) else [(None, v) for v in value]
    total = 1
    for child_key, child in children:
        total += _yaml_size(child_key, depth + 1, sizes, open_)
        total += _yaml_size(child, depth + 1, sizes, open_)
        if total > MAX_YAML_VALUES:
            raise InvalidParameter(
                f"the YAML expands to more than {MAX_YAML_VALUES:,} values (through aliases?); "
                "write the definitions out or split them."
            )
    open_.discard(key)
    sizes[key] = total
    return total


def _load_yaml(text: str) -> Any:
    import yaml  # type: ignore[import-untyped,unused-ignore]  # only the YAML reader needs it

    if len(text.encode("utf-8", errors="surrogatepass")) > MAX_YAML_BYTES:
        raise InvalidParameter(
            f"the definitions YAML is larger than {MAX_YAML_BYTES // (1024 * 1024)} MiB; "
            "split it into several files."
        )
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InvalidParameter(f"the definitions are not valid YAML{where}.") from None
    except RecursionError:
        raise InvalidParameter(f"the YAML nests deeper than {MAX_YAML_DEPTH} levels.") from None
    _yaml_size(document, 0, {}, set())
    return {} if document is None else document


# ---------------------------------------------------------------- the set of definitions


def _by_name(items: Iterable[Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for item in items:
        if isinstance(getattr(item, "name", None), str):
            found.setdefault(item.name, item)
    return found


@dataclass(frozen=True, slots=True)
class Definitions:
    """A set of entities, feature views and feature services: what a repository declares or
    what the server holds. Building one checks nothing; :meth:`validate` checks every rule."""

    entities: tuple[Entity, ...] = ()
    views: tuple[FeatureView, ...] = ()
    services: tuple[FeatureService, ...] = ()

    def __post_init__(self) -> None:
        for name in ("entities", "views", "services"):
            object.__setattr__(self, name, _tuple(getattr(self, name)))

    @classmethod
    def from_yaml(cls, text: str) -> Definitions:
        """Read one YAML document with the (optional) lists ``entities``, ``feature_views``
        and ``feature_services``; the module's docstring shows the form.

        Read with ``yaml.safe_load``; the document is refused when larger than 4 MiB, when it
        expands (through aliases) to more than :data:`MAX_YAML_VALUES` values, or nests too
        deep. Nothing is validated beyond the form (:meth:`validate` does that).

        Raises:
            InvalidParameter: not YAML, too large, an unknown or missing key (named, with
                where it is), or a value of the wrong type.
        """
        return cls.from_json(_load_yaml(text))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Definitions:
        """Read the JSON form (:meth:`to_json`'s, or any order of the same keys).

        Raises:
            InvalidParameter: as :meth:`from_yaml`, naming the key and where it is.
        """
        if not isinstance(data, Mapping):
            raise InvalidParameter(
                "the definitions are a mapping with the lists entities, feature_views and "
                "feature_services."
            )
        for key in data:
            if key not in _SECTIONS:
                raise InvalidParameter(
                    f"unknown key {_shown(key)} at the top level; the keys are "
                    f"{', '.join(_SECTIONS)}."
                )
        read: dict[str, tuple[Any, ...]] = {}
        for section in _SECTIONS:
            raw = data.get(section)
            raw = [] if raw is None else raw
            if not isinstance(raw, list | tuple):
                raise InvalidParameter(f"{section} must be a list.")
            if len(raw) > _LIMITS[section]:
                raise InvalidParameter(f"{section}: at most {_LIMITS[section]} are allowed.")
            reader = _READERS[section]
            read[section] = tuple(
                reader(_where(section, i, item), item) for i, item in enumerate(raw)
            )
        return cls(read["entities"], read["feature_views"], read["feature_services"])

    def to_json(self) -> dict[str, Any]:
        """The canonical JSON form: each list sorted by name (a view's features and a
        service's feature list keep their declared order); :meth:`from_json` reads it back to
        equal definitions."""
        return {
            "entities": [_entity_json(e) for e in sorted(self.entities, key=_name_key)],
            "feature_views": [_view_json(v) for v in sorted(self.views, key=_name_key)],
            "feature_services": [_service_json(s) for s in sorted(self.services, key=_name_key)],
        }

    def digest(self) -> str:
        """sha256 (hex) of the canonical JSON: equal definitions, equal digests."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def merged(self, other: Definitions) -> Definitions:
        """The union of both sets; an object defined the same way in both appears once.

        Raises:
            InvalidParameter: a name defined in both, differently.
        """
        parts = []
        for label, mine, theirs in (
            ("entity", self.entities, other.entities),
            ("feature view", self.views, other.views),
            ("feature service", self.services, other.services),
        ):
            known = _by_name(mine)
            extra = []
            for item in theirs:
                same = known.get(item.name)
                if same is None:
                    extra.append(item)
                    known[item.name] = item
                elif same != item:
                    raise InvalidParameter(
                        f"{label} {_shown(item.name)} is defined twice, differently; keep one."
                    )
            parts.append((*mine, *extra))
        return Definitions(*parts)

    def validate(self) -> None:
        """Check every rule (names, references, types, sources and cycles, SQL, teams,
        sizes).

        Raises:
            InvalidParameter: listing every problem (the first :data:`MAX_PROBLEMS`), each
                naming the object and what to fix.
        """
        found = problems(self)
        if found:
            raise InvalidParameter(format_problems(found))

    def entity(self, name: str) -> Entity:
        """The entity called ``name``. Raises NotFound."""
        return _find(self.entities, "entity", name)

    def view(self, name: str) -> FeatureView:
        """The feature view called ``name``. Raises NotFound."""
        return _find(self.views, "feature view", name)

    def service(self, name: str) -> FeatureService:
        """The feature service called ``name``. Raises NotFound."""
        return _find(self.services, "feature service", name)

    def join_keys(self, view: str) -> tuple[str, ...]:
        """The view's join keys: its entities' join keys, in order. Raises NotFound (the
        view or one of its entities)."""
        keys: list[str] = []
        for entity in self.view(view).entities:
            keys.extend(self.entity(entity).join_keys)
        return tuple(keys)

    def resolve_service(self, name: str) -> tuple[tuple[str, str], ...]:
        """The service's ``(view, feature)`` pairs in declared order, ``view:*`` expanded to
        the view's features, each pair once.

        Raises:
            NotFound: the service, or a view it names.
            InvalidParameter: a malformed reference or a feature the view lacks.
        """
        pairs: dict[tuple[str, str], None] = {}
        for ref in self.service(name).features:
            view_name, sep, feature = ref.partition(":")
            if not sep or not feature:
                raise InvalidParameter(f"{_shown(ref)}: write 'view:feature' or 'view:*'.")
            view = self.view(view_name)
            if feature == "*":
                pairs.update(((view_name, f.name), None) for f in view.features)
            elif view.feature(feature) is None:
                raise InvalidParameter(
                    f"feature view {_shown(view_name)} has no feature {_shown(feature)}."
                )
            else:
                pairs[(view_name, feature)] = None
        return tuple(pairs)

    def upstream(self, view: str) -> tuple[str, ...]:
        """The views ``view`` reads from through ``view:OTHER`` sources, nearest first.

        Raises:
            NotFound: the view, or a view in the chain.
            InvalidParameter: the chain is a cycle.
        """
        chain: list[str] = []
        current = self.view(view)
        while (parent := current.upstream_view) is not None:
            if parent == view or parent in chain:
                cycle = " -> ".join([view, *chain, parent])
                raise InvalidParameter(f"feature views read from each other: {cycle}.")
            chain.append(parent)
            current = self.view(parent)
        return tuple(chain)


def _name_key(item: Any) -> str:
    return str(item.name)


_Named = TypeVar("_Named", Entity, FeatureView, FeatureService)


def _find(items: Iterable[_Named], kind: str, name: str) -> _Named:
    for item in items:
        if item.name == name:
            return item
    raise NotFound(f"no {kind} called {_shown(name)} is defined.")


# ---------------------------------------------------------------- the rules

#: A problem: the object it is about (``feature view 'x'``) and what to fix.
Problem = tuple[str, str]


def format_problems(found: list[Problem]) -> str:
    """One message listing the first :data:`MAX_PROBLEMS` problems, and how many more."""
    count = len(found)
    noun = "problem" if count == 1 else "problems"
    lines = [f"the feature definitions have {count} {noun}:"]
    lines += [f"- {subject}: {what}" for subject, what in found[:MAX_PROBLEMS]]
    if count > MAX_PROBLEMS:
        lines.append(f"- ... and {count - MAX_PROBLEMS} more; fix these first.")
    return "\n".join(lines)


def problems(defs: Definitions) -> list[Problem]:
    """Every rule :meth:`Definitions.validate` checks, as a list of problems (empty: valid)."""
    found: list[Problem] = []
    _size_problems(defs, found)
    _unique_problems(defs, found)
    entities = _by_name(e for e in defs.entities if isinstance(e, Entity))
    views = _by_name(v for v in defs.views if isinstance(v, FeatureView))
    for entity in defs.entities:
        _entity_problems(entity, found)
    for view in defs.views:
        _view_problems(view, entities, views, found)
    _cycle_problems(views, found)
    for service in defs.services:
        _service_problems(service, views, found)
    return found


def subject_of(kind: str, name: object) -> str:
    """What a problem is about: ``feature view 'x'`` (``kind`` as the messages write it)."""
    return f"{kind} {_shown(name)}"


def _size_problems(defs: Definitions, found: list[Problem]) -> None:
    for label, items, limit in (
        ("entities", defs.entities, MAX_ENTITIES),
        ("feature views", defs.views, MAX_VIEWS),
        ("feature services", defs.services, MAX_SERVICES),
    ):
        if len(items) > limit:
            found.append(("the definitions", f"{len(items)} {label}; at most {limit} allowed"))


def _unique_problems(defs: Definitions, found: list[Problem]) -> None:
    for kind, items, cls in (
        ("entity", defs.entities, Entity),
        ("feature view", defs.views, FeatureView),
        ("feature service", defs.services, FeatureService),
    ):
        seen: set[str] = set()
        for item in items:
            if not isinstance(item, cls):
                found.append(("the definitions", f"{_shown(item)} is not a {cls.__name__}"))
                continue
            problem = _name_problem(kind, item.name)
            if problem is not None:
                found.append((subject_of(kind, item.name), problem))
            elif item.name in seen:
                found.append(
                    (
                        subject_of(kind, item.name),
                        f"defined more than once; {kind} names are unique",
                    )
                )
            seen.add(item.name)


def _type_problems(subject: str, item: Any, spec: Mapping[str, _Field]) -> list[Problem]:
    return [
        (subject, f"{key} must be {rule.expected}")
        for key, rule in spec.items()
        if not rule.check(getattr(item, key))
    ]


def _text_problems(subject: str, item: Any, found: list[Problem]) -> None:
    if len(item.description) > MAX_DESCRIPTION:
        found.append((subject, f"the description is longer than {MAX_DESCRIPTION} characters"))
    owner = getattr(item, "owner", None)  # entities have no owner
    if isinstance(owner, str) and not _TEAM.fullmatch(owner):
        found.append(
            (
                subject,
                f"owner {_shown(item.owner)} is not a team name: lowercase letters, digits, "
                "'.', '-' and '_' (1-64 characters)",
            )
        )


def _entity_problems(entity: Entity, found: list[Problem]) -> None:
    if not isinstance(entity, Entity):
        return
    subject = subject_of("entity", entity.name)
    typed = _type_problems(subject, entity, _ENTITY_FIELDS)
    if typed:
        found.extend(typed)
        return
    if not entity.join_keys:
        found.append((subject, "list at least one join key (the columns that identify one)"))
    for key in entity.join_keys:
        problem = _name_problem("join key", key)
        if problem is not None:
            found.append((subject, problem))
    if len(set(entity.join_keys)) != len(entity.join_keys):
        found.append((subject, "a join key is listed twice"))
    _text_problems(subject, entity, found)


def _view_problems(
    view: FeatureView,
    entities: Mapping[str, Entity],
    views: Mapping[str, FeatureView],
    found: list[Problem],
) -> None:
    if not isinstance(view, FeatureView):
        return
    subject = subject_of("feature view", view.name)
    typed = _type_problems(subject, view, _VIEW_FIELDS)
    if typed:
        found.extend(typed)
        return
    keys = _view_key_problems(subject, view, entities, found)
    _feature_problems(subject, view, keys, found)
    _source_problems(subject, view, views, found)
    _sql_problems(subject, view.sql, found)
    if view.ttl_seconds is not None and not 0 < view.ttl_seconds <= MAX_TTL_SECONDS:
        found.append(
            (
                subject,
                f"ttl_seconds must be positive and at most {MAX_TTL_SECONDS} (10 years), or "
                "null for no expiry",
            )
        )
    if len(view.tags) > MAX_TAGS or any(
        not 0 < len(k) <= MAX_TAG_KEY or len(v) > MAX_TAG_VALUE for k, v in view.tags.items()
    ):
        found.append(
            (
                subject,
                f"at most {MAX_TAGS} tags, keys 1 to {MAX_TAG_KEY} characters, values at most "
                f"{MAX_TAG_VALUE}",
            )
        )
    _text_problems(subject, view, found)


def _view_key_problems(
    subject: str, view: FeatureView, entities: Mapping[str, Entity], found: list[Problem]
) -> set[str]:
    """Check the view's entities; return its join keys (those known)."""
    if not view.entities:
        found.append((subject, "list at least one entity (their join keys key the rows)"))
    if len(view.entities) > MAX_VIEW_ENTITIES:
        found.append((subject, f"at most {MAX_VIEW_ENTITIES} entities per view"))
    if len(set(view.entities)) != len(view.entities):
        found.append((subject, "an entity is listed twice"))
    keys: list[str] = []
    for name in view.entities:
        entity = entities.get(name)
        if entity is None:
            found.append((subject, f"entity {_shown(name)} is not defined; define it or fix"))
        elif _is_texts(entity.join_keys):
            keys.extend(entity.join_keys)
    if len(set(keys)) != len(keys):
        found.append((subject, f"its entities share a join key ({', '.join(keys)})"))
    problem = _name_problem("timestamp field", view.timestamp_field)
    if problem is not None:
        found.append((subject, problem))
    elif view.timestamp_field in keys:
        found.append((subject, "the timestamp field cannot be a join key"))
    return set(keys)


def _feature_problems(
    subject: str, view: FeatureView, keys: set[str], found: list[Problem]
) -> None:
    if not view.features:
        found.append((subject, "list at least one feature"))
    if len(view.features) > MAX_FEATURES:
        found.append((subject, f"{len(view.features)} features; at most {MAX_FEATURES}"))
    seen: set[str] = set()
    for feature in view.features:
        if not isinstance(feature, Feature) or _type_problems(subject, feature, _FEATURE_FIELDS):
            found.append((subject, f"{_shown(feature)} is not a Feature(name, dtype)"))
            continue
        problem = _name_problem("feature", feature.name)
        if problem is not None:
            found.append((subject, problem))
        elif feature.name in seen:
            found.append((subject, f"feature {_shown(feature.name)} is listed twice"))
        elif feature.name in keys or feature.name == view.timestamp_field:
            found.append(
                (
                    subject,
                    f"feature {_shown(feature.name)} has the name of a join key or of the "
                    "timestamp field; rename it",
                )
            )
        if feature.dtype not in FEATURE_TYPES:
            found.append(
                (
                    subject,
                    f"feature {_shown(feature.name)} has type {_shown(feature.dtype)}; the "
                    f"types are {', '.join(FEATURE_TYPES)}",
                )
            )
        seen.add(feature.name)


def _source_problems(
    subject: str, view: FeatureView, views: Mapping[str, FeatureView], found: list[Problem]
) -> None:
    parent = view.upstream_view
    if parent is None:
        body = view.source.removeprefix("data:")
        try:
            parse_ref(body)
        except InvalidParameter as exc:
            found.append(
                (
                    subject,
                    f"source {_shown(view.source)} is not a dataset reference (NAME, NAME@alias "
                    f"or NAME/3) nor view:NAME: {exc.message}",
                )
            )
        return
    upstream = views.get(parent)
    if upstream is None:
        found.append((subject, f"source view {_shown(parent)} is not defined"))
    elif parent != view.name and set(upstream.entities) != set(view.entities):
        found.append(
            (
                subject,
                f"it reads feature view {_shown(parent)}, so it needs the same entities "
                f"({', '.join(upstream.entities)}), not ({', '.join(view.entities)})",
            )
        )


def _sql_problems(subject: str, sql: str | None, found: list[Problem]) -> None:
    if sql is None:
        return
    if len(sql.encode("utf-8", errors="surrogatepass")) > MAX_SQL_BYTES:
        found.append((subject, f"the SQL is longer than {MAX_SQL_BYTES // 1024} KiB"))
        return
    from shamal.datasets import check_select  # loads DuckDB: only when there is SQL

    try:
        check_select(sql)
    except InvalidParameter as exc:
        found.append((subject, exc.message))
        return
    if not _READS_SOURCE.search(sql):
        found.append((subject, "the SQL must read the relation named source"))


def _cycle_problems(views: Mapping[str, FeatureView], found: list[Problem]) -> None:
    """Each cycle among ``view:`` sources once, as ``a -> b -> a`` (from its least name)."""
    reported: set[str] = set()
    for start in sorted(views):
        path: list[str] = []
        current: str | None = start
        while current is not None and current in views and current not in path:
            path.append(current)
            current = views[current].upstream_view
        if current is None or current not in path:
            continue
        cycle = path[path.index(current) :]
        first = min(cycle)
        at = cycle.index(first)
        ordered = cycle[at:] + cycle[:at]
        if first not in reported:
            reported.add(first)
            text = " -> ".join([*ordered, first])
            found.append((subject_of("feature view", first), f"views read from each other: {text}"))


def _service_problems(
    service: FeatureService, views: Mapping[str, FeatureView], found: list[Problem]
) -> None:
    if not isinstance(service, FeatureService):
        return
    subject = subject_of("feature service", service.name)
    typed = _type_problems(subject, service, _SERVICE_FIELDS)
    if typed:
        found.extend(typed)
        return
    if not service.features:
        found.append((subject, "list at least one feature ('view:feature' or 'view:*')"))
    if len(service.features) > MAX_FEATURES:
        found.append((subject, f"at most {MAX_FEATURES} features per service"))
    if len(set(service.features)) != len(service.features):
        found.append((subject, "a feature is listed twice"))
    for ref in service.features:
        view_name, sep, feature = ref.partition(":")
        view = views.get(view_name)
        if not sep or not feature:
            found.append((subject, f"{_shown(ref)}: write 'view:feature' or 'view:*'"))
        elif view is None:
            found.append(
                (subject, f"{_shown(ref)}: feature view {_shown(view_name)} is not defined")
            )
        elif feature != "*" and not any(
            isinstance(f, Feature) and f.name == feature for f in view.features
        ):
            found.append(
                (subject, f"{_shown(ref)}: feature view {_shown(view_name)} has no such feature")
            )
    _text_problems(subject, service, found)
