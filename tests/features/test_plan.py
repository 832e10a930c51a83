"""The plan: what applying definitions changes, and what it would break."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings

from shamal.features._definitions import (
    Definitions,
    Entity,
    Feature,
    FeatureService,
    FeatureView,
)
from shamal.features._plan import Change, Plan, applied, plan
from tests.features.test_definitions import definitions

CUSTOMER = Entity("customer", ("customer_id",))
STATS = FeatureView(
    name="stats",
    entities=("customer",),
    source="customers",
    timestamp_field="ts",
    features=(Feature("total", "float64"), Feature("age", "int64")),
    owner="risk",
)
FLAGS = FeatureView(
    name="flags",
    entities=("customer",),
    source="view:stats",
    timestamp_field="ts",
    features=(Feature("big", "bool"), Feature("new", "bool")),
    owner="risk",
)
SERVICE = FeatureService("fraud", ("stats:total", "flags:*"), "risk")
CURRENT = Definitions((CUSTOMER,), (STATS, FLAGS), (SERVICE,))


def _with(
    defs: Definitions = CURRENT,
    *,
    entities: tuple[Entity, ...] | None = None,
    views: tuple[FeatureView, ...] | None = None,
    services: tuple[FeatureService, ...] | None = None,
) -> Definitions:
    return Definitions(
        defs.entities if entities is None else entities,
        defs.views if views is None else views,
        defs.services if services is None else services,
    )


def test_the_fixture_is_valid() -> None:
    CURRENT.validate()


def test_no_change_is_an_empty_plan() -> None:
    result = plan(CURRENT, CURRENT, in_use={"fraud"})
    assert result.empty
    assert result == Plan((), ())
    assert result.to_json() == {"changes": [], "breaking": [], "empty": True}


def test_creates_from_nothing_in_kind_then_name_order() -> None:
    result = plan(Definitions(), CURRENT)
    assert result.changes == (
        Change("entity", "customer", "create"),
        Change("feature_view", "flags", "create"),
        Change("feature_view", "stats", "create"),
        Change("feature_service", "fraud", "create"),
    )
    assert not result.breaking
    assert result.to_json()["changes"][0] == {
        "kind": "entity",
        "name": "customer",
        "action": "create",
        "fields": [],
    }


def test_update_names_the_fields_that_differ() -> None:
    stats = dataclasses.replace(
        STATS,
        ttl_seconds=60,
        tags={"a": "b"},
        features=(
            Feature("total", "float64"),
            Feature("age", "float64"),
            Feature("amount", "int64"),
        ),
    )
    result = plan(CURRENT, _with(views=(stats, FLAGS)))
    assert result.changes == (
        Change(
            "feature_view",
            "stats",
            "update",
            ("ttl_seconds", "tags", "features.+amount", "features.~age:int64->float64"),
        ),
    )
    removed = dataclasses.replace(STATS, features=(Feature("total", "float64"),))
    (change,) = plan(CURRENT, _with(views=(removed, FLAGS))).changes
    assert change.fields == ("features.-age",)
    reordered = dataclasses.replace(STATS, features=STATS.features[::-1])
    (change,) = plan(CURRENT, _with(views=(reordered, FLAGS))).changes
    assert change.fields == ("features.order",)


def test_update_of_entities_and_services() -> None:
    customer = dataclasses.replace(CUSTOMER, description="people")
    service = dataclasses.replace(SERVICE, features=("stats:age", "flags:*"), owner="ops")
    result = plan(CURRENT, _with(entities=(customer,), services=(service,)))
    assert result.changes == (
        Change("entity", "customer", "update", ("description",)),
        Change(
            "feature_service",
            "fraud",
            "update",
            ("owner", "features.+stats:age", "features.-stats:total"),
        ),
    )


def test_missing_objects_are_kept_unless_pruned() -> None:
    partial = Definitions((CUSTOMER,), (STATS,))
    kept = plan(CURRENT, partial)
    assert kept.empty
    assert applied(CURRENT, partial) == Definitions((CUSTOMER,), (STATS, FLAGS), (SERVICE,))
    pruned = plan(CURRENT, partial, prune=True)
    assert pruned.changes == (
        Change("feature_view", "flags", "delete"),
        Change("feature_service", "fraud", "delete"),
    )
    assert not pruned.breaking  # fraud is not in use
    assert applied(CURRENT, partial, prune=True) == partial


# ---------------------------------------------------------------- breaking, and the twin


def _remove_feature(view: FeatureView, name: str) -> FeatureView:
    return dataclasses.replace(view, features=tuple(f for f in view.features if f.name != name))


_BREAKING: list[tuple[str, Callable[[], tuple[Definitions, bool]], str]] = [
    (
        "service deleted",
        lambda: (Definitions((CUSTOMER,), (STATS, FLAGS)), True),
        "Feature service 'fraud' is in use and would be deleted",
    ),
    (
        "view deleted",
        lambda: (Definitions((CUSTOMER,), (STATS,), (SERVICE,)), True),
        "reads feature view 'flags', which would be deleted",
    ),
    (
        "feature removed",
        lambda: (_with(views=(_remove_feature(STATS, "total"), FLAGS)), False),
        "reads 'stats:total', which would be removed",
    ),
    (
        "feature removed through view:*",
        lambda: (_with(views=(STATS, _remove_feature(FLAGS, "new"))), False),
        "reads 'flags:new' (through 'flags:*'), which would be removed",
    ),
    (
        "feature retyped",
        lambda: (
            _with(
                views=(
                    dataclasses.replace(
                        STATS, features=(Feature("total", "int64"), Feature("age", "int64"))
                    ),
                    FLAGS,
                )
            ),
            False,
        ),
        "reads 'stats:total', whose type would change from float64 to int64",
    ),
    (
        "view entities changed",
        lambda: (
            Definitions(
                (CUSTOMER, Entity("account", ("account_id",))),
                (
                    dataclasses.replace(STATS, entities=("account",)),
                    dataclasses.replace(FLAGS, entities=("account",)),
                ),
                (SERVICE,),
            ),
            False,
        ),
        "reads feature view 'stats', whose entities would change from (customer) to (account)",
    ),
    (
        "entity join keys changed",
        lambda: (_with(entities=(Entity("customer", ("customer_id", "region")),)), False),
        "whose join keys would change from (customer_id) to (customer_id, region)",
    ),
    (
        "service list shrinks",
        lambda: (_with(services=(dataclasses.replace(SERVICE, features=("flags:*",)),)), False),
        "its new feature list drops 'stats:total'",
    ),
]


@pytest.mark.parametrize(("what", "build", "expected"), _BREAKING, ids=[c[0] for c in _BREAKING])
def test_a_breaking_change_to_a_service_in_use_is_reported(
    what: str, build: Callable[[], tuple[Definitions, bool]], expected: str
) -> None:
    desired, prune = build()
    result = plan(CURRENT, desired, in_use={"fraud"}, prune=prune)
    assert not result.empty
    assert any(expected in reason for reason in result.breaking), (what, result.breaking)
    assert all(r.startswith("Feature service 'fraud' is in use") for r in result.breaking)
    assert all(r.endswith(".") for r in result.breaking)
    assert result.to_json()["breaking"] == list(result.breaking)


@pytest.mark.parametrize(("what", "build", "expected"), _BREAKING, ids=[c[0] for c in _BREAKING])
def test_the_same_change_is_allowed_when_the_service_is_not_in_use(
    what: str, build: Callable[[], tuple[Definitions, bool]], expected: str
) -> None:
    desired, prune = build()
    for in_use in ((), {"other"}):
        result = plan(CURRENT, desired, in_use=in_use, prune=prune)
        assert not result.empty, what
        assert result.breaking == ()


def test_adding_features_to_a_service_in_use_is_fine() -> None:
    bigger = dataclasses.replace(SERVICE, features=(*SERVICE.features, "stats:age"))
    stats = dataclasses.replace(STATS, features=(*STATS.features, Feature("extra", "string")))
    flags = dataclasses.replace(FLAGS, features=(*FLAGS.features, Feature("vip", "bool")))
    result = plan(CURRENT, _with(views=(stats, flags), services=(bigger,)), in_use={"fraud"})
    assert len(result.changes) == 3
    assert result.breaking == ()


def test_changes_a_service_in_use_does_not_read_are_fine() -> None:
    stats = dataclasses.replace(
        STATS,
        features=(Feature("total", "float64"),),  # age: not read by fraud
        ttl_seconds=3600,
        description="changed",
    )
    result = plan(CURRENT, _with(views=(stats, FLAGS)), in_use={"fraud"})
    assert result.changes[0].fields == ("ttl_seconds", "description", "features.-age")
    assert result.breaking == ()


def test_a_service_listing_features_explicitly_survives_star_shrinking() -> None:
    explicit = dataclasses.replace(SERVICE, features=("flags:big",))
    current = _with(services=(explicit,))
    desired = _with(views=(STATS, _remove_feature(FLAGS, "new")), services=(explicit,))
    assert plan(current, desired, in_use={"fraud"}).breaking == ()


def test_switching_a_service_from_a_list_to_star_over_the_same_features_is_fine() -> None:
    current = _with(services=(dataclasses.replace(SERVICE, features=("flags:big", "flags:new")),))
    desired = _with(services=(dataclasses.replace(SERVICE, features=("flags:*",)),))
    result = plan(current, desired, in_use={"fraud"})
    assert result.changes[0].action == "update"
    assert result.breaking == ()


def test_in_use_names_unknown_to_the_server_are_ignored() -> None:
    result = plan(CURRENT, Definitions(), in_use={"ghost"}, prune=True)
    assert len(result.changes) == 4
    assert result.breaking == ()


@settings(max_examples=40, deadline=None)
@given(definitions())
def test_a_plan_from_definitions_to_themselves_is_empty(defs: Definitions) -> None:
    in_use: Any = {s.name for s in defs.services}
    assert plan(defs, defs, in_use=in_use).empty
    assert plan(defs, defs, in_use=in_use, prune=True) == Plan((), ())
    copied = Definitions.from_json(defs.to_json())
    assert plan(defs, copied, in_use=in_use, prune=True).empty
