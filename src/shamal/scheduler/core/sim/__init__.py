"""The trace-driven simulator: replays job traces through the live scheduler's policies,
admission and placement code (see :mod:`shamal.scheduler.core.sim._simulator`)."""

from shamal.scheduler.core.sim._plot import PLOT_FORMATS, plot_path, plot_timeline
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
    "PLOT_FORMATS",
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
    "plot_path",
    "plot_timeline",
    "simulate",
    "team_cluster",
]
