"""Races on SQLite and PostgreSQL: version numbering, alias moves, deletes beside writes.

Threads (and processes) start together on a barrier; nothing waits on a sleep.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest

from shamal.errors import AlreadyExists, NotFound
from shamal.registry import RegistryService
from shamal.server import Platform
from tests.registry import workers
from tests.registry.conftest import People

T = TypeVar("T")
SRC = "mlflow-artifacts:/models/m"


def _together(count: int, job: Callable[[int, threading.Barrier], T]) -> list[T]:
    """Run ``job(i, barrier)`` in ``count`` threads that pass the barrier together."""
    barrier = threading.Barrier(count)
    with ThreadPoolExecutor(max_workers=count) as pool:
        futures = [pool.submit(job, i, barrier) for i in range(count)]
        return [f.result(timeout=240) for f in futures]


def test_eight_threads_register_versions_unique_and_gapless(
    registry: RegistryService, people: People, platform: Platform
) -> None:
    registry.create_registered_model(people.ctx("mo"), "raced")
    per_thread = 5

    def job(i: int, barrier: threading.Barrier) -> list[int]:
        barrier.wait(timeout=60)
        return [
            registry.create_model_version(people.ctx("mo"), "raced", f"{SRC}/{i}/{n}").version
            for n in range(per_thread)
        ]

    results = _together(8, job)
    numbers = sorted(n for made in results for n in made)
    assert numbers == list(range(1, 8 * per_thread + 1))
    for made in results:
        assert made == sorted(made)  # each caller sees its own numbers increase
    stored = registry.search_model_versions(people.principals["mo"], filter_string="name='raced'")
    assert sorted(v.version for v in stored.items) == numbers
    assert platform.audit.verify().ok


@pytest.mark.slow
def test_four_processes_register_versions_unique_and_gapless(
    registry: RegistryService, people: People, platform: Platform
) -> None:
    registry.create_registered_model(people.ctx("mo"), "raced")
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(4)
    results: multiprocessing.Queue[list[int] | str] = spawn.Queue()
    key_file = str(platform.settings.keys_dir / "audit.key")
    args = (platform.settings.resolved_database_url, key_file, people.secrets["mo"], "raced", 6)
    procs = [
        spawn.Process(target=workers.create_versions, args=(*args, barrier, results))
        for _ in range(4)
    ]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=240) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    assert all(isinstance(o, list) for o in outcomes), outcomes
    numbers = sorted(n for o in outcomes for n in o)
    assert numbers == list(range(1, 25))
    assert platform.audit.verify().ok


def test_concurrent_alias_moves_end_on_a_written_value(
    registry: RegistryService, people: People
) -> None:
    registry.create_registered_model(people.ctx("mo"), "m")
    for _ in range(8):
        registry.create_model_version(people.ctx("mo"), "m", SRC)
    registry.set_registered_model_alias(people.ctx("mo"), "m", "prod", 1)
    mo = people.principals["mo"]
    seen: list[int] = []
    problems: list[str] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            version = registry.get_model_version_by_alias(mo, "m", "prod")
            if "prod" not in version.aliases:
                problems.append(f"alias resolved to {version.version}, which does not carry it")
            seen.append(version.version)

    def mover(i: int, barrier: threading.Barrier) -> int:
        barrier.wait(timeout=60)
        target = i + 1
        for _ in range(5):
            registry.set_registered_model_alias(people.ctx("mo"), "m", "prod", target)
        return target

    watcher = threading.Thread(target=reader)
    watcher.start()
    try:
        written = _together(8, mover)
    finally:
        done.set()
        watcher.join(timeout=60)
    final = registry.get_model_version_by_alias(mo, "m", "prod").version
    assert problems == []
    assert seen
    assert final in written
    assert set(seen) <= set(range(1, 9))
    model = registry.get_registered_model(mo, "m")
    assert [(a.alias, a.version) for a in model.aliases] == [("prod", final)]


def test_alias_moves_racing_version_deletes_never_dangle(
    registry: RegistryService, people: People
) -> None:
    registry.create_registered_model(people.ctx("mo"), "m")
    for _ in range(8):
        registry.create_model_version(people.ctx("mo"), "m", SRC)

    def job(i: int, barrier: threading.Barrier) -> str:
        barrier.wait(timeout=60)
        version = i // 2 + 1  # two threads per version: one points the alias, one deletes it
        try:
            if i % 2:
                registry.delete_model_version(people.ctx("rita"), "m", version)
                return "deleted"
            registry.set_registered_model_alias(people.ctx("mo"), "m", f"a{version}", version)
        except NotFound:
            return "not found"
        return "set"

    outcomes = _together(8, job)
    assert set(outcomes) <= {"deleted", "set", "not found"}
    assert outcomes[1::2] == ["deleted"] * 4
    mo = people.principals["mo"]
    model = registry.get_registered_model(mo, "m")
    assert model.aliases == ()  # every alias pointed at a version that is gone now
    remaining = registry.search_model_versions(mo, filter_string="name = 'm'")
    assert sorted(v.version for v in remaining.items) == [5, 6, 7, 8]


def test_parallel_creates_of_one_name_make_one_model(
    registry: RegistryService, people: People
) -> None:
    def job(_i: int, barrier: threading.Barrier) -> str:
        barrier.wait(timeout=60)
        try:
            registry.create_registered_model(people.ctx("otto"), "one")
        except AlreadyExists:
            return "exists"
        return "created"

    outcomes = _together(8, job)
    assert sorted(outcomes) == ["created"] + ["exists"] * 7
