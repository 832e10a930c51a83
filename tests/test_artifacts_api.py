"""The artifact API: roles, streaming round trips, and the hostile path catalogue over HTTP."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from shamal.db.models import ArtifactFileRow
from shamal.server import Platform

# hostile-inputs.md §1, as they arrive in a URL path. Dots and slashes a client
# would normalise away are percent-encoded, so the server sees them as written.
HOSTILE_PATHS = [
    "%2e%2e/%2e%2e/etc/passwd",
    "a/%2e%2e/%2e%2e/x",
    ".%2f%2e%2e/x",  # plain
    "%2fetc%2fpasswd",
    "%2f%2fetc/passwd",
    "C:/Windows/win.ini",  # absolute
    "%5c%5cserver%5cshare%5cx",
    "..%5c..%5cetc%5cpasswd",
    "a%5c..%5c..%5cx",  # backslash
    "%2e%2e/%2e%2e/etc",
    "..%2f..%2f",
    "%5c",
    "%252e%252e%252f",  # encoded
    "%25252e%25252e%25252fetc",  # triple
    "..;/..;/etc",
    "a;/%2e%2e/%2e%2e/x",
    "a%23/%2e%2e/%2e%2e/etc",
    "a%23/..",  # ; # ?
    "a%3F/%2e%2e/%2e%2e/etc",
    "a%3F/a",
    "static/js/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",  # static route
    "file:%2f%2f%2fetc/passwd",
    "a%00.txt",
    "a%0a%2e%2e/x",
    "a%0d%0aX-Injected: 1",  # scheme/ctl
    "%2e%2e%E2%88%95%2e%2e",
    "%EF%BC%8E%EF%BC%8E/x",
    "....//",
    "...",
    "%20%2e%2e/x",  # look-alike
    "~root/.ssh/id_rsa",
    "%2fproc/self/root/etc/passwd",
    "a" * 5000,
    "/".join(["d"] * 2000),
    "CON",
    "aux.txt",  # size, devices
]


def raw_request(
    app: Any, method: str, target: str, body: bytes = b"", token: str = ""
) -> tuple[int, dict[str, Any]]:
    """Send ``target`` exactly as written, as uvicorn would pass it on (no client-side
    normalisation of dot segments): ``path`` is the percent-decoded target, ``raw_path``
    the bytes on the wire."""
    raw, _, query = target.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote(raw),
        "raw_path": raw.encode("latin-1"),
        "query_string": query.encode("latin-1"),
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
    }
    sent: list[dict[str, Any]] = []
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(payload) if payload else {}


def _count(platform: Platform) -> int:
    with platform.db.unit_of_work(write=False) as s:
        return s.scalar(select(func.count()).select_from(ArtifactFileRow)) or 0


@pytest.fixture
def team(api: TestClient) -> str:
    assert api.post("/api/v1/teams", json={"name": "vision"}).status_code == 201
    return "vision"


def _member(api: TestClient, name: str, role: str) -> dict[str, str]:
    api.post("/api/v1/users", json={"name": name})
    api.put(f"/api/v1/teams/vision/members/{name}", json={"role": role})
    secret = api.post("/api/v1/tokens", json={"name": "t", "user": name}).json()["secret"]
    return {"Authorization": f"Bearer {secret}"}


def test_round_trip_with_digest_and_listing(api: TestClient, team: str) -> None:
    data = bytes(range(256)) * 20_000  # 5 MB: several chunks
    r = api.put(f"/api/v1/artifacts/{team}/models/v1/weights.bin", content=data)
    assert r.status_code == 201, r.text
    digest = hashlib.sha256(data).hexdigest()
    assert r.json()["digest"] == digest
    got = api.get(f"/api/v1/artifacts/{team}/models/v1/weights.bin")
    assert got.status_code == 200
    assert got.content == data
    assert got.headers["x-content-sha256"] == digest
    api.put(f"/api/v1/artifacts/{team}/models/v2/weights.bin", content=b"v2")
    api.put(f"/api/v1/artifacts/{team}/notes.txt", content=b"hi")
    listed = api.get(f"/api/v1/artifacts/{team}", params={"prefix": "models/"}).json()
    assert [f["path"] for f in listed] == ["models/v1/weights.bin", "models/v2/weights.bin"]
    # Overwrite replaces the pointer; identical content is stored once.
    api.put(f"/api/v1/artifacts/{team}/copy.bin", content=data)
    assert api.get(f"/api/v1/artifacts/{team}/copy.bin").content == data


@pytest.mark.parametrize(
    ("path", "disposition"),
    [
        ("plots/loss.html", "attachment; filename=\"loss.html\"; filename*=UTF-8''loss.html"),
        (
            'r\u00e9sultats/pr\u00e9diction "finale".csv',
            'attachment; filename="pr_diction _finale_.csv"; '
            "filename*=UTF-8''pr%C3%A9diction%20%22finale%22.csv",
        ),
    ],
    ids=["ascii", "unicode-and-quotes"],
)
def test_a_download_is_an_attachment_named_after_the_file_and_never_sniffed(
    api: TestClient, team: str, path: str, disposition: str
) -> None:
    """An uploaded HTML file must not render as a page of this server's origin."""
    page = b"<html><script>alert(document.cookie)</script></html>"
    assert api.put(f"/api/v1/artifacts/{team}/{path}", content=page).status_code == 201
    got = api.get(f"/api/v1/artifacts/{team}/{path}")
    assert got.content == page
    assert got.headers["content-type"] == "application/octet-stream"
    assert got.headers["content-disposition"] == disposition
    assert got.headers["x-content-type-options"] == "nosniff"
    missing = api.get(f"/api/v1/artifacts/{team}/nowhere.html")
    assert (missing.status_code, missing.headers["x-content-type-options"]) == (404, "nosniff")


def test_roles_on_artifacts(api: TestClient, team: str) -> None:
    viewer, member = _member(api, "vic", "viewer"), _member(api, "mia", "member")
    maintainer, outsider = _member(api, "max", "maintainer"), _member(api, "out", "viewer")
    api.delete("/api/v1/teams/vision/members/out")
    url = f"/api/v1/artifacts/{team}/a.txt"
    assert api.put(url, content=b"x", headers=viewer).status_code == 403
    assert api.put(url, content=b"x", headers=outsider).status_code == 404
    assert api.put(url, content=b"x", headers=member).status_code == 201
    assert api.get(url, headers=viewer).status_code == 200
    assert api.get(url, headers=outsider).status_code == 404
    assert api.get(f"/api/v1/artifacts/{team}", headers=outsider).status_code == 404
    assert api.delete(url, headers=member).status_code == 403
    assert api.delete(url, headers=maintainer).status_code == 204
    assert api.get(url, headers=viewer).status_code == 404


def test_a_team_recreated_under_an_old_name_sees_nothing_old(api: TestClient, team: str) -> None:
    api.put(f"/api/v1/artifacts/{team}/secret.txt", content=b"old")
    assert api.delete(f"/api/v1/teams/{team}").status_code == 204
    assert api.post("/api/v1/teams", json={"name": team}).status_code == 201
    assert api.get(f"/api/v1/artifacts/{team}/secret.txt").status_code == 404
    assert api.get(f"/api/v1/artifacts/{team}").json() == []


@pytest.mark.parametrize("raw", HOSTILE_PATHS, ids=lambda p: p[:40])
def test_hostile_paths_are_rejected_and_change_nothing(
    api: TestClient, platform: Platform, team: str, raw: str, tmp_path: Path
) -> None:
    sentinel = platform.settings.home.parent / "sentinel.txt"
    sentinel.write_text("untouched")
    api.put(f"/api/v1/artifacts/{team}/legit.txt", content=b"legit")
    rows_before = _count(platform)
    audit_before = len(platform.audit.entries(limit=1000))
    token = api.headers["Authorization"].removeprefix("Bearer ")
    for method in ("PUT", "GET", "DELETE"):
        status, body = raw_request(
            api.app,
            method,
            f"/api/v1/artifacts/{team}/{raw}",
            b"evil" if method == "PUT" else b"",
            token,
        )
        assert status in (400, 404), (method, status, body)
        assert body["error_code"] in (
            "INVALID_PARAMETER_VALUE",
            "RESOURCE_DOES_NOT_EXIST",
            "ENDPOINT_NOT_FOUND",
        )
        text = json.dumps(body)
        assert "Traceback" not in text
        assert str(platform.settings.home) not in text
        assert "\n" not in body["message"]
    r = api.get(f"/api/v1/artifacts/{team}", params={"prefix": raw.replace("%2f", "/")})
    assert r.status_code in (200, 400)
    assert sentinel.read_text() == "untouched"
    assert _count(platform) == rows_before
    assert api.get(f"/api/v1/artifacts/{team}/legit.txt").content == b"legit"
    # The rejected writes left audit entries (PUT and DELETE that reached a route).
    new = platform.audit.entries(limit=1000)[
        : len(platform.audit.entries(limit=1000)) - audit_before
    ]
    reached = [e for e in new if e.action in ("artifact.put", "artifact.delete")]
    assert all(e.outcome != "ok" for e in reached)


def test_nothing_is_written_outside_the_store(
    api: TestClient, platform: Platform, team: str
) -> None:
    outside = {
        p
        for p in platform.settings.home.parent.rglob("*")
        if not p.is_relative_to(platform.settings.home)
    }
    token = api.headers["Authorization"].removeprefix("Bearer ")
    for raw in HOSTILE_PATHS:
        status, _ = raw_request(api.app, "PUT", f"/api/v1/artifacts/{team}/{raw}", b"evil", token)
        assert status in (400, 404)
    after = {
        p
        for p in platform.settings.home.parent.rglob("*")
        if not p.is_relative_to(platform.settings.home)
    }
    assert after == outside


def test_key_rotation_under_a_running_server_rewrites_no_blob(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from shamal.cli import app as cli_app
    from shamal.config import Settings
    from shamal.server import create_app, start_platform

    settings = Settings(home=tmp_path / "home", encrypt_artifacts=True, allowed_hosts=("*",))
    running = start_platform(settings)
    client = TestClient(create_app(settings, running))
    client.headers["Authorization"] = f"Bearer {running.admin_secret}"
    client.post("/api/v1/teams", json={"name": "sec"})
    data = b"model weights " * 100_000
    assert client.put("/api/v1/artifacts/sec/w.bin", content=data).status_code == 201
    blobs_dir = settings.artifact_root / "blobs"
    stored = {p: p.read_bytes() for p in blobs_dir.rglob("*") if p.is_file()}
    blob_files = {p: b for p, b in stored.items() if not p.name.endswith(".key")}
    assert blob_files
    assert all(data[:64] not in b for b in blob_files.values())  # encrypted at rest

    monkeypatch.setenv("SHAMAL_HOME", str(settings.home))
    monkeypatch.setenv("SHAMAL_ENCRYPT_ARTIFACTS", "true")
    result = CliRunner().invoke(cli_app, ["artifacts", "rotate-key", "--retire-old"])
    assert result.exit_code == 0, result.output
    assert "re-wrapped 1 blob key" in result.output
    for path, before in blob_files.items():
        assert path.read_bytes() == before  # the blobs were not rewritten
    sidecars = [p for p in stored if p.name.endswith(".key")]
    assert all(p.read_bytes() != stored[p] for p in sidecars)  # only the keys were
    # The running server learns the new master key from the keyring file.
    assert client.get("/api/v1/artifacts/sec/w.bin").content == data
    running.close()

    # Turning encryption off later keeps what was stored encrypted readable.
    plain = start_platform(settings.model_copy(update={"encrypt_artifacts": False}))
    found, chunks = plain.artifacts.open(
        plain.security.authenticate(settings.token_file.read_text().strip()), "sec", "w.bin"
    )
    assert b"".join(chunks) == data
    plain.close()
