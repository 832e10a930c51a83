"""`shamal sim` through Typer's CliRunner: JSON keys, the plot, errors, teams."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from shamal.cli import app

runner = CliRunner()

KEYS = {
    "jobs_finished",
    "avg_jct_s",
    "p50_jct_s",
    "p99_jct_s",
    "avg_queue_s",
    "gpu_utilization",
    "makespan_s",
    "preemptions",
    "policy",
}


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    trace = tmp_path / "jobs.csv"
    rows = ["job_id,submit_time_s,duration_s,queue_s,num_gpus,num_cpus,mem_mib,user,vc,status"]
    for i in range(40):
        rows.append(f"{i},{i * 30},{(i % 7 + 1) * 200},,{[1, 2, 4, 8, 16][i % 5]},,,,,Failed")
    trace.write_text("\n".join(rows) + "\n")
    machines = tmp_path / "machines.csv"
    machines.write_text(
        "machineId, number of GPUs, single GPU mem\nm0,8, 24GB\nm1,8, 24GB\nm2,2, 12GB\n"
    )
    return trace, machines


def test_json_has_the_metrics(files: tuple[Path, Path]) -> None:
    trace, machines = files
    result = runner.invoke(
        app, ["sim", "--trace", str(trace), "--machines", str(machines), "--json"]
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.output)
    assert set(metrics) >= KEYS
    assert metrics["jobs_finished"] == 40
    assert metrics["policy"] == "las"  # the default policy


@pytest.mark.parametrize("policy", ["fifo", "srtf-oracle", "backfill"])
def test_policy_and_preemption_cost_options(files: tuple[Path, Path], policy: str) -> None:
    trace, machines = files
    result = runner.invoke(
        app,
        [
            "sim",
            "--trace",
            str(trace),
            "--machines",
            str(machines),
            "--policy",
            policy,
            "--preemption-cost",
            "10",
            "--limit",
            "30",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.output)
    assert metrics["policy"] == policy
    assert metrics["jobs"] == 30
    assert metrics["preemption_cost_s"] == 10


def test_plot_writes_a_png(files: tuple[Path, Path], tmp_path: Path) -> None:
    trace, machines = files
    plot = tmp_path / "out" / "timeline.png"
    result = runner.invoke(
        app,
        ["sim", "--trace", str(trace), "--machines", str(machines), "--plot", str(plot), "--json"],
    )
    assert result.exit_code == 0, result.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(result.output)["plot"] == str(plot)


def test_table_output(files: tuple[Path, Path]) -> None:
    trace, machines = files
    result = runner.invoke(app, ["sim", "--trace", str(trace), "--machines", str(machines)])
    assert result.exit_code == 0, result.output
    assert "average JCT" in result.output
    assert "GPU utilization" in result.output


def test_json_machine_list(files: tuple[Path, Path], tmp_path: Path) -> None:
    trace, _ = files
    machines = tmp_path / "machines.json"
    machines.write_text(
        json.dumps(
            {
                "nodes": [
                    {
                        "name": "big",
                        "gpus": 8,
                        "gpu_model": "H100",
                        "gpu_memory_mib": 81920,
                        "count": 2,
                    },
                    {"name": "small", "gpus": 2, "cpus": 16, "memory_mib": 65536},
                ]
            }
        )
    )
    result = runner.invoke(
        app, ["sim", "--trace", str(trace), "--machines", str(machines), "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["gpus"] == 18


def test_teams_mode(files: tuple[Path, Path], tmp_path: Path) -> None:
    trace, _ = files
    teams = tmp_path / "vc.csv"
    teams.write_text("vc,node num\nred,2\nblue,1\n")
    for extra in ([], ["--isolated"]):
        result = runner.invoke(
            app, ["sim", "--trace", str(trace), "--teams", str(teams), "--json", *extra]
        )
        assert result.exit_code == 0, result.output
        metrics = json.loads(result.output)
        assert set(metrics["teams"]) == {"red", "blue"}
        assert metrics["gpus"] == 24


def test_errors_are_one_line_with_a_hint(files: tuple[Path, Path], tmp_path: Path) -> None:
    trace, machines = files
    result = runner.invoke(app, ["sim", "--machines", str(machines)])
    assert result.exit_code == 1
    assert "--trace is required" in result.output
    result = runner.invoke(
        app, ["sim", "--trace", str(trace), "--machines", str(machines), "--policy", "nope"]
    )
    assert result.exit_code == 1
    assert "unknown policy" in result.output
    assert "las" in result.output
    no_durations = tmp_path / "gavel.csv"
    no_durations.write_text("job_id,submit_time_s,duration_s,num_gpus\n0,0,,1\n")
    result = runner.invoke(app, ["sim", "--trace", str(no_durations), "--machines", str(machines)])
    assert result.exit_code == 1
    assert "duration" in result.output
    result = runner.invoke(
        app, ["sim", "--trace", str(tmp_path / "missing.csv"), "--machines", str(machines)]
    )
    assert result.exit_code == 1
    assert "cannot read trace" in result.output


def test_pack_is_registered() -> None:
    result = runner.invoke(app, ["sim", "pack", "--help"])
    assert result.exit_code == 0, result.output
    assert "--nodes" in result.output


def test_a_cpu_only_cluster_reports_null_gpu_utilization(tmp_path: Path) -> None:
    trace = tmp_path / "cpu-jobs.csv"
    trace.write_text(
        "job_id,submit_time_s,duration_s,num_gpus,num_cpus\n0,0,100,0,4\n1,5,100,0,4\n"
    )
    machines = tmp_path / "cpu.csv"
    machines.write_text("name,gpus,cpus,memory_mib\nc0,0,16,65536\n")
    args = ["sim", "--trace", str(trace), "--machines", str(machines)]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.output)
    assert metrics["jobs_finished"] == 2
    assert metrics["gpu_utilization"] is None
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "n/a (no GPUs)" in result.output


def test_machine_lists_that_are_not_are_refused(files: tuple[Path, Path], tmp_path: Path) -> None:
    trace, _ = files
    teams = tmp_path / "vc_nodes.csv"
    teams.write_text("vc,node num\nred,2\n")
    for wrong, says in ((teams, "give it as --teams"), (trace, "give it as --trace")):
        result = runner.invoke(
            app, ["sim", "--trace", str(trace), "--machines", str(wrong), "--json"]
        )
        assert result.exit_code == 1
        said = " ".join(result.output.split())  # the console wraps long lines
        assert "is not a machine list" in said
        assert says in said
        assert "Traceback" not in said
    negative = tmp_path / "negative.csv"
    negative.write_text("machineId, number of GPUs, single GPU mem\nm0,-2, 12GB\n")
    result = runner.invoke(app, ["sim", "--trace", str(trace), "--machines", str(negative)])
    assert result.exit_code == 1
    assert f"{negative}, row 2, column 'number of GPUs'" in " ".join(result.output.split())


def test_a_trace_none_of_whose_jobs_fits_fails(files: tuple[Path, Path], tmp_path: Path) -> None:
    trace, _ = files
    cpu_only = tmp_path / "cpu.csv"
    cpu_only.write_text("name,gpus,cpus\nc0,0,16\n")
    result = runner.invoke(
        app, ["sim", "--trace", str(trace), "--machines", str(cpu_only), "--json"]
    )
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert "none of the 40 jobs" in said
    assert "the smallest asks for 1 GPU(s); the largest machine has 0 GPU(s)" in said


def run_with_plot(files: tuple[Path, Path], plot: Path, *extra: str) -> Result:
    trace, machines = files
    return runner.invoke(
        app,
        ["sim", "--trace", str(trace), "--machines", str(machines), "--plot", str(plot), *extra],
    )


def test_a_plot_path_that_cannot_be_drawn_is_refused_before_simulating(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    result = run_with_plot(files, tmp_path, "--json")
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert f"--plot {tmp_path} is a folder" in said
    assert "{" not in said  # refused before the simulation: no metrics
    assert not tmp_path.with_name(tmp_path.name + ".png").exists()
    result = run_with_plot(files, tmp_path / "x.txt", "--json")
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert "cannot draw a .txt file; use .png, .svg, .pdf" in said
    assert "{" not in said
    assert "Traceback" not in said


def test_the_plot_written_is_the_path_reported(files: tuple[Path, Path], tmp_path: Path) -> None:
    result = run_with_plot(files, tmp_path / "timeline", "--json")
    assert result.exit_code == 0, result.output
    written = tmp_path / "timeline.png"
    assert json.loads(result.output)["plot"] == str(written)
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = run_with_plot(files, tmp_path / "t.svg")
    assert result.exit_code == 0, result.output
    assert f"plot written to {tmp_path / 't.svg'}" in " ".join(result.output.split())
    assert b"<svg" in (tmp_path / "t.svg").read_bytes()[:500]
    result = run_with_plot(files, tmp_path / "deeper" / "t.PDF", "--json")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "deeper" / "t.PDF").read_bytes()[:5] == b"%PDF-"


def _refused(result: Result, message: str, exit_code: int = 1) -> None:
    assert result.exit_code == exit_code, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_hostile_sim_inputs_are_one_clean_error(files: tuple[Path, Path], tmp_path: Path) -> None:
    trace, machines = files
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00job_id")
    run = ["sim", "--trace", str(binary), "--machines", str(machines)]
    _refused(runner.invoke(app, run), "binary.csv: not a text file (expected a trace CSV)")
    huge = tmp_path / "huge.csv"
    huge.write_text("name,gpus\nm1,99999999999999\n")  # was expanded GPU by GPU: out of memory
    run = ["sim", "--trace", str(trace), "--machines", str(huge)]
    _refused(runner.invoke(app, run), "column 'gpus': more than 1,024: '99999999999999'")
    many = tmp_path / "many.csv"
    many.write_text("name,gpus,count\nm1,8,99999999999999\n")
    run = ["sim", "--trace", str(trace), "--machines", str(many)]
    _refused(runner.invoke(app, run), "column 'count': more than 100,000")
    run = ["sim", "--trace", str(trace), "--machines", str(machines)]
    _refused(runner.invoke(app, [*run, "--policy", "[red]x:x:"]), "unknown policy '[red]x:x:'")
    _refused(runner.invoke(app, [*run, "--preemption-cost", "inf"]), "--preemption-cost", 2)
