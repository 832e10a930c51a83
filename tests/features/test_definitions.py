"""Feature definitions: the YAML and JSON forms, every validation rule, lookups."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shamal.errors import InvalidParameter, NotFound
from shamal.features._definitions import (
    FEATURE_TYPES,
    MAX_PROBLEMS,
    TEAM_PATTERN,
    Definitions,
    Entity,
    Feature,
    FeatureService,
    FeatureView,
    check_name,
)

YAML = """
entities:
  - name: customer
    join_keys: [customer_id]
    description: a paying customer
  - {name: merchant, join_keys: [merchant_id]}
feature_views:
  - name: customer_stats
    entities: [customer]
    source: customers@prod
    timestamp_field: event_time
    ttl_seconds: 86400
    owner: risk
    sql: SELECT customer_id, event_time, sum(amount) AS total FROM source GROUP BY ALL
    features:
      - {name: total, dtype: float64}
      - {name: orders, dtype: int64}
    tags: {tier: gold, area: fraud}
  - name: customer_flags
    entities: [customer]
    source: view:customer_stats
    timestamp_field: event_time
    owner: risk
    online: false
    features:
      - {name: big_spender, dtype: bool}
  - name: merchant_stats
    entities: [merchant]
    source: data:merchants/3
    timestamp_field: ts
    owner: payments.core
    features:
      - {name: country, dtype: string}
feature_services:
  - name: fraud_model
    features: ["customer_stats:total", "customer_flags:*"]
    owner: risk
    description: what the fraud model reads
"""


def _defs() -> Definitions:
    return Definitions.from_yaml(YAML)


def _json() -> dict[str, Any]:
    return _defs().to_json()


def _view(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in data["feature_views"] if v["name"] == name)


def _problems_of(data: dict[str, Any]) -> str:
    with pytest.raises(InvalidParameter) as caught:
        Definitions.from_json(data).validate()
    return caught.value.message


# ---------------------------------------------------------------- forms


def test_yaml_reads_every_field_and_normalizes_sources() -> None:
    defs = _defs()
    defs.validate()
    stats = defs.view("customer_stats")
    assert stats.source == "data:customers@prod"
    assert stats.ttl_seconds == 86400
    assert stats.features == (Feature("total", "float64"), Feature("orders", "int64"))
    assert dict(stats.tags) == {"area": "fraud", "tier": "gold"}
    assert defs.view("merchant_stats").source == "data:merchants/3"
    assert defs.view("customer_flags").online is False
    assert defs.view("customer_flags").ttl_seconds is None
    assert defs.entity("customer").description == "a paying customer"


def test_yaml_round_trips_through_json() -> None:
    defs = _defs()
    data = defs.to_json()
    assert [v["name"] for v in data["feature_views"]] == sorted(
        ["customer_stats", "customer_flags", "merchant_stats"]
    )
    again = Definitions.from_json(data)
    assert again.to_json() == data
    assert again.digest() == defs.digest()
    assert {v.name: v for v in again.views} == {v.name: v for v in defs.views}


def test_digest_ignores_declaration_order_but_not_content() -> None:
    defs = _defs()
    shuffled = Definitions(defs.entities[::-1], defs.views[::-1], defs.services)
    assert shuffled.digest() == defs.digest()
    data = _json()
    _view(data, "customer_stats")["ttl_seconds"] = 60
    assert Definitions.from_json(data).digest() != defs.digest()


def test_source_forms_are_normalized() -> None:
    def source(text: str) -> str:
        return FeatureView("v", ("e",), text, "ts", (Feature("f", "int64"),), "t").source

    assert source("customers") == "data:customers"
    assert source("data:/customers/3") == "data:customers/3"
    assert source("customers@latest") == "data:customers"
    assert source("view:other") == "view:other"
    assert source("Not A Ref!") == "Not A Ref!"  # left for validate to report


def test_views_are_hashable_and_tags_read_only() -> None:
    view = _defs().view("customer_stats")
    assert hash(view) == hash(Definitions.from_yaml(YAML).view("customer_stats"))
    assert view != dataclasses.replace(view, tags={"x": "y"})
    changes: list[Callable[[dict[str, str]], object]] = [
        lambda t: t.__setitem__("tier", "silver"),
        lambda t: t.update(tier="silver"),
        lambda t: t.pop("tier"),
        lambda t: t.clear(),
    ]
    for change in changes:
        with pytest.raises(TypeError, match="read-only"):
            change(view.tags)
    assert view.tags == {"tier": "gold", "area": "fraud"}
    assert list(view.tags) == ["area", "tier"]


def test_definitions_pickle_copy_and_serialize() -> None:
    defs = _defs()
    assert pickle.loads(pickle.dumps(defs)) == defs
    assert copy.deepcopy(defs) == defs
    view = defs.view("customer_stats")
    assert dataclasses.asdict(view)["tags"] == {"area": "fraud", "tier": "gold"}
    assert json.loads(json.dumps(view.tags)) == {"area": "fraud", "tier": "gold"}


def test_an_empty_document_is_empty_definitions() -> None:
    assert Definitions.from_yaml("") == Definitions()
    assert Definitions.from_yaml("entities: []\n").to_json() == {
        "entities": [],
        "feature_views": [],
        "feature_services": [],
    }


@pytest.mark.parametrize(
    ("path", "where"),
    [
        ((), "at the top level"),
        (("entities", 0), "entities[0] ('customer')"),
        (("feature_views", 0), "feature_views[0] ('customer_flags')"),
        (("feature_views", 0, "features", 0), "feature_views[0] ('customer_flags').features[0]"),
        (("feature_services", 0), "feature_services[0] ('fraud_model')"),
    ],
)
def test_an_unknown_key_is_named_with_where_it_is(path: tuple[Any, ...], where: str) -> None:
    data = _json()
    target: Any = data
    for step in path:
        target = target[step]
    target["colour"] = "blue"
    with pytest.raises(InvalidParameter, match="unknown key 'colour'") as caught:
        Definitions.from_json(data)
    assert where in caught.value.message


def test_unknown_yaml_keys_are_refused() -> None:
    with pytest.raises(InvalidParameter, match=r"feature_views\[0\].*unknown key 'ttl'"):
        Definitions.from_yaml(YAML.replace("ttl_seconds: 86400", "ttl: 86400"))


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("ttl_seconds", "7d", "ttl_seconds must be a whole number"),
        ("ttl_seconds", True, "ttl_seconds must be a whole number"),
        ("online", "yes", "online must be true or false"),
        ("entities", "customer", "entities must be a list"),
        ("tags", {"a": 1}, "tags must be a mapping of text to text"),
        ("name", 3, "name must be text"),
        ("features", [{"name": "x"}], "missing dtype"),
    ],
)
def test_wrong_types_are_named(field: str, value: Any, expected: str) -> None:
    data = _json()
    data["feature_views"][0][field] = value
    with pytest.raises(InvalidParameter, match=expected):
        Definitions.from_json(data)


def test_missing_required_keys_are_named() -> None:
    with pytest.raises(InvalidParameter, match="missing join_keys"):
        Definitions.from_yaml("entities: [{name: customer}]")
    with pytest.raises(InvalidParameter, match="feature_services must be a list"):
        Definitions.from_yaml("feature_services: {a: 1}")


def test_yaml_that_does_not_parse_names_the_line() -> None:
    with pytest.raises(InvalidParameter, match="not valid YAML at line"):
        Definitions.from_yaml("entities:\n  - [unclosed\n")


def test_a_billion_laughs_document_is_refused_quickly() -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 10):
        refs = ", ".join([f"*a{level - 1}"] * 9)
        lines.append(f"a{level}: &a{level} [{refs}]")
    started = time.monotonic()
    with pytest.raises(InvalidParameter, match="expands to more than"):
        Definitions.from_yaml("\n".join(lines))
    assert time.monotonic() - started < 5


def test_a_recursive_alias_is_refused() -> None:
    with pytest.raises(InvalidParameter, match="recursive alias"):
        Definitions.from_yaml("entities: &e [*e]")


def test_small_aliases_are_fine() -> None:
    text = YAML.replace("owner: risk\n    sql", "owner: &team risk\n    sql").replace(
        "owner: risk\n    description", "owner: *team\n    description"
    )
    assert Definitions.from_yaml(text) == _defs()


def test_deep_nesting_and_huge_documents_are_refused() -> None:
    with pytest.raises(InvalidParameter, match="nests deeper"):
        Definitions.from_yaml("entities: " + "[" * 40 + "]" * 40)
    with pytest.raises(InvalidParameter, match="nests deeper"):
        Definitions.from_yaml("entities: " + "[" * 5000 + "]" * 5000)
    with pytest.raises(InvalidParameter, match="larger than 4 MiB"):
        Definitions.from_yaml("# " + "x" * (4 * 1024 * 1024))


def test_too_many_objects_are_refused_while_reading() -> None:
    data = {"feature_services": [{"name": f"s{i}"} for i in range(101)]}
    with pytest.raises(InvalidParameter, match="at most 100"):
        Definitions.from_json(data)


# ---------------------------------------------------------------- validation


def test_the_example_is_valid() -> None:
    _defs().validate()


def test_check_name_states_the_rule() -> None:
    check_name("feature", "total_7d")
    bad: Any
    for bad in ("Total", "7d", "_x", "a-b", "", "x" * 64, "total\n", 7):
        with pytest.raises(InvalidParameter, match="lowercase letter followed by up to 62"):
            check_name("feature", bad)


def test_team_rule_is_the_security_packages() -> None:
    from shamal.security import NAME_PATTERN

    assert TEAM_PATTERN == NAME_PATTERN


def _rule_cases() -> list[tuple[str, Any, str]]:
    """(what, a change to the example's JSON, the problem it must report)."""

    def view(target: str, **changes: Any) -> Any:
        return lambda d: _view(d, target).update(changes)

    return [
        ("bad entity name", lambda d: d["entities"][0].update(name="Customer"), "entity name"),
        ("bad view name", view("merchant_stats", name="merchant-stats"), "feature view name"),
        (
            "duplicate view",
            lambda d: d["feature_views"].append(copy.deepcopy(d["feature_views"][0])),
            "defined more than once",
        ),
        ("unknown entity", view("merchant_stats", entities=["shop"]), "'shop' is not defined"),
        ("no entity", view("merchant_stats", entities=[]), "at least one entity"),
        (
            "entity twice",
            view("merchant_stats", entities=["merchant", "merchant"]),
            "an entity is listed twice",
        ),
        ("no join key", lambda d: d["entities"][0].update(join_keys=[]), "at least one join key"),
        (
            "bad join key",
            lambda d: d["entities"][0].update(join_keys=["Customer ID"]),
            "join key name",
        ),
        (
            "shared join key",
            lambda d: (
                d["entities"][1].update(join_keys=["customer_id"])
                or _view(d, "merchant_stats").update(entities=["customer", "merchant"])
            ),
            "share a join key",
        ),
        (
            "duplicate feature",
            view("merchant_stats", features=[{"name": "a", "dtype": "bool"}] * 2),
            "feature 'a' is listed twice",
        ),
        (
            "unknown dtype",
            view("merchant_stats", features=[{"name": "a", "dtype": "decimal"}]),
            "type 'decimal'",
        ),
        (
            "feature named like a join key",
            view("merchant_stats", features=[{"name": "merchant_id", "dtype": "string"}]),
            "name of a join key or of the timestamp field",
        ),
        (
            "feature named like the timestamp",
            view("merchant_stats", features=[{"name": "ts", "dtype": "timestamp"}]),
            "name of a join key or of the timestamp field",
        ),
        ("no feature", view("merchant_stats", features=[]), "at least one feature"),
        (
            "bad feature name",
            view("merchant_stats", features=[{"name": "A", "dtype": "bool"}]),
            "feature name",
        ),
        ("zero ttl", view("merchant_stats", ttl_seconds=0), "ttl_seconds must be positive"),
        (
            "ttl over ten years",
            view("merchant_stats", ttl_seconds=11 * 366 * 86400),
            "ttl_seconds must be positive",
        ),
        (
            "bad dataset ref",
            view("merchant_stats", source="merchants/0"),
            "not a dataset reference",
        ),
        ("bad alias", view("merchant_stats", source="merchants@Prod!"), "not a dataset reference"),
        (
            "unknown source view",
            view("merchant_stats", source="view:nope"),
            "'nope' is not defined",
        ),
        (
            "other entities than the source view",
            view("merchant_stats", source="view:customer_stats"),
            "needs the same entities",
        ),
        ("sql not a select", view("customer_stats", sql="DELETE FROM source"), "must be a SELECT"),
        ("sql two statements", view("customer_stats", sql="SELECT 1; SELECT 2"), "exactly one"),
        ("sql not parsing", view("customer_stats", sql="SELEC * FRM source"), "does not parse"),
        ("sql ignores source", view("customer_stats", sql="SELECT 1 AS total"), "named source"),
        (
            "sql too long",
            view("customer_stats", sql="SELECT * FROM source -- " + "x" * 70_000),
            "longer than 64 KiB",
        ),
        ("bad owner", view("merchant_stats", owner="Payments Team"), "is not a team name"),
        ("owner with a newline", view("merchant_stats", owner="payments\n"), "not a team name"),
        (
            "bad service owner",
            lambda d: d["feature_services"][0].update(owner=""),
            "is not a team name",
        ),
        (
            "bad timestamp field",
            view("merchant_stats", timestamp_field="Event Time"),
            "timestamp field name",
        ),
        (
            "timestamp is a join key",
            view("merchant_stats", timestamp_field="merchant_id"),
            "timestamp field cannot be a join key",
        ),
        (
            "service reads unknown view",
            lambda d: d["feature_services"][0].update(features=["nope:total"]),
            "feature view 'nope' is not defined",
        ),
        (
            "service reads unknown feature",
            lambda d: d["feature_services"][0].update(features=["customer_stats:nope"]),
            "has no such feature",
        ),
        (
            "service ref malformed",
            lambda d: d["feature_services"][0].update(features=["customer_stats"]),
            "write 'view:feature' or 'view:*'",
        ),
        (
            "service feature twice",
            lambda d: d["feature_services"][0].update(features=["customer_flags:*"] * 2),
            "a feature is listed twice",
        ),
        (
            "service without features",
            lambda d: d["feature_services"][0].update(features=[]),
            "at least one feature",
        ),
        (
            "long description",
            lambda d: d["entities"][0].update(description="x" * 5001),
            "description is longer",
        ),
        (
            "too many tags",
            view("merchant_stats", tags={f"k{i}": "v" for i in range(65)}),
            "at most 64 tags",
        ),
        (
            "too many features",
            view(
                "merchant_stats",
                features=[{"name": f"f{i}", "dtype": "int64"} for i in range(1001)],
            ),
            "at most 1000",
        ),
    ]


@pytest.mark.parametrize(
    ("what", "change", "expected"), _rule_cases(), ids=[case[0] for case in _rule_cases()]
)
def test_each_rule_reports_its_problem(what: str, change: Any, expected: str) -> None:
    data = _json()
    change(data)
    if what == "too many features":
        with pytest.raises(InvalidParameter, match=expected):  # refused while reading
            Definitions.from_json(data)
        return
    assert expected in _problems_of(data), what


def test_too_many_features_in_python_objects_are_reported() -> None:
    view = _defs().view("merchant_stats")
    many = tuple(Feature(f"f{i}", "int64") for i in range(1001))
    defs = dataclasses.replace(_defs(), views=(dataclasses.replace(view, features=many),))
    with pytest.raises(InvalidParameter, match="1001 features; at most 1000"):
        defs.validate()


def test_too_many_views_are_reported() -> None:
    view = _defs().view("merchant_stats")
    views = tuple(dataclasses.replace(view, name=f"v{i}") for i in range(1001))
    defs = Definitions(_defs().entities, views)
    with pytest.raises(InvalidParameter, match="1001 feature views; at most 1000"):
        defs.validate()


def test_every_problem_is_listed_at_once_up_to_a_bound() -> None:
    data = _json()
    _view(data, "merchant_stats").update(owner="Bad Team", ttl_seconds=-1, source="x/0")
    message = _problems_of(data)
    assert "3 problems" in message
    for part in ("not a team name", "ttl_seconds", "not a dataset reference"):
        assert part in message
    data["feature_services"][0]["features"] = [f"nope{i}:x" for i in range(30)]
    message = _problems_of(data)
    assert "33 problems" in message
    assert f"and {33 - MAX_PROBLEMS} more" in message
    assert message.count("\n- ") == MAX_PROBLEMS + 1


def test_cycles_are_reported_as_a_chain() -> None:
    data = _json()
    _view(data, "customer_stats")["source"] = "view:customer_flags"
    message = _problems_of(data)
    assert "customer_flags -> customer_stats -> customer_flags" in message
    defs = Definitions.from_json(data)
    with pytest.raises(
        InvalidParameter, match="customer_flags -> customer_stats -> customer_flags"
    ):
        defs.upstream("customer_flags")


def test_a_view_reading_itself_is_a_cycle() -> None:
    data = _json()
    _view(data, "merchant_stats")["source"] = "view:merchant_stats"
    assert "merchant_stats -> merchant_stats" in _problems_of(data)


def test_a_longer_cycle_is_reported_once() -> None:
    data = _json()
    base = _view(data, "customer_flags")
    for name, source in (("c1", "view:c2"), ("c2", "view:c3"), ("c3", "view:c1")):
        data["feature_views"].append({**base, "name": name, "source": source})
    message = _problems_of(data)
    assert "c1 -> c2 -> c3 -> c1" in message
    assert "1 problem:" in message


def test_python_objects_of_the_wrong_types_are_reported_not_crashed_on() -> None:
    view = FeatureView(
        name="v",
        entities=("customer",),
        source="customers",
        timestamp_field="ts",
        features=({"name": "a"},),  # type: ignore[arg-type]
        owner="risk",
        ttl_seconds="1d",  # type: ignore[arg-type]
    )
    defs = Definitions(_defs().entities, (view,))
    with pytest.raises(InvalidParameter, match="ttl_seconds must be a whole number"):
        defs.validate()
    defs = Definitions(_defs().entities, (dataclasses.replace(view, ttl_seconds=None),))
    with pytest.raises(InvalidParameter, match=r"is not a Feature\(name, dtype\)"):
        defs.validate()
    with pytest.raises(InvalidParameter, match="is not a FeatureView"):
        Definitions(views=("oops",)).validate()  # type: ignore[arg-type]


def test_lists_from_python_become_tuples() -> None:
    view = FeatureView(
        name="v",
        entities=["customer"],  # type: ignore[arg-type]
        source="customers",
        timestamp_field="ts",
        features=[Feature("a", "int64")],  # type: ignore[arg-type]
        owner="risk",
    )
    assert view.entities == ("customer",)
    assert view.features == (Feature("a", "int64"),)
    Definitions([Entity("customer", ["id"])], [view]).validate()  # type: ignore[arg-type]


# ---------------------------------------------------------------- lookups and merging


def test_lookups() -> None:
    defs = _defs()
    assert defs.join_keys("customer_flags") == ("customer_id",)
    assert defs.upstream("customer_flags") == ("customer_stats",)
    assert defs.upstream("customer_stats") == ()
    assert defs.resolve_service("fraud_model") == (
        ("customer_stats", "total"),
        ("customer_flags", "big_spender"),
    )
    with pytest.raises(NotFound, match="no feature view called 'nope'"):
        defs.view("nope")
    with pytest.raises(NotFound):
        defs.entity("nope")
    with pytest.raises(NotFound):
        defs.service("nope")


def test_resolve_service_expands_star_in_order_and_once() -> None:
    defs = _defs()
    service = FeatureService("s", ("customer_stats:orders", "customer_stats:*"), "risk")
    defs = dataclasses.replace(defs, services=(service,))
    assert defs.resolve_service("s") == (
        ("customer_stats", "orders"),
        ("customer_stats", "total"),
    )
    bad = dataclasses.replace(defs, services=(FeatureService("s", ("customer_stats:x",), "r"),))
    with pytest.raises(InvalidParameter, match="has no feature 'x'"):
        bad.resolve_service("s")


def test_merged_unions_and_refuses_conflicts() -> None:
    defs = _defs()
    first = Definitions(defs.entities, defs.views[:1])
    second = Definitions(defs.entities[:1], defs.views[1:], defs.services)
    assert first.merged(second).digest() == defs.digest()
    changed = dataclasses.replace(defs.entities[0], description="another")
    with pytest.raises(InvalidParameter, match="entity 'customer' is defined twice"):
        first.merged(Definitions((changed,)))


def test_feature_types() -> None:
    assert FEATURE_TYPES == ("int64", "float64", "string", "bool", "timestamp")


# ---------------------------------------------------------------- properties

_names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
_text = st.text(max_size=12)


@st.composite
def definitions(draw: st.DrawFn) -> Definitions:
    entity_names = draw(st.lists(_names, min_size=1, max_size=3, unique=True))
    entities = tuple(Entity(name, (f"{name}_id",), draw(_text)) for name in entity_names)
    views = []
    for name in draw(st.lists(_names, max_size=4, unique=True)):
        features = draw(st.lists(_names, min_size=1, max_size=4, unique=True))
        views.append(
            FeatureView(
                name=name,
                entities=(draw(st.sampled_from(entity_names)),),
                source=draw(st.sampled_from(["data:events", "data:events@prod", "data:events/2"])),
                timestamp_field="ts",
                features=tuple(
                    Feature(f"f_{f}", draw(st.sampled_from(FEATURE_TYPES))) for f in features
                ),
                owner=draw(st.sampled_from(["risk", "growth.team"])),
                ttl_seconds=draw(st.none() | st.integers(1, 10**6)),
                online=draw(st.booleans()),
                description=draw(_text),
                tags=draw(st.dictionaries(_names, _text, max_size=2)),
            )
        )
    services = []
    for name in draw(st.lists(_names, max_size=3, unique=True)) if views else []:
        refs = [f"{v.name}:*" for v in views[:2]]
        services.append(FeatureService(name, tuple(refs), "risk", draw(_text)))
    return Definitions(entities, tuple(views), tuple(services))


@settings(max_examples=40, deadline=None)
@given(definitions())
def test_json_round_trip_of_generated_definitions(defs: Definitions) -> None:
    defs.validate()
    data = defs.to_json()
    again = Definitions.from_json(data)
    assert again.to_json() == data
    assert again.digest() == defs.digest()
    assert set(again.views) == set(defs.views)
