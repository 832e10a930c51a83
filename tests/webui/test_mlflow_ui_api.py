"""MLflow's own UI under /mlflow/, in process, on SQLite and PostgreSQL: the session in front
of it (signed out, other origins, other teams), the calls it makes answered as a stock
server answers them (GraphQL, bulk histories, dataset summaries, artifact files), and the
mlflow client's "View run at" links. The same pages in the real Chromium:
``test_mlflow_ui.py``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from shamal.webui import STOCK_UI_PATH, stock_ui_build
from tests import needs
from tests.webui.conftest import sign_in
from tests.webui.test_pages import MLFLOW, _experiment, _member_token, _run


def _stock_ui_index() -> Path:
    spec = importlib.util.find_spec("mlflow")
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0] if locations else "mlflow") / "server/js/build/index.html"


@pytest.fixture(autouse=True)
def _stock_ui_installed() -> None:
    needs.path(_stock_ui_index(), "MLflow's built UI (pip install 'shamal[mlflow-ui]')")
    assert stock_ui_build() is not None


SAME_ORIGIN = {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
AJAX = "/mlflow/ajax-api/2.0/mlflow"


def _graphql(client: TestClient, query: str, variables: dict[str, Any], path: str) -> Any:
    answer = client.post(path, json={"query": query, "variables": variables}, headers=SAME_ORIGIN)
    assert answer.status_code == 200, answer.text
    return answer.json()


GET_RUN = """
query GetRun($data: MlflowGetRunInput!) @component(name: "MLflow.ExperimentRunTracking") {
  mlflowGetRun(input: $data) {
    apiError { code message }
    run {
      info { runUuid runName status startTime experimentId }
      experiment { experimentId name }
      modelVersions { name version status }
      data { metrics { key value step timestamp } params { key value } tags { key value } }
      inputs { datasetInputs { dataset { name digest } tags { key value } } }
    }
  }
}
"""
SAMPLED = """
query H($data: MlflowGetMetricHistoryBulkIntervalInput!) {
  mlflowGetMetricHistoryBulkInterval(input: $data) {
    __typename metrics { runId key step value timestamp }
  }
}
"""


def test_signed_out_the_stock_ui_sends_to_sign_in_and_its_calls_answer_401(
    browser: TestClient, admin_token: str
) -> None:
    page = browser.get(STOCK_UI_PATH)
    assert page.status_code == 303
    assert page.headers["location"] == "/ui/sign-in?next=/mlflow/"
    call = browser.get(f"{AJAX}/experiments/search")
    assert call.status_code == 401
    assert call.json()["error_code"] == "UI_ERROR"
    assert browser.post("/mlflow/graphql", json={"query": "{ test { output } }"}).status_code == 401
    # The built scripts are MLflow's public release: no session needed, nothing else served.
    index = Path(str(stock_ui_build())) / "index.html"
    script = next(p for p in index.read_text().split('"') if p.startswith("static-files/"))
    assert browser.get(f"/mlflow/{script}").status_code == 200
    hostile = [
        "static-files/../index.html",
        "static-files/%2e%2e/index.html",
        "static-files/..%2F..%2Fconfig.py",
        "static-files/%2e%2e%2f%2e%2e%2fversion.py",
        "x/../y",
    ]
    for path in hostile:
        assert browser.get(f"/mlflow/{path}").status_code in (401, 404), path
    sign_in(browser, admin_token)
    for path in hostile:
        assert browser.get(f"/mlflow/{path}").status_code == 404, path
    page = browser.get(STOCK_UI_PATH)
    assert page.status_code == 200
    assert '<div id="root"' in page.text
    assert "script-src 'self';" in page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    # Only the UI's server calls are handed on: not the rest of the API.
    assert browser.get("/mlflow/api/v1/teams").status_code == 404
    assert browser.get("/mlflow/ui/experiments").status_code == 404


def test_the_ui_calls_meet_the_session_roles_and_teams(
    api: TestClient, browser: TestClient
) -> None:
    api.post("/api/v1/teams", json={"name": "red"}).raise_for_status()
    api.post("/api/v1/teams", json={"name": "blue"}).raise_for_status()
    red = _experiment(api, "red-secrets", [{"key": "shamal.team", "value": "red"}])
    blue = _experiment(api, "blue-work", [{"key": "shamal.team", "value": "blue"}])
    hidden = _run(api, red, "hidden-run", metrics={"loss": [1.0, 0.5]})
    shown = _run(api, blue, "shown-run", metrics={"loss": [3.0, 2.0, 1.0]})
    sign_in(browser, _member_token(api, "bea", team="blue"))

    found = browser.get(f"{AJAX}/experiments/search", params={"max_results": 25})
    assert found.status_code == 200
    assert found.headers["x-content-type-options"] == "nosniff"
    names = [e["name"] for e in found.json()["experiments"]]
    assert "blue-work" in names
    assert "red-secrets" not in names
    assert browser.get(f"{AJAX}/runs/get", params={"run_id": hidden}).status_code == 404
    answer = _graphql(browser, GET_RUN, {"data": {"runId": hidden}}, "/mlflow/graphql")
    assert answer["data"]["mlflowGetRun"] is None
    assert answer["errors"] == [f"Run with id={hidden} not found"]
    answer = _graphql(browser, GET_RUN, {"data": {"runId": shown}}, "/mlflow/graphql")
    assert answer["errors"] is None
    assert answer["data"]["mlflowGetRun"]["run"]["info"]["runName"] == "shown-run"

    # A search sent by POST reads, and a viewer may; a write needs the member's role.
    search = browser.post(
        f"{AJAX}/runs/search", json={"experiment_ids": [blue]}, headers=SAME_ORIGIN
    )
    assert [r["info"]["run_name"] for r in search.json()["runs"]] == ["shown-run"]
    tag = {"run_id": shown, "key": "k", "value": "v"}
    assert browser.post(f"{AJAX}/runs/set-tag", json=tag, headers=SAME_ORIGIN).status_code == 403
    run = api.get(f"{MLFLOW}/runs/get", params={"run_id": shown}).json()["run"]
    assert "tags" not in run["data"] or all(t["key"] != "k" for t in run["data"]["tags"])


def test_a_write_from_another_origin_is_refused(
    api: TestClient, browser: TestClient, admin_token: str
) -> None:
    experiment = _experiment(api, "origins")
    run = _run(api, experiment, "r")
    sign_in(browser, admin_token)
    tag = {"run_id": run, "key": "from", "value": "elsewhere"}
    refused = [
        {},
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": "http://testserver", "Sec-Fetch-Site": "cross-site"},
        {"Origin": "http://testserver", "Sec-Fetch-Site": "same-site"},
    ]
    for headers in refused:
        answer = browser.post(f"{AJAX}/runs/set-tag", json=tag, headers=headers)
        assert answer.status_code == 403, headers
    tags = api.get(f"{MLFLOW}/runs/get", params={"run_id": run}).json()["run"]["data"]
    assert all(t["key"] != "from" for t in tags.get("tags", []))
    assert browser.post(f"{AJAX}/runs/set-tag", json=tag, headers=SAME_ORIGIN).status_code == 200
    tags = api.get(f"{MLFLOW}/runs/get", params={"run_id": run}).json()["run"]["data"]["tags"]
    assert {"key": "from", "value": "elsewhere"} in tags


def test_graphql_answers_the_ui_queries_from_the_services(api: TestClient) -> None:
    experiment = _experiment(api, "graphql")
    first = _run(api, experiment, "first", params={"lr": "0.1"}, metrics={"loss": [3.0, 2.0, 1.0]})
    second = _run(api, experiment, "second")
    points = [
        {"key": "loss", "value": v, "timestamp": 1, "step": i} for i, v in enumerate(["NaN", 4.0])
    ]
    api.post(
        f"{MLFLOW}/runs/log-batch", json={"run_id": second, "metrics": points}
    ).raise_for_status()
    answer = _graphql(api, GET_RUN, {"data": {"runId": first}}, "/graphql")
    run = answer["data"]["mlflowGetRun"]["run"]
    assert answer["errors"] is None
    assert run["info"]["runUuid"] == first
    assert run["info"]["status"] == "RUNNING"
    assert isinstance(run["info"]["startTime"], str)  # int64 as LongString
    assert run["experiment"] == {"experimentId": experiment, "name": "graphql"}
    assert run["modelVersions"] == []
    assert run["data"]["params"] == [{"key": "lr", "value": "0.1"}]
    assert run["data"]["metrics"] == [{"key": "loss", "value": 1.0, "step": "2", "timestamp": "1"}]

    sampled = _graphql(
        api,
        SAMPLED,
        {"data": {"runIds": [first, second], "metricKey": "loss", "maxResults": 10}},
        "/graphql",
    )
    body = sampled["data"]["mlflowGetMetricHistoryBulkInterval"]
    assert body["__typename"] == "MlflowGetMetricHistoryBulkIntervalResponse"
    points = [(m["runId"], m["step"], m["value"]) for m in body["metrics"]]
    assert points == [
        (first, "0", 3.0), (first, "1", 2.0), (first, "2", 1.0),
        (second, "0", None), (second, "1", 4.0),
    ]  # fmt: skip

    searched = _graphql(
        api,
        "mutation S($d: MlflowSearchRunsInput!) { mlflowSearchRuns(input: $d) "
        "{ runs { info { runName } } nextPageToken } }",
        {"d": {"experimentIds": [experiment], "orderBy": ["attributes.run_name ASC"]}},
        "/graphql",
    )
    names = [r["info"]["runName"] for r in searched["data"]["mlflowSearchRuns"]["runs"]]
    assert names == ["first", "second"]
    assert _graphql(api, '{ test(inputString: "hi") { output } }', {}, "/graphql")["data"] == {
        "test": {"output": "hi"}
    }


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("{ " + "mlflowGetRun(input: {}) { run { info { runId } } } " * 1 + "}", "run_id"),
        ("{ nope }", "Cannot query field 'nope' on type 'Query'."),
        ("query {", "Syntax Error"),
        ("{ test { output } }" + " " * 30_000, "longer than"),
        (
            "{ " + " ".join(f"a{i}: test {{ output }}" for i in range(11)) + " }",
            "GraphQL queries should have at most 10 root fields",
        ),
        (
            "{ test { " + " ".join(f"o{i}: output" for i in range(11)) + " } }",
            "GraphQL queries should have at most 10 aliases",
        ),
        ("{ test { " + "output " * 1001 + "} }", "selections"),
        ('{ mlflowGetRun(input: {runId: "x"}) { run { data { metrics { key } } } } }', "x"),
    ],
)
def test_graphql_refuses_what_it_should_in_its_errors(
    api: TestClient, query: str, message: str
) -> None:
    answer = api.post("/graphql", json={"query": query})
    assert answer.status_code == 200, answer.text
    errors = answer.json()["errors"]
    assert errors, answer.text
    assert message in errors[0], errors
    assert "Traceback" not in answer.text


def test_graphql_refuses_a_deep_query_and_a_bad_body(api: TestClient) -> None:
    deep = "{ __schema { types { fields { type " + "{ ofType " * 6 + "{ name }" + " }" * 10
    answer = api.post("/graphql", json={"query": deep}).json()
    assert answer["data"] is None
    assert "depth" in answer["errors"][0]
    assert api.post("/graphql", json={"query": 1}).json()["errors"]
    assert api.post("/graphql", json={"query": "{ test { output } }", "variables": []}).json()[
        "errors"
    ]
    assert api.post("/graphql", content=b"[1]").status_code == 400
    assert (
        TestClient(api.app).post("/graphql", json={"query": "{ test { output } }"}).status_code
        == 401
    )


def test_bulk_history_and_dataset_summaries_as_a_stock_server(api: TestClient) -> None:
    experiment = _experiment(api, "bulk")
    first = _run(api, experiment, "a", metrics={"acc": [0.1, 0.2]})
    second = _run(api, experiment, "b", metrics={"acc": [0.3]})
    bulk = api.get(
        "/ajax-api/2.0/mlflow/metrics/get-history-bulk",
        params={"run_id": [second, first], "metric_key": "acc"},
    )
    assert bulk.status_code == 200, bulk.text
    got = [(m["run_id"], m["step"], m["value"]) for m in bulk.json()["metrics"]]
    expected = sorted([(first, 0, 0.1), (first, 1, 0.2), (second, 0, 0.3)], key=lambda p: p[0])
    assert got == expected
    missing = api.get("/ajax-api/2.0/mlflow/metrics/get-history-bulk", params={"metric_key": "acc"})
    assert missing.status_code == 400
    assert "at least one run_id" in missing.json()["message"]

    dataset = {"name": "train", "digest": "d1", "source_type": "local", "source": "{}"}
    api.post(
        f"{MLFLOW}/runs/log-inputs",
        json={
            "run_id": first,
            "datasets": [
                {"dataset": dataset, "tags": [{"key": "mlflow.data.context", "value": "training"}]}
            ],
        },
    ).raise_for_status()
    api.post(
        f"{MLFLOW}/runs/log-inputs", json={"run_id": second, "datasets": [{"dataset": dataset}]}
    ).raise_for_status()
    found = api.post(
        "/ajax-api/2.0/mlflow/experiments/search-datasets", json={"experiment_ids": [experiment]}
    )
    assert found.status_code == 200, found.text
    summaries = found.json()["dataset_summaries"]
    assert sorted(summaries, key=lambda s: s.get("context", "")) == [
        {"experiment_id": experiment, "name": "train", "digest": "d1"},
        {"experiment_id": experiment, "name": "train", "digest": "d1", "context": "training"},
    ]
    # GraphQL gives the missing context as "", as a stock server's GraphQL does.
    graphql = _graphql(
        api,
        "mutation S($d: MlflowSearchDatasetsInput) { mlflowSearchDatasets(input: $d) "
        "{ datasetSummaries { experimentId name digest context } } }",
        {"d": {"experimentIds": [experiment]}},
        "/graphql",
    )
    assert graphql["errors"] is None, graphql
    contexts = sorted(
        d["context"] for d in graphql["data"]["mlflowSearchDatasets"]["datasetSummaries"]
    )
    assert contexts == ["", "training"]
    too_many = api.post(
        "/ajax-api/2.0/mlflow/experiments/search-datasets",
        json={"experiment_ids": [str(i) for i in range(21)]},
    )
    assert too_many.status_code == 400


def test_artifact_files_for_the_ui_viewers(api: TestClient) -> None:
    experiment = _experiment(api, "files")
    run = _run(api, experiment, "r")
    root = api.get(f"{MLFLOW}/runs/get", params={"run_id": run}).json()["run"]["info"][
        "artifact_uri"
    ]
    proxy = root.removeprefix("mlflow-artifacts:/")
    put = api.put(f"/api/2.0/mlflow-artifacts/artifacts/{proxy}/notes/a.txt", content=b"hello")
    assert put.status_code == 200, put.text
    got = api.get("/get-artifact", params={"run_uuid": run, "path": "notes/a.txt"})
    assert got.status_code == 200
    listed = _graphql(
        api,
        "query L($d: MlflowListArtifactsInput) { mlflowListArtifacts(input: $d) "
        "{ files { path isDir fileSize } } }",
        {"d": {"runId": run}},
        "/graphql",
    )
    # A folder's size is "0" in GraphQL, as a stock server answers.
    assert listed["data"]["mlflowListArtifacts"]["files"] == [
        {"path": "notes", "isDir": True, "fileSize": "0"}
    ]
    assert got.content == b"hello"
    climbing = api.get("/get-artifact", params={"run_id": run, "path": "../x"})
    assert (climbing.status_code, climbing.json()["message"]) == (400, "Invalid path")
    assert api.get("/get-artifact", params={"run_id": run, "path": "nope.txt"}).status_code == 404
    assert api.get("/get-artifact", params={"run_id": "0" * 32, "path": "a"}).status_code == 404

    api.post(f"{MLFLOW}/registered-models/create", json={"name": "m"}).raise_for_status()
    api.post(
        f"{MLFLOW}/model-versions/create",
        json={"name": "m", "source": f"runs:/{run}/notes", "run_id": run},
    ).raise_for_status()
    version = api.get(
        "/model-versions/get-artifact", params={"name": "m", "version": "1", "path": "a.txt"}
    )
    assert version.status_code == 200
    assert version.content == b"hello"
    absent = api.get(
        "/model-versions/get-artifact", params={"name": "m", "version": "1", "path": "MLmodel"}
    )
    assert absent.status_code == 404
    assert (
        api.get("/model-versions/get-artifact", params={"name": "m", "path": "a.txt"}).status_code
        == 400
    )


def test_the_view_run_link_opens_the_stock_ui(
    api: TestClient, browser: TestClient, admin_token: str
) -> None:
    experiment = _experiment(api, "links")
    run = _run(api, experiment, "linked")
    # Signed out, the link's fragment rides the sign-in form and lands in MLflow's UI.
    answer = sign_in(browser, admin_token, fragment=f"#/experiments/{experiment}/runs/{run}")
    assert answer.status_code == 303  # type: ignore[attr-defined]
    assert answer.headers["location"] == f"/mlflow/#/experiments/{experiment}/runs/{run}"  # type: ignore[attr-defined]
    # Signed in, "/" tells its script where the link goes.
    home = browser.get("/")
    assert 'data-stock-ui="/mlflow/"' in home.text
    # A person sent to sign in from /mlflow/ comes back to the UI's route they asked for.
    browser.cookies.clear()
    answer = sign_in(browser, admin_token, next="/mlflow/", fragment="#/models/m")
    assert answer.headers["location"] == "/mlflow/#/models/m"  # type: ignore[attr-defined]
    browser.cookies.clear()
    answer = sign_in(browser, admin_token, next="/mlflow/", fragment="#/x?<script>")
    assert answer.headers["location"] == "/mlflow/"  # type: ignore[attr-defined]


def test_with_the_stock_ui_off_links_stay_in_shamal_ui(
    api: TestClient, browser: TestClient, admin_token: str
) -> None:
    state = api.app.state  # type: ignore[attr-defined]
    state.settings = state.settings.model_copy(update={"mlflow_ui": False})
    run = "d" * 32
    answer = sign_in(browser, admin_token, fragment=f"#/experiments/3/runs/{run}")
    assert answer.headers["location"] == f"/ui/experiments/3/runs/{run}"  # type: ignore[attr-defined]
    assert 'data-stock-ui=""' in browser.get("/").text
    off = browser.get(STOCK_UI_PATH)
    assert off.status_code == 404
    assert "mlflow-ui extra" in off.text
    assert browser.get(f"{AJAX}/experiments/search").status_code == 404


UI_ROUTES = [
    ("POST", "/graphql"),
    ("GET", "/ajax-api/2.0/mlflow/metrics/get-history-bulk"),
    ("POST", "/ajax-api/2.0/mlflow/experiments/search-datasets"),
    ("GET", "/get-artifact"),
    ("GET", "/ajax-api/2.0/mlflow/get-artifact"),
    ("GET", "/model-versions/get-artifact"),
    ("GET", "/ajax-api/2.0/mlflow/logged-models/m-0/artifacts/files"),
    ("GET", "/ajax-api/2.0/mlflow/gateway-proxy"),
]
_VARIABLES = ["data", "input", "runId", "experimentIds", "metricKey", "maxResults", "filter"]


def test_fuzzed_ui_calls_never_cause_a_server_error(api: TestClient) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tests.tracking.test_mlflow_hostile import bodies, values

    experiment = _experiment(api, "fuzzed")
    run = _run(api, experiment, "r", metrics={"loss": [1.0, 2.0]})
    queries = st.one_of(
        st.just(GET_RUN),
        st.just(SAMPLED),
        st.text(max_size=60),
        st.sampled_from(["{ test { output } }", "mutation { testMutation { output } }", "{"]),
    )
    variables = st.dictionaries(st.sampled_from(_VARIABLES), values, max_size=4)

    @given(route=st.sampled_from(UI_ROUTES), body=bodies, query=queries, given_vars=variables)
    @settings(
        max_examples=150,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def check(route: tuple[str, str], body: dict[str, Any], query: str, given_vars: Any) -> None:
        method, path = route
        if path == "/graphql":
            given_vars.setdefault("data", {"runId": run, "runIds": [run], "metricKey": "loss"})
            body = {"query": query, "variables": given_vars}
        if method == "GET":
            params = {k: str(v) for k, v in body.items() if v is not None}
            answer = api.request(method, path, params=params)
        else:
            answer = api.request(
                method, path, content=json.dumps(body), headers={"Content-Type": "application/json"}
            )
        assert answer.status_code < 500, (method, path, body, answer.text)
        assert "internal error" not in answer.text.lower(), (path, body, answer.text)

    check()
