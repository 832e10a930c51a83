"""The fan-out DAG in Dagster, run in Dagster's own venv: ``python dagster_fanout.py N WORKERS``.

One op makes N items as dynamic outputs (``DynamicOut``), a no-op op is mapped over them
(``.map``), one op gathers the results (``.collect``); the job runs on Dagster's
``multiprocess_executor`` (each step in a process of its own, started with its default
``spawn``; at most ``WORKERS`` at once, Dagster's default being the machine's CPU count) by
``execute_job`` on a ``DagsterInstance`` in ``DAGSTER_HOME`` (a fresh folder the parent makes:
SQLite storage; nothing leaves the machine).

``wall_s`` is the time from calling ``execute_job`` to its return. Per step, from the run's
event log: ``started_at`` is its ``STEP_START`` event (sent from the step's process as it
starts the op) and ``finished_at`` its ``STEP_SUCCESS`` (or ``STEP_FAILURE``). Prints one JSON
object on its last line of stdout.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from dagster import (
    DagsterInstance,
    DynamicOut,
    DynamicOutput,
    execute_job,
    job,
    multiprocess_executor,
    op,
    reconstructable,
)

WORKERS = int(os.environ.get("BENCH_PIPELINE_WORKERS", "2"))


@op(out=DynamicOut(int), config_schema={"n": int})
def items(context):  # type: ignore[no-untyped-def]  # a string annotation (future import) is refused
    for i in range(context.op_config["n"]):
        yield DynamicOutput(i, mapping_key=str(i))


@op
def noop(i: int) -> int:
    return i


@op
def gather(values: list[int]) -> int:
    return len(values)


@job(executor_def=multiprocess_executor.configured({"max_concurrent": WORKERS}))
def fanout() -> None:
    gather(items().map(noop).collect())


def steps(instance: DagsterInstance, run_id: str, run_start: float) -> list[dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event is None or event.step_key is None:
            continue
        step = found.setdefault(
            event.step_key, {"name": event.step_key.split("[")[0], "task": event.step_key}
        )
        kind = event.event_type_value
        if kind == "STEP_START":
            step["started_at"] = entry.timestamp
        elif kind in ("STEP_SUCCESS", "STEP_FAILURE"):
            step["finished_at"] = entry.timestamp
            step["state"] = kind
    return [{"name": "flow", "started_at": run_start}, *found.values()]


def main() -> int:
    n = int(sys.argv[1])
    instance = DagsterInstance.get()  # DAGSTER_HOME, set by the parent
    config = {"ops": {"items": {"config": {"n": n}}}}
    wall_start = time.time()
    started = time.perf_counter()
    with execute_job(reconstructable(fanout), instance=instance, run_config=config) as result:
        wall = time.perf_counter() - started
        value = result.output_for_node("gather") if result.success else None
    import dagster

    print(
        json.dumps(
            {
                "tool": "Dagster",
                "version": dagster.__version__,
                "wall_s": wall,
                "result": value,
                "state": "COMPLETED" if result.success else "FAILED",
                "workers": WORKERS,
                "steps": steps(instance, result.run_id, wall_start),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
