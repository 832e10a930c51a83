"""The live scheduler: jobs from the database onto a real cluster, through the executors.

* :class:`SchedulerLoop` ticks: reconcile running attempts, ask the scheduler core's policy,
  apply its starts and preemptions (:mod:`._loop`);
* :class:`JobLifecycle` moves jobs through their states in the database, with the leases that
  let several schedulers share one database (:mod:`._lifecycle`, :mod:`._store`);
* :func:`build_cluster` and :func:`effective_settings` model the configured cluster
  (:mod:`._cluster`); :class:`ClusterCapacity` answers what a job could ever get on it
  (:mod:`._fit`), which :class:`shamal.jobs.JobService` asks at submission;
* :func:`build_loop` and :class:`SchedulerThread` run it inside a server, with jobs jailed
  (:func:`job_sandbox`) in their own folders (:func:`job_folders`) (:mod:`._thread`).
"""

from __future__ import annotations

from shamal.scheduler.live._cluster import build_cluster, effective_settings, local_node
from shamal.scheduler.live._fit import ClusterCapacity, cluster_capacity, quotas_of
from shamal.scheduler.live._lifecycle import JobLifecycle
from shamal.scheduler.live._loop import SchedulerLoop, SchedulerParts
from shamal.scheduler.live._thread import (
    JobCredentials,
    SchedulerThread,
    Services,
    build_loop,
    hidden_from_jobs,
    job_executors,
    job_folders,
    job_sandbox,
    scheduler_name,
)

__all__ = [
    "ClusterCapacity",
    "JobCredentials",
    "JobLifecycle",
    "SchedulerLoop",
    "SchedulerParts",
    "SchedulerThread",
    "Services",
    "build_cluster",
    "build_loop",
    "cluster_capacity",
    "effective_settings",
    "hidden_from_jobs",
    "job_executors",
    "job_folders",
    "job_sandbox",
    "local_node",
    "quotas_of",
    "scheduler_name",
]
