"""Slow clients cannot stall the API (issue 18, point 4).

A body that trickles in holds no worker thread; a body that stalls or crawls is cut off
with 408 and what came of it is discarded; an account may stream only so many bodies at
once (429 with ``Retry-After``). The live tests drive a real ``shamal server`` through raw
sockets, the way a hostile client would.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
from fastapi.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send

from shamal.artifacts._streaming import SPOOL_IN_MEMORY
from shamal.client import ShamalClient
from shamal.server._guard import RequestGuard
from tests.live import LiveServer
from tests.polling import wait_for

KIB = 1024
#: What each slow upload sends at once: past the in-memory part of a body, so its spool
#: file shows it has reached the handler.
HEAD_START = 300 * KIB


# ---------------------------------------------------------------- the guard, in process
class _Recorder:
    """The guard's side of the wire: what it sent back."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])


async def _reading_app(scope: Scope, receive: Receive, send: Send) -> None:
    """An application that reads its whole body, then answers 201 with its length."""
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": str(size).encode()})


_SCOPE: Scope = {"type": "http", "method": "PUT", "path": "/api/v1/artifacts/t/x", "headers": []}


def _guard(**limits: Any) -> RequestGuard:
    return RequestGuard(_reading_app, allowed_hosts=["*"], max_body=1024 * KIB, **limits)


def test_a_stalled_body_is_cut_off_with_408() -> None:
    async def main() -> _Recorder:
        never = anyio.Event()
        sent = False

        async def receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": b"x" * 10, "more_body": True}
            await never.wait()  # the client sends nothing more
            raise AssertionError("unreachable")

        out = _Recorder()
        await _guard(body_timeout_s=0.05)(_SCOPE, receive, out)
        return out

    out = anyio.run(main)
    assert out.status == 408
    assert b"REQUEST_TIMEOUT" in out.messages[1]["body"]
    assert (b"connection", b"close") in out.messages[0]["headers"]


def _trickle(pieces: int, piece: bytes) -> Iterator[Message]:
    for i in range(pieces):
        yield {"type": "http.request", "body": piece, "more_body": i < pieces - 1}


def _paced_run(guard_limits: dict[str, Any], pieces: int, piece: bytes) -> tuple[_Recorder, int]:
    """Feed ``pieces`` pieces, one a second by the guard's clock; returns the answer and how
    many pieces the guard took before it answered."""
    now = 0.0
    taken = 0
    messages = _trickle(pieces, piece)

    def clock() -> float:
        return now

    async def receive() -> Message:
        nonlocal now, taken
        now += 1.0
        taken += 1
        return next(messages)

    out = _Recorder()
    guard = _guard(clock=clock, body_timeout_s=60.0, **guard_limits)
    anyio.run(guard, _SCOPE, receive, out)
    return out, taken


def test_a_body_under_the_least_rate_is_cut_off_after_the_grace() -> None:
    # 10 bytes a second against a floor of 100: allowed through the 3 s grace, then cut off.
    out, taken = _paced_run({"min_body_rate": 100, "rate_grace_s": 3.0}, 50, b"x" * 10)
    assert out.status == 408
    assert taken == 4  # the first piece read after the grace
    assert b"REQUEST_TIMEOUT" in out.messages[1]["body"]


def test_a_body_at_the_least_rate_passes() -> None:
    out, taken = _paced_run({"min_body_rate": 100, "rate_grace_s": 3.0}, 50, b"x" * 100)
    assert (out.status, taken) == (201, 50)
    assert out.messages[1]["body"] == b"5000"


# ---------------------------------------------------------------- a live server
def _open_upload(port: int, token: str, path: str, total: int, first: int) -> socket.socket:
    """A PUT of ``total`` bytes of which only ``first`` are sent now."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = (
        f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {total}\r\n\r\n"
    )
    sock.sendall(head.encode() + b"s" * first)
    return sock


def _answer(sock: socket.socket) -> tuple[int, str]:
    """The status and head of the answer on ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    return int(head.split(" ", 2)[1]), head.lower()


def _spool_files(home: Path) -> list[Path]:
    return list((home / "artifacts" / ".tmp").glob("upload-*"))


def _user_token(admin: ShamalClient, name: str, team: str) -> str:
    admin.create_user(name)
    admin.set_member(team, name, "member")
    return str(admin.create_token(f"{name}-token", user=name)["secret"])


def _latencies(client: httpx.Client, path: str, n: int) -> list[float]:
    took = []
    for _ in range(n):
        start = time.perf_counter()
        assert client.get(path).status_code == 200
        took.append(time.perf_counter() - start)
    return took


def test_200_slow_uploads_leave_other_users_answered_in_their_normal_time(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    env = {"SHAMAL_MAX_UPLOADS_PER_PRINCIPAL": "256", "SHAMAL_ACCESS_LOG": "false"}
    with LiveServer(home, env=env) as server, ShamalClient(server.url, server.token) as admin:
        admin.create_team("slow")
        admin.create_team("busy")
        slow_token = _user_token(admin, "trickler", "slow")
        busy_token = _user_token(admin, "bystander", "busy")
        admin.upload_artifact("busy", "a.txt", io.BytesIO(b"hello"))
        probe = httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {busy_token}"}, timeout=30
        )
        listing = "/api/v1/artifacts/busy"  # a plain-def route: it needs a worker thread
        _latencies(probe, listing, 5)  # warm the connection and the caches
        before = _latencies(probe, listing, 40)

        total = 2048 * KIB
        socks = [
            _open_upload(server.port, slow_token, f"/api/v1/artifacts/slow/f{i}", total, HEAD_START)
            for i in range(200)
        ]
        stop = threading.Event()

        def trickle() -> None:  # 1 KiB a socket every quarter second: slow, yet alive
            while not stop.wait(0.25):
                for sock in socks:
                    sock.sendall(b"s" * KIB)

        trickler = threading.Thread(target=trickle, daemon=True)
        trickler.start()
        try:
            # Every upload is inside its handler: each has a spool file.
            wait_for(lambda: len(_spool_files(home)) == 200, "200 uploads in their handlers")
            during = _latencies(probe, listing, 40)
            assert len(_spool_files(home)) == 200  # still all held open
        finally:
            stop.set()
            trickler.join(timeout=30)
            for sock in socks:
                sock.close()
            probe.close()
        # Cut off by their clients: every partial upload is discarded.
        wait_for(lambda: not _spool_files(home), "the partial uploads to be removed")
        assert admin.list_artifacts("slow") == []
    median_before, median_during = statistics.median(before), statistics.median(during)
    print(  # the figures the issue asks for (pytest -s shows them)
        f"\nlisting latency ms: before median {median_before * 1e3:.1f} max "
        f"{max(before) * 1e3:.1f}; with 200 slow uploads median {median_during * 1e3:.1f} "
        f"max {max(during) * 1e3:.1f}"
    )
    # Normal latency: the same order as without the uploads (a loaded 2-core test machine
    # gets a margin), and never the seconds that waiting for a worker thread would take.
    assert median_during < 3 * median_before + 0.02
    assert max(during) < 0.5


def test_a_stalled_upload_is_cut_off_and_uploads_are_capped_per_account(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {"SHAMAL_MAX_UPLOADS_PER_PRINCIPAL": "2", "SHAMAL_BODY_TIMEOUT_S": "4"}
    with LiveServer(home, env=env) as server, ShamalClient(server.url, server.token) as admin:
        admin.create_team("t")
        token = _user_token(admin, "hog", "t")
        total = 1024 * KIB
        with contextlib.ExitStack() as sockets:
            held = [
                sockets.enter_context(
                    _open_upload(server.port, token, f"/api/v1/artifacts/t/h{i}", total, HEAD_START)
                )
                for i in range(2)
            ]
            wait_for(lambda: len(_spool_files(home)) == 2, "two uploads in their handlers")
            third = sockets.enter_context(
                _open_upload(server.port, token, "/api/v1/artifacts/t/third", total, 0)
            )
            status, head = _answer(third)
            assert status == 429
            assert "retry-after: 1" in head
            # Another account is not held to the hog's count.
            assert admin.upload_artifact("t", "admin.txt", io.BytesIO(b"fine"))["size"] == 4
            # The held uploads send nothing more: each is cut off with 408, its spool removed.
            for sock in held:
                status, head = _answer(sock)
                assert status == 408
                assert "connection: close" in head
        wait_for(lambda: not _spool_files(home), "the stalled uploads to be removed")
        assert [a["path"] for a in admin.list_artifacts("t")] == ["admin.txt"]
        # Their slots are free again.
        with httpx.Client(base_url=server.url, timeout=30) as c:
            r = c.put(
                "/api/v1/artifacts/t/after.bin",
                content=b"x" * HEAD_START,
                headers={"Authorization": f"Bearer {token}"},
            )
        assert r.status_code == 201


def test_bodies_around_the_spool_threshold_arrive_whole(api: TestClient) -> None:
    """Kept in memory, at the edge, spilled to a file: the store gets every byte in order."""
    api.post("/api/v1/teams", json={"name": "edge"}).raise_for_status()
    for size in (0, 1, SPOOL_IN_MEMORY - 1, SPOOL_IN_MEMORY, 3 * SPOOL_IN_MEMORY + 7):
        body = bytes(i % 251 for i in range(size))
        chunks = [body[i : i + 10_000] for i in range(0, size, 10_000)]
        put = api.put(f"/api/v1/artifacts/edge/b{size}", content=iter(chunks))
        assert put.status_code == 201, put.text
        assert put.json()["digest"] == hashlib.sha256(body).hexdigest()
        assert api.get(f"/api/v1/artifacts/edge/b{size}").content == body
