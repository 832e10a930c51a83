"""The scheduler core: pure policies, admission and placement over a resource model.

Nothing here touches the database or the executors: the live scheduler
(:mod:`shamal.scheduler.live`) builds a :class:`SchedulerState` from its job table, asks a
:class:`Policy` for :class:`Start` / :class:`Preempt` decisions and applies them; the
trace simulator (:mod:`shamal.scheduler.core.sim`) does the same over a trace.
"""

from shamal.scheduler.core._admission import Admission, QuotaBook, decay_all, decayed_usage
from shamal.scheduler.core._engine import BasePolicy, schedule
from shamal.scheduler.core._mig import device_memory_mib, profiles_for
from shamal.scheduler.core._placement import allocate, place, release
from shamal.scheduler.core._policies import (
    DEFAULT_POLICY,
    SIMULATION_ONLY,
    get_policy,
    policy_defaults,
    policy_names,
    policy_options,
    policy_summary,
    simulation_policy,
)
from shamal.scheduler.core._predictor import ErrorTracker, JobRecord, RuntimePredictor, error_report
from shamal.scheduler.core._resources import (
    GPU_MILLI,
    Cluster,
    Gpu,
    Node,
    Placement,
    Pool,
    Request,
    Resources,
    Slot,
    mig_share_milli,
)
from shamal.scheduler.core._state import (
    DEFAULT_PREEMPTION_COST_S,
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
    pools_in_regions,
)
from shamal.scheduler.core._strategies import DEFAULT_STRATEGY, STRATEGIES

__all__ = [
    "DEFAULT_POLICY",
    "DEFAULT_PREEMPTION_COST_S",
    "DEFAULT_STRATEGY",
    "GPU_MILLI",
    "SIMULATION_ONLY",
    "STRATEGIES",
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
    "device_memory_mib",
    "error_report",
    "get_policy",
    "job_pool",
    "job_shape",
    "mig_share_milli",
    "place",
    "policy_defaults",
    "policy_names",
    "policy_options",
    "policy_summary",
    "pools_in_regions",
    "profiles_for",
    "release",
    "schedule",
    "simulation_policy",
]
