"""RegistryService and its store on SQLite and PostgreSQL: rules, numbering, aliases, audit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from shamal.db.models import ModelAliasRow, ModelVersionRow, ModelVersionTagRow
from shamal.errors import AlreadyExists, Conflict, InvalidParameter, NotFound, PermissionDenied
from shamal.registry import TEAM_TAG, ModelAlias, RegistryService, Stage, VersionStatus
from shamal.server import Platform
from tests.registry.conftest import ArtifactSources, People

SRC = "mlflow-artifacts:/models/m1"


class SteppingClock:
    """A clock that moves one second each time it is read."""

    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _count(platform: Platform, table: type[ModelVersionRow] | type[ModelAliasRow]) -> int:
    with platform.db.unit_of_work(write=False) as s:
        return s.scalar(select(func.count()).select_from(table)) or 0


def test_model_lifecycle_with_timestamps_tags_and_description(
    platform: Platform, people: People, sources: ArtifactSources
) -> None:
    clock = SteppingClock()
    svc = RegistryService(platform.db, platform.audit, sources, clock)
    created = svc.create_registered_model(
        people.ctx("admin"), "fraud", tags={"k": "v"}, description="first"
    )
    t0 = _ms(clock.now)
    assert (created.name, created.description, dict(created.tags)) == ("fraud", "first", {"k": "v"})
    assert created.creation_timestamp == created.last_updated_timestamp == t0
    assert (created.user_id, created.team_id, created.aliases, created.latest_versions) == (
        "admin",
        None,
        (),
        (),
    )
    updated = svc.update_registered_model(people.ctx("admin"), "fraud", "second")
    assert updated.description == "second"
    assert updated.last_updated_timestamp > updated.creation_timestamp == t0
    assert svc.update_registered_model(people.ctx("admin"), "fraud", None).description == "second"
    svc.set_registered_model_tag(people.ctx("admin"), "fraud", "k", "w")
    svc.set_registered_model_tag(people.ctx("admin"), "fraud", "k2", "x" * 100_000)
    svc.delete_registered_model_tag(people.ctx("admin"), "fraud", "missing")  # no error
    svc.delete_registered_model_tag(people.ctx("admin"), "fraud", "k2")
    assert dict(svc.get_registered_model(people.principals["admin"], "fraud").tags) == {"k": "w"}
    with pytest.raises(AlreadyExists):
        svc.create_registered_model(people.ctx("admin"), "fraud")


@pytest.mark.parametrize(
    "name",
    ["", "   ", "a/b", "a:b", "../x", "./x", ".", "..", "x/..", "a\nb", "a\x00b", "n" * 257],
)
def test_malformed_model_names_are_refused(
    registry: RegistryService, people: People, name: str
) -> None:
    with pytest.raises(InvalidParameter):
        registry.create_registered_model(people.ctx("admin"), name)
    assert registry.search_registered_models(people.principals["admin"]).items == ()


def test_versions_are_numbered_from_one_and_never_reused(
    registry: RegistryService, people: People, platform: Platform, sources: ArtifactSources
) -> None:
    ctx = people.ctx("admin")
    registry.create_registered_model(ctx, "m")
    numbers = [registry.create_model_version(ctx, "m", f"{SRC}/{i}").version for i in range(3)]
    assert numbers == [1, 2, 3]
    registry.delete_model_version(people.ctx("admin"), "m", 3)
    assert registry.create_model_version(ctx, "m", SRC).version == 4
    with pytest.raises(NotFound):
        registry.get_model_version(people.principals["admin"], "m", 3)
    assert sources.calls[-1] == SRC
    got = registry.get_model_version(people.principals["admin"], "m", 4)
    assert (got.status, got.current_stage, got.source) == (VersionStatus.READY, Stage.NONE, SRC)
    assert _count(platform, ModelVersionRow) == 3


def test_source_is_resolved_and_the_location_is_what_downloads_answer(
    registry: RegistryService, people: People, sources: ArtifactSources
) -> None:
    sources.logged_models["m-0123abcd"] = "mlflow-artifacts:/models/m-0123abcd"
    sources.logged_model_runs["m-0123abcd"] = "0123456789abcdef0123456789abcdef"
    ctx = people.ctx("admin")
    registry.create_registered_model(ctx, "m")
    made = registry.create_model_version(
        ctx,
        "m",
        "mlflow-artifacts:/models/m-0123abcd/m%31",
        run_id="0123456789abcdef0123456789abcdef",
        tags=[("a", "1"), ("a", "2"), ("b", "3")],
        run_link="http://runs/1",
        description="d",
        model_id="m-0123abcd",
    )
    assert made.storage_location == "mlflow-artifacts:/models/m-0123abcd/m1"
    assert made.source == "mlflow-artifacts:/models/m-0123abcd/m%31"
    assert (made.run_id, made.run_link, made.description, made.model_id) == (
        "0123456789abcdef0123456789abcdef",
        "http://runs/1",
        "d",
        "m-0123abcd",
    )
    assert dict(made.tags) == {"a": "2", "b": "3"}
    admin = people.principals["admin"]
    uri = registry.get_model_version_download_uri(admin, "m", 1)
    assert uri == "mlflow-artifacts:/models/m-0123abcd/m1"


@pytest.mark.parametrize(
    "source",
    [
        "file:///etc/passwd",
        "/etc/passwd",
        "mlflow-artifacts://h:1/../../../../",
        "mlflow-artifacts:/a/..%2f..%2fetc",
        "s3://other-bucket/x",
        "models:/m/one",
        "models:/m/-1",
        "",
    ],
)
def test_refused_sources_store_nothing(
    registry: RegistryService, people: People, platform: Platform, source: str
) -> None:
    registry.create_registered_model(people.ctx("admin"), "m")
    with pytest.raises(InvalidParameter):
        registry.create_model_version(people.ctx("admin"), "m", source)
    assert _count(platform, ModelVersionRow) == 0
    assert registry.create_model_version(people.ctx("admin"), "m", SRC).version == 1


def test_a_copy_needs_a_source_version_the_caller_can_see(
    registry: RegistryService, people: People, platform: Platform
) -> None:
    registry.create_registered_model(people.ctx("rita"), "red-model", tags={TEAM_TAG: "red"})
    made = registry.create_model_version(people.ctx("mo"), "red-model", SRC, run_id="a" * 32)
    registry.create_registered_model(people.ctx("bo"), "blue-copy", tags={TEAM_TAG: "blue"})
    for source in ("models:/red-model/1", "models:/red-model/latest", "models:/red-model@x"):
        with pytest.raises(NotFound):  # another team's model: as if it did not exist
            registry.create_model_version(people.ctx("bo"), "blue-copy", source)
    assert _count(platform, ModelVersionRow) == 1
    registry.create_registered_model(people.ctx("mo"), "red-copy", tags={TEAM_TAG: "red"})
    copy = registry.create_model_version(people.ctx("mo"), "red-copy", "models:/red-model/1")
    assert (copy.source, copy.run_id) == ("models:/red-model/1", made.run_id)
    assert registry.get_model_version_download_uri(people.principals["mo"], "red-copy", 1) == SRC


def test_malformed_version_references_are_refused(
    registry: RegistryService, people: People
) -> None:
    registry.create_registered_model(people.ctx("admin"), "m")
    bad: list[dict[str, Any]] = [
        {"run_id": "x" * 33},
        {"run_id": "../etc"},
        {"model_id": "m 1"},
        {"run_link": "http://x/\r\nX-Injected: 1"},
        {"tags": {"k" * 251: "v"}},
        {"tags": {"": "v"}},
    ]
    for kwargs in bad:
        with pytest.raises(InvalidParameter):
            registry.create_model_version(people.ctx("admin"), "m", SRC, **kwargs)
    with pytest.raises(InvalidParameter):
        registry.create_model_version(people.ctx("admin"), "m", "mlflow-artifacts:/" + "a" * 2000)
    with pytest.raises(NotFound):
        registry.create_model_version(people.ctx("admin"), "missing", SRC)


def test_stages_latest_versions_and_archiving(registry: RegistryService, people: People) -> None:
    ctx = people.ctx("admin")
    registry.create_registered_model(ctx, "m")
    for _ in range(4):
        registry.create_model_version(ctx, "m", SRC)
    registry.transition_model_version_stage(ctx, "m", 1, Stage.PRODUCTION, False)
    registry.transition_model_version_stage(ctx, "m", 2, Stage.PRODUCTION, False)
    registry.transition_model_version_stage(ctx, "m", 3, Stage.STAGING, False)
    admin = people.principals["admin"]
    latest = {v.current_stage: v.version for v in registry.get_latest_versions(admin, "m")}
    assert latest == {Stage.NONE: 4, Stage.STAGING: 3, Stage.PRODUCTION: 2}
    only = registry.get_latest_versions(admin, "m", [Stage.PRODUCTION])
    assert [v.version for v in only] == [2]
    moved = registry.transition_model_version_stage(ctx, "m", 4, Stage.PRODUCTION, True)
    assert moved.current_stage is Stage.PRODUCTION
    stages = {v: registry.get_model_version(admin, "m", v).current_stage for v in (1, 2, 3, 4)}
    assert stages == {
        1: Stage.ARCHIVED,
        2: Stage.ARCHIVED,
        3: Stage.STAGING,
        4: Stage.PRODUCTION,
    }
    model = registry.get_registered_model(admin, "m")
    # In a stock server's order: the stage of the oldest version first.
    assert [(v.current_stage, v.version) for v in model.latest_versions] == [
        (Stage.ARCHIVED, 2),
        (Stage.STAGING, 3),
        (Stage.PRODUCTION, 4),
    ]
    with pytest.raises(InvalidParameter):
        registry.transition_model_version_stage(ctx, "m", 1, Stage.ARCHIVED, True)
    with pytest.raises(NotFound):
        registry.transition_model_version_stage(ctx, "m", 9, Stage.STAGING, False)
    updated = registry.update_model_version(ctx, "m", 1, "old one")
    assert updated.description == "old one"


def test_aliases_move_resolve_and_follow_their_version(
    registry: RegistryService, people: People, platform: Platform
) -> None:
    ctx = people.ctx("admin")
    admin = people.principals["admin"]
    registry.create_registered_model(ctx, "m")
    for _ in range(3):
        registry.create_model_version(ctx, "m", SRC)
    registry.set_registered_model_alias(ctx, "m", "champion", 1)
    registry.set_registered_model_alias(ctx, "m", "champion", 2)  # a move, not a second row
    registry.set_registered_model_alias(ctx, "m", "challenger", 3)
    registry.set_registered_model_alias(ctx, "m", "a" * 255, 3)
    assert registry.get_model_version_by_alias(admin, "m", "champion").version == 2
    model = registry.get_registered_model(admin, "m")
    assert model.aliases == (
        ModelAlias("a" * 255, 3),
        ModelAlias("challenger", 3),
        ModelAlias("champion", 2),
    )
    assert registry.get_model_version(admin, "m", 3).aliases == ("a" * 255, "challenger")
    registry.delete_model_version(ctx, "m", 3)  # takes its aliases with it
    assert [a.alias for a in registry.get_registered_model(admin, "m").aliases] == ["champion"]
    with pytest.raises(NotFound):
        registry.get_model_version_by_alias(admin, "m", "challenger")
    registry.delete_registered_model_alias(ctx, "m", "champion")
    registry.delete_registered_model_alias(ctx, "m", "champion")  # absent: no error
    assert _count(platform, ModelAliasRow) == 0
    with pytest.raises(NotFound):
        registry.set_registered_model_alias(ctx, "m", "champion", 3)


@pytest.mark.parametrize(
    "alias", ["latest", "LATEST", "v1", "V12", "", "a b", "a/b", "a.b", "ü" * 256, "a" * 256]
)
def test_reserved_and_malformed_aliases_are_refused(
    registry: RegistryService, people: People, alias: str
) -> None:
    registry.create_registered_model(people.ctx("admin"), "m")
    registry.create_model_version(people.ctx("admin"), "m", SRC)
    with pytest.raises(InvalidParameter):
        registry.set_registered_model_alias(people.ctx("admin"), "m", alias, 1)


def test_rename_keeps_versions_tags_and_aliases(registry: RegistryService, people: People) -> None:
    ctx = people.ctx("admin")
    admin = people.principals["admin"]
    registry.create_registered_model(ctx, "old", tags={"k": "v"})
    registry.create_model_version(ctx, "old", SRC, tags={"vk": "vv"})
    registry.set_registered_model_alias(ctx, "old", "prod", 1)
    registry.create_registered_model(ctx, "taken")
    with pytest.raises(AlreadyExists):
        registry.rename_registered_model(ctx, "old", "taken")
    renamed = registry.rename_registered_model(ctx, "old", "new")
    assert (renamed.name, dict(renamed.tags), renamed.aliases) == (
        "new",
        {"k": "v"},
        (ModelAlias("prod", 1),),
    )
    version = registry.get_model_version_by_alias(admin, "new", "prod")
    assert (version.name, version.version, dict(version.tags)) == ("new", 1, {"vk": "vv"})
    with pytest.raises(NotFound):
        registry.get_registered_model(admin, "old")
    with pytest.raises(InvalidParameter):
        registry.rename_registered_model(ctx, "new", "a/b")
    assert registry.create_model_version(ctx, "new", SRC).version == 2


def test_delete_model_takes_everything_and_the_name_starts_over(
    registry: RegistryService, people: People, platform: Platform
) -> None:
    ctx = people.ctx("admin")
    registry.create_registered_model(ctx, "m")
    registry.create_model_version(ctx, "m", SRC, tags={"a": "b"})
    registry.set_registered_model_alias(ctx, "m", "prod", 1)
    registry.delete_registered_model(ctx, "m")
    with pytest.raises(NotFound):
        registry.get_registered_model(people.principals["admin"], "m")
    with platform.db.unit_of_work(write=False) as s:
        for table in (ModelVersionRow, ModelVersionTagRow, ModelAliasRow):
            assert s.scalar(select(func.count()).select_from(table)) == 0
    registry.create_registered_model(ctx, "m")
    assert registry.create_model_version(ctx, "m", SRC).version == 1
    with pytest.raises(NotFound):
        registry.delete_registered_model(ctx, "never-was")


def test_version_tags(registry: RegistryService, people: People) -> None:
    ctx = people.ctx("admin")
    admin = people.principals["admin"]
    registry.create_registered_model(ctx, "m")
    registry.create_model_version(ctx, "m", SRC)
    registry.set_model_version_tag(ctx, "m", 1, "k", "v")
    registry.set_model_version_tag(ctx, "m", 1, "k", "w" * 5000)
    registry.set_model_version_tag(ctx, "m", 1, "x" * 250, "")
    assert dict(registry.get_model_version(admin, "m", 1).tags) == {"k": "w" * 5000, "x" * 250: ""}
    registry.delete_model_version_tag(ctx, "m", 1, "k")
    registry.delete_model_version_tag(ctx, "m", 1, "k")
    assert dict(registry.get_model_version(admin, "m", 1).tags) == {"x" * 250: ""}
    with pytest.raises(NotFound):
        registry.set_model_version_tag(ctx, "m", 2, "k", "v")
    with pytest.raises(NotFound):
        registry.delete_model_version_tag(ctx, "m", 2, "k")
    with pytest.raises(InvalidParameter):
        registry.set_model_version_tag(ctx, "m", 1, "k", "v" * 100_001)


def test_team_models_viewers_read_members_write_maintainers_delete(
    registry: RegistryService, people: People
) -> None:
    model = registry.create_registered_model(people.ctx("mo"), "red-m", tags={TEAM_TAG: "red"})
    assert model.team == "red"
    assert model.team_id == people.principals["mo"].team_ids["red"]
    registry.create_model_version(people.ctx("mo"), "red-m", SRC)
    assert registry.get_registered_model(people.principals["vi"], "red-m").name == "red-m"
    with pytest.raises(PermissionDenied):
        registry.create_model_version(people.ctx("vi"), "red-m", SRC)
    with pytest.raises(PermissionDenied):
        registry.set_registered_model_alias(people.ctx("vi"), "red-m", "prod", 1)
    with pytest.raises(PermissionDenied):
        registry.delete_model_version(people.ctx("mo"), "red-m", 1)
    with pytest.raises(PermissionDenied):
        registry.delete_registered_model(people.ctx("mo"), "red-m")
    for outsider in ("otto", "bo"):
        with pytest.raises(NotFound, match="^Registered Model with name=red-m not found$"):
            registry.get_registered_model(people.principals[outsider], "red-m")
        with pytest.raises(NotFound):
            registry.create_model_version(people.ctx(outsider), "red-m", SRC)
        found = registry.search_registered_models(people.principals[outsider])
        assert [m.name for m in found.items] == []
        assert registry.search_model_versions(people.principals[outsider]).items == ()
    with pytest.raises(InvalidParameter):
        registry.set_registered_model_tag(people.ctx("mo"), "red-m", TEAM_TAG, "blue")
    with pytest.raises(InvalidParameter):
        registry.delete_registered_model_tag(people.ctx("mo"), "red-m", TEAM_TAG)
    registry.delete_model_version(people.ctx("rita"), "red-m", 1)
    registry.delete_registered_model(people.ctx("rita"), "red-m")


def test_who_may_create_a_team_model(registry: RegistryService, people: People) -> None:
    with pytest.raises(PermissionDenied):
        registry.create_registered_model(people.ctx("vi"), "a", tags={TEAM_TAG: "red"})
    with pytest.raises(NotFound):
        registry.create_registered_model(people.ctx("otto"), "a", tags={TEAM_TAG: "red"})
    with pytest.raises(NotFound):
        registry.create_registered_model(people.ctx("mo"), "a", tags={TEAM_TAG: "nope"})
    with pytest.raises(InvalidParameter):  # an admin outside the team
        registry.create_registered_model(people.ctx("admin"), "a", tags={TEAM_TAG: "red"})
    with pytest.raises(InvalidParameter):
        registry.create_registered_model(people.ctx("mo"), "a", tags={TEAM_TAG: "Not A Team"})
    open_model = registry.create_registered_model(people.ctx("otto"), "open")
    assert open_model.team_id is None
    registry.create_model_version(people.ctx("bo"), "open", SRC)  # open to every account
    registry.delete_registered_model(people.ctx("vi"), "open")
    assert registry.search_registered_models(people.principals["admin"]).items == ()


def test_every_change_is_audited_in_its_transaction(
    registry: RegistryService, people: People, platform: Platform
) -> None:
    registry.create_registered_model(people.ctx("mo", "registered_model.create"), "m")
    registry.create_model_version(people.ctx("mo", "model_version.create"), "m", SRC)
    registry.set_registered_model_alias(people.ctx("mo", "registered_model.alias.set"), "m", "p", 1)
    with pytest.raises(InvalidParameter):
        registry.create_model_version(people.ctx("mo", "model_version.create"), "m", "file:///x")
    entries = platform.audit.entries(actor="mo")
    assert [(e.action, e.target, e.outcome) for e in reversed(entries)] == [
        ("registered_model.create", "registered_model:m", "ok"),
        ("model_version.create", "model_version:m/1", "ok"),
        ("registered_model.alias.set", "registered_model:m", "ok"),
    ]
    assert entries[0].detail["alias"] == "p"
    assert platform.audit.verify().ok


def test_search_filters_orders_pages_and_visibility(
    registry: RegistryService, people: People
) -> None:
    for i in range(5):
        registry.create_registered_model(people.ctx("otto"), f"open-{i}", tags={"i": str(i)})
    registry.create_registered_model(people.ctx("mo"), "open-red", tags={TEAM_TAG: "red"})
    otto = people.principals["otto"]
    first = registry.search_registered_models(otto, max_results=2, order_by=["name DESC"])
    assert [m.name for m in first.items] == ["open-4", "open-3"]
    assert first.next_page_token is not None
    rest = registry.search_registered_models(
        otto, max_results=2, order_by=["name DESC"], page_token=first.next_page_token
    )
    assert [m.name for m in rest.items] == ["open-2", "open-1"]
    tagged = registry.search_registered_models(otto, filter_string="tags.i = '3'")
    assert [m.name for m in tagged.items] == ["open-3"]
    assert tagged.next_page_token is None
    red = registry.search_registered_models(
        people.principals["vi"], filter_string="name LIKE '%red'"
    )
    assert [m.name for m in red.items] == ["open-red"]
    assert registry.search_registered_models(otto, filter_string="name LIKE '%red'").items == ()
    for bad in ("name = 'x' OR 1=1", "nope = 1", "name ="):
        with pytest.raises(InvalidParameter):
            registry.search_registered_models(otto, filter_string=bad)
    with pytest.raises(InvalidParameter):
        registry.search_registered_models(otto, max_results=1001)
    with pytest.raises(InvalidParameter):
        registry.search_registered_models(otto, page_token="garbage")
    listed = registry.list_registered_models(otto, search="OPEN-", limit=3, offset=1)
    assert [m.name for m in listed] == ["open-1", "open-2", "open-3"]
    assert [m.name for m in registry.list_registered_models(otto, search="%")] == []


def test_search_model_versions(
    platform: Platform, people: People, sources: ArtifactSources
) -> None:
    registry = RegistryService(platform.db, platform.audit, sources, SteppingClock())
    ctx = people.ctx("admin")
    admin = people.principals["admin"]
    for name in ("a", "b"):
        registry.create_registered_model(ctx, name)
        for _ in range(3):
            registry.create_model_version(ctx, name, SRC, run_id="r" + name)
    # As on a stock server: by default the version changed last comes first ...
    registry.update_model_version(ctx, "a", 2, description="touched")
    every = registry.search_model_versions(admin)
    assert [(v.name, v.version) for v in every.items] == [
        ("a", 2),
        ("b", 3),
        ("b", 2),
        ("b", 1),
        ("a", 3),
        ("a", 1),
    ]
    # ... and any order ends with name ASC, version DESC.
    by_name = registry.search_model_versions(admin, order_by=["name"])
    assert [(v.name, v.version) for v in by_name.items] == [
        ("a", 3),
        ("a", 2),
        ("a", 1),
        ("b", 3),
        ("b", 2),
        ("b", 1),
    ]
    page = registry.search_model_versions(admin, filter_string="name = 'b'", max_results=2)
    assert [v.version for v in page.items] == [3, 2]
    more = registry.search_model_versions(
        admin, filter_string="name = 'b'", max_results=2, page_token=page.next_page_token
    )
    assert ([v.version for v in more.items], more.next_page_token) == ([1], None)
    by_number = registry.search_model_versions(
        admin, filter_string="version_number >= 2 AND run_id = 'ra'", order_by=["version_number"]
    )
    assert [(v.name, v.version) for v in by_number.items] == [("a", 2), ("a", 3)]
    with pytest.raises(InvalidParameter):
        registry.search_model_versions(admin, max_results=200_001)
    with pytest.raises(InvalidParameter):
        registry.search_model_versions(admin, order_by=["name; DROP TABLE model_versions"])


def test_prompts_are_left_out_of_searches_unless_asked_for(
    registry: RegistryService, people: People
) -> None:
    ctx = people.ctx("admin")
    admin = people.principals["admin"]
    registry.create_registered_model(ctx, "model")
    registry.create_registered_model(ctx, "prompt", tags={"mlflow.prompt.is_prompt": "true"})
    for name in ("model", "prompt"):
        registry.create_model_version(ctx, name, SRC)
    models = "tags.`mlflow.prompt.is_prompt` != 'true'"  # what the stock client always adds
    for text in (
        None,
        models,
        f"name LIKE '%' AND {models}",
        "tags.`mlflow.prompt.is_prompt` = 'false'",
    ):
        assert [
            m.name for m in registry.search_registered_models(admin, filter_string=text).items
        ] == ["model"]
        assert [
            v.name for v in registry.search_model_versions(admin, filter_string=text).items
        ] == ["model"]
    for text in (
        "tags.`mlflow.prompt.is_prompt` = 'true'",
        "tags.`mlflow.prompt.is_prompt` != 'false'",
    ):
        assert [
            m.name for m in registry.search_registered_models(admin, filter_string=text).items
        ] == ["prompt"]
        assert [
            v.name for v in registry.search_model_versions(admin, filter_string=text).items
        ] == ["prompt"]


def test_a_team_that_owns_models_cannot_be_deleted(
    registry: RegistryService, people: People, platform: Platform
) -> None:
    """Deleting the team would open its models to everyone: the database refuses (RESTRICT)."""
    registry.create_registered_model(people.ctx("mo"), "red-m", tags={TEAM_TAG: "red"})
    registry.create_model_version(people.ctx("mo"), "red-m", SRC)
    with pytest.raises(Conflict):
        platform.security.delete_team(people.ctx("admin", "team.delete"), "red")
    outsider = people.principals["otto"]
    with pytest.raises(NotFound):
        registry.get_registered_model(outsider, "red-m")
    assert registry.get_registered_model(people.principals["mo"], "red-m").team == "red"
    # Once its models are gone, the team can go.
    registry.delete_registered_model(people.ctx("admin"), "red-m")
    platform.security.delete_team(people.ctx("admin", "team.delete"), "red")


def test_latest_versions_are_listed_in_a_stock_servers_order(
    registry: RegistryService, people: People
) -> None:
    """A stock server lists each stage's newest version in the order it meets the stages
    walking the versions up (the stage of the oldest version first), not by stage name."""
    ctx = people.ctx("admin")
    admin = people.principals["admin"]
    registry.create_registered_model(ctx, "m")
    for _ in range(4):
        registry.create_model_version(ctx, "m", SRC)
    for version, stage in ((1, Stage.PRODUCTION), (2, Stage.STAGING), (3, Stage.PRODUCTION)):
        registry.transition_model_version_stage(ctx, "m", version, stage, False)
    latest = registry.get_latest_versions(admin, "m")
    assert [(v.version, v.current_stage) for v in latest] == [
        (3, Stage.PRODUCTION),
        (2, Stage.STAGING),
        (4, Stage.NONE),
    ]
    asked = registry.get_latest_versions(admin, "m", [Stage.NONE, Stage.STAGING])
    assert [v.version for v in asked] == [2, 4]
    model = registry.get_registered_model(admin, "m")
    assert [v.version for v in model.latest_versions] == [3, 2, 4]
