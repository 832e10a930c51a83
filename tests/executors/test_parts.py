"""The executors' pure parts: outcomes, environments, log framing, process identity,
Ray bundle shapes, and the value types' JSON round trips."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shamal.errors import InvalidParameter
from shamal.executors import (
    REQUEUE_EXIT_CODE,
    ExitReason,
    ExitStatus,
    Handle,
    LaunchFailed,
    LaunchSpec,
    _procfs,
)
from shamal.executors._env import (
    clean_environment,
    compose_environment,
    gang_layout,
    interpreter_first_on_path,
    platform_variables,
    slot_visible_devices,
    worker_environment,
)
from shamal.executors._logs import MAX_LINE, LineFramer
from shamal.executors._outcome import StopCause, decide_outcome, stronger
from shamal.executors._procfs import (
    ProcessIdentity,
    atomic_write_json,
    ephemeral_ports,
    free_port,
    kill_group_of,
    read_json,
)
from shamal.executors._ray import bundle_for, strategy_for
from shamal.scheduler.core._resources import Placement, Slot
from tests.executors.conftest import python

# ---------------------------------------------------------------- outcomes


@pytest.mark.parametrize(
    ("codes", "cause", "culprit", "reason", "requeue"),
    [
        ((0, 0), None, None, ExitReason.SUCCEEDED, False),
        ((0, 3), StopCause.GANG, 1, ExitReason.FAILED, False),
        ((-15, REQUEUE_EXIT_CODE), StopCause.GANG, 1, ExitReason.FAILED, True),
        ((REQUEUE_EXIT_CODE,), StopCause.PREEMPT, None, ExitReason.PREEMPTED, True),
        ((-9,), StopCause.PREEMPT, None, ExitReason.PREEMPTED, True),
        ((0,), StopCause.PREEMPT, None, ExitReason.SUCCEEDED, False),
        ((REQUEUE_EXIT_CODE,), StopCause.TIMEOUT, None, ExitReason.TIMEOUT, False),
        ((0,), StopCause.CANCEL, None, ExitReason.KILLED, False),
        ((REQUEUE_EXIT_CODE,), StopCause.CANCEL, None, ExitReason.KILLED, False),
    ],
)
def test_outcome_rules(
    codes: tuple[int, ...],
    cause: StopCause | None,
    culprit: int | None,
    reason: ExitReason,
    requeue: bool,
) -> None:
    status = decide_outcome(codes, cause, culprit)
    assert (status.reason, status.requeue) == (reason, requeue)
    assert status.exit_codes == codes


def test_failed_outcome_names_the_culprit_code() -> None:
    status = decide_outcome((-15, 7, 2), None, 1)
    assert status.exit_code == 7
    assert "rank 1" in status.detail
    assert decide_outcome((0, 4), None, None).culprit_rank == 1  # first non-zero


def test_stronger_causes_win() -> None:
    assert stronger(None, StopCause.GANG)
    assert stronger(StopCause.GANG, StopCause.PREEMPT)
    assert stronger(StopCause.PREEMPT, StopCause.CANCEL)
    assert not stronger(StopCause.CANCEL, StopCause.PREEMPT)
    assert not stronger(StopCause.TIMEOUT, StopCause.TIMEOUT)


def test_exit_status_round_trip_and_refusal() -> None:
    status = ExitStatus(ExitReason.FAILED, (0, None, -9), True, 2, "why")
    assert ExitStatus.from_dict(status.to_dict()) == status
    with pytest.raises(ValueError, match="malformed"):
        ExitStatus.from_dict({"reason": "failed"})
    with pytest.raises(ValueError, match="is not a valid"):
        ExitStatus.from_dict({**status.to_dict(), "reason": "exploded"})


def test_handle_round_trip() -> None:
    handle = Handle("local", "job-1", 2, Path("/logs/a.log"), {"k": [1, "x"]})
    assert Handle.from_json(handle.to_json()) == handle
    for bad in ("[]", '{"executor": "local"}', '{"executor":"l","job_id":"j","attempt":"x",'):
        with pytest.raises(InvalidParameter):
            Handle.from_json(bad)


def test_launch_spec_validation(tmp_path: Path) -> None:
    ok = LaunchSpec(
        job_id="j",
        attempt=0,
        command=python("pass"),
        workdir=tmp_path,
        env={},
        placement=Placement((Slot("n", 1, 1),)),
        log_path=tmp_path / "a.log",
    )
    assert ok.world_size == 1
    changes: list[dict[str, Any]] = [
        {"job_id": "a/b"},
        {"attempt": -1},
        {"command": ()},
        {"placement": Placement(())},
        {"time_limit_s": 0.0},
        {"grace_s": -1.0},
    ]
    for change in changes:
        with pytest.raises(InvalidParameter):
            dataclasses.replace(ok, **change)


# ---------------------------------------------------------------- environment


def test_clean_environment_keeps_only_the_allow_list() -> None:
    source = {"PATH": "/bin", "HOME": "/h", "SHAMAL_ADMIN_TOKEN": "x", "AWS_SECRET": "y"}
    assert clean_environment(source, ("PATH", "HOME", "LANG")) == {"PATH": "/bin", "HOME": "/h"}


def test_the_python_running_shamal_comes_first_on_a_workers_path() -> None:
    # `make run` starts .venv/bin/shamal without activating .venv; workers inherit PATH.
    system = os.pathsep.join(["/usr/local/bin", "/usr/bin"])
    first = interpreter_first_on_path(system, prefix="/repo/.venv", base_prefix="/usr")
    assert first.split(os.pathsep) == ["/repo/.venv/bin", "/usr/local/bin", "/usr/bin"]
    activated = os.pathsep.join(["/usr/bin", "/repo/.venv/bin"])
    assert interpreter_first_on_path(activated, prefix="/repo/.venv", base_prefix="/usr") == (
        activated
    )
    assert interpreter_first_on_path(system, prefix="/usr", base_prefix="/usr") == system
    assert interpreter_first_on_path("", prefix="/repo/.venv", base_prefix="/usr") == (
        "/repo/.venv/bin"
    )


def test_a_worker_starts_with_this_installs_python_and_the_server_keeps_its_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    source = {"PATH": "/usr/bin", "HOME": "/h", "SHAMAL_ADMIN_TOKEN": "x"}
    env = worker_environment(source, ("PATH", "HOME"))
    assert env == {
        "PATH": os.pathsep.join([str(tmp_path / "venv" / "bin"), "/usr/bin"]),
        "HOME": "/h",
    }
    assert source["PATH"] == "/usr/bin"  # the server's own environment is left alone
    assert worker_environment({"HOME": "/h"}, ("PATH", "HOME")) == {"HOME": "/h"}


def test_platform_variables_win_over_the_jobs() -> None:
    env = compose_environment(
        {"PATH": "/bin"},
        {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "PYTHONUNBUFFERED": "0", "MINE": "1"},
        {"CUDA_VISIBLE_DEVICES": "2"},
    )
    assert env == {
        "PATH": "/bin",
        "PYTHONUNBUFFERED": "0",
        "MINE": "1",
        "CUDA_VISIBLE_DEVICES": "2",
    }


def test_gang_layout_counts_per_node() -> None:
    assert gang_layout(["a", "b", "a", "a"]) == [(0, 3), (0, 1), (1, 3), (2, 3)]


def test_platform_variables_for_a_gang_member() -> None:
    env = platform_variables(
        "j", 3, rank=2, world_size=4, layout=(1, 2), master=("10.0.0.5", 29500), gpu_milli=500
    )
    assert env["RANK"] == "2"
    assert env["WORLD_SIZE"] == "4"
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("1", "2")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.5", "29500")
    assert env["SHAMAL_ATTEMPT"] == "3"
    assert env["SHAMAL_GPU_FRACTION"] == "0.5"
    with pytest.raises(ValueError, match="master"):
        platform_variables("j", 0, rank=0, world_size=2, layout=(0, 2), master=None)


def test_mig_without_nvml_falls_back_to_the_index() -> None:
    mig = Slot("n", 0, 0, gpus=(4,), mig_profile="1g.10gb", mig_start=1)
    assert slot_visible_devices(mig, None, lambda g, s, p: None) == "4"
    assert slot_visible_devices(mig, None, None) == "4"
    with pytest.raises(LaunchFailed):
        slot_visible_devices(mig, None, _raise_lookup)


def _raise_lookup(gpu: int, start: int, profile: str) -> str:
    raise LookupError("absent")


# ---------------------------------------------------------------- log framing


def test_framer_emits_whole_prefixed_lines() -> None:
    framer = LineFramer(b"[rank 1] ")
    assert framer.feed(b"par") == b""
    assert framer.feed(b"tial\nnext\nhalf") == b"[rank 1] partial\n[rank 1] next\n"
    assert framer.feed(b"\n\n") == b"[rank 1] half\n[rank 1] \n"
    assert framer.feed(b"tail") == b""
    assert framer.flush() == b"[rank 1] tail\n"
    assert framer.flush() == b""


def test_framer_cuts_endless_lines() -> None:
    framer = LineFramer()
    out = framer.feed(b"x" * (MAX_LINE + 10))
    assert out == b"x" * MAX_LINE + b"\n"
    assert framer.flush() == b"x" * 10 + b"\n"


@pytest.mark.parametrize("read", [1000, 65536, 200_000])
def test_a_long_line_is_cut_the_same_whatever_the_reads(read: int) -> None:
    """A line over MAX_LINE is cut at the same places whether it arrives in one read with
    its newline or in many: the job page's log never depends on the pipe's timing."""
    stream = b"a" * (MAX_LINE + 5000) + b"\nshort\n" + b"b" * (2 * MAX_LINE) + b"\n"
    framer = LineFramer()
    out = b"".join(framer.feed(stream[i : i + read]) for i in range(0, len(stream), read))
    out += framer.flush()
    assert out.split(b"\n")[:-1] == [
        b"a" * MAX_LINE,
        b"a" * 5000,
        b"short",
        b"b" * MAX_LINE,
        b"b" * MAX_LINE,
    ]


def test_a_line_cut_exactly_at_the_limit_is_not_followed_by_an_empty_one() -> None:
    framer = LineFramer()
    assert framer.feed(b"c" * MAX_LINE) == b"c" * MAX_LINE + b"\n"
    assert framer.feed(b"\nnext\n") == b"next\n"
    assert framer.feed(b"\n") == b"\n"  # a real empty line stays


# ---------------------------------------------------------------- process identity


def test_identity_of_a_live_and_a_finished_process() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    identity = ProcessIdentity.of(proc.pid)
    assert identity is not None
    assert identity.is_alive()
    impostor = ProcessIdentity(proc.pid, identity.start_ticks + 1, identity.boot)
    assert not impostor.is_alive()  # same pid, another start time: a reused pid
    other_boot = ProcessIdentity(proc.pid, identity.start_ticks, "another-boot")
    assert not other_boot.is_alive()
    assert not kill_group_of(impostor, signal.SIGKILL)  # never signals a reused pid
    assert ProcessIdentity.from_dict(identity.to_dict()) == identity
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait()
    assert not identity.is_alive()


def test_identity_of_no_process() -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())  # pids stay below it
    assert ProcessIdentity.of(pid_max) is None


def test_atomic_json_files(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    assert read_json(path) is None
    atomic_write_json(path, {"a": 1})
    atomic_write_json(path, {"a": 2})
    assert read_json(path) == {"a": 2}
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temp files left
    path.write_text("[1, 2]")
    assert read_json(path) is None  # not an object


# ---------------------------------------------------------------- ports


def _bind(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    return sock


def test_a_master_port_is_chosen_below_the_kernels_ephemeral_range() -> None:
    # Outgoing connections take ports from that range at any moment: a MASTER_PORT picked
    # from it was taken between the choice and rank 0's bind (EADDRINUSE in a Ray gang).
    low, high = ephemeral_ports()
    assert 1024 <= low < high <= 65535
    ports = {free_port() for _ in range(20)}
    assert all(20_000 <= port < low for port in ports), ports
    assert len(ports) > 1  # chosen at random, not one fixed port
    with _bind(ports.pop()):
        pass  # and free


def test_a_taken_port_is_never_chosen_and_a_full_window_falls_back_to_the_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: list[socket.socket] = []
    try:
        # A window of 64 ports below the real ephemeral range, every one of them bound here.
        start = 20_000
        while len(taken) < 64:
            try:
                taken.append(_bind(start + len(taken)))
            except OSError:  # in use by something else: start the window after it
                for sock in taken:
                    sock.close()
                start, taken = start + len(taken) + 1, []
        window = range(start, start + 64)
        ranges = tmp_path / "ip_local_port_range"
        ranges.write_text(f"{window.stop}\t60999\n")
        monkeypatch.setattr(_procfs, "_EPHEMERAL_RANGE", ranges)
        monkeypatch.setattr(_procfs, "_LOWEST_CHOSEN_PORT", window.start)
        assert ephemeral_ports() == (window.stop, 60999)
        port = free_port()
        assert port not in window
        with _bind(port):
            pass
    finally:
        for sock in taken:
            sock.close()


def test_without_the_kernels_range_linuxs_default_is_assumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_procfs, "_EPHEMERAL_RANGE", tmp_path / "missing")
    assert ephemeral_ports() == (32_768, 60_999)
    (tmp_path / "garbled").write_text("not ports")
    monkeypatch.setattr(_procfs, "_EPHEMERAL_RANGE", tmp_path / "garbled")
    assert ephemeral_ports() == (32_768, 60_999)


# ---------------------------------------------------------------- ray shapes


def test_ray_bundles_follow_the_slots() -> None:
    assert bundle_for(Slot("n", 1500, 256)) == {"CPU": 1.5, "memory": 256.0 * 1024 * 1024}
    assert bundle_for(Slot("n", 1000, 0, gpus=(0, 1)))["GPU"] == 2.0
    assert bundle_for(Slot("n", 1000, 0, gpus=(0,), gpu_milli=250))["GPU"] == 0.25
    mig = bundle_for(Slot("n", 1000, 0, gpus=(0,), mig_profile="3g.40gb"))
    assert mig["GPU"] == pytest.approx(3 / 7, abs=1e-3)
    assert bundle_for(Slot("n", 0, 0)) == {"CPU": 0.001}


def test_ray_strategy_follows_the_placement_shape() -> None:
    one_node = Placement((Slot("a", 1, 1), Slot("a", 1, 1)))
    two_nodes = Placement((Slot("a", 1, 1), Slot("b", 1, 1)))
    assert strategy_for(one_node) == "STRICT_PACK"
    assert strategy_for(two_nodes) == "PACK"
