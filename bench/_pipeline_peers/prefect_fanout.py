"""The fan-out DAG in Prefect 3, run in Prefect's own venv:
``python prefect_fanout.py N WORKERS [per-task|pool]``.

One task makes a list of N items, N no-op tasks are mapped over it, one task gathers their
results; the flow runs on Prefect's ``ProcessPoolTaskRunner`` (at most ``WORKERS`` processes at
once, Prefect's default being the machine's CPU count), in one of two modes:

- ``per-task`` (the default; the issue's comparison, "each step in its own process as Shamal's
  are"): every task runs in a process of its own. Prefect 3 has no runner for that, so
  :class:`ProcessPerTaskRunner` is Prefect's own runner, unchanged, whose pool retires each
  worker process after one task (``max_tasks_per_child=1``, the standard library's option):
  a new process per task, at most ``WORKERS`` at once, with Prefect's own initialiser, message
  forwarding and state reporting.
- ``pool``: Prefect's runner as it comes, whose ``WORKERS`` processes run task after task;
  reported beside the comparison, as what a Prefect user gets by default.

Against the local Prefect API server the parent started (``prefect server start`` on loopback,
SQLite in a fresh ``PREFECT_HOME``; ``PREFECT_API_URL`` points at it; nothing leaves the
machine). Without it, Prefect's ephemeral mode starts a temporary server in this process and,
as seen with 3.9.1, a second one in the pool's first worker process (spawned processes do not
inherit the first one's URL): about 12 s of server start-up inside the timed run.

A first, empty flow run warms the client before the clock starts (Shamal's server is also up
before its run is timed). Then ``wall_s`` is the time from calling the flow to its return, and
the ``flow`` entry's ``started_at`` the instant of that call. Per task, the API's records:
``started_at`` is the task run's ``start_time`` (its Running state, set in the pool process
just before the function runs) and ``finished_at`` its ``end_time``. Prints one JSON object
on its last line of stdout.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from prefect import flow, task, task_runners
from prefect.task_runners import ProcessPoolTaskRunner

MODES = ("per-task", "pool")


class ProcessPerTaskRunner(ProcessPoolTaskRunner):  # type: ignore[misc]
    """Prefect's process pool runner whose worker processes each run one task and exit.

    Prefect builds its pool on entry; this swaps it, before any task is submitted, for the
    same pool (same spawn context, Prefect's worker initialiser and its arguments) with
    ``max_tasks_per_child=1``. Written against Prefect 3.9.1's runner (checked on import by
    the benchmark's pin)."""

    def __enter__(self) -> ProcessPerTaskRunner:
        super().__enter__()
        prefects = self._executor
        self._executor = ProcessPoolExecutor(
            max_workers=self._max_workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=task_runners._initialize_process_pool_worker,
            initargs=(
                self._subprocess_message_queue,
                getattr(self, "_initializer", None),
                getattr(self, "_initargs", ()),
            ),
            max_tasks_per_child=1,
        )
        if prefects is not None:
            prefects.shutdown(wait=True)  # never used: no task was submitted to it
        return self


@task
def items(n: int) -> list[int]:
    return list(range(n))


@task
def noop(i: int) -> int:
    return i


@task
def gather(values: list[int]) -> int:
    return len(values)


@flow
def warm_up() -> None:
    """Starts the ephemeral API server and its database; no tasks."""


def fanout_flow(workers: int, mode: str):  # type: ignore[no-untyped-def]
    runner: Any = (ProcessPerTaskRunner if mode == "per-task" else ProcessPoolTaskRunner)(
        max_workers=workers
    )

    @flow(name="fanout", task_runner=runner)
    def fanout(n: int) -> int:
        listed = items.submit(n)
        mapped = noop.map(listed)
        return gather.submit(mapped).result()

    return fanout


def task_runs(flow_run_id: object, called_at: float) -> list[dict[str, object]]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    runs: list[object] = []
    only = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
    with get_client(sync_client=True) as client:
        while page := client.read_task_runs(flow_run_filter=only, limit=200, offset=len(runs)):
            runs.extend(page)  # the API answers at most 200 at a time
    steps = [
        {  # type: ignore[attr-defined]
            "name": run.task_key.split("-")[0] if run.task_key else run.name,
            "task": run.name,
            "state": run.state_type.value if run.state_type else None,
            "started_at": run.start_time.timestamp() if run.start_time else None,
            "finished_at": run.end_time.timestamp() if run.end_time else None,
        }
        for run in runs
    ]
    return [{"name": "flow", "started_at": called_at}, *steps]


def main() -> int:
    n, workers = int(sys.argv[1]), int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else MODES[0]
    if mode not in MODES:
        raise SystemExit(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    warm_up()
    fanout = fanout_flow(workers, mode)
    called_at = time.time()
    started = time.perf_counter()
    state = fanout(n, return_state=True)
    wall = time.perf_counter() - started
    result = state.result()
    import prefect

    print(
        json.dumps(
            {
                "tool": "Prefect",
                "version": prefect.__version__,
                "wall_s": wall,
                "result": result,
                "state": state.type.value,
                "workers": workers,
                "mode": mode,
                "steps": task_runs(state.state_details.flow_run_id, called_at),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
