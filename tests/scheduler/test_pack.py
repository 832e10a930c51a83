"""The GPU-sharing packing experiment and its `shamal sim pack` command."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from shamal.cli.sim_pack import pack
from shamal.scheduler.core.sim import TraceError, load_nodes, load_pods, run_pack_experiment
from tests import needs

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces" / "alibaba_openb"


@pytest.fixture
def traces() -> Path:
    needs.path(TRACES / "openb_pod_list_default.csv", "the Alibaba openb traces")
    return TRACES


def _slice(source: Path, target: Path, *, every: int = 1, limit: int | None = None) -> Path:
    with source.open(newline="") as handle:
        rows = list(csv.reader(handle))
    body = rows[1::every][:limit]
    with target.open("w", newline="") as handle:
        csv.writer(handle).writerows([rows[0], *body])
    return target


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Every 12th node of the real node list (~100 nodes) and 1,500 real pods."""
    needs.path(TRACES / "openb_pod_list_default.csv", "the Alibaba openb traces")
    folder = tmp_path_factory.mktemp("openb")
    nodes = _slice(TRACES / "openb_node_list_gpu_node.csv", folder / "nodes.csv", every=12)
    pods = _slice(TRACES / "openb_pod_list_default.csv", folder / "pods.csv", limit=1500)
    return nodes, pods


def test_loads_the_real_lists(traces: Path) -> None:
    nodes = load_nodes(traces / "openb_node_list_gpu_node.csv")
    pods = load_pods(traces / "openb_pod_list_default.csv")
    assert sum(len(n.gpus) for n in nodes) == 6212
    assert len(pods) == 8152
    assert sum(1 for p in pods if p.gpu_milli) == 3078
    assert all(0 < p.gpu_milli < 1000 for p in pods if not p.gpus and p.gpu_milli)
    spec = load_pods(traces / "openb_pod_list_gpuspec33.csv")
    assert any(p.gpu_models for p in spec)


def test_experiment_reports_each_checkpoint(small_trace: tuple[Path, Path]) -> None:
    nodes, pods = small_trace
    result = run_pack_experiment(nodes, pods, demand=1.3, seeds=2, strategy="fgd-pack")
    ratios = result["alloc_ratio"]
    assert isinstance(ratios, dict)
    assert list(ratios) == ["0.9", "1.0", "1.3"]
    assert 0.8 < ratios["0.9"] <= ratios["1.0"] <= ratios["1.3"] <= 1
    per_seed = result["alloc_ratio_per_seed"]
    assert isinstance(per_seed, dict)
    assert len(per_seed["1.3"]) == 2
    again = run_pack_experiment(nodes, pods, demand=1.3, seeds=2, strategy="fgd-pack")
    assert again["alloc_ratio"] == ratios  # seeded: the same runs


def test_fragmentation_aware_packs_tighter_than_random(small_trace: tuple[Path, Path]) -> None:
    nodes, pods = small_trace
    ratio = {
        s: run_pack_experiment(nodes, pods, seeds=3, strategy=s)["alloc_ratio"]["1.3"]  # type: ignore[index]
        for s in ("random", "best-fit", "fgd-pack")
    }
    assert ratio["random"] < ratio["best-fit"] < ratio["fgd-pack"]


def test_progress_reaches_the_number_of_seeds(small_trace: tuple[Path, Path]) -> None:
    nodes, pods = small_trace
    seen: list[float] = []
    run_pack_experiment(
        nodes, pods, seeds=2, demand=0.5, progress=lambda done, total: seen.append(done / total)
    )
    assert seen == sorted(seen)
    assert seen[-1] == 1.0


def test_bad_lists_are_trace_errors(tmp_path: Path) -> None:
    missing = tmp_path / "missing.csv"
    with pytest.raises(TraceError, match="cannot read"):
        load_nodes(missing)
    no_column = tmp_path / "nodes.csv"
    no_column.write_text("sn,cpu_milli\nx,1000\n")
    with pytest.raises(TraceError, match="missing column"):
        load_nodes(no_column)
    bad_value = tmp_path / "pods.csv"
    bad_value.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np,lots,1,1,1000,\n")
    with pytest.raises(TraceError, match="not a number"):
        load_pods(bad_value)
    two_fractions = tmp_path / "frac.csv"
    two_fractions.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np,1,1,2,500,\n")
    with pytest.raises(TraceError, match="2 GPU"):
        load_pods(two_fractions)


# ------------------------------------------------------------------ the CLI


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """A stand-in for the `shamal sim` group."""

    app.command("pack")(pack)
    return app


def test_cli_prints_one_json_object(small_trace: tuple[Path, Path]) -> None:
    nodes, pods = small_trace
    args = ["pack", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1", "--json"]
    result = CliRunner().invoke(_app(), [*args, "--policy", "best-fit"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["alloc_ratio"]) == {"0.9", "1.0", "1.3"}
    assert report["strategy"] == "best-fit"
    assert report["unit"] == "ratio"
    assert all(0 < ratio <= 1 for ratio in report["alloc_ratio"].values())


def test_cli_table_by_default(small_trace: tuple[Path, Path]) -> None:
    nodes, pods = small_trace
    args = ["pack", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1", "--demand", "1"]
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 0, result.output
    assert "100%" in result.stdout
    assert "130%" not in result.stdout


def test_cli_errors_are_one_line_and_exit_1(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn,1000,1000,1,T4\n")
    runner = CliRunner()
    missing = runner.invoke(
        _app(), ["pack", "--nodes", str(nodes), "--pods", str(tmp_path / "none.csv")]
    )
    assert missing.exit_code == 1
    assert "cannot read" in missing.output
    unknown = runner.invoke(
        _app(), ["pack", "--nodes", str(nodes), "--pods", str(nodes), "--policy", "tetris"]
    )
    assert unknown.exit_code == 1
    assert "unknown policy" in unknown.output
