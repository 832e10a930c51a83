"""The stock mlflow client is the judge: the registry against a real server, SQLite and PostgreSQL.

The tests that register versions need the platform's source resolver
(``TrackingService.resolve_model_source``) and runs with artifacts: they use
sources the server itself minted (a run's ``artifact_uri``, ``runs:/...``).
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import mlflow
import pytest
from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from tests.live import LiveServer

pytestmark = [
    pytest.mark.slow,
    # mlflow.pyfunc warns once, at import time, about its own type hints.
    pytest.mark.filterwarnings("ignore:.*Any type hint is inferred:UserWarning"),
]

MODEL_CODE = """
import mlflow
from mlflow.pyfunc import PythonModel


class Doubler(PythonModel):
    def predict(self, context, model_input: list[int], params=None) -> list[int]:
        return [FACTOR * x for x in model_input]


mlflow.models.set_model(Doubler())
"""


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _code(exc: pytest.ExceptionInfo[MlflowException]) -> str:
    return str(exc.value.error_code)


def _run_with_model(tmp_path: Path, factor: int = 2) -> tuple[str, str]:
    """A run whose artifacts hold a pyfunc model at ``model/``; returns (run id, artifact uri)."""
    import mlflow.pyfunc

    code = tmp_path / f"doubler_{factor}.py"
    code.write_text(MODEL_CODE.replace("FACTOR", str(factor)))
    folder = tmp_path / f"model-{factor}"
    mlflow.pyfunc.save_model(path=str(folder), python_model=str(code))
    mlflow.set_experiment("registry-tests")
    with mlflow.start_run() as run:
        mlflow.log_artifacts(str(folder), artifact_path="model")
    return run.info.run_id, str(run.info.artifact_uri)


# ---------------------------------------------------------------------- no versions needed
def test_registered_models_create_get_update_rename_tags_delete(mlflow_env: LiveServer) -> None:
    client = MlflowClient()
    name = _name("rm")
    made = client.create_registered_model(name, tags={"team": "fraud"}, description="first")
    assert (made.name, made.description, made.tags) == (name, "first", {"team": "fraud"})
    assert made.creation_timestamp > 1_600_000_000_000
    with pytest.raises(MlflowException) as dup:
        client.create_registered_model(name)
    assert _code(dup) == "RESOURCE_ALREADY_EXISTS"
    client.update_registered_model(name, description="second")
    client.set_registered_model_tag(name, "stage", "dev")
    client.set_registered_model_tag(name, "long", "x" * 5000)
    client.delete_registered_model_tag(name, "team")
    got = client.get_registered_model(name)
    assert (got.description, got.tags) == ("second", {"stage": "dev", "long": "x" * 5000})
    assert got.last_updated_timestamp >= got.creation_timestamp
    client.rename_registered_model(name, name + "-new")
    with pytest.raises(MlflowException) as gone:
        client.get_registered_model(name)
    assert _code(gone) == "RESOURCE_DOES_NOT_EXIST"
    assert client.get_registered_model(name + "-new").tags["stage"] == "dev"
    client.delete_registered_model(name + "-new")
    with pytest.raises(MlflowException) as deleted:
        client.delete_registered_model(name + "-new")
    assert _code(deleted) == "RESOURCE_DOES_NOT_EXIST"


def test_search_registered_models_filter_order_and_pages(mlflow_env: LiveServer) -> None:
    client = MlflowClient()
    batch = uuid.uuid4().hex[:8]
    names = [f"page-{batch}-{i}" for i in range(5)]
    for i, name in enumerate(names):
        client.create_registered_model(name, tags={"batch": batch, "i": str(i)})
    found = client.search_registered_models(
        filter_string=f"name LIKE 'page-{batch}-%'", order_by=["name DESC"], max_results=2
    )
    assert [m.name for m in found] == names[::-1][:2]
    seen = [m.name for m in found]
    token = found.token
    while token:
        more = client.search_registered_models(
            filter_string=f"tags.batch = '{batch}'",
            order_by=["name DESC"],
            max_results=2,
            page_token=token,
        )
        seen += [m.name for m in more]
        token = more.token
    assert seen == names[::-1]
    tagged = client.search_registered_models(
        filter_string=f"tags.i = '3' AND tags.batch = '{batch}'"
    )
    assert [m.name for m in tagged] == [names[3]]
    every = mlflow.search_registered_models(filter_string=f"name LIKE 'page-{batch}%'")
    assert sorted(m.name for m in every) == names
    for bad in ("name = 'x' OR 1=1", "name = 'x'; DROP TABLE registered_models; --", "1"):
        with pytest.raises(MlflowException) as exc:
            client.search_registered_models(filter_string=bad)
        assert _code(exc) == "INVALID_PARAMETER_VALUE"
    with pytest.raises(MlflowException) as exc:
        client.search_registered_models(order_by=["name; DROP TABLE registered_models"])
    assert _code(exc) == "INVALID_PARAMETER_VALUE"
    assert len(client.search_registered_models(filter_string=f"tags.batch = '{batch}'")) == 5


def test_search_page_sizes_of_zero_and_less_match_stock(mlflow_env: LiveServer) -> None:
    """Stock: a registered-model search with max_results 0 or less is an empty list (no
    next page: a stock server's token leads back to the same empty page); a model-version
    search refuses it with a 400; a bad filter is still a 400 either way."""
    client = MlflowClient()
    name = _name("zero-page")
    client.create_registered_model(name)
    for size in (0, -1, -5):
        page = client.search_registered_models(max_results=size)
        assert list(page) == []
        assert not page.token
        with pytest.raises(MlflowException) as versions:
            client.search_model_versions(f"name = '{name}'", max_results=size)
        assert _code(versions) == "INVALID_PARAMETER_VALUE"
    with pytest.raises(MlflowException) as bad_filter:
        client.search_registered_models(filter_string="name = 'x' OR 1=1", max_results=0)
    assert _code(bad_filter) == "INVALID_PARAMETER_VALUE"
    with pytest.raises(MlflowException) as too_many:
        client.search_registered_models(max_results=1001)
    assert _code(too_many) == "INVALID_PARAMETER_VALUE"
    assert [m.name for m in client.search_registered_models(f"name = '{name}'", 1)] == [name]


# Keys a stock 3.17 server refuses on registry tags (400 INVALID_PARAMETER_VALUE) ...
REFUSED_TAG_KEYS = [
    "../x", "..", ".", "..a", "...", "/abs", "/", "//", "a/../b", "a/..", "./a", "a/",
    "a//b", "a/./b", "a\\b", "a\nb", "a\tb", "a\x00b", "a\u200bb", "a\U0001f600",
]  # fmt: skip
# ... and keys it takes.
TAKEN_TAG_KEYS = ["a..b", "a/b", ".a", "a.", "a b", " ", "a-b", "a:b", "C:x", "ß", "٣", "k" * 250]


def test_registry_tag_keys_follow_stock_rules(mlflow_env: LiveServer, tmp_path: Path) -> None:
    """Registered-model and model-version tag keys: the characters and path rules of a
    stock server, on set, on create and on delete (where, as on stock, a key over 250
    characters is no error); the 250-character and 100,000-character limits on set."""
    run_id, artifact_uri = _run_with_model(tmp_path)
    client = MlflowClient()
    name = _name("tag-keys")
    client.create_registered_model(name)
    client.create_model_version(name, f"{artifact_uri}/model", run_id=run_id)
    for key in REFUSED_TAG_KEYS:
        calls = {
            "version set": lambda k=key: client.set_model_version_tag(name, "1", k, "v"),
            "model set": lambda k=key: client.set_registered_model_tag(name, k, "v"),
            "version delete": lambda k=key: client.delete_model_version_tag(name, "1", k),
            "model delete": lambda k=key: client.delete_registered_model_tag(name, k),
            "model create": lambda k=key: client.create_registered_model(_name("t"), {k: "v"}),
            "version create": lambda k=key: client.create_model_version(
                name, f"{artifact_uri}/model", run_id=run_id, tags={k: "v"}
            ),
        }
        for what, call in calls.items():
            with pytest.raises(MlflowException) as refused:
                call()
            assert _code(refused) == "INVALID_PARAMETER_VALUE", (what, key)
            assert "tag key" in refused.value.message, (what, key)
    for key in TAKEN_TAG_KEYS:
        client.set_model_version_tag(name, "1", key, "v")
        client.set_registered_model_tag(name, key, "w")
    assert set(client.get_model_version(name, "1").tags) == set(TAKEN_TAG_KEYS)
    assert set(client.get_registered_model(name).tags) == set(TAKEN_TAG_KEYS)
    assert [v.version for v in client.search_model_versions(f"name = '{name}'")] == ["1"]
    for call in (
        lambda: client.set_model_version_tag(name, "1", "k" * 251, "v"),
        lambda: client.set_registered_model_tag(name, "k" * 251, "v"),
        lambda: client.set_model_version_tag(name, "1", "k", "v" * 100_001),
        lambda: client.set_registered_model_tag(name, "k", "v" * 100_001),
    ):
        with pytest.raises(MlflowException) as too_long:
            call()
        assert _code(too_long) == "INVALID_PARAMETER_VALUE"
    client.set_model_version_tag(name, "1", "k", "v" * 100_000)
    client.delete_model_version_tag(name, "1", "k" * 251)
    client.delete_registered_model_tag(name, "k" * 251)


def test_missing_things_are_404_and_unknown_endpoints_too(mlflow_env: LiveServer) -> None:
    client = MlflowClient()
    missing = _name("missing")
    calls = [
        lambda: client.get_registered_model(missing),
        lambda: client.get_model_version(missing, "1"),
        lambda: client.get_model_version_download_uri(missing, "1"),
        lambda: client.set_registered_model_alias(missing, "prod", "1"),
        lambda: client.delete_model_version(missing, "1"),
    ]
    for call in calls:
        with pytest.raises(MlflowException) as exc:
            call()
        assert _code(exc) == "RESOURCE_DOES_NOT_EXIST"
    with pytest.warns(FutureWarning, match="deprecated"), pytest.raises(MlflowException) as exc:
        client.get_latest_versions(missing)
    assert _code(exc) == "RESOURCE_DOES_NOT_EXIST"
    name = _name("empty")
    client.create_registered_model(name)
    with pytest.raises(MlflowException) as exc:
        client.get_model_version(name, "1")
    assert _code(exc) == "RESOURCE_DOES_NOT_EXIST"
    for model in (name, missing):  # a stock server's 400, whichever of the two is missing
        with pytest.raises(MlflowException) as exc:
            client.get_model_version_by_alias(model, "prod")
        assert _code(exc) == "INVALID_PARAMETER_VALUE"
        assert "Registered model alias prod not found." in str(exc.value)
    headers = {"Authorization": f"Bearer {mlflow_env.token}"}
    for path in ("registered-models/list", "model-versions/get-artifact"):
        r = httpx.get(f"{mlflow_env.url}/api/2.0/mlflow/{path}", headers=headers)
        assert (r.status_code, r.json()["error_code"]) == (404, "ENDPOINT_NOT_FOUND")
    r = httpx.get(f"{mlflow_env.url}/ajax-api/2.0/mlflow/registered-models/search", headers=headers)
    assert r.status_code == 200


@pytest.mark.parametrize(
    "source",
    [
        "file:///etc/passwd",
        "/etc",
        "mlflow-artifacts://h:1/../../../../",
        "mlflow-artifacts:/..%2f..%2fetc",
        "s3://other-tenant-bucket/x",
        "http://x/base?../../../etc",
        "gopher://127.0.0.1:6379/_SET",
    ],
)
def test_hostile_sources_are_refused_and_nothing_is_stored(
    mlflow_env: LiveServer, source: str
) -> None:
    client = MlflowClient()
    name = _name("hostile")
    client.create_registered_model(name)
    with pytest.raises(MlflowException) as exc:
        client.create_model_version(name, source)
    assert _code(exc) == "INVALID_PARAMETER_VALUE"
    assert client.search_model_versions(f"name = '{name}'") == []
    assert client.get_registered_model(name).latest_versions == []


# ---------------------------------------------------------------------- versions (need tracking)
def test_versions_create_get_search_update_tags_stages_delete(
    mlflow_env: LiveServer, tmp_path: Path
) -> None:
    client = MlflowClient()
    run_id, artifact_uri = _run_with_model(tmp_path)
    name = _name("mv")
    client.create_registered_model(name)
    source = f"{artifact_uri}/model"
    made = [
        client.create_model_version(name, source, run_id=run_id, tags={"n": str(i)})
        for i in range(3)
    ]
    assert [v.version for v in made] == ["1", "2", "3"]
    first = client.get_model_version(name, "1")
    assert (first.source, first.run_id, first.status, first.current_stage) == (
        source,
        run_id,
        "READY",
        "None",
    )
    assert first.tags == {"n": "0"}
    client.update_model_version(name, "1", description="the first")
    client.set_model_version_tag(name, "1", "k", "v" * 5000)
    client.delete_model_version_tag(name, "1", "n")
    first = client.get_model_version(name, "1")
    assert (first.description, first.tags) == ("the first", {"k": "v" * 5000})
    uri = client.get_model_version_download_uri(name, "1")
    assert uri
    assert not uri.startswith(("file:", "/"))
    found = client.search_model_versions(f"name = '{name}'", order_by=["version_number ASC"])
    assert [v.version for v in found] == ["1", "2", "3"]
    page = client.search_model_versions(f"name = '{name}'", max_results=2)
    # As on a stock server, the version changed last comes first (version 1, described
    # above), then by version, newest first.
    assert [v.version for v in page] == ["1", "3"]
    assert page.token
    rest = client.search_model_versions(f"name = '{name}'", max_results=2, page_token=page.token)
    assert [v.version for v in rest] == ["2"]
    assert not rest.token
    by_run = client.search_model_versions(f"run_id = '{run_id}' AND name = '{name}'")
    assert len(by_run) == 3
    for version, archive in (("1", False), ("2", True)):
        with pytest.warns(FutureWarning, match="deprecated"):  # stages are deprecated, not gone
            client.transition_model_version_stage(name, version, "Production", archive)
    assert client.get_model_version(name, "1").current_stage == "Archived"
    with pytest.warns(FutureWarning, match="deprecated"):  # stages are deprecated, not gone
        latest = client.get_latest_versions(name, stages=["Production"])
    assert [v.version for v in latest] == ["2"]
    model = client.get_registered_model(name)
    assert {v.current_stage: v.version for v in model.latest_versions} == {
        "None": "3",
        "Production": "2",
        "Archived": "1",
    }
    client.delete_model_version(name, "3")
    with pytest.raises(MlflowException) as exc:
        client.get_model_version(name, "3")
    assert _code(exc) == "RESOURCE_DOES_NOT_EXIST"
    assert client.create_model_version(name, source, run_id=run_id).version == "4"


def test_search_filters_a_stock_server_takes(mlflow_env: LiveServer, tmp_path: Path) -> None:
    """Name lists (IN / NOT IN) for registered models and versions, run id patterns (LIKE,
    ILIKE) for versions, and a version number
    written as a quoted string, are filters a stock server answers; they were 400s here."""
    client = MlflowClient()
    run_id, artifact_uri = _run_with_model(tmp_path)
    a, b, c = _name("in-a"), _name("in-b"), _name("in-c")
    for name in (a, b, c):
        client.create_registered_model(name)
    for name in (a, a, a, b):
        client.create_model_version(name, f"{artifact_uri}/model", run_id=run_id)
    models = client.search_registered_models(f"name IN ('{a}', '{c}', 'nobody')")
    assert sorted(m.name for m in models) == sorted([a, c])
    versions = client.search_model_versions(
        f"name IN ('{a}', '{b}') AND version_number <= 2", order_by=["name", "version_number"]
    )
    assert [(v.name, v.version) for v in versions] == [(a, "1"), (a, "2"), (b, "1")]
    others = client.search_model_versions(f"run_id = '{run_id}' AND name NOT IN ('{a}')")
    assert [(v.name, v.version) for v in others] == [(b, "1")]
    for pattern in (f"run_id LIKE '{run_id[:8]}%'", f"run_id ILIKE '{run_id[:8].upper()}%'"):
        found = client.search_model_versions(f"{pattern} AND name = '{b}'")
        assert [(v.name, v.version) for v in found] == [(b, "1")], pattern
    assert client.search_model_versions(f"run_id LIKE 'x{run_id[:8]}%'") == []
    quoted = client.search_model_versions(f"name = '{a}' AND version_number = '2'")
    assert [v.version for v in quoted] == ["2"]
    newer = client.search_model_versions(f"name = '{a}' AND version_number > '1'")
    assert sorted(v.version for v in newer) == ["2", "3"]
    for bad in (f"name = '{a}' AND version_number = 'two'", "name IN (1, 2)"):
        with pytest.raises(MlflowException) as refused:
            client.search_model_versions(bad)
        assert _code(refused) == "INVALID_PARAMETER_VALUE", bad


def test_register_alias_move_and_load_by_alias(mlflow_env: LiveServer, tmp_path: Path) -> None:
    import mlflow.pyfunc

    client = MlflowClient()
    name = _name("aliased")
    run_a, _ = _run_with_model(tmp_path, factor=2)
    run_b, _ = _run_with_model(tmp_path, factor=3)
    v1 = mlflow.register_model(f"runs:/{run_a}/model", name)
    v2 = mlflow.register_model(f"runs:/{run_b}/model", name)
    assert (v1.version, v2.version) == ("1", "2")
    client.set_registered_model_alias(name, "champion", "1")
    assert mlflow.pyfunc.load_model(f"models:/{name}@champion").predict([1, 2]) == [2, 4]
    client.set_registered_model_alias(name, "champion", "2")  # moves
    by_alias = client.get_model_version_by_alias(name, "champion")
    assert (by_alias.version, by_alias.aliases) == ("2", ["champion"])
    assert mlflow.pyfunc.load_model(f"models:/{name}@champion").predict([1, 2]) == [3, 6]
    assert mlflow.pyfunc.load_model(f"models:/{name}/1").predict([5]) == [10]
    assert client.get_registered_model(name).aliases == {"champion": "2"}
    for reserved in ("latest", "v1"):
        with pytest.raises(MlflowException):
            client.set_registered_model_alias(name, reserved, "1")
    client.delete_registered_model_alias(name, "champion")
    with pytest.raises(MlflowException) as exc:
        client.get_model_version_by_alias(name, "champion")
    assert _code(exc) == "INVALID_PARAMETER_VALUE"  # a stock server's code
    client.set_registered_model_alias(name, "gone-with-it", "1")
    client.delete_model_version(name, "1")
    assert client.get_registered_model(name).aliases == {}


def test_alias_latest_is_the_newest_version_as_on_stock(
    mlflow_env: LiveServer, tmp_path: Path
) -> None:
    """Stock: ``latest`` (any case) is a reserved alias every model has, naming its newest
    version whatever its stage; ``models:/name@latest`` loads it; a model without versions
    has no latest (404), and no alias can be set by that name."""
    import mlflow.pyfunc

    client = MlflowClient()
    name = _name("latest")
    client.create_registered_model(name)
    with pytest.raises(MlflowException) as none_yet:
        client.get_model_version_by_alias(name, "latest")
    assert _code(none_yet) == "RESOURCE_DOES_NOT_EXIST"
    assert f"Latest version not found for model {name}." in str(none_yet.value)
    run_a, _ = _run_with_model(tmp_path, factor=2)
    run_b, _ = _run_with_model(tmp_path, factor=3)
    for run_id in (run_a, run_b, run_a):
        mlflow.register_model(f"runs:/{run_id}/model", name)
    with pytest.warns(FutureWarning, match="deprecated"):  # stages are deprecated, not gone
        client.transition_model_version_stage(name, "1", "Production")
    client.set_registered_model_alias(name, "champion", "2")
    for spelling in ("latest", "LATEST", "Latest"):
        assert client.get_model_version_by_alias(name, spelling).version == "3"
    client.delete_model_version(name, "3")
    newest = client.get_model_version_by_alias(name, "latest")
    assert (newest.version, newest.aliases) == ("2", ["champion"])
    assert mlflow.pyfunc.load_model(f"models:/{name}@latest").predict([1, 2]) == [3, 6]
    assert mlflow.pyfunc.load_model(f"models:/{name}@LATEST").predict([1]) == [3]
    for spelling in ("latest", "Latest"):
        with pytest.raises(MlflowException) as reserved:
            client.set_registered_model_alias(name, spelling, "1")
        assert _code(reserved) == "INVALID_PARAMETER_VALUE"
    with pytest.raises(MlflowException) as no_model:
        client.get_model_version_by_alias(name + "-nope", "latest")
    assert _code(no_model) == "RESOURCE_DOES_NOT_EXIST"


def test_alias_names_are_checked_on_lookup_and_delete_as_on_stock(
    mlflow_env: LiveServer, tmp_path: Path
) -> None:
    """Stock checks an alias name on lookup before it looks for the model (a 400 naming the
    rule, not a 404); deleting a reserved name is a no-op; a 255-character name of any
    script is valid, 256 are not."""
    client = MlflowClient()
    name = _name("alias-names")
    run_id, _ = _run_with_model(tmp_path)
    mlflow.register_model(f"runs:/{run_id}/model", name)
    for model in (name, name + "-nope"):
        for bad in ("Bad Alias!", "a.b", "x" * 256, "new\nline"):
            with pytest.raises(MlflowException) as refused:
                client.get_model_version_by_alias(model, bad)
            assert _code(refused) == "INVALID_PARAMETER_VALUE", (model, bad)
    with pytest.raises(MlflowException) as explained:
        client.get_model_version_by_alias(name, "Bad Alias!")
    assert "may only contain alphanumerics, underscores (_), and dashes (-)" in str(explained.value)
    wide = "é" * 255
    client.set_registered_model_alias(name, wide, "1")
    assert client.get_model_version_by_alias(name, wide).aliases == [wide]
    for reserved in ("latest", "LATEST", "v1"):
        client.delete_registered_model_alias(name, reserved)
    client.delete_registered_model_alias(name, wide)
    assert client.get_registered_model(name).aliases == {}


def test_eight_clients_register_at_once_unique_and_gapless(
    mlflow_env: LiveServer, tmp_path: Path
) -> None:
    run_id, artifact_uri = _run_with_model(tmp_path)
    name = _name("raced")
    MlflowClient().create_registered_model(name)
    barrier = threading.Barrier(8)

    def register(_i: int) -> ModelVersion:
        client = MlflowClient()
        barrier.wait(timeout=60)
        return client.create_model_version(name, f"{artifact_uri}/model", run_id=run_id)

    with ThreadPoolExecutor(max_workers=8) as pool:
        made = list(pool.map(register, range(8)))
    assert sorted(int(v.version) for v in made) == list(range(1, 9))
    stored = MlflowClient().search_model_versions(f"name = '{name}'")
    assert sorted(int(v.version) for v in stored) == list(range(1, 9))


def test_a_version_without_description_reads_as_empty_text_as_on_stock(
    mlflow_env: LiveServer, tmp_path: Path
) -> None:
    """A stock server always sends a version's description, so the client reads one never
    set as "" (not None) wherever a version comes back; a script's
    ``mv.description.strip()`` works against either server."""
    client = MlflowClient()
    name = _name("no-description")
    run_id, _ = _run_with_model(tmp_path)
    registered = mlflow.register_model(f"runs:/{run_id}/model", name)
    made = client.create_model_version(name, registered.source, run_id=run_id)
    client.set_registered_model_alias(name, "champion", made.version)
    with pytest.warns(FutureWarning, match="deprecated"):  # stages are deprecated, not gone
        staged = client.transition_model_version_stage(name, "1", "Staging")
    with pytest.warns(FutureWarning, match="deprecated"):
        latest = client.get_latest_versions(name)
    copied = client.copy_model_version(f"models:/{name}/1", name + "-copy")
    seen = [
        registered,
        made,
        staged,
        copied,
        client.get_model_version(name, "1"),
        client.get_model_version_by_alias(name, "champion"),
        *client.search_model_versions(f"name = '{name}'"),
        *client.get_registered_model(name).latest_versions,
        *latest,
    ]
    assert [v.description for v in seen] == [""] * len(seen)
    described = client.update_model_version(name, "2", description="second")
    assert described.description == "second"
    assert client.update_model_version(name, "2", description="").description == ""


def test_prompts_register_load_alias_and_search_as_on_stock(mlflow_env: LiveServer) -> None:
    """``mlflow.genai`` keeps prompts in the registry: a prompt version is a model version
    tagged as a prompt whose source is a placeholder (``prompt-template``). A stock server
    takes it; here it was refused as a source outside the artifact store. Any other source
    for a prompt version is still refused, and a prompt version cannot be copied as a model."""
    import mlflow.genai

    name = _name("prompt")
    first = mlflow.genai.register_prompt(name=name, template="Hi {{x}}", commit_message="c1")
    chat = [{"role": "user", "content": "Hey {{y}}"}]
    second = mlflow.genai.register_prompt(name=name, template=chat, tags={"k": "v"})
    assert (first.version, second.version) == (1, 2)
    assert mlflow.genai.load_prompt(f"prompts:/{name}/1").format(x="a") == "Hi a"
    assert mlflow.genai.load_prompt(f"prompts:/{name}@latest").template == chat
    mlflow.genai.set_prompt_alias(name, "prod", 1)
    by_alias = mlflow.genai.load_prompt(f"prompts:/{name}@prod")
    assert (by_alias.version, by_alias.template, by_alias.commit_message) == (1, "Hi {{x}}", "c1")
    assert mlflow.genai.load_prompt(name, version=2).tags == {"k": "v"}
    assert [p.name for p in mlflow.genai.search_prompts(f"name = '{name}'")] == [name]
    client = MlflowClient()
    assert client.search_registered_models(f"name = '{name}'") == []  # models, not prompts
    headers = {"Authorization": f"Bearer {mlflow_env.token}"}
    url = f"{mlflow_env.url}/api/2.0/mlflow/model-versions/create"
    prompt_tags = [{"key": "mlflow.prompt.is_prompt", "value": "true"}]
    for source in ("file:///etc/passwd", "mlflow-artifacts:/1/x", "dummy-source/../x", ""):
        body = {"name": name, "source": source, "tags": prompt_tags}
        refused = httpx.post(url, json=body, headers=headers)
        assert (refused.status_code, refused.json()["error_code"]) == (
            400,
            "INVALID_PARAMETER_VALUE",
        ), source
    model = _name("not-a-prompt")
    client.create_registered_model(model)
    copied = httpx.post(url, json={"name": model, "source": f"models:/{name}/1"}, headers=headers)
    assert (copied.status_code, copied.json()["error_code"]) == (400, "INVALID_PARAMETER_VALUE")
    assert client.search_model_versions(f"name = '{model}'") == []
    versions = httpx.get(
        f"{mlflow_env.url}/api/2.0/mlflow/model-versions/search",
        params={"filter": f"name = '{name}' AND tags.`mlflow.prompt.is_prompt` = 'true'"},
        headers=headers,
    ).json()["model_versions"]
    assert sorted(v["version"] for v in versions) == ["1", "2"]


def test_a_version_names_the_run_or_logged_model_that_holds_its_files(
    mlflow_env: LiveServer, tmp_path: Path
) -> None:
    """As on a stock server, a ``run_id`` (or ``model_id``) sent with a new version must be
    the run (logged model) whose artifacts hold its source, when the caller can read it,
    and a copy's must be those of the version it copies: a version cannot claim the lineage
    of a run it can see did not make it. Refused as a 400 that stores nothing. A run the
    caller cannot read (here: one that does not exist), or a run other than the one that
    produced the named logged model, is taken as a stock server takes it, kept as given
    but unverified: the native lineage says so and does not follow it."""
    import mlflow.pyfunc

    client = MlflowClient()
    name = _name("lineage")
    run_a, uri_a = _run_with_model(tmp_path, factor=2)
    run_b, uri_b = _run_with_model(tmp_path, factor=3)
    code = tmp_path / "doubler_2.py"
    with mlflow.start_run() as logging_run:
        logged = mlflow.pyfunc.log_model(name="logged", python_model=str(code))
    assert logged.model_id is not None
    client.create_registered_model(name)
    claims: dict[str, tuple[str, str | None, str | None]] = {  # why: (source, run, model)
        "another run's files": (f"{uri_a}/model", run_b, None),
        "another run's runs:/ uri": (f"runs:/{run_a}/model", run_b, None),
        "a run's files as a logged model's": (f"{uri_a}/model", None, logged.model_id),
        "a logged model under another's id": (logged.model_uri, None, "m-" + "0" * 32),
    }
    for why, (source, run_id, model_id) in claims.items():
        with pytest.raises(MlflowException) as refused:
            client.create_model_version(name, source, run_id=run_id, model_id=model_id)
        assert _code(refused) == "INVALID_PARAMETER_VALUE", why
    assert client.search_model_versions(f"name = '{name}'") == []
    made = [
        client.create_model_version(name, f"{uri_a}/model", run_id=run_a),
        mlflow.register_model(f"runs:/{run_b}/model", name),
        mlflow.register_model(logged.model_uri, name),
        client.create_model_version(name, f"{uri_b}/model"),  # no claim, nothing to check
        client.create_model_version(
            name, logged.model_uri, run_id=logging_run.info.run_id, model_id=logged.model_id
        ),
        client.create_model_version(name, f"{uri_a}/model", run_id="0" * 32),
        client.create_model_version(name, logged.model_uri, run_id=run_a, model_id=logged.model_id),
    ]
    assert [(v.version, v.run_id) for v in made] == [
        ("1", run_a),
        ("2", run_b),
        ("3", logging_run.info.run_id),
        ("4", None),
        ("5", logging_run.info.run_id),
        ("6", "0" * 32),
        ("7", run_a),
    ]
    headers = {"Authorization": f"Bearer {mlflow_env.token}"}
    verified = {
        v.version: httpx.get(
            f"{mlflow_env.url}/api/v1/models/{name}/versions/{v.version}", headers=headers
        ).json()["lineage"]["run_verified"]
        for v in made
    }
    assert verified == {str(n): n < 6 for n in range(1, 8)}
    client.create_registered_model(name + "-copy")
    with pytest.raises(MlflowException) as copied:
        client.create_model_version(name + "-copy", f"models:/{name}/1", run_id=run_b)
    assert _code(copied) == "INVALID_PARAMETER_VALUE"
    copy = client.copy_model_version(f"models:/{name}/2", name + "-copy")
    assert (copy.version, copy.run_id) == ("1", run_b)
    assert mlflow.pyfunc.load_model(f"models:/{name}-copy/1").predict([1]) == [3]


def test_a_rename_updates_every_version_as_on_stock(mlflow_env: LiveServer, tmp_path: Path) -> None:
    """A stock server updates each version of a renamed model (each carries the model's
    name), so after a rename a search's default order (changed last first, then newest
    version first) lists the versions newest first; here they kept their old times."""
    client = MlflowClient()
    name = _name("renamed")
    run_id, _ = _run_with_model(tmp_path)
    for _ in range(3):
        mlflow.register_model(f"runs:/{run_id}/model", name)
    client.update_model_version(name, "1", description="touched last")
    before = client.search_model_versions(f"name = '{name}'")
    assert [v.version for v in before] == ["1", "3", "2"]
    client.rename_registered_model(name, name + "-new")
    renamed = client.get_registered_model(name + "-new")
    after = client.search_model_versions(f"name = '{name}-new'")
    assert [v.version for v in after] == ["3", "2", "1"]
    assert {v.last_updated_timestamp for v in after} == {renamed.last_updated_timestamp}
    assert min(v.last_updated_timestamp for v in after) >= max(
        v.last_updated_timestamp for v in before
    )
    client.update_model_version(name + "-new", "2", description="touched after")
    client.rename_registered_model(name + "-new", name + "-new")  # a no-op rename, as on stock
    again = client.search_model_versions(f"name = '{name}-new'")
    assert [v.version for v in again] == ["3", "2", "1"]


def test_version_numbers_no_version_can_have_are_missing_versions_as_on_stock(
    mlflow_env: LiveServer, tmp_path: Path
) -> None:
    """A stock server looks up any integer version and finds none for 0, a negative number
    or one past the column's range (404); here those were 400s. What is not an integer
    is still a 400."""
    client = MlflowClient()
    name = _name("numbers")
    run_id, _ = _run_with_model(tmp_path)
    mlflow.register_model(f"runs:/{run_id}/model", name)
    for version in ("0", "-1", "99999999999", -3):
        calls = {
            "get": lambda v=version: client.get_model_version(name, v),
            "download uri": lambda v=version: client.get_model_version_download_uri(name, v),
            "update": lambda v=version: client.update_model_version(name, v, "d"),
            "delete": lambda v=version: client.delete_model_version(name, v),
            "set tag": lambda v=version: client.set_model_version_tag(name, v, "k", "v"),
            "delete tag": lambda v=version: client.delete_model_version_tag(name, v, "k"),
            "set alias": lambda v=version: client.set_registered_model_alias(name, "a", v),
        }
        for what, call in calls.items():
            with pytest.raises(MlflowException) as missing:
                call()
            assert _code(missing) == "RESOURCE_DOES_NOT_EXIST", (what, version)
    for version in ("x", "1.0", "latest"):
        with pytest.raises(MlflowException) as malformed:
            client.get_model_version(name, version)
        assert _code(malformed) == "INVALID_PARAMETER_VALUE", version
    assert client.get_model_version(name, "01").version == "1"
    assert client.get_registered_model(name).aliases == {}
