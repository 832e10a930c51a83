"""What only the Ray executor needs: losing actors, and a launch that died half-way."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shamal.executors import Executor, ExitReason
from shamal.executors._local import LocalExecutor
from shamal.executors._procfs import ProcessIdentity
from shamal.executors._ray import RayExecutor, _names
from tests.executors.conftest import Jobs, cpu_slot, python
from tests.polling import wait_until

pytestmark = pytest.mark.slow

WRITE_PID_THEN_RUN = """
    import os, pathlib, time
    marks = pathlib.Path(os.environ["MARK_DIR"])
    with open(marks / "starts", "a") as fh:
        fh.write("started\\n")
    (marks / ("pid-" + os.environ.get("RANK", "0"))).write_text(str(os.getpid()))
    while not (marks / "release").exists():
        time.sleep(0.02)
"""


@pytest.fixture
def ray_jobs(ray_cluster: None, tmp_path: Path) -> Iterator[Jobs]:
    helper = Jobs(RayExecutor(start_timeout_s=30.0, node_tmpdir=str(tmp_path / "node")), tmp_path)
    yield helper
    helper.cleanup()


def test_executors_satisfy_the_protocol() -> None:
    built: list[Executor] = [LocalExecutor(), RayExecutor()]  # checked by mypy
    assert [e.name for e in built] == ["local", "ray"]


def test_a_vanished_actor_makes_the_job_lost_and_stops_its_peers(ray_jobs: Jobs) -> None:
    import ray

    spec = ray_jobs.spec(python(WRITE_PID_THEN_RUN), slots=(cpu_slot(), cpu_slot()))
    handle = ray_jobs.launch(spec)
    survivor = ProcessIdentity.of(int(ray_jobs.written("pid-0", "rank 0 to start")))
    ray_jobs.written("pid-1", "rank 1 to start")
    assert survivor is not None
    namespace, names, _ = _names(spec.job_id, spec.attempt, 2)
    ray.kill(ray.get_actor(names[1], namespace=namespace))  # its node "died"

    restarted = RayExecutor()
    assert restarted.reattach(handle.to_json()) is None
    status = restarted.poll(handle)
    assert status is not None
    assert status.reason is ExitReason.LOST
    wait_until(lambda: not survivor.is_alive(), "rank 0's process to be stopped")


def test_a_half_done_launch_is_cleared_and_run_once(ray_jobs: Jobs) -> None:
    executor = ray_jobs.executor
    assert isinstance(executor, RayExecutor)
    spec = ray_jobs.spec(python(WRITE_PID_THEN_RUN))
    namespace, names, pg_name = _names(spec.job_id, spec.attempt, 1)
    # What a server that died inside launch() leaves: a placement group and an actor
    # whose process never started.
    pg: Any = executor._placement_group(spec, pg_name)
    executor._create_actors(spec, namespace, names, pg)

    handle = ray_jobs.launch(spec)
    wait_until(ray_jobs.mark("pid-0").exists, "the job to start")
    assert executor.launch(spec) == handle  # now a real run: launching again is a no-op
    ray_jobs.mark("release").write_text("go")
    status = executor.wait(handle, 30)
    assert status is not None
    assert status.reason is ExitReason.SUCCEEDED
    assert ray_jobs.mark("starts").read_text() == "started\n"
