"""Fixtures for the executor tests: a local Ray cluster, executors, job specs, deadlines.

The Ray cluster is started once per session and only when a Ray test runs (they are
marked ``slow``); it declares two GPUs that do not exist, so that Ray's GPU assignment
(and ``CUDA_VISIBLE_DEVICES``) can be checked on a machine without one.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
import textwrap
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from shamal.executors import (
    Executor,
    ExitStatus,
    Handle,
    LaunchSpec,
    ensure_ray_token,
    get_executor,
)
from shamal.scheduler.core._resources import Placement, Slot
from tests import needs
from tests.polling import wait_for


def python(code: str) -> tuple[str, ...]:
    """argv that runs ``code`` with this interpreter."""
    return (sys.executable, "-c", textwrap.dedent(code))


def cpu_slot(node: str = "node-a") -> Slot:
    return Slot(node=node, cpu_milli=500, memory_mib=64)


class Jobs:
    """Builds specs in a test's folder and launches them; stops leftovers at teardown."""

    def __init__(self, executor: Executor, root: Path) -> None:
        self.executor = executor
        self.root = root
        self.workdir = root / "snapshot"
        self.workdir.mkdir(parents=True)
        (self.workdir / "train.py").write_text("print('snapshot file')\n")
        self.marks = root / "marks"
        self.marks.mkdir()
        self.handles: list[Handle] = []

    def spec(
        self,
        command: Sequence[str],
        *,
        slots: Sequence[Slot] | None = None,
        env: Mapping[str, str] | None = None,
        time_limit_s: float | None = None,
        grace_s: float = 5.0,
        job_id: str | None = None,
        attempt: int = 0,
    ) -> LaunchSpec:
        job_id = job_id or f"job-{uuid.uuid4().hex[:10]}"
        return LaunchSpec(
            job_id=job_id,
            attempt=attempt,
            command=tuple(command),
            workdir=self.workdir,
            env={"MARK_DIR": str(self.marks), **(env or {})},
            placement=Placement(tuple(slots or (cpu_slot(),))),
            log_path=self.root / "logs" / job_id / f"attempt-{attempt}.log",
            time_limit_s=time_limit_s,
            grace_s=grace_s,
        )

    def launch(self, spec: LaunchSpec) -> Handle:
        handle = self.executor.launch(spec)
        self.handles.append(handle)
        return handle

    def run(self, spec: LaunchSpec, timeout: float = 30.0) -> ExitStatus:
        """Launch and wait for the end."""
        status = self.executor.wait(self.launch(spec), timeout)
        assert status is not None, f"job did not end within {timeout}s"
        return status

    def mark(self, name: str) -> Path:
        return self.marks / name

    def written(self, name: str, what: str) -> str:
        """Wait until the job has written mark ``name`` (created is not enough: a process
        id is written just after its file is made) and return its text."""
        mark = self.mark(name)
        text: str = wait_for(lambda: mark.exists() and mark.read_text().strip(), what)
        return text

    def cleanup(self) -> None:
        for handle in self.handles:
            if self.executor.poll(handle) is None:
                self.executor.cancel(handle)
                self.executor.wait(handle, 30)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    ray = needs.module("ray")
    options = {
        "num_cpus": 2,
        "num_gpus": 2,
        "object_store_memory": 150 * 1024 * 1024,
        "include_dashboard": False,
        "log_to_driver": False,
        "namespace": "shamal-executor-tests",
    }
    # Ray waits 30 s by default for its GCS to write its port file, a deadline a machine busy
    # with the rest of the suite can pass; a retry would leave the slow GCS running, so the
    # one start gets a longer wait instead (Ray's own operator override).
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")
    # Servers of other test files start Ray heads at the same time; the token they share is
    # made once, before any of them (as the Ray executor does before it starts a head).
    ensure_ray_token()
    # And this head keeps its session in a folder of its own: heads started together in the
    # shared /tmp/ray raced over its session links and log rotation (a GCS that never wrote
    # its port file, nor any log). The path stays short: Ray's sockets live under it.
    options["_temp_dir"] = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # nosec B108
    try:
        ray.init(**options)
    except RuntimeError:  # a GCS that never came up: one more head, in a fresh folder
        ray.shutdown()
        # The failed start's process handles go now, their "still running" warnings with them
        # (the GCS is Ray's to stop), not charged to whichever test the collector runs in.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
        options["_temp_dir"] = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # nosec B108
        ray.init(**options)
    yield
    ray.shutdown()


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.slow)])
def executor(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Executor]:
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
        built = get_executor("ray", start_timeout_s=30.0, node_tmpdir=str(tmp_path / "node"))
    else:
        built = get_executor("local")
    yield built
    built.close()


@pytest.fixture
def jobs(executor: Executor, tmp_path: Path) -> Iterator[Jobs]:
    helper = Jobs(executor, tmp_path)
    yield helper
    helper.cleanup()
