"""Machine lists for the simulator: what is a machine list, and bad values refused with
the file, the row (or machine) and the column."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shamal.scheduler.core.sim import TraceError, load_machines, load_trace, simulate
from shamal.scheduler.core.sim._trace import TraceJob

PHILLY_HEADER = "machineId, number of GPUs, single GPU mem"


def write(tmp_path: Path, text: str, name: str = "machines.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_shared_machine_lists_load_as_they_are(tmp_path: Path) -> None:
    philly = load_machines(write(tmp_path, f"{PHILLY_HEADER}\nm0,2, 12GB\nm1,8, 24GB\n"))
    assert philly.capacity().gpu_milli == 10_000
    alibaba = load_machines(
        write(
            tmp_path,
            "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,0,\nn1,64000,262144,2,P100\n",
        )
    )
    assert alibaba.capacity().gpu_milli == 2000
    assert alibaba.nodes["n0"].gpus == []


@pytest.mark.parametrize(
    ("row", "column", "problem"),
    [
        ("m0,-2, 12GB", "number of GPUs", "not a number >= 0: '-2'"),
        ("m0,two, 12GB", "number of GPUs", "not a number: 'two'"),
        ("m0,2.5, 12GB", "number of GPUs", "not a whole number: '2.5'"),
        ("m0,nan, 12GB", "number of GPUs", "not a number >= 0"),
        ("m0,, 12GB", "number of GPUs", "no GPU count"),
        ("m0,2, -12GB", "single GPU mem", "not a memory size >= 0"),
        ("m0,2, 12 parsecs", "single GPU mem", "unknown memory unit"),
    ],
)
def test_a_bad_value_names_the_file_row_and_column(
    tmp_path: Path, row: str, column: str, problem: str
) -> None:
    path = write(tmp_path, f"{PHILLY_HEADER}\nm1,2, 12GB\n{row}\n")
    with pytest.raises(TraceError) as refused:
        load_machines(path)
    assert str(refused.value).startswith(f"{path}, row 3, column {column!r}: ")
    assert problem in str(refused.value)


@pytest.mark.parametrize(
    ("extra", "value", "problem"),
    [
        ("cpus", "-4", "not a number >= 0"),
        ("cpu_milli", "lots", "not a number"),
        ("memory_mib", "-1", "not a memory size >= 0"),
        ("count", "0", "not a number >= 1"),
        ("count", "1.5", "not a whole number"),
    ],
)
def test_the_optional_columns_are_checked_too(
    tmp_path: Path, extra: str, value: str, problem: str
) -> None:
    path = write(tmp_path, f"name,gpus,{extra}\nn0,8,{value}\n")
    with pytest.raises(TraceError, match=rf"row 2, column '{extra}': {problem}"):
        load_machines(path)


def test_json_machines_are_checked_by_index_and_key(tmp_path: Path) -> None:
    path = write(
        tmp_path, json.dumps([{"name": "a", "gpus": 8}, {"name": "b", "gpus": -2}]), "m.json"
    )
    with pytest.raises(TraceError, match=r"m\.json, machine 1, column 'gpus': not a number >= 0"):
        load_machines(path)
    path = write(tmp_path, json.dumps({"nodes": [{"name": "a", "gpus": True}]}), "m.json")
    with pytest.raises(TraceError, match="not a number: True"):
        load_machines(path)
    path = write(tmp_path, json.dumps([{"name": "a", "gpus": 2, "colour": "red"}]), "m.json")
    with pytest.raises(TraceError, match="unexpected column.*'colour'"):
        load_machines(path)


def test_a_trace_or_a_team_file_is_not_taken_for_a_machine_list(tmp_path: Path) -> None:
    trace = write(
        tmp_path, "job_id,submit_time_s,duration_s,num_gpus\n0,0,100,2\n1,5,100,8\n", "jobs.csv"
    )
    with pytest.raises(TraceError) as refused:
        load_machines(trace)
    message = str(refused.value)
    assert "is not a machine list" in message
    assert "looks like a job trace: give it as --trace" in message
    assert "expected a GPU count column" in message
    teams = write(tmp_path, "vc,node num\nred,2\nblue,1\n", "vc.csv")
    with pytest.raises(TraceError, match="looks like a team file: give it as --teams"):
        load_machines(teams)
    no_gpus = write(tmp_path, "name,cpus\nc0,16\n")
    with pytest.raises(TraceError, match="no GPU count column"):
        load_machines(no_gpus)
    both = write(tmp_path, "name,gpus,gpu\nn0,2,2\n")
    with pytest.raises(TraceError, match="both give gpus"):
        load_machines(both)
    empty = write(tmp_path, "")
    with pytest.raises(TraceError, match="not a machine list"):
        load_machines(empty)
    header_only = write(tmp_path, f"{PHILLY_HEADER}\n")
    with pytest.raises(TraceError, match="no machines"):
        load_machines(header_only)
    twice = write(tmp_path, f"{PHILLY_HEADER}\nm0,2,12GB\nm0,2,12GB\n")
    with pytest.raises(TraceError, match="duplicate machine name 'm0'"):
        load_machines(twice)


def test_a_bad_trace_value_names_its_column(tmp_path: Path) -> None:
    path = write(tmp_path, "job_id,submit_time_s,duration_s,num_gpus\n0,0,abc,1\n", "t.csv")
    with pytest.raises(TraceError, match=r"t\.csv:2: column 'duration_s': not a number: 'abc'"):
        load_trace(path)
    path = write(tmp_path, "job_id,submit_time_s,duration_s,num_gpus\n0,0,inf,1\n", "t.csv")
    with pytest.raises(TraceError, match="not a finite number"):
        load_trace(path)


def test_a_cpu_only_cluster_simulates_with_no_gpu_utilization(tmp_path: Path) -> None:
    cluster = load_machines(write(tmp_path, "name,gpus,cpus,memory_mib\nc0,0,16,65536\n"))
    jobs = [
        TraceJob(id=f"j{i}", submit_s=5.0 * i, duration_s=100.0, gpus=0, cpus=4) for i in range(6)
    ]
    metrics = simulate(jobs, cluster, "fifo").metrics
    assert metrics["jobs_finished"] == 6
    assert metrics["gpus"] == 0
    assert metrics["gpu_utilization"] is None
    assert metrics["makespan_s"] > 0
