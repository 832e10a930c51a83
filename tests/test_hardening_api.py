"""Smaller holes a hostile tenant showed in the control plane (issue 18, point 6).

* JSON strings with a lone UTF-16 surrogate (``"\\ud800"``), in any field of any route: 400,
  never a 500 (Python's ``json`` reads them, no database driver or encoder can write them).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient

from tests.live import LiveServer

LONE = "\ud800"
M = "/api/2.0/mlflow"


def _variants(body: Any) -> Iterator[tuple[str, Any]]:
    """(where, body with one string or key replaced by a lone surrogate), for every string
    leaf and every key of ``body``."""
    if isinstance(body, str):
        yield "", LONE
        yield "", f"a{LONE}b"
    elif isinstance(body, dict):
        for key, value in body.items():
            for where, changed in _variants(value):
                yield f".{key}{where}", {**body, key: changed}
            renamed = {(LONE if k == key else k): v for k, v in body.items()}
            yield f".<key {key}>", renamed
    elif isinstance(body, list):
        for i, value in enumerate(body):
            for where, changed in _variants(value):
                yield f"[{i}]{where}", [*body[:i], changed, *body[i + 1 :]]


def _catalogue(api: TestClient) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, a body the route accepts as it is) over the MLflow dialect and the
    native API, with the objects the bodies name made first."""
    exp = api.post(f"{M}/experiments/create", json={"name": "surr-exp"}).json()["experiment_id"]
    created = api.post(f"{M}/runs/create", json={"experiment_id": exp}).json()
    run = created["run"]["info"]["run_id"]
    assert api.post(f"{M}/registered-models/create", json={"name": "surr-m"}).status_code == 200
    version = api.post(
        f"{M}/model-versions/create", json={"name": "surr-m", "source": f"runs:/{run}/model"}
    )
    assert version.status_code == 200, version.text
    study = {"name": "surr-study", "team": "default"}
    assert api.post("/api/v1/tune/studies", json=study).status_code == 200
    trial = api.post("/api/v1/tune/studies/default/surr-study/trials").json()["id"]
    return [
        ("POST", f"{M}/experiments/create", {"name": "e2", "tags": [{"key": "k", "value": "v"}]}),
        ("POST", f"{M}/experiments/update", {"experiment_id": exp, "new_name": "e3"}),
        ("POST", f"{M}/experiments/set-experiment-tag", {"experiment_id": exp, "key": "k"}),
        (
            "POST",
            f"{M}/runs/create",
            {"experiment_id": exp, "run_name": "r", "tags": [{"key": "k", "value": "v"}]},
        ),
        ("POST", f"{M}/runs/update", {"run_id": run, "run_name": "r2", "status": "RUNNING"}),
        ("POST", f"{M}/runs/log-parameter", {"run_id": run, "key": "p", "value": "v"}),
        ("POST", f"{M}/runs/set-tag", {"run_id": run, "key": "t", "value": "v"}),
        ("POST", f"{M}/runs/delete-tag", {"run_id": run, "key": "t"}),
        (
            "POST",
            f"{M}/runs/log-metric",
            {"run_id": run, "key": "m", "value": 1.0, "timestamp": 1, "step": 0},
        ),
        (
            "POST",
            f"{M}/runs/log-batch",
            {
                "run_id": run,
                "params": [{"key": "q", "value": "v"}],
                "tags": [{"key": "t2", "value": "v"}],
                "metrics": [{"key": "m2", "value": 1.0, "timestamp": 1, "step": 0}],
            },
        ),
        ("POST", f"{M}/runs/search", {"experiment_ids": [exp], "filter": "tags.a = 'b'"}),
        ("POST", f"{M}/experiments/search", {"filter": "name = 'x'", "max_results": 5}),
        ("POST", f"{M}/registered-models/create", {"name": "m2", "description": "d"}),
        ("PATCH", f"{M}/registered-models/update", {"name": "surr-m", "description": "d"}),
        ("POST", f"{M}/registered-models/set-tag", {"name": "surr-m", "key": "k", "value": "v"}),
        (
            "POST",
            f"{M}/model-versions/create",
            {"name": "surr-m", "source": f"runs:/{run}/model", "description": "d"},
        ),
        (
            "PATCH",
            f"{M}/model-versions/update",
            {"name": "surr-m", "version": "1", "description": "d"},
        ),
        ("POST", f"{M}/registered-models/alias", {"name": "surr-m", "alias": "a", "version": "1"}),
        ("POST", "/api/v1/teams", {"name": "t-surr", "description": "d"}),
        ("POST", "/api/v1/tokens", {"name": "tok"}),
        ("POST", f"/api/v1/tune/trials/{trial}/attrs", {"key": "k", "value": {"a": ["b"]}}),
        (
            "POST",
            f"/api/v1/tune/trials/{trial}/suggest",
            {"name": "p", "distribution": {"type": "categorical", "choices": ["a", "b"]}},
        ),
    ]


def test_lone_surrogates_in_any_field_answer_400(api: TestClient) -> None:
    failures = []
    for method, path, body in _catalogue(api):
        for where, changed in _variants(body):
            content = json.dumps(changed)  # ensure_ascii: the surrogate travels as \ud800
            answer = api.request(
                method, path, content=content, headers={"content-type": "application/json"}
            )
            if answer.status_code != 400 or "Traceback" in answer.text:
                failures.append(f"{method} {path} {where}: {answer.status_code}")
            else:
                assert answer.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert not failures, "\n".join(failures)


def test_a_surrogate_pair_is_one_character_and_accepted(api: TestClient) -> None:
    exp = api.post(f"{M}/experiments/create", json={"name": "pairs"}).json()["experiment_id"]
    run = api.post(f"{M}/runs/create", json={"experiment_id": exp}).json()["run"]["info"]
    content = json.dumps({"run_id": run["run_id"], "key": "t", "value": "smile \U0001f600"})
    assert "\\ud83d\\ude00" in content
    answer = api.post(
        f"{M}/runs/set-tag", content=content, headers={"content-type": "application/json"}
    )
    assert answer.status_code == 200, answer.text
    got = api.get(f"{M}/runs/get", params={"run_id": run["run_id"]}).json()
    assert {"key": "t", "value": "smile \U0001f600"} in got["run"]["data"]["tags"]


def _exchange(sock: socket.socket, request: bytes) -> bytes:
    """Send one request on ``sock`` and read one whole response (Content-Length framed)."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        rest += chunk
    return head + b"\r\n\r\n" + rest


def test_the_connection_stays_usable_after_a_lone_surrogate(tmp_path: Path) -> None:
    server = LiveServer(tmp_path / "home").start()
    try:
        token = server.token
        body = json.dumps({"name": LONE}).encode()
        request = (
            f"POST {M}/experiments/create HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            first = _exchange(sock, request)
            assert first.startswith(b"HTTP/1.1 400 "), first[:200]
            assert b"connection: close" not in first.lower()
            second = _exchange(sock, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert second.startswith(b"HTTP/1.1 200 "), second[:200]
        log = server.log.read_text(errors="replace")
        assert "Traceback" not in log
    finally:
        server.stop()


def _account(api: TestClient, name: str, team: str) -> dict[str, str]:
    """A user with the member role... maintainer role in its own new team; its auth header."""
    assert api.post("/api/v1/users", json={"name": name}).status_code < 300
    assert api.post("/api/v1/teams", json={"name": team}).status_code < 300
    joined = api.put(f"/api/v1/teams/{team}/members/{name}", json={"role": "maintainer"})
    assert joined.status_code < 300, joined.text
    secret = api.post("/api/v1/tokens", json={"name": "t", "user": name}).json()["secret"]
    return {"Authorization": f"Bearer {secret}"}


def _team_tag(team: str) -> list[dict[str, str]]:
    return [{"key": "shamal.team", "value": team}]


def _assert_generic(answer: Any, status: int, secret_words: tuple[str, ...]) -> str:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert body["error_code"] == "RESOURCE_ALREADY_EXISTS", body
    message = str(body["message"]).lower()
    for word in (*secret_words, "team", "hidden", "other", "another", "permission", "access"):
        assert word not in message, message
    return message


def test_a_name_taken_by_a_hidden_object_is_a_generic_conflict(api: TestClient) -> None:
    """Creating (or renaming to) a name another team's object holds answers as any taken
    name does: nothing says whose it is, or that the caller cannot see it."""
    alice = _account(api, "alice", "vision")
    bob = _account(api, "bob", "speech")
    exp = api.post(
        f"{M}/experiments/create",
        json={"name": "secret-exp", "tags": _team_tag("vision")},
        headers=alice,
    ).json()["experiment_id"]
    run = api.post(f"{M}/runs/create", json={"experiment_id": exp}, headers=alice).json()
    run_id = run["run"]["info"]["run_id"]
    made = api.post(
        f"{M}/registered-models/create",
        json={"name": "secret-model", "tags": _team_tag("vision")},
        headers=alice,
    )
    assert made.status_code == 200, made.text
    version = api.post(
        f"{M}/model-versions/create",
        json={"name": "secret-model", "source": f"runs:/{run_id}/model"},
        headers=alice,
    )
    assert version.status_code == 200, version.text
    deployed = api.put(
        "/api/v1/deployments/secret-dep",
        json={"team": "vision", "primary": [{"model": "models:/secret-model/1"}]},
        headers=alice,
    )
    assert deployed.status_code == 200, deployed.text
    hidden = ("alice", "vision", "secret-model/1")

    # Bob sees none of it...
    assert api.get("/api/v1/deployments/secret-dep", headers=bob).status_code == 404
    # ...and each of his creates on those names is a plain "taken" (MLflow's own status, 400,
    # under its dialect; 409 under Shamal's API).
    mine = api.post(
        f"{M}/experiments/create",
        json={"name": "bob-exp", "tags": _team_tag("speech")},
        headers=bob,
    )
    bob_exp = mine.json()["experiment_id"]
    taken = api.post(
        f"{M}/experiments/create",
        json={"name": "secret-exp", "tags": _team_tag("speech")},
        headers=bob,
    )
    _assert_generic(taken, 400, hidden)
    renamed = api.post(
        f"{M}/experiments/update",
        json={"experiment_id": bob_exp, "new_name": "secret-exp"},
        headers=bob,
    )
    _assert_generic(renamed, 400, hidden)
    own = api.post(
        f"{M}/registered-models/create",
        json={"name": "bob-model", "tags": _team_tag("speech")},
        headers=bob,
    )
    assert own.status_code == 200, own.text
    again = api.post(
        f"{M}/registered-models/create",
        json={"name": "bob-model", "tags": _team_tag("speech")},
        headers=bob,
    )
    taken_model = api.post(
        f"{M}/registered-models/create",
        json={"name": "secret-model", "tags": _team_tag("speech")},
        headers=bob,
    )
    # The same words as for a name of his own.
    assert _assert_generic(taken_model, 400, hidden).replace("secret-model", "x") == (
        _assert_generic(again, 400, ()).replace("bob-model", "x")
    )
    moved = api.post(
        f"{M}/registered-models/rename",
        json={"name": "bob-model", "new_name": "secret-model"},
        headers=bob,
    )
    _assert_generic(moved, 400, hidden)
    bob_run = api.post(f"{M}/runs/create", json={"experiment_id": bob_exp}, headers=bob).json()
    bob_version = api.post(
        f"{M}/model-versions/create",
        json={"name": "bob-model", "source": f"runs:/{bob_run['run']['info']['run_id']}/model"},
        headers=bob,
    )
    assert bob_version.status_code == 200, bob_version.text
    dep = api.put(
        "/api/v1/deployments/secret-dep",
        json={"team": "speech", "primary": [{"model": "models:/bob-model/1"}]},
        headers=bob,
    )
    _assert_generic(dep, 409, hidden)
    # Alice's deployment is as it was.
    still = api.get("/api/v1/deployments/secret-dep", headers=alice).json()
    assert still["team"] == "vision"
    assert still["revision"] == 1


def test_redact_target_masks_tokens_and_credential_parameters() -> None:
    from shamal.server._redact import redact_target

    secret = "shm_" + "A1b2-C3d4_" * 4 + "xyz"
    assert redact_target(f"/health?token={secret}&a=1") == "/health?token=***&a=1"
    assert (
        redact_target("/x?Access-Token=abc;key=v&keep=me") == "/x?Access-Token=***;key=***&keep=me"
    )
    assert redact_target(f"/api/v1/things/{secret}/x") == "/api/v1/things/shm_***/x"
    assert redact_target(f"/x?q=shm%5F{secret[4:]}") == "/x?q=shm_***"
    assert redact_target("/x?X-Amz-Signature=deadbeef&X-Amz-Date=1") == (
        "/x?X-Amz-Signature=***&X-Amz-Date=1"
    )
    assert redact_target("/plain/path?a=b") == "/plain/path?a=b"


def test_tokens_never_reach_the_access_log(tmp_path: Path) -> None:
    """Wherever the request carries a token (query string, path), the access line masks it."""
    with LiveServer(tmp_path / "home") as server:
        token = server.token
        headers = {"Authorization": f"Bearer {token}"}
        targets = [
            f"/health?token={token}",
            f"/api/v1/whoami?access_token={token}",
            f"/api/2.0/mlflow/experiments/get-by-name?experiment_name={token}",
            f"/api/v1/deployments/{token}",
            "/health?api_key=plain-secret-value",
        ]
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for target in targets:
                client.get(target, headers=headers)
            # The access line of the last request is written before its answer is sent.
            last = "/api/2.0/mlflow/experiments/get-by-name?experiment_name=marker-last"
            assert client.get(last, headers=headers).status_code == 404
        log = server.log.read_text(errors="replace")
    assert "experiment_name=marker-last" in log  # the access log is on and was read
    assert token not in log
    assert token[4:20] not in log
    assert "plain-secret-value" not in log
    assert "/api/v1/deployments/shm_***" in log
    assert "/health?token=***" in log
