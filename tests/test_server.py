"""The server shell: route inventory, error path, request guard, probes, listener."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import pytest
from fastapi import APIRouter, Depends, FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient

from shamal.config import Settings
from shamal.security import Principal
from shamal.security.api import audit_action_of, audit_exemption_of, require_principal
from shamal.server import PUBLIC_ROUTES, Platform, create_app, make_listener
from shamal.webui import PUBLIC_ROUTES as UI_PUBLIC_ROUTES
from shamal.webui import UIRoute, csrf_protected, same_origin_protected, session_principal

MUTATING = {"POST", "PUT", "PATCH", "DELETE"}


def _calls(dependant: Any) -> Iterator[Callable[..., Any]]:
    for dep in dependant.dependencies:
        if dep.call is not None:
            yield dep.call
        yield from _calls(dep)


DOC_ROUTES = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


def api_routes(app: FastAPI) -> list[Any]:
    """Every effective route, routers' own dependencies included."""
    return [rc for rc in iter_route_contexts(app.routes) if isinstance(rc.original_route, APIRoute)]


def _ui_route_problems(rc: Any) -> list[str]:
    """A web UI page needs the session (the cookie re-authenticated); a form post the
    session's CSRF token, and a call MLflow's own UI makes by script the browser's word that
    it comes from this site. The sign-in form checks its own (and audits every try)."""
    if rc.path in UI_PUBLIC_ROUTES:
        return []
    calls = list(_calls(rc.dependant))
    problems = []
    if session_principal not in calls:
        problems.append(f"{sorted(rc.methods)} {rc.path}: no session dependency")
    if rc.methods & MUTATING and not {csrf_protected, same_origin_protected} & set(calls):
        problems.append(f"{sorted(rc.methods)} {rc.path}: no CSRF check")
    return problems


def route_inventory_problems(app: FastAPI) -> list[str]:
    """Every API route needs the auth dependency; every mutating one the audit dependency.
    The web UI's routes need its session instead, and its forms the CSRF check."""
    problems = []
    for rc in iter_route_contexts(app.routes):
        if not isinstance(rc.original_route, APIRoute):
            if rc.path not in DOC_ROUTES:
                problems.append(f"{rc.path}: a non-API route outside the allow-list")
            continue
        if isinstance(rc.original_route, UIRoute):
            problems.extend(_ui_route_problems(rc))
            continue
        if rc.path in PUBLIC_ROUTES:
            continue
        calls = list(_calls(rc.dependant))
        if require_principal not in calls:
            problems.append(f"{sorted(rc.methods)} {rc.path}: no auth dependency")
        if rc.methods & MUTATING and not any(
            audit_action_of(c) or audit_exemption_of(c) for c in calls
        ):
            problems.append(f"{sorted(rc.methods)} {rc.path}: not audited")
    return problems


def test_every_route_but_the_probes_needs_a_token_and_changes_are_audited(
    api: TestClient,
) -> None:
    app = api.app
    assert isinstance(app, FastAPI)
    routes = api_routes(app)
    assert len(routes) > 10
    assert route_inventory_problems(app) == []
    guards = {require_principal, session_principal}
    public = {r.path for r in routes if not guards & set(_calls(r.dependant))}
    assert public == set(PUBLIC_ROUTES) | set(UI_PUBLIC_ROUTES)


def test_the_inventory_flags_an_unguarded_route(platform: Platform) -> None:
    app = create_app(platform.settings, platform)

    @app.post("/api/v1/forgotten")
    def forgotten() -> dict[str, str]:
        return {}

    problems = route_inventory_problems(app)
    assert any("/api/v1/forgotten: no auth dependency" in p for p in problems)
    assert any("/api/v1/forgotten: not audited" in p for p in problems)


def test_the_inventory_flags_an_unguarded_ui_page_and_form(platform: Platform) -> None:
    app = create_app(platform.settings, platform)
    router = APIRouter(route_class=UIRoute)

    @router.get("/ui/open")
    def open_page() -> dict[str, str]:
        return {}

    @router.post("/ui/unchecked")
    def unchecked(_: Annotated[Principal, Depends(session_principal)]) -> dict[str, str]:
        return {}

    app.include_router(router)
    problems = route_inventory_problems(app)
    assert "['GET'] /ui/open: no session dependency" in problems
    assert "['POST'] /ui/unchecked: no CSRF check" in problems
    assert not any("/ui/unchecked: no session" in p for p in problems)


def test_probes_answer_without_a_token(api: TestClient) -> None:
    anonymous = TestClient(api.app)
    assert anonymous.get("/health").json() == {"status": "ok"}
    ready = anonymous.get("/ready")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"
    assert anonymous.get("/openapi.json").json()["info"]["title"] == "Shamal"


def test_unknown_endpoints_and_methods(api: TestClient) -> None:
    r = api.get("/api/v1/no/such/thing")
    assert r.status_code == 404
    assert r.json()["error_code"] == "ENDPOINT_NOT_FOUND"
    r = api.patch("/api/v1/teams")
    assert r.status_code == 405


def test_unexpected_errors_leak_nothing(
    platform: Platform, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(platform.settings, platform)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("password=hunter2 at /srv/secret/path.py")

    client = TestClient(app, raise_server_exceptions=False)
    with caplog.at_level("ERROR"):
        r = client.get("/boom")
    assert r.status_code == 500
    assert r.json() == {
        "error_code": "INTERNAL_ERROR",
        "message": "internal error; the server log has the details",
    }
    assert "hunter2" not in r.text
    assert "Traceback" not in r.text
    assert "hunter2" in caplog.text  # the detail stays in the server log


def test_body_limit_by_header_and_by_bytes_received(platform: Platform, admin_token: str) -> None:
    settings = platform.settings.model_copy(update={"max_request_bytes": 2048})
    client = TestClient(create_app(settings, platform), raise_server_exceptions=False)
    client.headers["Authorization"] = f"Bearer {admin_token}"
    big = b'{"name": "' + b"x" * 5000 + b'"}'
    r = client.post("/api/v1/teams", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error_code"] == "REQUEST_TOO_LARGE"

    def chunked() -> Iterator[bytes]:  # no Content-Length: the bytes are counted
        yield b'{"name": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    r = client.post(
        "/api/v1/teams", content=chunked(), headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 413
    r = client.post("/api/v1/teams", content=b"{}", headers={"Content-Length": "nonsense"})
    assert r.status_code == 400  # malformed, not too large
    assert "Content-Length" in r.json()["message"]
    assert [t["name"] for t in client.get("/api/v1/teams").json()] == []


def test_host_header_allow_list_guards_loopback_servers(platform: Platform) -> None:
    settings = Settings(home=platform.settings.home, database_url=platform.settings.database_url)
    assert "attacker.example" not in settings.effective_allowed_hosts
    app = create_app(settings, platform)
    client = TestClient(app, base_url="http://127.0.0.1:8600")
    assert client.get("/health").status_code == 200
    assert client.get("/health", headers={"Host": "localhost:8600"}).status_code == 200
    assert client.get("/health", headers={"Host": "[::1]:8600"}).status_code == 200
    r = client.get("/health", headers={"Host": "attacker.example"})
    assert r.status_code == 400
    assert r.json()["message"] == "host not allowed"


def test_listener_gives_accepted_connections_tcp_nodelay() -> None:
    """The uvicorn multi-worker pitfall: without IPPROTO_TCP, keep-alive waits ~40 ms."""
    sock = make_listener("127.0.0.1", 0)
    assert sock.proto == socket.IPPROTO_TCP
    port = sock.getsockname()[1]
    seen: list[int] = []

    async def scenario() -> None:
        done = asyncio.Event()

        def on_client(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn = writer.get_extra_info("socket")
            seen.append(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()
            done.set()

        server = await asyncio.start_server(on_client, sock=sock)
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.wait_for(done.wait(), 10)
        writer.close()
        server.close()
        await server.wait_closed()

    asyncio.run(scenario())
    assert seen
    assert seen[0] != 0


def test_public_bind_needs_an_explicit_host_allow_list(tmp_path: Any) -> None:
    from shamal.errors import InvalidParameter
    from shamal.server import serve

    with pytest.raises(InvalidParameter, match="SHAMAL_ALLOWED_HOSTS"):
        serve(Settings(home=tmp_path, host="0.0.0.0"))
    assert not (tmp_path / "shamal.db").exists()  # refused before touching anything


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "application/json"),  # nested 100k deep
        (b"--x\r\n", "multipart/form-data; boundary=x" + ";" * 5000),  # parser DoS (header)
        (b'{"name": "' + b"a" * 3_000_000 + b'"}', "application/json"),  # one 3 MB field
        (b"\xff\xfe\x00garbage", "application/json"),
        (b"name=x", "application/x-www-form-urlencoded"),
        (b"\x80\x04\x95pickle", "application/vnd.bentoml+pickle"),
    ],
    ids=["deep-json", "semicolons", "huge-field", "binary", "form", "pickle-type"],
)
def test_hostile_bodies_get_a_clean_4xx(
    api: TestClient, platform: Platform, body: bytes, content_type: str
) -> None:
    before = [t["name"] for t in api.get("/api/v1/teams").json()]
    r = api.post("/api/v1/teams", content=body, headers={"Content-Type": content_type})
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error_code"] in ("INVALID_PARAMETER_VALUE", "REQUEST_TOO_LARGE")
    assert [t["name"] for t in api.get("/api/v1/teams").json()] == before
    assert api.get("/health").status_code == 200  # still serving


def test_forwarded_headers_and_header_tricks_do_not_authenticate(api: TestClient) -> None:
    anonymous = TestClient(api.app, raise_server_exceptions=False)
    tricks = [
        {"X-Forwarded-For": "127.0.0.1"},
        {"X-Real-IP": "127.0.0.1", "X-Forwarded-User": "admin"},
        {"User-Agent": "shamal-client", "Origin": "http://127.0.0.1:8600"},
        {"authorization": "bearer"},
        {"Authorization": "Bearer null"},
    ]
    for headers in tricks:
        r = anonymous.post("/api/v1/teams", json={"name": "sneaky"}, headers=headers)
        assert r.status_code == 401, headers
    assert "sneaky" not in [t["name"] for t in api.get("/api/v1/teams").json()]


def test_the_address_the_mlflow_client_links_to_opens_the_web_ui(api: TestClient) -> None:
    # "View run at <server>/#/experiments/1/runs/<id>": the browser asks for "/" only, and
    # keeps the fragment across the redirect; the sign-in form carries it on.
    answer = api.get("/", headers={"Authorization": ""}, follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/ui/sign-in"
    form = api.get("/ui/sign-in", headers={"Authorization": ""})
    assert form.status_code == 200
    assert form.headers["content-type"].startswith("text/html")
    assert 'src="/ui/static/sign-in.js"' in form.text


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/models?search=%00",
        "/api/v1/models?search=a%00b",
        "/api/2.0/mlflow/experiments/get-by-name?experiment_name=x%00",
        "/api/v1/artifacts/team/a%00b",
    ],
)
def test_a_nul_anywhere_in_the_url_is_a_400(api: TestClient, url: str) -> None:
    """PostgreSQL text cannot hold a NUL: a search for one answered 500 there (found by
    schemathesis over the model list)."""
    answer = api.get(url)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert api.get("/api/v1/models", params={"search": "a"}).status_code == 200
