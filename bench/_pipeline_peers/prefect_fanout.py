"""The fan-out DAG in Prefect 3, run in Prefect's own venv: ``python prefect_fanout.py N WORKERS``.

One task makes a list of N items, N no-op tasks are mapped over it, one task gathers their
results; the flow runs with Prefect's ``ProcessPoolTaskRunner`` (each task in a process of the
pool, ``WORKERS`` processes, Prefect's default being the machine's CPU count) against the
local Prefect API server the parent started (``prefect server start`` on loopback, SQLite in a
fresh ``PREFECT_HOME``; ``PREFECT_API_URL`` points at it; nothing leaves the machine). Without
it, Prefect's ephemeral mode starts a temporary server in this process and, as seen with
3.9.1, a second one in the pool's first worker process (spawned processes do not inherit the
first one's URL): about 12 s of server start-up inside the timed run.

A first, empty flow run warms the client before the clock starts (Shamal's server is also up
before its run is timed). Then ``wall_s`` is the time from calling the flow to its return, and
the ``flow`` entry's ``started_at`` the instant of that call. Per task, the API's records:
``started_at`` is the task run's ``start_time`` (its Running state, set in the pool process
just before the function runs) and ``finished_at`` its ``end_time``. Prints one JSON object
on its last line of stdout.
"""

from __future__ import annotations

import json
import sys
import time

from prefect import flow, task
from prefect.task_runners import ProcessPoolTaskRunner


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


def fanout_flow(workers: int):  # type: ignore[no-untyped-def]
    @flow(name="fanout", task_runner=ProcessPoolTaskRunner(max_workers=workers))
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
    warm_up()
    fanout = fanout_flow(workers)
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
                "steps": task_runs(state.state_details.flow_run_id, called_at),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
