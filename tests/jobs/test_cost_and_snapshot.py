"""Cost accounting (pure) and code snapshots (deterministic, .gitignore-aware, safe to unpack)."""

from __future__ import annotations

import os
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shamal.errors import InvalidParameter
from shamal.jobs import snapshot
from shamal.jobs._cost import report
from shamal.jobs._store import Attempt
from shamal.scheduler.core._resources import Pool

T0 = datetime(2026, 11, 1, tzinfo=UTC)
POOLS = {
    "gpu": Pool("gpu", {"cost_per_gpu_hour": "2.5", "cost_per_cpu_hour": "0.1"}),
    "cpu": Pool("cpu", {"cost_per_cpu_hour": "0.05", "cost_per_gib_hour": "0.01"}),
}


def _attempt(job: str, team: str, pool: str, start_h: float, hours: float, **res: int) -> Attempt:
    start = T0 + timedelta(hours=start_h)
    return Attempt(
        job_id=job,
        attempt=1,
        team=team,
        user="u",
        pool=pool,
        nodes=("n1",),
        cpu_milli=res.get("cpu", 1000),
        memory_mib=res.get("mem", 1024),
        gpu_milli=res.get("gpu", 0),
        started_at=start,
        ended_at=start + timedelta(hours=hours),
        outcome="succeeded",
        exit_code=0,
    )


def test_cost_by_team_prices_each_resource_by_its_pool() -> None:
    attempts = [
        _attempt("a", "vision", "gpu", 0, 2, gpu=2000, cpu=4000),  # 4 GPU-h, 8 CPU-h
        _attempt("b", "vision", "cpu", 0, 1, cpu=2000, mem=4096),  # 2 CPU-h, 4 GiB-h
        _attempt("c", "nlp", "gpu", 1, 1, gpu=250, cpu=1000),  # 0.25 GPU-h, 1 CPU-h
    ]
    lines = report(attempts, POOLS, by="team", since=T0, until=T0 + timedelta(days=1))
    assert [line.key for line in lines] == ["vision", "nlp"]
    vision, nlp = lines
    assert (vision.jobs, vision.attempts) == (2, 2)
    assert vision.gpu_seconds == pytest.approx(4 * 3600)
    assert vision.cpu_seconds == pytest.approx(10 * 3600)
    assert vision.memory_gib_seconds == pytest.approx(2 * 3600 + 4 * 3600)
    assert vision.cost == pytest.approx(4 * 2.5 + 8 * 0.1 + 2 * 0.05 + 4 * 0.01)
    assert nlp.cost == pytest.approx(0.25 * 2.5 + 1 * 0.1)


def test_cost_counts_only_the_part_inside_the_period_so_reports_add_up() -> None:
    attempts = [_attempt("a", "t", "gpu", 0, 10, gpu=1000)]
    cut = T0 + timedelta(hours=4)
    first = report(attempts, POOLS, by="job", since=T0, until=cut)
    second = report(attempts, POOLS, by="job", since=cut, until=T0 + timedelta(days=1))
    assert first[0].gpu_seconds == pytest.approx(4 * 3600)
    assert second[0].gpu_seconds == pytest.approx(6 * 3600)
    whole = report(attempts, POOLS, by="job", since=T0, until=T0 + timedelta(days=1))
    assert first[0].cost + second[0].cost == pytest.approx(whole[0].cost)
    assert report(attempts, POOLS, by="pool", since=T0 + timedelta(days=2), until=cut) == []
    with pytest.raises(InvalidParameter):
        report(attempts, POOLS, by="planet", since=T0, until=cut)


def _tree(root: Path) -> None:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "data").mkdir()
    (root / ".git").mkdir()
    (root / ".gitignore").write_text("data/\n*.log\n!keep.log\n")
    (root / "src" / ".gitignore").write_text("*.tmp\n")
    for name in ("train.py", "x.log", "keep.log", "data/big.csv", ".git/HEAD"):
        (root / name).write_text(name)
    for name in ("src/pkg/model.py", "src/pkg/cache.tmp", "src/notes.tmp"):
        (root / name).write_text(name)
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    os.symlink("/etc/passwd", root / "link")


def test_snapshot_honours_gitignore_and_is_deterministic(tmp_path: Path) -> None:
    _tree(tmp_path / "a")
    built = snapshot.build(tmp_path / "a", tmp_path)
    with tarfile.open(built.path) as tar:
        names = tar.getnames()
        modes = {m.name: m.mode for m in tar.getmembers()}
    assert names == [
        ".gitignore",
        "keep.log",
        "run.sh",
        "src/.gitignore",
        "src/pkg/model.py",
        "train.py",
    ]
    assert (modes["run.sh"], modes["train.py"]) == (0o755, 0o644)
    _tree(tmp_path / "b")  # same content, other folder, other times: same bytes
    os.utime(tmp_path / "b" / "train.py", (1, 1))
    assert snapshot.build(tmp_path / "b", tmp_path).digest == built.digest
    (tmp_path / "b" / "train.py").write_text("changed")
    assert snapshot.build(tmp_path / "b", tmp_path).digest != built.digest
    out = tmp_path / "out"
    assert snapshot.extract(built.path, out) == len(names)
    assert (out / "src" / "pkg" / "model.py").read_text() == "src/pkg/model.py"


def test_extract_refuses_escapes_before_writing_anything(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        good = tarfile.TarInfo("ok.py")
        tar.addfile(good)
        bad = tarfile.TarInfo("../../outside.py")
        tar.addfile(bad)
    out = tmp_path / "out"
    with pytest.raises(snapshot.SnapshotError, match="outside the folder"):
        snapshot.extract(archive, out)
    assert list(out.iterdir()) == []
    assert not (tmp_path / "outside.py").exists()
    with pytest.raises(snapshot.SnapshotError, match="not a folder"):
        snapshot.build(tmp_path / "missing")


def _names(folder: Path, tmp_path: Path) -> list[str]:
    built = snapshot.build(folder, tmp_path)
    with tarfile.open(built.path) as tar:
        return tar.getnames()


def _repository(root: Path) -> None:
    """A repository whose ignore rules live above and beside the folder snapshotted."""
    (root / ".git" / "info").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".git" / "info" / "exclude").write_text("secret.txt\n")
    (root / ".gitignore").write_text("*.ckpt\n/top-only.txt\nbuild/\n")
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "sub" / "build").mkdir()
    (root / "sub" / ".gitignore").write_text("!important.ckpt\n")
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / ".gitignore").write_text("*.tmp\n")
    for name in (
        "top-only.txt",
        "secret.txt",
        "sub/model.ckpt",
        "sub/important.ckpt",
        "sub/train.py",
        "sub/secret.txt",
        "sub/top-only.txt",
        "sub/deeper/x.ckpt",
        "sub/deeper/keep.py",
        "sub/build/out.bin",
        "a/b/run.py",
        "a/b/scratch.tmp",
    ):
        (root / name).write_text(name)


def test_snapshot_honours_the_ignore_rules_of_the_enclosing_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _repository(repo)
    assert _names(repo / "sub", tmp_path) == [
        ".gitignore",
        "deeper/keep.py",
        "important.ckpt",  # re-included by sub/.gitignore, which overrides the root's
        "top-only.txt",  # the root's pattern is anchored to the root
        "train.py",
    ]
    assert _names(repo / "a" / "b", tmp_path) == ["run.py"]  # a/.gitignore reaches a/b
    whole = _names(repo, tmp_path)
    assert "sub/secret.txt" not in whole
    assert "secret.txt" not in whole
    assert "sub/model.ckpt" not in whole
    assert "sub/important.ckpt" in whole
    assert not [name for name in whole if name.startswith(".git/") or name == ".git"]
    # Content-addressed still: the same repository elsewhere gives the same bytes.
    _repository(tmp_path / "copy")
    assert (
        snapshot.build(tmp_path / "copy" / "sub", tmp_path).digest
        == snapshot.build(repo / "sub", tmp_path).digest
    )


def test_a_worktree_git_file_marks_the_root_and_is_never_packed(tmp_path: Path) -> None:
    repo = tmp_path / "worktree"
    (repo / "pkg").mkdir(parents=True)
    (repo / ".git").write_text("gitdir: /elsewhere/.git/worktrees/w\n")
    (repo / ".gitignore").write_text("*.log\n")
    (repo / "pkg" / "run.py").write_text("print()\n")
    (repo / "pkg" / "debug.log").write_text("noise\n")
    assert _names(repo / "pkg", tmp_path) == ["run.py"]
    assert _names(repo, tmp_path) == [".gitignore", "pkg/run.py"]
