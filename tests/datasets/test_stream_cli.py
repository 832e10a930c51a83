"""`shamal data stream` end to end: a real CLI process consumes RabbitMQ into a real server
until SIGTERM (committing the open batch, printing no credential), and a drain of a Redis
stream with `--idle-exit` whose poison message `shamal data dead-letters` then shows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator

import pytest
from typer.testing import CliRunner

from shamal.cli import app
from shamal.client import ShamalClient
from tests import needs
from tests.live import LiveServer
from tests.polling import wait_until

pytestmark = pytest.mark.slow

LIMIT = 64 * 1024

pika = needs.module("pika")
redis = needs.module("redis")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # A small request limit, for the batch that must be split to fit.
    home = tmp_path_factory.mktemp("stream-cli-home")
    with LiveServer(home, env={"SHAMAL_MAX_REQUEST_BYTES": str(LIMIT)}) as live:
        with ShamalClient(live.url, live.token) as api:
            api.create_team("iot")
        yield live


@pytest.fixture
def api(server: LiveServer) -> Iterator[ShamalClient]:
    with ShamalClient(server.url, server.token) as client:
        yield client


@pytest.fixture
def dataset(api: ShamalClient) -> str:
    name = f"cli-{uuid.uuid4().hex[:10]}"
    api.create_dataset(name, team="iot")
    return name


def _rows(api: ShamalClient, name: str) -> int:
    found = api.get_dataset(name)["latest_version"]
    return 0 if found is None else int(api.dataset_version(f"{name}/{found}")["row_count"])


@pytest.fixture
def queue() -> Iterator[str]:
    name = f"shamal-cli-{uuid.uuid4().hex[:10]}"
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    connection.channel().queue_declare(name)
    yield name
    connection.channel().queue_delete(name)
    connection.close()


def _publish(queue: str, payloads: list[bytes]) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    try:
        channel = connection.channel()
        for index, payload in enumerate(payloads):
            properties = pika.BasicProperties(message_id=f"{queue}-{index}")
            channel.basic_publish("", queue, payload, properties)
    finally:
        connection.close()


def _ready(queue: str) -> int:
    """Messages in ``queue`` not yet delivered to any consumer."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    try:
        declared = connection.channel().queue_declare(queue, passive=True)
        return int(declared.method.message_count)
    finally:
        connection.close()


def test_the_cli_consumes_until_sigterm_and_commits_the_open_batch(
    server: LiveServer, api: ShamalClient, dataset: str, queue: str
) -> None:
    env = {
        **os.environ,
        "SHAMAL_URL": server.url,
        "SHAMAL_TOKEN": server.token,
        # The password stays off the command line, and is never printed.
        "SHAMAL_STREAM_FROM": f"amqp://guest:guest@127.0.0.1:5672/{queue}",
    }
    command = [sys.executable, "-m", "shamal", "data", "stream", dataset, "--max-rows", "3"]
    process = subprocess.Popen(  # noqa: S603 - our own CLI
        [*command, "--max-seconds", "3600"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _publish(queue, [json.dumps({"id": i, "reading": i / 2}).encode() for i in range(5)])
        # Three close a batch by size; two wait in the open batch (its age is an hour) ...
        wait_until(lambda: _rows(api, dataset) == 3, "the first batch", timeout=60)
        # The prefetch window is the batch size: the last two are delivered only once the
        # first three are acknowledged. SIGTERM before then would leave them in the queue.
        wait_until(lambda: _ready(queue) == 0, "the last two delivered", timeout=60)
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    # ... and SIGTERM commits them before it stops.
    assert process.returncode == 0, out
    assert _rows(api, dataset) == 5
    assert "stopped: 2 batch(es), 5 rows written, 0 skipped, 0 parked" in out
    assert f"amqp://127.0.0.1:5672/{queue}" in out
    assert "guest" not in out


def test_a_drain_with_idle_exit_and_the_dead_letters_it_parked(
    server: LiveServer,
    api: ShamalClient,
    dataset: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = f"shamal-cli-{uuid.uuid4().hex[:10]}"
    with redis.Redis("127.0.0.1", 6379) as client:
        for i in range(4):
            client.xadd(key, {"data": json.dumps({"id": i, "name": f"n{i}"})})
        client.xadd(key, {"data": b'{"id": 9, "name": "Fatima Al Mansouri"'})
    monkeypatch.setenv("SHAMAL_URL", server.url)
    monkeypatch.setenv("SHAMAL_TOKEN", server.token)
    shamal: Callable[..., tuple[int, str]] = _runner()
    try:
        code, out = shamal(
            "data",
            "stream",
            dataset,
            "--from",
            f"redis://127.0.0.1:6379/0?stream={key}&group=cli",
            "--max-seconds",
            "0.2",
            "--idle-exit",
            "0.5",
            "--json",
        )
        assert code == 0, out
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert lines[-1]["totals"]["written"] == 4
        assert lines[-1]["totals"]["parked"] == 1
        assert _rows(api, dataset) == 4
        code, out = shamal("data", "dead-letters", dataset)
        assert code == 0, out
        assert "not JSON" in out
        assert "Fatima" not in out
        code, out = shamal("data", "stream", dataset, "--from", "kafka://host/topic")
        assert code == 1
        assert "mqtt" in out
    finally:
        with redis.Redis("127.0.0.1", 6379) as client:
            client.delete(key)


def test_a_batch_over_the_request_limit_is_split_and_a_huge_record_parked(
    server: LiveServer, api: ShamalClient, dataset: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = f"shamal-cli-{uuid.uuid4().hex[:10]}"
    with redis.Redis("127.0.0.1", 6379) as client:
        for i in range(40):  # 40 x 4 KiB: over the 64 KiB a request may carry
            client.xadd(key, {"data": json.dumps({"id": i, "name": "x" * 4096})})
        client.xadd(key, {"data": json.dumps({"id": 99, "name": "y" * (LIMIT * 2)})})
    monkeypatch.setenv("SHAMAL_URL", server.url)
    monkeypatch.setenv("SHAMAL_TOKEN", server.token)
    try:
        code, out = _runner()(
            "data",
            "stream",
            dataset,
            "--from",
            f"redis://127.0.0.1:6379/0?stream={key}&group=big",
            "--max-rows",
            "100",
            "--max-seconds",
            "0.5",
            "--idle-exit",
            "0.5",
            "--json",
        )
        assert code == 0, out
        totals = json.loads(out.splitlines()[-1])["totals"]
        assert (totals["written"], totals["parked"]) == (40, 1)
        assert _rows(api, dataset) == 40
        assert api.get_dataset(dataset)["latest_version"] >= 3  # written in parts
        letters = api.dead_letters(dataset)
        assert [d["reason"] for d in letters] == [
            "the record is larger than the server takes in one request"
        ]
    finally:
        with redis.Redis("127.0.0.1", 6379) as client:
            client.delete(key)


def _runner() -> Callable[..., tuple[int, str]]:
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
        return result.exit_code, result.output

    return run
