"""Long reads are capped per account (issue 18, point 4): a streamed download holds one of
its account's ``SHAMAL_MAX_DOWNLOADS_PER_PRINCIPAL`` slots until its last byte is sent,
so an account that holds the cap's worth of slow downloads open gets 429 with
``Retry-After`` for the next one, while another account still downloads; the slot comes
back once the stream ends. Job-log reads count as downloads, metric-history reads as
searches.

The download tests drive a real ``shamal server`` and read its answers with httpx
streaming: a reader that takes nothing leaves the server's send blocked on a full socket.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from shamal.artifacts import PrincipalSlots
from shamal.client import ShamalClient
from shamal.config import Settings
from shamal.server import create_app
from shamal.server._platform import Platform, start_platform
from tests.live import LiveServer
from tests.polling import wait_for

MIB = 1024 * 1024
#: Far past what the loopback's socket buffers hold: a download nobody reads stays open.
LARGE = 64 * MIB
CAP = 2
LARGE_PATH = "/api/v1/artifacts/t/large"
SMALL = "/api/v1/artifacts/t/small"


def _user_token(admin: ShamalClient, name: str, team: str) -> str:
    admin.create_user(name)
    admin.set_member(team, name, "member")
    return str(admin.create_token(f"{name}-token", user=name)["secret"])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {"SHAMAL_MAX_DOWNLOADS_PER_PRINCIPAL": str(CAP), "SHAMAL_ACCESS_LOG": "false"}
    with LiveServer(tmp_path_factory.mktemp("downloads"), env) as live:
        yield live


@pytest.fixture(scope="module")
def tokens(server: LiveServer) -> tuple[str, str]:
    """Tokens of two accounts of team ``t``, which holds ``large`` (LARGE bytes) and
    ``small``."""
    with ShamalClient(server.url, server.token) as admin:
        admin.create_team("t")
        hog, other = _user_token(admin, "hog", "t"), _user_token(admin, "other", "t")
    payload = bytes(range(256)) * (LARGE // 256)
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {hog}"}, timeout=60
    ) as http:
        http.put("/api/v1/artifacts/t/large", content=payload).raise_for_status()
        http.put("/api/v1/artifacts/t/small", content=b"small").raise_for_status()
    return hog, other


def _open(http: httpx.Client, path: str, token: str) -> httpx.Response:
    request = http.build_request("GET", path, headers={"Authorization": f"Bearer {token}"})
    return http.send(request, stream=True)


def _download_all(http: httpx.Client, path: str, token: str) -> int:
    with http.stream("GET", path, headers={"Authorization": f"Bearer {token}"}) as answer:
        assert answer.status_code == 200, answer.read()
        return sum(len(chunk) for chunk in answer.iter_bytes())


def _small_passes(http: httpx.Client, token: str) -> bool:
    answer = http.get(SMALL, headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code in (200, 429), answer.text
    return answer.status_code == 200


def _open_when_free(http: httpx.Client, token: str) -> httpx.Response:
    """A stream of the large file, once a slot is free: the server gives a finished
    download's slot back just after its last byte, so the first try can still be refused."""
    opened: list[httpx.Response] = []

    def _try() -> bool:
        answer = _open(http, LARGE_PATH, token)
        if answer.status_code == 200:
            opened.append(answer)
            return True
        assert answer.status_code == 429, answer.read()
        answer.close()
        return False

    wait_for(_try, "a free download slot", 30)
    return opened[0]


def test_slow_downloads_hold_their_slots_until_the_stream_ends(
    server: LiveServer, tokens: tuple[str, str]
) -> None:
    hog, other = tokens
    with contextlib.ExitStack() as held, httpx.Client(base_url=server.url, timeout=60) as http:
        slow = []
        for _ in range(CAP):  # each on its own connection, read no further than its head
            answer = held.enter_context(contextlib.closing(_open(http, LARGE_PATH, hog)))
            assert answer.status_code == 200
            slow.append(answer)
        refused = http.get(SMALL, headers={"Authorization": f"Bearer {hog}"})
        assert refused.status_code == 429
        assert float(refused.headers["Retry-After"]) > 0
        assert "REQUEST_LIMIT_EXCEEDED" in refused.text
        assert "At most 2 downloads at once per account" in refused.text
        # The cap is per account: another one downloads the same file meanwhile.
        assert _download_all(http, LARGE_PATH, other) == LARGE
        # A slow stream read to its end gives its slot back.
        assert sum(len(chunk) for chunk in slow[0].iter_bytes()) == LARGE
        wait_for(lambda: _small_passes(http, hog), "the finished download's slot", 30)
        # A client that goes away mid-stream gives its slot back too: with a new stream
        # holding one slot, a second download passes only once the abandoned one is gone.
        slow[1].close()
        held.enter_context(contextlib.closing(_open_when_free(http, hog)))
        wait_for(lambda: _small_passes(http, hog), "the abandoned download's slot", 30)


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    settings = Settings(
        home=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'shamal.db'}",
        allowed_hosts=("*",),
        max_downloads_per_principal=CAP,
        max_searches_per_principal=CAP,
    )
    running = start_platform(settings)
    yield running
    running.close()


def test_proxy_downloads_job_logs_and_metric_histories_hold_slots(platform: Platform) -> None:
    assert platform.admin_secret is not None
    key = f"user:{platform.security.authenticate(platform.admin_secret).user.id}"
    proxy = "/api/2.0/mlflow-artifacts/artifacts/1/0123456789abcdef/artifacts/f"
    logs = "/api/v1/jobs/0123456789ab/logs"
    history = "/api/2.0/mlflow/metrics/get-history?run_id=0123456789abcdef&metric_key=m"
    bulk = (
        "/api/2.0/mlflow/metrics/get-history-bulk-interval"
        "?run_ids=0123456789abcdef&metric_key=m&max_results=10"
    )
    with TestClient(create_app(platform.settings, platform)) as api:
        api.headers["Authorization"] = f"Bearer {platform.admin_secret}"
        free = {path: api.get(path).status_code for path in (proxy, logs, history, bulk)}
        assert 429 not in free.values()
        downloads: PrincipalSlots = api.app.state.download_slots  # type: ignore[attr-defined]
        searches: PrincipalSlots = api.app.state.search_slots  # type: ignore[attr-defined]
        for slots, paths in ((downloads, (proxy, logs)), (searches, (history, bulk))):
            with contextlib.ExitStack() as held:
                for _ in range(CAP):  # the account's reads that run elsewhere
                    held.enter_context(slots.hold(key))
                for path in paths:
                    refused = api.get(path)
                    assert refused.status_code == 429, path
                    assert refused.headers["Retry-After"]
            assert slots.in_use(key) == 0
            assert {path: api.get(path).status_code for path in paths} == {
                path: free[path] for path in paths
            }
