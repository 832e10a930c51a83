"""Scheduler benchmark: the platform's policies on real traces, in the trace simulator.

Everything runs in-process through :mod:`shamal.scheduler.core.sim`, which replays the trace
through the same policy, admission and placement code the live scheduler uses. One
run prints every figure and the ratios the targets are about:

1. **Philly, pooled cluster** (``philly/jobs.csv``, 111,549 jobs, on the 2,490 GPUs of
   ``philly/machines.csv``): FIFO (head-of-line blocking, what users get today), oracle
   SJF and SRTF (true durations; simulation only) and each platform policy. Average,
   median and p99 JCT, average queueing delay, GPU utilization, makespan and the wall
   time of each simulation. Targets: the default policy closes >= 90% of the gap between
   FIFO and oracle SRTF in average JCT and in average queueing delay (Helios' QSSF
   closed 88% on its slice of Philly); the whole trace simulates in < 60 s.
2. **Stress** (not a target of the issue; full runs only): the whole trace on every
   other Philly machine (1,242 GPUs), a sustained overload with long queues: FIFO, the
   default policy and oracle SRTF, and the same gap ratios.
3. **Team quotas** (the Philly trace, each job given one of the 11 teams of
   ``philly/vc_nodes.csv`` at random, seeded, in proportion to team size among the
   teams large enough for it; each team's quota = its nodes x 8 GPUs; the cluster = those
   352 nodes): isolated quotas vs borrowing idle quota with reclaim by preemption, under
   the default policy (and FIFO for reference). Targets: no team's average queueing
   delay worse with borrowing; cluster average JCT >= 1.5x better.
4. **Alibaba GPU sharing**: packing rows added by :func:`alibaba_packing_rows`.

Modelling (see :mod:`shamal.scheduler.core.sim._simulator`): every job runs its
``duration_s`` (failed and cancelled ones included); each preemption costs
``--preemption-cost`` seconds of restore (default 60); queueing delay = JCT - time
running, so time spent preempted counts as waiting.

Run from the repository root with Shamal's venv::

    .venv/bin/python bench/scheduler.py --quick     # smoke run: first 20,000 jobs on
                                                    # half the machines, ~1.5 minutes
    .venv/bin/python bench/scheduler.py [--json]    # the benchmark, about 10 minutes

Exit status: 0 once the benchmark ran, pass or fail; 2 when the traces are missing.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from shamal.scheduler.core import DEFAULT_POLICY, Cluster, policy_names, simulation_policy
from shamal.scheduler.core._policies import DEFAULT_LAS_THRESHOLDS
from shamal.scheduler.core._strategies import DEFAULT_STRATEGY, STRATEGIES
from shamal.scheduler.core.sim import (
    DEFAULT_PREEMPTION_COST_S,
    TraceError,
    TraceJob,
    assign_teams,
    load_machines,
    load_teams,
    load_trace,
    run_pack_experiment,
    simulate,
    team_cluster,
)

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path(os.environ.get("SHAMAL_TRACES", ROOT.parent / "shared" / "traces"))
QUICK_JOBS = 20_000
QUICK_MACHINE_STRIDE = 2  # --quick: every other Philly machine, so 20,000 jobs still queue
STRESS_MACHINE_STRIDE = 2  # the stress run: the whole trace on every other machine
QUICK_TEAM_GPUS_PER_NODE = 4  # --quick: team nodes of 4 GPUs instead of 8
GAP_TARGET = 0.90
SIM_TIME_TARGET_S = 60.0
TEAM_JCT_TARGET = 1.5


@dataclass
class Row:
    """One simulation: what ran and its metrics."""

    label: str
    policy: str
    metrics: dict[str, Any]
    note: str = ""


@dataclass
class Report:
    config: dict[str, Any]
    pooled: list[Row] = field(default_factory=list)
    sensitivity: list[Row] = field(default_factory=list)
    stress: list[Row] = field(default_factory=list)
    teams: list[Row] = field(default_factory=list)
    packing: list[dict[str, Any]] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)


def _say(console: Console, text: str) -> None:
    console.print(text, highlight=False)


def _run(
    label: str,
    jobs: Sequence[TraceJob],
    make_cluster: Callable[[], Cluster],
    policy: str,
    options: dict[str, Any] | None,
    say: Callable[[str], None],
    *,
    note: str = "",
    **sim_options: Any,
) -> Row:
    say(f"  {label} ...")
    started = time.perf_counter()
    metrics = simulate(
        jobs,
        make_cluster(),
        simulation_policy(policy, **(options or {})),
        record_timeline=False,
        **sim_options,
    ).metrics
    metrics["wall_s"] = time.perf_counter() - started
    say(
        f"    avg JCT {metrics['avg_jct_s']:,.0f} s, avg queue {metrics['avg_queue_s']:,.1f} s, "
        f"{metrics['preemptions']:,} preemptions, {metrics['sim_seconds']:.1f} s"
    )
    return Row(label, policy, metrics, note)


def gap_closed(fifo: float, policy: float, oracle: float) -> float:
    """Share of the FIFO -> oracle gap a policy closes (1.0: as good as the oracle)."""
    gap = fifo - oracle
    return (fifo - policy) / gap if gap > 0 else float("nan")


def helios_gaps() -> dict[str, float]:
    """QSSF's published share of the FIFO -> SRTF gap (cluster-wide rows)."""
    path = TRACES / "expected_results" / "helios_qssf_philly_expected.csv"
    rows = {
        r["metric"]: r
        for r in csv.DictReader(
            line for line in path.read_text().splitlines() if not line.startswith("#")
        )
        if r["vc"] == "all"
    }
    return {
        metric: gap_closed(
            float(rows[metric]["fifo"]),
            float(rows[metric]["qssf_predicted"]),
            float(rows[metric]["srtf_oracle_preemptive"]),
        )
        for metric in ("avg_jct", "avg_queue")
    }


# ----------------------------------------------------------------- Philly pooled


def philly_cluster(every: int = 1) -> Cluster:
    """Philly's machines, or every ``every``-th of them (in file order)."""
    full = load_machines(TRACES / "philly" / "machines.csv")
    return Cluster.of(full.pools.values(), list(full.nodes.values())[::every])


def bench_stress(report: Report, jobs: list[TraceJob], say: Callable[[str], None]) -> None:
    """The whole trace on half the machines: sustained overload, large queues."""
    cost = report.config["preemption_cost_s"]
    gpus = philly_cluster(STRESS_MACHINE_STRIDE).capacity().gpu_milli // 1000
    report.config["stress_gpus"] = gpus
    say(f"Stress: {len(jobs):,} jobs on every other Philly machine ({gpus:,} GPUs)")
    rows = {
        name: _run(
            name,
            jobs,
            lambda: philly_cluster(STRESS_MACHINE_STRIDE),
            name,
            None,
            say,
            preemption_cost_s=cost,
        )
        for name in (DEFAULT_POLICY, "fifo", "srtf-oracle")
    }
    report.stress.extend(rows.values())
    for metric, key in (("avg_jct", "avg_jct_s"), ("avg_queue", "avg_queue_s")):
        closed = gap_closed(
            rows["fifo"].metrics[key],
            rows[DEFAULT_POLICY].metrics[key],
            rows["srtf-oracle"].metrics[key],
        )
        report.checks.append(
            {
                "name": f"Stress (half the machines): {DEFAULT_POLICY} closes the FIFO -> SRTF "
                f"gap in {metric}",
                "value": closed,
                "display": f"{100 * closed:.1f}%",
                "target": f"(extra) >= {100 * GAP_TARGET:.0f}%",
                "pass": closed >= GAP_TARGET,
            }
        )


def bench_pooled(
    report: Report, jobs: list[TraceJob], quick: bool, say: Callable[[str], None]
) -> None:
    machines = TRACES / "philly" / "machines.csv"
    every = QUICK_MACHINE_STRIDE if quick else 1

    def cluster() -> Cluster:
        return philly_cluster(every)

    cost = report.config["preemption_cost_s"]
    report.config["philly_gpus"] = cluster().capacity().gpu_milli // 1000
    say(
        f"Philly pooled: {len(jobs):,} jobs on {machines}"
        + (" (every other machine: --quick)" if quick else "")
    )
    # The default policy first, alone on the machine, for the whole-trace time.
    order = [DEFAULT_POLICY, "fifo", "sjf-oracle", "srtf-oracle"]
    order += [p for p in policy_names() if p not in order]
    rows = {
        name: _run(name, jobs, cluster, name, None, say, preemption_cost_s=cost) for name in order
    }
    report.pooled.extend(rows[name] for name in order)
    report.pooled.append(
        _run(
            "fifo, no head-of-line blocking",
            jobs,
            cluster,
            "fifo",
            {"strict": False},
            say,
            note="FIFO that starts any later job that fits",
            preemption_cost_s=cost,
        )
    )
    fifo, oracle, default = (
        rows["fifo"].metrics,
        rows["srtf-oracle"].metrics,
        rows[DEFAULT_POLICY].metrics,
    )
    helios = helios_gaps()
    greedy = report.pooled[-1].metrics
    for metric, key in (("avg_jct", "avg_jct_s"), ("avg_queue", "avg_queue_s")):
        closed = gap_closed(fifo[key], default[key], oracle[key])
        report.checks.append(
            {
                "name": f"Philly: {DEFAULT_POLICY} closes the FIFO -> SRTF gap in {metric}",
                "value": closed,
                "display": f"{100 * closed:.1f}%",
                "target": f">= {100 * GAP_TARGET:.0f}% (Helios QSSF {100 * helios[metric]:.0f}%)",
                "pass": closed >= GAP_TARGET,
            }
        )
        versus_greedy = gap_closed(greedy[key], default[key], oracle[key])
        report.checks.append(
            {
                "name": f"  same gap from FIFO without head-of-line blocking, {metric}",
                "value": versus_greedy,
                "display": f"{100 * versus_greedy:.1f}%",
                "target": "-",
                "pass": None,
            }
        )
    seconds = default["sim_seconds"]
    whole = len(jobs) == report.config["philly_jobs_total"]
    report.checks.append(
        {
            "name": f"Philly: whole-trace simulation time, {DEFAULT_POLICY}"
            + ("" if whole else f" ({len(jobs):,} jobs only: --quick)"),
            "value": seconds,
            "display": f"{seconds:.1f} s",
            "target": f"< {SIM_TIME_TARGET_S:.0f} s",
            "pass": seconds < SIM_TIME_TARGET_S if whole else None,
        }
    )
    if quick:
        return
    say("LAS sensitivity (thresholds in GPU-seconds, start protection, preemption cost)")
    variants: list[tuple[str, dict[str, Any], float]] = [
        ("las thresholds (3600,)", {"thresholds": (3600.0,)}, cost),
        ("las thresholds (36000,)", {"thresholds": (36_000.0,)}, cost),
        (
            "las thresholds (1000, 10000, 100000)",
            {"thresholds": (1000.0, 10_000.0, 100_000.0)},
            cost,
        ),
        ("las min_run_s 60", {"min_run_s": 60.0}, cost),
        ("las min_run_s 1800", {"min_run_s": 1800.0}, cost),
        ("las, preemption cost 300 s", {}, 300.0),
    ]
    for label, options, variant_cost in variants:
        report.sensitivity.append(
            _run(label, jobs, cluster, "las", options, say, preemption_cost_s=variant_cost)
        )


# ----------------------------------------------------------------- team quotas


def bench_teams(
    report: Report, jobs: list[TraceJob], quick: bool, say: Callable[[str], None]
) -> None:
    vc = TRACES / "philly" / "vc_nodes.csv"
    seed = report.config["team_seed"]
    cost = report.config["preemption_cost_s"]
    per_node = QUICK_TEAM_GPUS_PER_NODE if quick else 8
    report.config["team_gpus_per_node"] = per_node
    isolated_quotas = load_teams(vc, borrow=False, gpus_per_node=per_node)
    borrowing_quotas = load_teams(vc, borrow=True, gpus_per_node=per_node)
    assigned = assign_teams(jobs, isolated_quotas, seed=seed)

    def cluster() -> Cluster:
        return team_cluster(vc, gpus_per_node=per_node)

    say(f"Team quotas: {len(assigned):,} jobs, 11 teams of {vc}, seed {seed}")
    results: dict[tuple[str, str], Row] = {}
    for policy in (DEFAULT_POLICY, "fifo"):
        for mode, quotas in (("isolated", isolated_quotas), ("borrowing", borrowing_quotas)):
            row = _run(
                f"{policy}, {mode} quotas",
                assigned,
                cluster,
                policy,
                None,
                say,
                quotas=quotas,
                preemption_cost_s=cost,
            )
            results[(policy, mode)] = row
            report.teams.append(row)
    for policy in (DEFAULT_POLICY, "fifo"):
        isolated = results[(policy, "isolated")].metrics
        borrowing = results[(policy, "borrowing")].metrics
        worse = [
            team
            for team, figures in borrowing["teams"].items()
            if figures["avg_queue_s"] > isolated["teams"][team]["avg_queue_s"] + 1e-6
        ]
        report.checks.append(
            {
                "name": f"Teams ({policy}): teams whose avg queueing delay is worse with borrowing",
                "value": len(worse),
                "display": ", ".join(worse) if worse else "none",
                "target": "none",
                "pass": not worse,
            }
        )
        ratio = isolated["avg_jct_s"] / borrowing["avg_jct_s"]
        bound = isolated["avg_jct_s"] / (borrowing["avg_jct_s"] - borrowing["avg_queue_s"])
        report.checks.append(
            {
                "name": f"Teams ({policy}): cluster avg JCT, isolated / borrowing",
                "value": ratio,
                "display": f"{ratio:.3f}x (zero queueing would give {bound:.3f}x)",
                "target": f">= {TEAM_JCT_TARGET}x",
                "pass": ratio >= TEAM_JCT_TARGET,
            }
        )
        queue_ratio = isolated["avg_queue_s"] / max(borrowing["avg_queue_s"], 1e-9)
        report.checks.append(
            {
                "name": f"Teams ({policy}): cluster avg queueing delay, isolated / borrowing",
                "value": queue_ratio,
                "display": f"{isolated['avg_queue_s']:,.1f} s -> {borrowing['avg_queue_s']:,.2f} s",
                "target": "-",
                "pass": None,
            }
        )


# ----------------------------------------------------------------- Alibaba packing


FGD_PUBLISHED = {  # expected_results/fgd_atc23_gpu_alloc_ratio_summary.csv, default pod list
    "random": 87.47,
    "dot-product": 90.85,
    "gpu-packing": 92.00,
    "best-fit": 93.08,
    "fgd": 95.39,
}


def alibaba_packing_rows(report: Report, quick: bool, say: Callable[[str], None]) -> None:
    """The GPU-sharing packing experiment of the traces README (method of FGD, ATC'23):
    every placement strategy on the default pod list, 10 seeds (2 with ``--quick``), and the
    check: the default strategy's allocation ratio at 130% demand above FGD's 95.4%."""
    nodes = TRACES / "alibaba_openb" / "openb_node_list_gpu_node.csv"
    pods = TRACES / "alibaba_openb" / "openb_pod_list_default.csv"
    seeds = 2 if quick else 10
    for strategy in STRATEGIES:
        say(f"  packing with {strategy} ({seeds} seeds) ...")
        result = run_pack_experiment(nodes, pods, demand=1.3, seeds=seeds, strategy=strategy)
        ratios = result["alloc_ratio"]
        published = FGD_PUBLISHED.get(strategy)
        report.packing.append(
            {
                "strategy": strategy + (" (default)" if strategy == DEFAULT_STRATEGY else ""),
                "alloc % at 90%": f"{100 * ratios['0.9']:.2f}",
                "at 100%": f"{100 * ratios['1.0']:.2f}",
                "at 130%": f"{100 * ratios['1.3']:.2f}",
                "published at 130%": "-" if published is None else f"{published:.2f}",
                "seeds": seeds,
                "run s": f"{result['seconds']:.0f}",
            }
        )
        if strategy == DEFAULT_STRATEGY:
            report.checks.append(
                {
                    "name": f"Alibaba GPU sharing: {strategy} allocation ratio at 130% demand",
                    "value": ratios["1.3"],
                    "display": f"{100 * ratios['1.3']:.2f}%",
                    "target": f"> FGD {FGD_PUBLISHED['fgd']:.1f}% ({seeds} seeds)",
                    "pass": 100 * ratios["1.3"] > FGD_PUBLISHED["fgd"],
                }
            )


# ----------------------------------------------------------------- output


def _s(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _metrics_table(title: str, rows: Sequence[Row]) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    for column in (
        "policy",
        "avg JCT s",
        "p50 JCT s",
        "p99 JCT s",
        "avg queue s",
        "GPU util",
        "makespan s",
        "preempt.",
        "sim s",
    ):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for row in rows:
        m = row.metrics
        table.add_row(
            row.label + (" (default)" if row.label == DEFAULT_POLICY else ""),
            _s(m["avg_jct_s"]),
            _s(m["p50_jct_s"]),
            _s(m["p99_jct_s"]),
            _s(m["avg_queue_s"]),
            f"{100 * m['gpu_utilization']:.1f}%",
            _s(m["makespan_s"]),
            f"{m['preemptions']:,}",
            f"{m['sim_seconds']:.1f}",
        )
    return table


def _team_table(report: Report) -> Table:
    table = Table(
        title=f"Team quotas: avg queueing delay per team (s), {DEFAULT_POLICY} and fifo",
        title_justify="left",
        header_style="bold",
    )
    table.add_column("team")
    table.add_column("jobs", justify="right")
    for row in report.teams:
        table.add_column(row.label.replace(" quotas", ""), justify="right")
    teams = report.teams[0].metrics["teams"]
    for team in teams:
        table.add_row(
            team,
            f"{teams[team]['jobs']:,}",
            *(_s(row.metrics["teams"][team]["avg_queue_s"]) for row in report.teams),
        )
    return table


def _checks_table(report: Report) -> Table:
    table = Table(title="Targets", title_justify="left", header_style="bold")
    for column in ("check", "value", "target", "result"):
        table.add_column(column)
    for check in report.checks:
        verdict = {True: "PASS", False: "FAIL", None: "-"}[check["pass"]]
        table.add_row(check["name"], check["display"], check["target"], verdict)
    return table


def print_report(report: Report) -> None:
    console = Console(width=None if sys.stdout.isatty() else 160)
    config = report.config
    if report.pooled:
        console.print(
            _metrics_table(
                f"Philly pooled: {config['philly_jobs']:,} jobs on {config['philly_gpus']:,} "
                f"GPUs, preemption cost {config['preemption_cost_s']:g} s",
                report.pooled,
            )
        )
    if report.sensitivity:
        console.print(_metrics_table("LAS sensitivity (whole trace)", report.sensitivity))
    if report.stress:
        console.print(
            _metrics_table(
                f"Stress: the whole trace on every other Philly machine "
                f"({config['stress_gpus']:,} GPUs)",
                report.stress,
            )
        )
    prediction = next(
        (r.metrics.get("prediction") for r in report.pooled if r.policy == "predicted-sjf"), None
    )
    if prediction:
        console.print(
            f"Runtime predictor on Philly (online: predicted at submission, learned at "
            f"finish; features: GPUs and recent jobs of that size only): MdAPE "
            f"{100 * prediction['mdape']:.0f}%, within 2x {100 * prediction['within_2x']:.0f}%, "
            f"MAE {prediction['mae_s']:,.0f} s over {prediction['n']:,} jobs"
        )
    if report.teams:
        gpus = 352 * config["team_gpus_per_node"]
        console.print(_metrics_table(f"Team quotas (11 teams, {gpus:,} GPUs)", report.teams))
        console.print(_team_table(report))
    if report.packing:
        table = Table(title="Alibaba GPU sharing", title_justify="left", header_style="bold")
        for key in report.packing[0]:
            table.add_column(str(key))
        for item in report.packing:
            table.add_row(*(str(v) for v in item.values()))
        console.print(table)
    console.print(_checks_table(report))
    load = ", ".join(f"{x:.2f}" for x in config["loadavg_at_start"])
    console.print(
        f"{config['cpus']} CPUs, load average at start {load}; total {config['total_s']:.0f} s"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help=f"first {QUICK_JOBS:,} jobs only, no sensitivity runs"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--preemption-cost",
        type=float,
        default=DEFAULT_PREEMPTION_COST_S,
        help="restore seconds per preemption (default %(default)s)",
    )
    parser.add_argument("--team-seed", type=int, default=0, help="seed of the team assignment")
    parser.add_argument(
        "--only",
        default="pooled,stress,teams,packing",
        help="comma-separated parts to run: pooled, stress (not with --quick), teams, packing",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    progress = Console(stderr=True)

    def say(text: str) -> None:
        _say(progress, text)

    started = time.perf_counter()
    try:
        all_jobs = load_trace(TRACES / "philly" / "jobs.csv")
        gpus = load_machines(TRACES / "philly" / "machines.csv").capacity().gpu_milli // 1000
    except TraceError as exc:
        say(f"benchmark could not run: {exc} (set SHAMAL_TRACES to the traces folder)")
        return 2
    jobs = all_jobs[:QUICK_JOBS] if args.quick else all_jobs
    parts = {p.strip() for p in args.only.split(",")}
    report = Report(
        config={
            "mode": "quick" if args.quick else "full",
            "default_policy": DEFAULT_POLICY,
            "las_thresholds_gpu_s": list(DEFAULT_LAS_THRESHOLDS),
            "preemption_cost_s": args.preemption_cost,
            "team_seed": args.team_seed,
            "philly_jobs": len(jobs),
            "philly_jobs_total": len(all_jobs),
            "philly_gpus": gpus,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_at_start": list(os.getloadavg()),
        }
    )
    if "pooled" in parts:
        bench_pooled(report, jobs, args.quick, say)
    if "stress" in parts and not args.quick:
        bench_stress(report, jobs, say)
    if "teams" in parts:
        bench_teams(report, jobs, args.quick, say)
    if "packing" in parts:
        alibaba_packing_rows(report, args.quick, say)
    report.config["total_s"] = time.perf_counter() - started
    if args.json:
        payload = {
            "config": report.config,
            "pooled": [r.__dict__ for r in report.pooled],
            "sensitivity": [r.__dict__ for r in report.sensitivity],
            "stress": [r.__dict__ for r in report.stress],
            "teams": [r.__dict__ for r in report.teams],
            "packing": report.packing,
            "checks": report.checks,
        }
        print(json.dumps(payload, indent=2, default=str))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
