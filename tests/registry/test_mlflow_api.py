"""The registry's MLflow REST routes in-process: shapes, statuses, hostile inputs, both prefixes."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from shamal.mlflow.registry_api import PREFIXES
from shamal.server import Platform
from tests.registry.conftest import People
from tests.test_server import api_routes, route_inventory_problems

API = "/api/2.0/mlflow"
SRC = "mlflow-artifacts:/models/m1"


def _ok(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _error(response: Any, status: int, code: str) -> None:
    assert (response.status_code, response.json()["error_code"]) == (status, code), response.text


def _bad(response: Any) -> None:
    _error(response, 400, "INVALID_PARAMETER_VALUE")


def _missing(response: Any) -> None:
    _error(response, 404, "RESOURCE_DOES_NOT_EXIST")


def _model(client: TestClient, name: str, **extra: Any) -> dict[str, Any]:
    body = _ok(client.post(f"{API}/registered-models/create", json={"name": name, **extra}))
    model: dict[str, Any] = body["registered_model"]
    return model


def _version(client: TestClient, name: str, source: str = SRC, **extra: Any) -> dict[str, Any]:
    body = {"name": name, "source": source, **extra}
    version: dict[str, Any] = _ok(client.post(f"{API}/model-versions/create", json=body))[
        "model_version"
    ]
    return version


def _names(client: TestClient, **params: Any) -> list[str]:
    body = _ok(client.get(f"{API}/registered-models/search", params=params))
    return [m["name"] for m in body.get("registered_models", [])]


def test_registered_model_json_shape(client: TestClient) -> None:
    made = _model(client, "shape", tags=[{"key": "k", "value": "v"}])
    assert set(made) == {
        "name",
        "creation_timestamp",
        "last_updated_timestamp",
        "user_id",
        "latest_versions",
        "tags",
        "aliases",
    }  # no description: unset fields are left out
    assert isinstance(made["creation_timestamp"], int)
    assert made["creation_timestamp"] > 1_600_000_000_000  # milliseconds
    assert made["tags"] == [{"key": "k", "value": "v"}]
    assert (made["user_id"], made["latest_versions"], made["aliases"]) == ("admin", [], [])
    version = _version(
        client, "shape", run_id="0123456789abcdef0123456789abcdef", description="first"
    )
    assert version["version"] == "1"
    assert (version["current_stage"], version["status"], version["source"]) == (
        "None",
        "READY",
        SRC,
    )
    assert version["run_id"] == "0123456789abcdef0123456789abcdef"
    assert "model_id" not in version
    assert "run_link" not in version
    alias = {"name": "shape", "alias": "prod", "version": "1"}
    assert _ok(client.post(f"{API}/registered-models/alias", json=alias)) == {}
    got = _ok(client.get(f"{API}/registered-models/get", params={"name": "shape"}))
    model = got["registered_model"]
    assert model["aliases"] == [{"alias": "prod", "version": "1"}]
    assert [v["version"] for v in model["latest_versions"]] == ["1"]
    assert model["latest_versions"][0]["aliases"] == ["prod"]
    params = {"name": "shape", "alias": "prod"}
    by_alias = _ok(client.get(f"{API}/registered-models/alias", params=params))
    assert by_alias["model_version"]["version"] == "1"
    uri = _ok(
        client.get(f"{API}/model-versions/get-download-uri", params={"name": "shape", "version": 1})
    )
    assert uri == {"artifact_uri": SRC}


@pytest.mark.parametrize("prefix", PREFIXES)
def test_every_endpoint_under_both_prefixes(client: TestClient, prefix: str) -> None:
    name = f"full{prefix.count('ajax')}"

    def call(method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        return _ok(client.request(method, f"{prefix}/{path}", **kwargs))

    call("POST", "registered-models/create", json={"name": name, "description": "d"})
    call("POST", "model-versions/create", json={"name": name, "source": SRC})
    call("POST", "model-versions/create", json={"name": name, "source": SRC})
    mv = {"name": name, "version": "1"}
    assert call("GET", "model-versions/get", params=mv)["model_version"]["version"] == "1"
    upd = call("PATCH", "model-versions/update", json=mv | {"description": "x"})
    assert upd["model_version"]["description"] == "x"
    moved = call(
        "POST",
        "model-versions/transition-stage",
        json=mv | {"stage": "production", "archive_existing_versions": False},
    )
    assert moved["model_version"]["current_stage"] == "Production"
    call("POST", "model-versions/set-tag", json=mv | {"key": "k", "value": "v"})
    assert call("GET", "model-versions/get", params=mv)["model_version"]["tags"] == [
        {"key": "k", "value": "v"}
    ]
    call("DELETE", "model-versions/delete-tag", json=mv | {"key": "k"})
    latest_body = {"name": name, "stages": ["Production"]}
    posted = call("POST", "registered-models/get-latest-versions", json=latest_body)
    got = call("GET", "registered-models/get-latest-versions", params=latest_body)
    assert [v["version"] for v in posted["model_versions"]] == ["1"]
    assert posted == got
    every = call("GET", "registered-models/get-latest-versions", params={"name": name})
    assert sorted(v["version"] for v in every["model_versions"]) == ["1", "2"]
    found = call("GET", "model-versions/search", params={"filter": f"name = '{name}'"})
    assert sorted(v["version"] for v in found["model_versions"]) == ["1", "2"]
    call("POST", "registered-models/set-tag", json={"name": name, "key": "t", "value": "1"})
    call("DELETE", "registered-models/delete-tag", json={"name": name, "key": "t"})
    call("POST", "registered-models/alias", json={"name": name, "alias": "a", "version": "2"})
    call("DELETE", "registered-models/alias", json={"name": name, "alias": "a"})
    renamed = call("POST", "registered-models/rename", json={"name": name, "new_name": name + "-r"})
    assert renamed["registered_model"]["name"] == name + "-r"
    name += "-r"
    patched = call("PATCH", "registered-models/update", json={"name": name, "description": "e"})
    assert patched["registered_model"]["description"] == "e"
    call("DELETE", "model-versions/delete", json={"name": name, "version": "2"})
    call("DELETE", "registered-models/delete", json={"name": name})
    _error(
        client.get(f"{prefix}/registered-models/get", params={"name": name}),
        404,
        "RESOURCE_DOES_NOT_EXIST",
    )


def test_errors_are_mlflow_codes_never_500(client: TestClient) -> None:
    _model(client, "m")
    _version(client, "m")
    duplicate = client.post(f"{API}/registered-models/create", json={"name": "m"})
    _error(duplicate, 400, "RESOURCE_ALREADY_EXISTS")
    _error(client.post(f"{API}/registered-models/create", json={}), 400, "INVALID_PARAMETER_VALUE")
    _bad(client.post(f"{API}/registered-models/create", content=b"[1]"))
    missing = [
        ("GET", "registered-models/get", {"name": "nope"}),
        ("GET", "model-versions/get", {"name": "m", "version": "7"}),
        ("GET", "model-versions/get", {"name": "nope", "version": "1"}),
        ("GET", "model-versions/get-download-uri", {"name": "m", "version": "7"}),
        ("GET", "registered-models/get-latest-versions", {"name": "nope"}),
    ]
    for method, path, params in missing:
        _missing(client.request(method, f"{API}/{path}", params=params))
    # A missing alias is a 400 on a stock server, whether the model or its alias is missing.
    for params in ({"name": "m", "alias": "nope"}, {"name": "nope", "alias": "nope"}):
        r = client.get(f"{API}/registered-models/alias", params=params)
        _error(r, 400, "INVALID_PARAMETER_VALUE")
        assert r.json()["message"] == "Registered model alias nope not found."
    for body in (
        {"name": "nope"},
        {"name": "m", "version": "7", "key": "k", "value": "v"},
    ):
        path = "model-versions/set-tag" if "version" in body else "registered-models/set-tag"
        _missing(client.post(f"{API}/{path}", json=body | {"key": "k", "value": "v"}))
    _missing(
        client.request("DELETE", f"{API}/model-versions/delete", json={"name": "m", "version": "9"})
    )
    for version in ("abc", "1.5", "", "1e3", "0x1"):
        r = client.get(f"{API}/model-versions/get", params={"name": "m", "version": version})
        _error(r, 400, "INVALID_PARAMETER_VALUE")
    for version in ("-1", "0", "99999999999"):  # integers: looked up, as on stock, and missing
        r = client.get(f"{API}/model-versions/get", params={"name": "m", "version": version})
        _error(r, 404, "RESOURCE_DOES_NOT_EXIST")
    bad_stage = {"name": "m", "version": "1", "stage": "Prod", "archive_existing_versions": False}
    _bad(client.post(f"{API}/model-versions/transition-stage", json=bad_stage))
    _error(client.get(f"{API}/registered-models/get-everything"), 404, "ENDPOINT_NOT_FOUND")
    ui_only = client.get(f"{API}/model-versions/get-artifact", params={"path": "x"})
    _error(ui_only, 404, "ENDPOINT_NOT_FOUND")
    assert client.put(f"{API}/registered-models/create", json={"name": "x"}).status_code == 405
    for alias in ("latest", "v3", "a b", "x" * 257):
        body = {"name": "m", "alias": alias, "version": "1"}
        _bad(client.post(f"{API}/registered-models/alias", json=body))


def test_tag_and_alias_limits(client: TestClient) -> None:
    _model(client, "m", tags=[{"key": "k" * 250, "value": "v" * 5000}])
    _version(client, "m", tags=[{"key": "k" * 250, "value": "v" * 5000}])
    body = {"name": "m", "alias": "a" * 255, "version": "1"}
    _ok(client.post(f"{API}/registered-models/alias", json=body))
    _bad(client.post(f"{API}/registered-models/alias", json={**body, "alias": "a" * 256}))
    long_key = {"name": "m", "key": "k" * 251, "value": "v"}
    _bad(client.post(f"{API}/registered-models/set-tag", json=long_key))
    got = _ok(
        client.get(f"{API}/registered-models/alias", params={"name": "m", "alias": "a" * 255})
    )
    assert got["model_version"]["tags"] == [{"key": "k" * 250, "value": "v" * 5000}]


STORED_URIS = [
    "file:///etc",
    "file:/etc/passwd",
    "/etc",
    "//proc/self/root/etc",
    "http:///#/../../../../etc/",
    "http://x/base?../../../etc",
    "mlflow-artifacts://h:1/../../../../",
    "mlflow-artifacts:/..%2f..%2fetc",
    "mlflow-artifacts:/a/%252e%252e/%252e%252e/etc",
    "s3:/bucket/models/../../other",
    "s3://other-tenant-bucket/x",
    "runs:/0123456789abcdef0123456789abcdef/model",
    "models:/m-0123456789abcdef",
    "dbfs:/x",
    "ftp://x/y",
    "gopher://127.0.0.1:6379/_SET",
    "jar:file:///x!/",
    "netdoc:///etc/passwd",
    "http://x/artifacts%00",
    "HTTP://X/../../",
    "mlflow-artifacts:/a\x00b",
]


@pytest.mark.parametrize("source", STORED_URIS)
def test_hostile_sources_are_refused_at_create_time(client: TestClient, source: str) -> None:
    _model(client, "m")
    r = client.post(f"{API}/model-versions/create", json={"name": "m", "source": source})
    _error(r, 400, "INVALID_PARAMETER_VALUE")
    assert "Traceback" not in r.text
    found = _ok(client.get(f"{API}/model-versions/search", params={"filter": "name = 'm'"}))
    assert found.get("model_versions", []) == []
    assert _version(client, "m")["version"] == "1"  # the refused one took no number


@pytest.mark.parametrize(
    "source", ["models:/other-tenant-model/1", "models:/m/7", "models:/m@champion"]
)
def test_a_registry_source_that_names_nothing_is_404_and_stores_nothing(
    client: TestClient, source: str
) -> None:
    _model(client, "m")
    r = client.post(f"{API}/model-versions/create", json={"name": "m", "source": source})
    _error(r, 404, "RESOURCE_DOES_NOT_EXIST")
    found = _ok(client.get(f"{API}/model-versions/search", params={"filter": "name = 'm'"}))
    assert found.get("model_versions", []) == []


INJECTED_FILTERS = [
    "name = 'x' OR 1=1",
    "name = 'x' OR '1'='1'",
    "name = 'x'; DROP TABLE registered_models; --",
    "name = 'x' UNION SELECT password FROM users",
    "name = \u2018x\u2019",
    "name IN (" + ",".join(["'a'"] * 1001) + ")",
    "(" * 5000 + "name = 'x'" + ")" * 5000,
    " AND ".join(["name = 'x'"] * 101),
    "name = '" + "x" * 25_000 + "'",
    "tags.\x00 = 'x'",
    "name",
    "= = =",
    "metrics.acc > 0",
    "creation_timestamp > 0",
]
INJECTED_ORDER_BY = [
    "name; DROP TABLE registered_models",
    "(SELECT 1)",
    "1",
    "name ASC NULLS FIRST --",
    "tags.`x` DESC; --",
    "CASE WHEN 1=1 THEN name END",
    "name DESC, name ASC",
]


@pytest.mark.parametrize("path", ["registered-models/search", "model-versions/search"])
def test_filter_and_order_by_injection_is_a_400(client: TestClient, path: str) -> None:
    _model(client, "m", tags=[{"key": "a", "value": "b"}])
    _version(client, "m", tags=[{"key": "a", "value": "b"}])
    for text in INJECTED_FILTERS:
        r = client.get(f"{API}/{path}", params={"filter": text})
        _error(r, 400, "INVALID_PARAMETER_VALUE")
        assert "SELECT" not in r.json()["message"]
    for item in INJECTED_ORDER_BY:
        r = client.get(f"{API}/{path}", params={"order_by": [item]})
        _error(r, 400, "INVALID_PARAMETER_VALUE")
    for token in ("garbage", "eyJvZmZzZXQiOiAtMX0=", "x" * 500):
        _bad(client.get(f"{API}/{path}", params={"page_token": token}))
    key = "registered_models" if path.startswith("registered") else "model_versions"
    for legal in ("tags.`a` = 'b'", "tags.\"a\" = 'b'", "name = 'm'", "name ILIKE 'M'"):
        assert len(_ok(client.get(f"{API}/{path}", params={"filter": legal}))[key]) == 1
    for inert in ("name = 'it''s'", "name = 'x\\' OR 1=1 --'"):  # quotes stay inside the string
        assert _ok(client.get(f"{API}/{path}", params={"filter": inert})).get(key, []) == []
    assert _names(client) == ["m"]  # nothing was dropped or changed


def test_search_pages_with_tokens_and_caps(client: TestClient) -> None:
    for i in range(5):
        _model(client, f"p{i}")
    seen: list[str] = []
    token = None
    while True:
        params: dict[str, Any] = {"max_results": 2, "order_by": ["name DESC"]}
        if token:
            params["page_token"] = token
        body = _ok(client.get(f"{API}/registered-models/search", params=params))
        seen += [m["name"] for m in body["registered_models"]]
        token = body.get("next_page_token")
        if not token:
            break
    assert seen == ["p4", "p3", "p2", "p1", "p0"]
    for bad in (1001, "ten"):
        r = client.get(f"{API}/registered-models/search", params={"max_results": bad})
        _error(r, 400, "INVALID_PARAMETER_VALUE")
    for bad in (0, -1):
        r = client.get(f"{API}/model-versions/search", params={"max_results": bad})
        _error(r, 400, "INVALID_PARAMETER_VALUE")
    r = client.get(f"{API}/model-versions/search", params={"max_results": 200_001})
    _error(r, 400, "INVALID_PARAMETER_VALUE")


def test_other_teams_see_404_and_viewers_cannot_write(client: TestClient, people: People) -> None:
    body = {"name": "red-m", "tags": [{"key": "shamal.team", "value": "red"}]}
    r = client.post(f"{API}/registered-models/create", json=body, headers=people.headers("mo"))
    assert r.status_code == 200, r.text
    r = client.post(
        f"{API}/model-versions/create",
        json={"name": "red-m", "source": SRC},
        headers=people.headers("mo"),
    )
    assert r.status_code == 200, r.text
    for who in ("otto", "bo"):
        h = people.headers(who)
        _missing(client.get(f"{API}/registered-models/get", params={"name": "red-m"}, headers=h))
        _missing(
            client.request(
                "DELETE", f"{API}/registered-models/delete", json={"name": "red-m"}, headers=h
            )
        )
        listed = _ok(client.get(f"{API}/registered-models/search", headers=h))
        assert listed.get("registered_models", []) == []
        listed = _ok(client.get(f"{API}/model-versions/search", headers=h))
        assert listed.get("model_versions", []) == []
    vi = people.headers("vi")
    assert _ok(client.get(f"{API}/registered-models/get", params={"name": "red-m"}, headers=vi))
    alias = {"name": "red-m", "alias": "prod", "version": "1"}
    r = client.post(f"{API}/registered-models/alias", json=alias, headers=vi)
    _error(r, 403, "PERMISSION_DENIED")
    mo = people.headers("mo")
    r = client.request(
        "DELETE", f"{API}/registered-models/delete", json={"name": "red-m"}, headers=mo
    )
    _error(r, 403, "PERMISSION_DENIED")
    rita = people.headers("rita")
    r = client.request(
        "DELETE", f"{API}/registered-models/delete", json={"name": "red-m"}, headers=rita
    )
    assert r.status_code == 200


def test_no_token_no_registry(client: TestClient) -> None:
    anonymous = TestClient(client.app, raise_server_exceptions=False)
    r = anonymous.get(f"{API}/registered-models/search")
    _error(r, 401, "UNAUTHENTICATED")
    r = anonymous.post(f"{API}/registered-models/create", json={"name": "sneaky"})
    _error(r, 401, "UNAUTHENTICATED")
    assert _names(client) == []


def test_rejections_and_successes_are_audited(client: TestClient, platform: Platform) -> None:
    _model(client, "m")
    r = client.post(f"{API}/model-versions/create", json={"name": "m", "source": "file:///etc"})
    _error(r, 400, "INVALID_PARAMETER_VALUE")
    entries = platform.audit.entries(action="model_version.create")
    assert [(e.target, e.outcome) for e in entries] == [
        ("registered_model:m", "invalid_parameter_value")
    ]
    created = platform.audit.entries(action="registered_model.create")
    assert [(e.target, e.outcome) for e in created] == [("registered_model:m", "ok")]


def test_registry_routes_are_guarded_and_audited(client: TestClient) -> None:
    app = client.app
    assert isinstance(app, FastAPI)
    assert route_inventory_problems(app) == []
    registry_routes = {
        (rc.path, method)
        for rc in api_routes(app)
        if ("/registered-models/" in rc.path or "/model-versions/" in rc.path)
        and rc.path.startswith(PREFIXES)  # the stock UI's file view is not a registry route
        for method in rc.methods
    }
    assert len(registry_routes) == 2 * 22  # every registry endpoint, under both prefixes
    assert {p.split("/mlflow/")[0] for p, _ in registry_routes} == {
        p.removesuffix("/mlflow") for p in PREFIXES
    }
