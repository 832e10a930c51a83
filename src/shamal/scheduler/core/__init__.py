"""The scheduler core: pure policies, admission and placement over a resource model.

Nothing here touches the database or the executors: the live scheduler
(:mod:`shamal.jobs`) builds a :class:`SchedulerState` from its job table, asks a
:class:`Policy` for :class:`Start` / :class:`Preempt` decisions and applies them; the
trace simulator (:mod:`shamal.scheduler.sim`) does the same over a trace.
"""

from shamal.scheduler._admission import Admission, QuotaBook, decay_all, decayed_usage
from shamal.scheduler._engine import BasePolicy, schedule
from shamal.scheduler._placement import allocate, place, release
from shamal.scheduler._policies import (
    DEFAULT_POLICY,
    SIMULATION_ONLY,
    get_policy,
    policy_defaults,
    policy_names,
    policy_options,
    policy_summary,
    simulation_policy,
)
from shamal.scheduler._predictor import ErrorTracker, JobRecord, RuntimePredictor, error_report
from shamal.scheduler._resources import (
    GPU_MILLI,
    Cluster,
    Gpu,
    Node,
    Placement,
    Pool,
    Request,
    Resources,
    Slot,
)
from shamal.scheduler._state import (
    Decision,
    JobPhase,
    Policy,
    Preempt,
    PriorityClass,
    SchedJob,
    SchedulerState,
    Start,
    TeamQuota,
    job_pool,
    job_shape,
)

__all__ = [
    "DEFAULT_POLICY",
    "GPU_MILLI",
    "SIMULATION_ONLY",
    "Admission",
    "BasePolicy",
    "Cluster",
    "Decision",
    "ErrorTracker",
    "Gpu",
    "JobPhase",
    "JobRecord",
    "Node",
    "Placement",
    "Policy",
    "Pool",
    "Preempt",
    "PriorityClass",
    "QuotaBook",
    "Request",
    "Resources",
    "RuntimePredictor",
    "SchedJob",
    "SchedulerState",
    "Slot",
    "Start",
    "TeamQuota",
    "allocate",
    "decay_all",
    "decayed_usage",
    "error_report",
    "get_policy",
    "job_pool",
    "job_shape",
    "place",
    "policy_defaults",
    "policy_names",
    "policy_options",
    "policy_summary",
    "release",
    "schedule",
    "simulation_policy",
]
