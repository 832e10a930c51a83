"""Where a client can tell Shamal from a stock MLflow server, it cannot (issue 26, point 2).

The stock ``mlflow`` client against a live Shamal, on SQLite and PostgreSQL: run ids the
server does not know (or may not show) are taken as a stock server takes them, but kept
unverified so Shamal's lineage never claims them; unnamed logged models get unique names;
a version made from a logged model is listed in its ``mlflow.modelVersions`` tag; the
version probe answers the MLflow version Shamal speaks; sampled metric histories keep the
points a stock server keeps (the stock server's own store, in process, is the judge).
"""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.store.tracking.rest_store import RestStore
from mlflow.utils.rest_utils import MlflowHostCreds
from packaging.version import Version

from shamal.mlflow import MLFLOW_VERSION
from tests.live import LiveServer

pytestmark = pytest.mark.slow


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _client(server: LiveServer) -> MlflowClient:
    # The token comes from MLFLOW_TRACKING_TOKEN (mlflow_env); the URIs are this client's own.
    return MlflowClient(tracking_uri=server.url, registry_uri=server.url)


def _headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _lineage(server: LiveServer, name: str, version: str, token: str) -> dict[str, Any]:
    answer = httpx.get(
        f"{server.url}/api/v1/models/{name}/versions/{version}", headers=_headers(token)
    )
    assert answer.status_code == 200, answer.text
    lineage: dict[str, Any] = answer.json()["lineage"]
    return lineage


def _account(server: LiveServer, team: str, user: str, role: str | None) -> str:
    """A new account (a member of ``team`` when ``role`` is given) and its token."""
    admin = _headers(server.token)
    assert httpx.post(f"{server.url}/api/v1/users", json={"name": user}, headers=admin)
    if role is not None:
        member = httpx.put(
            f"{server.url}/api/v1/teams/{team}/members/{user}", json={"role": role}, headers=admin
        )
        assert member.is_success, member.text
    made = httpx.post(
        f"{server.url}/api/v1/tokens", json={"name": "t", "user": user}, headers=admin
    )
    assert made.is_success, made.text
    secret: str = made.json()["secret"]
    return secret


def _mlflow(server: LiveServer, path: str, body: dict[str, Any], token: str) -> Any:
    answer = httpx.post(f"{server.url}/api/2.0/mlflow/{path}", json=body, headers=_headers(token))
    assert answer.status_code == 200, answer.text
    return answer.json()


# ---------------------------------------------------------------------- unverified run ids
def test_a_version_may_name_a_run_the_server_does_not_know(mlflow_env: LiveServer) -> None:
    """MLflow's own registry tests register ``runs:/run_id/model`` with ``run_id_1``: a stock
    server takes both; so does Shamal, and answers the run id as given."""
    client = _client(mlflow_env)
    name = _name("unknown-run")
    client.create_registered_model(name)
    made = client.create_model_version(name, "runs:/run_id/model", "run_id_1", {"k": "v"})
    again = client.create_model_version(name, "runs:/run_id/another_model", "run_id_1")
    assert (made.version, made.run_id, made.source, made.tags) == (
        "1",
        "run_id_1",
        "runs:/run_id/model",
        {"k": "v"},
    )
    assert (again.version, again.run_id) == ("2", "run_id_1")
    got = client.get_model_version(name, "1")
    assert (got.run_id, got.source) == ("run_id_1", "runs:/run_id/model")
    found = client.search_model_versions(f"run_id = 'run_id_1' AND name = '{name}'")
    assert sorted(v.version for v in found) == ["1", "2"]
    # No files behind it: the download URI is the source as given, nothing the server made.
    assert client.get_model_version_download_uri(name, "1") == "runs:/run_id/model"
    lineage = _lineage(mlflow_env, name, "1", mlflow_env.token)
    assert (lineage["run_id"], lineage["run_verified"], lineage["run_visible"]) == (
        "run_id_1",
        False,
        False,
    )
    # A known, readable run with a source naming an unknown one (MLflow's GraphQL test does
    # this): taken as a claim too, unverified; a source inside that run stays verified.
    experiment = client.create_experiment(_name("known-run"))
    known = client.create_run(experiment).info.run_id
    claimed = client.create_model_version(name, "runs:/graphql_test/model", known)
    assert (claimed.version, claimed.run_id) == ("3", known)
    claimed_lineage = _lineage(mlflow_env, name, "3", mlflow_env.token)
    assert (claimed_lineage["run_id"], claimed_lineage["run_verified"]) == (known, False)
    own = client.create_model_version(name, f"runs:/{known}/model", known)
    assert _lineage(mlflow_env, name, own.version, mlflow_env.token)["run_verified"] is True
    # Hostile sources stay refused, known run or not.
    for source in ("runs:/run_id/../../etc", "file:///etc/passwd", "s3://bucket/model"):
        with pytest.raises(MlflowException) as refused:
            client.create_model_version(name, source, "run_id_1")
        assert refused.value.error_code == "INVALID_PARAMETER_VALUE", source
    assert len(client.search_model_versions(f"name = '{name}'")) == 4


def test_another_teams_run_is_taken_as_an_unknown_one(mlflow_env: LiveServer) -> None:
    """A run id of a team the caller cannot read is accepted exactly as an unknown id is
    (nothing tells the caller it exists), kept unverified, and never shown as lineage:
    not to the caller, and not to the run's own team, whose run did not make the version."""
    team = _name("vision")
    admin = _headers(mlflow_env.token)
    assert httpx.post(f"{mlflow_env.url}/api/v1/teams", json={"name": team}, headers=admin)
    owner = _account(mlflow_env, team, _name("mia"), "member")
    outsider = _account(mlflow_env, team, _name("out"), None)
    tag = [{"key": "shamal.team", "value": team}]
    experiment = _mlflow(mlflow_env, "experiments/create", {"name": team, "tags": tag}, owner)
    run = _mlflow(mlflow_env, "runs/create", {"experiment_id": experiment["experiment_id"]}, owner)[
        "run"
    ]["info"]["run_id"]
    name = _name("claims")
    _mlflow(mlflow_env, "registered-models/create", {"name": name}, outsider)
    answers = [
        _mlflow(
            mlflow_env,
            "model-versions/create",
            {"name": name, "source": f"runs:/{claimed}/model", "run_id": claimed},
            outsider,
        )["model_version"]
        for claimed in (run, uuid.uuid4().hex)
    ]
    hidden, unknown = answers
    assert hidden["run_id"] == run
    # Reading the run itself, the outsider gets an unknown run's answer, word for word.
    for claimed in (run, uuid.uuid4().hex):
        read = httpx.get(
            f"{mlflow_env.url}/api/2.0/mlflow/runs/get",
            params={"run_id": claimed},
            headers=_headers(outsider),
        )
        assert (read.status_code, read.json()) == (
            404,
            {
                "error_code": "RESOURCE_DOES_NOT_EXIST",
                "message": f"Run with id={claimed} not found",
            },
        )
    # The two answers differ only where the requests did (the ids) and in their number/time.
    same = ("run_id", "source", "version", "creation_timestamp", "last_updated_timestamp")
    assert {k: v for k, v in hidden.items() if k not in same} == {
        k: v for k, v in unknown.items() if k not in same
    }
    assert "storage_location" not in hidden or hidden["storage_location"] == ""
    for token in (outsider, mlflow_env.token):
        lineage = _lineage(mlflow_env, name, "1", token)
        assert (lineage["run_verified"], lineage["run_name"], lineage["datasets"]) == (
            False,
            None,
            [],
        )
    # The run's own team registers a version it did make: that one is lineage.
    made = _name("made")
    _mlflow(mlflow_env, "registered-models/create", {"name": made, "tags": tag}, owner)
    body = {"name": made, "source": f"runs:/{run}/model", "run_id": run}
    _mlflow(mlflow_env, "model-versions/create", body, owner)
    assert _lineage(mlflow_env, made, "1", owner)["run_verified"] is True
    graph = httpx.get(
        f"{mlflow_env.url}/api/v1/lineage",
        params={"uri": f"runs:/{run}", "direction": "down"},
        headers=_headers(mlflow_env.token),
    )
    assert graph.status_code == 200, graph.text
    assert f"models:/{made}/1" in graph.text
    assert f"models:/{name}/1" not in graph.text


def test_a_logged_model_may_name_a_source_run_the_server_does_not_know(
    mlflow_env: LiveServer,
) -> None:
    client = _client(mlflow_env)
    experiment = client.create_experiment(_name("logged"))
    claimed = uuid.uuid4().hex
    model = client.create_logged_model(experiment, name="m", source_run_id=claimed)
    assert client.get_logged_model(model.model_id).source_run_id == claimed
    # Its lineage upstream stops at the model: the claimed run is no edge of the graph.
    graph = httpx.get(
        f"{mlflow_env.url}/api/v1/lineage",
        params={"uri": f"models:/{model.model_id}", "direction": "up"},
        headers=_headers(mlflow_env.token),
    )
    assert graph.status_code == 200, graph.text
    assert graph.json()["edges"] == []
    # A version registered from it does not inherit the unverified run as its lineage.
    name = _name("from-logged")
    client.create_registered_model(name)
    version = client.create_model_version(
        name, f"models:/{model.model_id}", model_id=model.model_id
    )
    assert version.run_id in (None, "")
    with pytest.raises(MlflowException) as refused:
        client.create_logged_model(experiment, source_run_id="../" + claimed)
    assert refused.value.error_code == "INVALID_PARAMETER_VALUE"


# ---------------------------------------------------------------------- logged models
def test_unnamed_logged_models_get_unique_names(mlflow_env: LiveServer) -> None:
    client = _client(mlflow_env)
    experiment = client.create_experiment(_name("unnamed"))
    first = client.create_logged_model(experiment)
    second = client.create_logged_model(experiment)
    assert first.name
    assert second.name
    assert first.name != second.name
    assert "model" not in (first.name, second.name)
    found = client.search_logged_models([experiment], filter_string=f"name = '{first.name}'")
    assert [m.model_id for m in found] == [first.model_id]


def test_a_version_from_a_logged_model_is_listed_in_its_tag(mlflow_env: LiveServer) -> None:
    """``mlflow.modelVersions`` is a JSON list of ``{name, version}`` a stock server appends
    to each time a version names the logged model (the version as its registry store holds
    it: an integer), once per version."""
    client = _client(mlflow_env)
    experiment = client.create_experiment(_name("tagged"))
    model = client.create_logged_model(experiment, name="tagged")
    first, second = _name("first"), _name("second")
    for name in (first, second):
        client.create_registered_model(name)
    uri = f"models:/{model.model_id}"
    client.create_model_version(first, uri, model_id=model.model_id)
    assert json.loads(client.get_logged_model(model.model_id).tags["mlflow.modelVersions"]) == [
        {"name": first, "version": 1}
    ]
    client.create_model_version(first, uri, model_id=model.model_id)
    client.create_model_version(second, uri, model_id=model.model_id)
    listed = json.loads(client.get_logged_model(model.model_id).tags["mlflow.modelVersions"])
    assert listed == [
        {"name": first, "version": 1},
        {"name": first, "version": 2},
        {"name": second, "version": 1},
    ]
    # A version without model_id leaves the tag alone.
    other = client.create_logged_model(experiment, name="untagged")
    client.create_model_version(second, f"models:/{other.model_id}")
    assert "mlflow.modelVersions" not in client.get_logged_model(other.model_id).tags


# ---------------------------------------------------------------------- the version probe
def test_the_version_probe_answers_the_mlflow_version_spoken(mlflow_env: LiveServer) -> None:
    import mlflow

    pinned = Version(mlflow.__version__)
    assert Version(MLFLOW_VERSION) == Version(f"{pinned.major}.{pinned.minor}")
    creds = MlflowHostCreds(mlflow_env.url, token=mlflow_env.token)
    assert RestStore._get_server_version(creds) == Version(MLFLOW_VERSION)
    answer = httpx.get(f"{mlflow_env.url}/version")
    assert answer.text == MLFLOW_VERSION
    assert answer.headers["x-shamal-version"] == __import__("shamal").__version__


# ---------------------------------------------------------------------- sampled histories
def _stock_store(tmp_path: Path) -> Any:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    return SqlAlchemyStore(f"sqlite:///{tmp_path}/stock.db", str(tmp_path / "artifacts"))


def _points(seed: int, count: int) -> list[Metric]:
    """Irregular steps, several points on one step, negative steps and a NaN."""
    points = []
    for i in range(count):
        step = (i * 7 + seed) // 3 - 5
        value = math.nan if i == count // 2 else float((i * 31 + seed) % 17)
        points.append(Metric("loss", value, 1_000 + (i * 13 + seed) % 50, step))
    return points


def _value(value: Any) -> Any:
    """A metric value, NaN spelled one way (proto JSON sends the string ``"NaN"``)."""
    return "nan" if str(value).lower() == "nan" else float(value)


def _shape(metrics: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(m["run_id"], m["step"], m["timestamp"], _value(m["value"])) for m in metrics]


# The stock store's own models use a loader SQLAlchemy 2.1 deprecates: its warning, not ours.
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")
def test_sampled_histories_keep_the_points_a_stock_server_keeps(
    mlflow_env: LiveServer, tmp_path: Path
) -> None:
    client = _client(mlflow_env)
    stock = _stock_store(tmp_path)
    stock_experiment = stock.create_experiment("judge")
    experiment = client.create_experiment(_name("sampled"))
    ours, theirs = [], []
    for seed, count in ((0, 120), (5, 37), (2, 1)):
        points = _points(seed, count)
        run = client.create_run(experiment).info.run_id
        client.log_batch(run, metrics=points)
        judge = stock.create_run(stock_experiment, "u", 0, [], "r").info.run_id
        stock.log_batch(judge, points, [], [])
        ours.append(run)
        theirs.append(judge)
    rename = dict(zip(theirs, ours, strict=True))
    for max_results, steps in ((10, None), (1, None), (2500, None), (7, (0, 20)), (3, (-9, -1))):
        params: dict[str, Any] = {"run_ids": ours, "metric_key": "loss"}
        params["max_results"] = max_results
        if steps is not None:
            params["start_step"], params["end_step"] = steps
        answer = httpx.get(
            f"{mlflow_env.url}/api/2.0/mlflow/metrics/get-history-bulk-interval",
            params=params,
            headers=_headers(mlflow_env.token),
        )
        assert answer.status_code == 200, answer.text
        start, end = steps if steps is not None else (None, None)
        expected = [
            {
                "run_id": rename[m.run_id],
                "step": m.step,
                "timestamp": m.timestamp,
                "value": m.value,
            }
            for m in stock.get_metric_history_bulk_interval(theirs, "loss", max_results, start, end)
        ]
        assert _shape(answer.json().get("metrics", [])) == _shape(expected), (max_results, steps)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"max_results": 0}, "max_results must be between 1 and 2500."),
        ({"max_results": 2501}, "max_results must be between 1 and 2500."),
        ({"start_step": 3}, "If either start step or end step are specified, both must be"),
        ({"start_step": 3, "end_step": 1}, "end_step must be greater than start_step."),
    ],
)
def test_sampled_history_refusals_use_stock_words(
    mlflow_env: LiveServer, params: dict[str, Any], message: str
) -> None:
    client = _client(mlflow_env)
    run = client.create_run(client.create_experiment(_name("refused"))).info.run_id
    answer = httpx.get(
        f"{mlflow_env.url}/api/2.0/mlflow/metrics/get-history-bulk-interval",
        params={"run_ids": [run], "metric_key": "loss", **params},
        headers=_headers(mlflow_env.token),
    )
    assert answer.status_code == 400
    assert answer.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert answer.json()["message"].startswith(message)


# ---------------------------------------------------------------------- error wording
def test_refusals_use_a_stock_servers_words(mlflow_env: LiveServer) -> None:
    """MLflow's clients and tests match on these messages, not only on the error codes."""
    client = _client(mlflow_env)
    name, experiment = _name("worded"), _name("worded")
    client.create_registered_model(name)
    client.create_experiment(experiment)
    missing_run = uuid.uuid4().hex
    expected: dict[str, tuple[Any, str, str]] = {
        "missing model": (
            lambda: client.get_registered_model(name + "-x"),
            "RESOURCE_DOES_NOT_EXIST",
            f"Registered Model with name={name}-x not found",
        ),
        "missing version": (
            lambda: client.get_model_version(name, "7"),
            "RESOURCE_DOES_NOT_EXIST",
            f"Model Version (name={name}, version=7) not found",
        ),
        # A stock server looks (model, alias) up alone: a 400, whichever is missing.
        "missing alias": (
            lambda: client.get_model_version_by_alias(name, "gone"),
            "INVALID_PARAMETER_VALUE",
            "Registered model alias gone not found.",
        ),
        "missing model's alias": (
            lambda: client.get_model_version_by_alias(name + "-x", "champion"),
            "INVALID_PARAMETER_VALUE",
            "Registered model alias champion not found.",
        ),
        "model taken": (
            lambda: client.create_registered_model(name),
            "RESOURCE_ALREADY_EXISTS",
            f"Registered Model (name={name}) already exists.",
        ),
        "experiment taken": (
            lambda: client.create_experiment(experiment),
            "RESOURCE_ALREADY_EXISTS",
            f"Experiment(name={experiment}) already exists.",
        ),
        "missing run": (
            lambda: client.get_run(missing_run),
            "RESOURCE_DOES_NOT_EXIST",
            f"Run with id={missing_run} not found",
        ),
    }
    for why, (call, code, words) in expected.items():
        with pytest.raises(MlflowException) as refused:
            call()
        assert refused.value.error_code == code, why
        assert words in str(refused.value), why


def test_invalid_parameters_use_a_stock_servers_words(mlflow_env: LiveServer) -> None:
    client = _client(mlflow_env)
    name = _name("invalid")
    client.create_registered_model(name)
    client.create_model_version(name, "runs:/run_id/model", "run_id_1")
    base = f"{mlflow_env.url}/api/2.0/mlflow"
    headers = _headers(mlflow_env.token)
    calls = {
        "bad stage": (
            "POST",
            "model-versions/transition-stage",
            {"name": name, "version": "1", "stage": "bogus", "archive_existing_versions": False},
            "Invalid Model Version stage: bogus. Value must be one of None, Staging, "
            "Production, Archived.",
        ),
        "bad version": (
            "GET",
            "model-versions/get",
            {"name": name, "version": "x"},
            "Parameter 'version' must be an integer, got 'x'.",
        ),
        "version alias": (
            "POST",
            "registered-models/alias",
            {"name": name, "alias": "v3", "version": "1"},
            "Version alias name 'v3' is reserved.",
        ),
        "bad alias": (
            "POST",
            "registered-models/alias",
            {"name": name, "alias": "a b", "version": "1"},
            "Invalid alias name: 'a b'. Names may only contain alphanumerics, underscores (_), "
            "and dashes (-).",
        ),
        "bad name": (
            "POST",
            "registered-models/create",
            {"name": "a/b"},
            "Invalid model name 'a/b'. Names cannot contain '/' or ':'.",
        ),
    }
    for why, (method, path, body, words) in calls.items():
        sent = {"params": body} if method == "GET" else {"json": body}
        answer = httpx.request(method, f"{base}/{path}", headers=headers, **sent)
        assert (answer.status_code, answer.json()) == (
            400,
            {"error_code": "INVALID_PARAMETER_VALUE", "message": words},
        ), why
