"""The trace-driven simulator: replays job traces through the live scheduler's policies,
admission and placement code (see :mod:`shamal.scheduler.core.sim._simulator`), and the
packing experiment over node and pod lists (:mod:`shamal.scheduler.core.sim._pack`)."""

from shamal.scheduler.core.sim._pack import load_nodes, load_pods, run_pack_experiment
from shamal.scheduler.core.sim._simulator import (
    DEFAULT_PREEMPTION_COST_S,
    NORMAL,
    SimOptions,
    SimResult,
    Simulator,
    simulate,
)
from shamal.scheduler.core.sim._trace import (
    DEFAULT_POOL,
    TraceError,
    TraceJob,
    assign_teams,
    gang_request,
    load_machines,
    load_teams,
    load_trace,
    team_cluster,
)

__all__ = [
    "DEFAULT_POOL",
    "DEFAULT_PREEMPTION_COST_S",
    "NORMAL",
    "SimOptions",
    "SimResult",
    "Simulator",
    "TraceError",
    "TraceJob",
    "assign_teams",
    "gang_request",
    "load_machines",
    "load_teams",
    "load_trace",
    "load_nodes",
    "load_pods",
    "run_pack_experiment",
    "simulate",
    "team_cluster",
]
