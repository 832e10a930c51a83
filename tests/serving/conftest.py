"""Fixtures of the serving tests: real ``shamal serve`` processes and the models they serve.

* :class:`ServerProcess` starts ``python -m shamal serve ARGS`` with ``--http-port 0``, waits
  for its ``Serving OIP REST on http://HOST:PORT`` line and knows its URL; ``stop()`` sends
  SIGTERM and returns the exit code. Extra arguments (``--grpc-port``...) pass straight through.
* ``start_server`` (function scope): a factory ``start_server(*args, env=None)`` that stops every
  process it started at teardown.
* ``model_store`` (session): a folder with every test model built once (see
  :func:`build_model_store`), and ``oip_server`` (session): one server for all of them, with the
  names listed in :data:`STORE_MODELS`.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.needs import module
from tests.serving import models

module("tritonclient.http")

REPO = Path(__file__).resolve().parents[2]
_READY = re.compile(r"Serving OIP REST on (http://\S+)")
START_TIMEOUT_S = 60.0

#: Datatypes with an identity model ``identity_<datatype lower>`` in the store.
DATATYPES = list(models.ONNX_TYPES)
#: Served names in ``oip_server``.
STORE_MODELS = [f"identity_{d.lower()}" for d in DATATYPES] + ["add_sub", "iris", "scale"]
STORE_MODELS += ["tokens", "text"]  # INT64 [batch, seq] and BYTES [batch, 1] identities


class ServerProcess:
    """One ``shamal serve`` process on a free port of 127.0.0.1."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        ambient = {k: v for k, v in os.environ.items() if not k.startswith("SHAMAL_")}
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        environment = {**ambient, "PYTHONPATH": path, **(env or {})}
        command = [sys.executable, "-m", "shamal", "serve", "--http-port", "0", *args]
        self.proc = subprocess.Popen(
            command,
            cwd=REPO,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr_lines: list[str] = []
        self._pumps = [
            threading.Thread(target=self._pump_stdout, daemon=True),
            threading.Thread(target=self._pump_stderr, daemon=True),
        ]
        for pump in self._pumps:
            pump.start()
        self.url = self._wait_ready()
        self.host_port = self.url.removeprefix("http://")

    def _pump_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def _pump_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line)

    def _wait_ready(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            found = _READY.search(line)
            if found:
                return found.group(1)
        self.close()
        raise AssertionError("the server did not start:\n" + "".join(self.stderr_lines[-40:]))

    def close(self) -> None:
        """Kill the process if it still runs, and close its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for pump in self._pumps:
            pump.join(10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, wait, and return the exit code (kill after ``timeout``)."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                return self.proc.wait(timeout)
            return self.proc.returncode
        finally:
            self.close()


@pytest.fixture
def start_server() -> Iterator[Callable[..., ServerProcess]]:
    """``start_server(*args, env=None) -> ServerProcess``; every process is stopped at teardown."""
    started: list[ServerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> ServerProcess:
        server = ServerProcess(list(args), env)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


def build_model_store(root: Path) -> dict[str, Path]:
    """Every model of :data:`STORE_MODELS` under ``root``; name -> path for ``--model``."""
    paths: dict[str, Path] = {}
    for datatype in DATATYPES:
        name = f"identity_{datatype.lower()}"
        paths[name] = models.identity_model(root / f"{name}.onnx", datatype)
    paths["tokens"] = models.identity_model(root / "tokens.onnx", "INT64", "seq")
    paths["text"] = models.identity_model(root / "text.onnx", "BYTES", 1)
    paths["add_sub"] = models.add_sub_model(root / "add_sub" / "model.onnx").parent
    paths["iris"], _, _ = models.iris_model(root / "iris")
    paths["scale:1"] = models.scale_model(root / "scale1" / "model.onnx", 2.0)
    paths["scale:2"] = models.scale_model(root / "scale2" / "model.onnx", 3.0)
    return paths


@pytest.fixture(scope="session")
def model_store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_model_store(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def oip_server(model_store: dict[str, Path]) -> Iterator[ServerProcess]:
    """One server for every store model; 4 MiB body limit; one intra-op thread per model."""
    args = ["--threads", "1", "--max-request-bytes", str(4 * 1024 * 1024)]
    for name, path in model_store.items():
        args += ["--model", f"{name}={path}"]
    server = ServerProcess(args)
    yield server
    assert server.stop() == 0
