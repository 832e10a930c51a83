"""Conversions between jobs as stored and the scheduler core's values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shamal.jobs._entities import Job
from shamal.scheduler.core import JobRecord, Placement, Request, Slot


def placement_to_json(placement: Placement) -> dict[str, Any]:
    return {
        "slots": [
            {
                "node": slot.node,
                "cpu_milli": slot.cpu_milli,
                "memory_mib": slot.memory_mib,
                "gpus": list(slot.gpus),
                "gpu_milli": slot.gpu_milli,
                "mig_profile": slot.mig_profile,
                "mig_start": slot.mig_start,
            }
            for slot in placement.slots
        ]
    }


def placement_from_json(data: Mapping[str, Any]) -> Placement:
    return Placement(
        tuple(
            Slot(
                node=str(item["node"]),
                cpu_milli=int(item["cpu_milli"]),
                memory_mib=int(item["memory_mib"]),
                gpus=tuple(int(g) for g in item.get("gpus", ())),
                gpu_milli=int(item.get("gpu_milli", 0)),
                mig_profile=item.get("mig_profile"),
                mig_start=int(item.get("mig_start", 0)),
            )
            for item in data["slots"]
        )
    )


def request_of(job: Job) -> Request:
    return Request(
        cpu_milli=job.cpu_milli,
        memory_mib=job.memory_mib,
        gpus=job.gpus,
        gpu_milli=job.gpu_milli,
        mig_profile=job.mig_profile,
        gpu_models=frozenset(job.gpu_models),
        gpu_memory_mib=job.gpu_memory_mib,
        workers=job.workers,
    )


def record_of(job: Job, runtime_s: float) -> JobRecord:
    """A finished job as the runtime predictor learns it."""
    total = request_of(job).total
    return JobRecord(
        runtime_s=runtime_s,
        team=job.team,
        user=job.user,
        fingerprint=job.fingerprint,
        gpus=total.gpu_milli / 1000,
        cpu_milli=total.cpu_milli,
        memory_mib=total.memory_mib,
        submitted_at=job.submitted_at.timestamp(),
        finished_at=job.finished_at.timestamp() if job.finished_at else None,
    )
