"""ExecutorSet: real executors behind one, each call routed to the executor that owns it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from shamal.errors import InvalidParameter
from shamal.executors import ExecutorSet, ExitReason, Handle, check_executor
from shamal.executors._local import LocalExecutor
from shamal.executors._ray import RayExecutor
from tests.executors.conftest import Jobs, python

WAIT_FOR_RELEASE = """
    import os, pathlib, time
    marks = pathlib.Path(os.environ["MARK_DIR"])
    (marks / ("started-" + os.environ["SHAMAL_JOB_ID"])).write_text("yes")
    while not (marks / "release").exists():
        time.sleep(0.02)
"""


def test_check_executor_says_what_the_server_runs_and_how_to_add_one() -> None:
    check_executor(None, ("local",))
    check_executor("ray", ("local", "ray"))
    with pytest.raises(InvalidParameter) as refused:
        check_executor("ray", ("local",))
    message = refused.value.message
    assert "'local'" in message
    assert """SHAMAL_SCHEDULER__EXECUTORS='["ray"]'""" in message


def test_members_need_names_of_their_own() -> None:
    with pytest.raises(InvalidParameter, match="twice"):
        ExecutorSet(LocalExecutor(), LocalExecutor())


def test_a_set_launches_on_its_default_and_refuses_an_executor_it_does_not_run(
    tmp_path: Path,
) -> None:
    routed = ExecutorSet(LocalExecutor())
    assert (routed.name, routed.names) == ("local", ("local",))
    jobs = Jobs(routed, tmp_path)
    try:
        unnamed = jobs.launch(jobs.spec(python("print('ran')")))
        named = jobs.launch(replace(jobs.spec(python("print('ran')")), executor="local"))
        assert (unnamed.executor, named.executor) == ("local", "local")
        for handle in (unnamed, named):
            status = routed.wait(handle, 30)
            assert status is not None
            assert status.reason is ExitReason.SUCCEEDED
        elsewhere = replace(jobs.spec(python("print('ran')")), executor="ray")
        with pytest.raises(InvalidParameter, match="SHAMAL_SCHEDULER__EXECUTORS"):
            routed.launch(elsewhere)
        assert not elsewhere.log_path.parent.exists()  # nothing was started
    finally:
        jobs.cleanup()


def test_a_handle_stored_before_the_set_is_reattached_by_it(tmp_path: Path) -> None:
    # A server upgraded with a job running: the handle its single executor stored.
    before = Jobs(LocalExecutor(), tmp_path)
    try:
        stored = before.launch(before.spec(python(WAIT_FOR_RELEASE))).to_json()
        routed = ExecutorSet(LocalExecutor())
        handle = routed.reattach(stored)
        assert handle is not None
        assert handle.executor == "local"
        assert routed.poll(handle) is None
        routed.cancel(handle)
        status = routed.wait(handle, 30)
        assert status is not None
        assert status.reason is ExitReason.KILLED
    finally:
        before.cleanup()


def test_a_handle_naming_no_member_goes_to_the_default(tmp_path: Path) -> None:
    routed = ExecutorSet(LocalExecutor())
    ray_handle = Handle("ray", "j", 0, tmp_path / "x.log", {"namespace": "n", "actors": []})
    # The default judges it as it did alone: the local executor refuses another's handle.
    with pytest.raises(InvalidParameter, match="handle given to the local executor"):
        routed.reattach(ray_handle.to_json())
    with pytest.raises(InvalidParameter, match="not an executor handle"):
        routed.reattach('{"job_id": "j", "attempt": 0}')  # no executor named at all
    with pytest.raises(InvalidParameter):
        routed.reattach("{not json")


@pytest.fixture
def both(ray_cluster: None, tmp_path: Path) -> Iterator[tuple[ExecutorSet, RayExecutor]]:
    ray = RayExecutor(start_timeout_s=30.0, node_tmpdir=str(tmp_path / "node"))
    routed = ExecutorSet(LocalExecutor(), ray)
    yield routed, ray
    routed.close()


@pytest.mark.slow
def test_each_attempt_runs_on_the_executor_it_names_and_calls_follow_the_handle(
    both: tuple[ExecutorSet, RayExecutor], tmp_path: Path
) -> None:
    routed, ray = both
    assert routed.names == ("local", "ray")
    jobs = Jobs(routed, tmp_path)
    try:
        on_local = jobs.launch(jobs.spec(python(WAIT_FOR_RELEASE)))
        on_ray = jobs.launch(replace(jobs.spec(python(WAIT_FOR_RELEASE)), executor="ray"))
        assert (on_local.executor, on_ray.executor) == ("local", "ray")
        for handle in (on_local, on_ray):
            jobs.written(f"started-{handle.job_id}", f"job {handle.job_id} to start")
        # Only the Ray executor knows the Ray attempt: the set asked it, not the default.
        assert ray.poll(on_ray) is None
        with pytest.raises(InvalidParameter):
            LocalExecutor().poll(on_ray)
        # A set whose default is Ray (a restarted server configured the other way round)
        # reattaches each stored handle through its owner, and stops each through it.
        turned = ExecutorSet(
            RayExecutor(start_timeout_s=30.0, node_tmpdir=str(tmp_path / "node")), LocalExecutor()
        )
        found = [turned.reattach(h.to_json()) for h in (on_local, on_ray)]
        assert [h.executor if h else None for h in found] == ["local", "ray"]
        assert all(turned.poll(h) is None for h in found if h)
        turned.preempt(on_local, 1.0)
        turned.cancel(on_ray)
        ended = {h.executor: turned.wait(h, 60) for h in (on_local, on_ray)}
        assert {k: v.reason if v else None for k, v in ended.items()} == {
            "local": ExitReason.PREEMPTED,
            "ray": ExitReason.KILLED,
        }
        # Finished runs of both, through the first set again.
        done = [
            jobs.launch(jobs.spec(python("print('ran')"))),
            jobs.launch(replace(jobs.spec(python("print('ran')")), executor="ray")),
        ]
        statuses = [routed.wait(h, 60) for h in done]
        assert [s.reason if s else None for s in statuses] == [ExitReason.SUCCEEDED] * 2
        assert "ran" in done[1].log_path.read_text()
    finally:
        jobs.mark("release").write_text("")
        jobs.cleanup()
