"""Jobs: what users submit to the scheduler, and what they see of it.

:class:`JobService` takes requests from people (submit, list, show, cancel, preempt, logs,
cost) under the platform's rules; the live scheduler (:mod:`shamal.scheduler.live`) moves
jobs through their states in the same table (:data:`store`) and is handed to the service
only as a :class:`Capacity`. :mod:`shamal.jobs.snapshot` packs a job's code folder.

The names below load on first use (PEP 562): the job spec's checks (``check_env``,
``JobIn``...), which the CLI checks a job with, then load without the database layer and the
services.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shamal import lazy

if TYPE_CHECKING:
    from shamal.jobs import _store as store
    from shamal.jobs._convert import placement_from_json, placement_to_json, record_of, request_of
    from shamal.jobs._cursor import job_cursor, job_cursor_after
    from shamal.jobs._entities import (
        ACTIVE_STATES,
        FINAL_STATES,
        Amount,
        CostLine,
        Job,
        JobEvent,
        JobSpec,
        JobState,
        QuotaUse,
    )
    from shamal.jobs._rules import MAX_MEMORY_MIB, check_env, check_mig_profile, duration_text
    from shamal.jobs._schemas import JobIn
    from shamal.jobs._service import (
        NAMESPACE,
        Capacity,
        DataRegions,
        JobService,
        LogChunk,
        job_finished,
        log_prefix,
    )
    from shamal.jobs._store import Attempt, job_statuses

#: Where each name lives: (module, attribute); attribute None: the module itself.
_WHERE: dict[str, tuple[str, str | None]] = {
    "ACTIVE_STATES": ("_entities", "ACTIVE_STATES"),
    "Amount": ("_entities", "Amount"),
    "Attempt": ("_store", "Attempt"),
    "Capacity": ("_service", "Capacity"),
    "CostLine": ("_entities", "CostLine"),
    "DataRegions": ("_service", "DataRegions"),
    "FINAL_STATES": ("_entities", "FINAL_STATES"),
    "MAX_MEMORY_MIB": ("_rules", "MAX_MEMORY_MIB"),
    "Job": ("_entities", "Job"),
    "JobEvent": ("_entities", "JobEvent"),
    "JobIn": ("_schemas", "JobIn"),
    "job_cursor": ("_cursor", "job_cursor"),
    "job_cursor_after": ("_cursor", "job_cursor_after"),
    "JobService": ("_service", "JobService"),
    "JobSpec": ("_entities", "JobSpec"),
    "JobState": ("_entities", "JobState"),
    "LogChunk": ("_service", "LogChunk"),
    "NAMESPACE": ("_service", "NAMESPACE"),
    "QuotaUse": ("_entities", "QuotaUse"),
    "check_env": ("_rules", "check_env"),
    "check_mig_profile": ("_rules", "check_mig_profile"),
    "duration_text": ("_rules", "duration_text"),
    "job_finished": ("_service", "job_finished"),
    "job_statuses": ("_store", "job_statuses"),
    "log_prefix": ("_service", "log_prefix"),
    "placement_from_json": ("_convert", "placement_from_json"),
    "placement_to_json": ("_convert", "placement_to_json"),
    "record_of": ("_convert", "record_of"),
    "request_of": ("_convert", "request_of"),
    "store": ("_store", None),
}

__all__ = [
    "ACTIVE_STATES",
    "FINAL_STATES",
    "MAX_MEMORY_MIB",
    "NAMESPACE",
    "Amount",
    "Attempt",
    "Capacity",
    "CostLine",
    "DataRegions",
    "Job",
    "JobEvent",
    "JobIn",
    "job_cursor",
    "job_cursor_after",
    "JobService",
    "JobSpec",
    "JobState",
    "LogChunk",
    "QuotaUse",
    "check_env",
    "check_mig_profile",
    "duration_text",
    "job_finished",
    "job_statuses",
    "log_prefix",
    "placement_from_json",
    "placement_to_json",
    "record_of",
    "request_of",
    "store",
]


def __getattr__(name: str) -> Any:
    return lazy.attribute(__name__, _WHERE, name, globals())
