"""The pytest plugin that points MLflow's own REST tests at a server of our choosing.

Loaded by ``bench/mlflow_suite.py`` (``-p mlflow_suite_adapter``) into a pytest run over MLflow's
``tests/tracking/test_rest_tracking.py`` and ``tests/tracking/test_model_registry.py``. It changes
nothing in those files: it swaps the server fixtures they define (``store_type``, ``mlflow_client``
in the first, ``client`` in the second) for a fresh server per test, started as a separate
process, and adds the server's token to every request sent to it. Everything else (the tests,
MLflow's conftest, the stock client) runs as MLflow's own CI runs it.

The server comes from the environment (set by ``bench/mlflow_suite.py``):

- ``MLFLOW_SUITE_SERVER``: ``shamal`` or ``stock``;
- ``MLFLOW_SUITE_SHAMAL_PYTHON`` and ``MLFLOW_SUITE_SHAMAL_SRC``: the Python that runs
  ``shamal server`` and the ``src`` folder it imports Shamal from;
- ``MLFLOW_SUITE_MLFLOW``: the ``mlflow`` command of the stock server (the suite's own venv).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

_SERVER = os.environ.get("MLFLOW_SUITE_SERVER", "shamal")
_QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class _Server:
    """One server process in its own process group, on a fresh home under ``home``."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token: str | None = None
        self.log = home / "server.log"
        home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **_QUIET}
        env.pop("MLFLOW_TRACKING_URI", None)
        if _SERVER == "shamal":
            env.update(SHAMAL_HOME=str(home), PYTHONPATH=os.environ["MLFLOW_SUITE_SHAMAL_SRC"])
            argv = [os.environ["MLFLOW_SUITE_SHAMAL_PYTHON"], "-m", "shamal", "server"]
            argv += ["--port", str(self.port), "--workers", "1"]
            self.ready = "/ready"
        else:
            argv = [os.environ["MLFLOW_SUITE_MLFLOW"], "server"]
            argv += ["--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}"]
            argv += ["--artifacts-destination", str(home / "artifacts")]
            argv += ["--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
            self.ready = "/health"
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self, deadline_s: float = 120.0) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log.read_text()[-3000:]}")
            try:
                answer = requests.get(self.url + self.ready, timeout=1.0)
                if answer.status_code == 200 and self._token_ready():
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)  # a poll with a deadline
        raise RuntimeError(f"server not ready:\n{self.log.read_text()[-3000:]}")

    def _token_ready(self) -> bool:
        if _SERVER != "shamal":
            return True
        token = self.home / "token"
        if not token.exists() or not token.read_text().strip():
            return False
        self.token = token.read_text().strip()
        return True

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


# The requests library sends every call of the client and of the tests' raw requests: the
# token goes on those bound for the server under test (and only those).
_CURRENT: dict[str, str] = {}
_send = requests.Session.request


def _with_token(self: requests.Session, method: str, url: str, *args: Any, **kw: Any) -> Any:
    token, base = _CURRENT.get("token"), _CURRENT.get("url")
    if token and base and str(url).startswith(base):
        headers = dict(kw.get("headers") or {})
        if not any(k.lower() == "authorization" for k in headers):
            headers["Authorization"] = f"Bearer {token}"
        kw["headers"] = headers
    return _send(self, method, url, *args, **kw)


requests.Session.request = _with_token  # type: ignore[method-assign]


_TEMPLATE: list[Path] = []


def _fresh_home(tmp_path: Path) -> Path:
    """A fresh Shamal home for one test: a copy of one started (migrated, token written) and
    stopped once per session, as MLflow's fixtures copy a migrated SQLite database."""
    home = tmp_path / f"{_SERVER}-home"
    if _SERVER != "shamal":
        return home
    if not _TEMPLATE:
        template = Path(tempfile.mkdtemp(prefix="shamal-suite-template-")) / "home"
        first = _Server(template)
        try:
            first.wait_ready()
        finally:
            first.stop()
        first.log.unlink()
        _TEMPLATE.append(template)
    shutil.copytree(_TEMPLATE[0], home)
    return home


def _serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from mlflow import MlflowClient

    server = _Server(_fresh_home(tmp_path))
    try:
        server.wait_ready()
        _CURRENT.update(url=server.url, token=server.token or "")
        if server.token:
            monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", server.token)
        yield MlflowClient(server.url)
    finally:
        _CURRENT.clear()
        server.stop()
        shutil.rmtree(server.home, ignore_errors=True)


@pytest.fixture(params=[_SERVER], ids=["server"])
def store_type(request: pytest.FixtureRequest) -> str:
    """One server per test instead of MLflow's two local stores (file and SQLite)."""
    return str(request.param)


@pytest.fixture
def mlflow_client(
    store_type: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    """A client of a fresh server process (test_rest_tracking.py's fixture, swapped)."""
    yield from _serve(tmp_path, monkeypatch)


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A client of a fresh server process (test_model_registry.py's fixture, swapped)."""
    yield from _serve(tmp_path, monkeypatch)


_SWAPPED = {
    "test_rest_tracking.py": {"store_type": store_type, "mlflow_client": mlflow_client},
    "test_model_registry.py": {"client": client},
}


@pytest.hookimpl(wrapper=True)
def pytest_pycollect_makemodule(module_path: Path, parent: Any) -> Any:
    """Import the test module and put the fixtures above in place of its own, before pytest
    reads its fixtures."""
    module = yield
    swapped = _SWAPPED.get(module_path.name)
    if swapped and module is not None:
        for name, fixture in swapped.items():
            setattr(module.obj, name, fixture)
    return module
