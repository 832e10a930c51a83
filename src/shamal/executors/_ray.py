"""The ``ray`` executor: the same attempts on a Ray cluster.

An attempt becomes:

- a **placement group** with one bundle per worker (``CPU``, ``memory``, ``GPU`` as the
  slot holds: whole GPUs, a fraction, or a MIG slice's share of a GPU), detached, named
  ``shamal-job-<job>-attempt-<n>``. Strategy: ``STRICT_PACK`` when the scheduler put
  every worker on one node, else ``PACK``. Ray picks the actual nodes from its own view
  of free resources: the placement's *shape* is honoured, not its node names.
- one **named, detached actor** per worker (:class:`~._ray_worker.RankProcess`), in the
  Ray namespace ``shamal-job-<job>``, named ``attempt-<n>-rank-<r>``, holding its
  bundle's resources. It runs the command as a subprocess in its own process group, in
  a copy of the snapshot shipped through the object store (``ship_workdir=True``, the
  default) or in ``LaunchSpec.workdir`` itself when every node shares that folder. The
  environment follows the shared conventions; ``CUDA_VISIBLE_DEVICES`` holds the GPU ids
  *Ray* assigned to the actor, ``MASTER_ADDR`` is rank 0's node.

Logs are pulled by :meth:`RayExecutor.poll` into ``LaunchSpec.log_path`` (whole lines,
rank-prefixed; the per-rank offsets are kept in ``<log>.offsets.json``, so delivery is
at-least-once across a server restart, a few lines may repeat). The final status is
written to ``<log>.status.json`` and then the actors and placement group are removed.

Limits, honestly: reattach works while the Ray cluster keeps the detached actors (a
server restart is fine; a restart of the Ray head without GCS fault tolerance loses every
attempt, reported ``lost``); if an actor's process dies (node failure, OOM kill) its
worker is ``lost`` and the subprocess may outlive it on that node; a MIG slot is only a
share of a GPU to Ray (no MIG isolation); ``shamal`` must be importable on the Ray nodes
(same version); one poller per attempt is expected (two may duplicate log lines).
"""

from __future__ import annotations

import dataclasses
import io
import logging
import tarfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from shamal.errors import InvalidParameter, ServiceUnavailable
from shamal.executors._cgroups import Limits
from shamal.executors._env import DEFAULT_PASSTHROUGH, gang_layout, platform_variables
from shamal.executors._isolation import Sandbox
from shamal.executors._outcome import StopCause, decide_outcome, stronger
from shamal.executors._procfs import atomic_write_json, read_json
from shamal.executors._protocol import (
    OUT_OF_MEMORY,
    ExitReason,
    ExitStatus,
    Handle,
    LaunchFailed,
    LaunchSpec,
    poll_until,
)
from shamal.executors._ray_token import ensure_ray_token
from shamal.scheduler.core import GPU_MILLI, Placement, Slot, mig_share_milli

__all__ = ["RayExecutor", "bundle_for", "strategy_for"]

logger = logging.getLogger(__name__)

_MIB = 1024 * 1024
_CALL_TIMEOUT_S = 30.0
_CHUNK = 1024 * 1024


def bundle_for(slot: Slot) -> dict[str, float]:
    """The Ray resources of one worker's bundle."""
    bundle: dict[str, float] = {}
    if slot.cpu_milli:
        bundle["CPU"] = slot.cpu_milli / 1000
    if slot.memory_mib:
        bundle["memory"] = float(slot.memory_mib * _MIB)
    if slot.mig_profile is not None:
        bundle["GPU"] = mig_share_milli(slot.mig_profile) / GPU_MILLI
    elif slot.gpu_milli:
        bundle["GPU"] = slot.gpu_milli / GPU_MILLI
    elif slot.gpus:
        bundle["GPU"] = float(len(slot.gpus))
    if not bundle:
        bundle["CPU"] = 0.001  # Ray refuses empty bundles
    return bundle


def strategy_for(placement: Placement) -> str:
    """``STRICT_PACK`` for a one-node placement, else ``PACK``."""
    return "STRICT_PACK" if len(placement.nodes) == 1 else "PACK"


def _names(job_id: str, attempt: int, world_size: int) -> tuple[str, list[str], str]:
    namespace = f"shamal-job-{job_id}"
    actors = [f"attempt-{attempt}-rank-{rank}" for rank in range(world_size)]
    return namespace, actors, f"shamal-job-{job_id}-attempt-{attempt}"


def _archive(workdir: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(workdir, arcname=".")
    return buf.getvalue()


class RayExecutor:
    """Runs attempts on a Ray cluster; see the module docstring.

    Thread-safe. Connects on first use: to the running Ray session of this process if
    there is one, else ``ray.init(address=address, **init_options)``.

    Args:
        address: the cluster to join (``"auto"``: the one ``RAY_ADDRESS`` or this node
            runs); ignored when Ray is already initialised in this process.
        ship_workdir: copy the snapshot to the nodes through the object store; false
            when ``LaunchSpec.workdir`` is on a filesystem every node mounts.
        cancel_grace_s: seconds between SIGTERM and SIGKILL on :meth:`cancel`.
        start_timeout_s: how long :meth:`launch` waits for the placement group.
        poll_interval_s: the longest pause between two polls in :meth:`wait`.
        passthrough_env: names of the node's variables that workers inherit.
        node_tmpdir: where actors keep the snapshot copy and output on their node
            (default: the node's temporary folder). An actor that dies without
            cleaning up (the ``lost`` case) leaves its folder behind there.
        init_options: more keyword arguments for ``ray.init``.
        sandbox: confine every worker on its node, as the local executor does (the
            tenant's OS user, namespaces, a cgroup with the slot's limits); needs Ray's
            workers to run as root where ``own_users`` is set.
    """

    name = "ray"

    def __init__(  # noqa: PLR0913 - keyword-only options, each with a default
        self,
        address: str | None = "auto",
        *,
        ship_workdir: bool = True,
        cancel_grace_s: float = 5.0,
        start_timeout_s: float = 60.0,
        poll_interval_s: float = 0.2,
        passthrough_env: Sequence[str] = DEFAULT_PASSTHROUGH,
        node_tmpdir: str | None = None,
        init_options: Mapping[str, Any] | None = None,
        sandbox: Sandbox | None = None,
    ) -> None:
        self._sandbox = sandbox
        self._node_tmpdir = node_tmpdir
        self._address = address
        self._ship = ship_workdir
        self._cancel_grace_s = cancel_grace_s
        self._start_timeout_s = start_timeout_s
        self._poll_interval_s = poll_interval_s
        self._passthrough = list(passthrough_env)
        self._init_options = dict(init_options or {})
        self._lock = threading.Lock()
        self._pull_lock = threading.Lock()
        self._owns_connection = False
        self._actor_class: Any = None

    # ------------------------------------------------------------------ connection
    def _ray(self) -> Any:
        try:
            import ray
        except ImportError:
            raise ServiceUnavailable("the ray executor needs the 'ray' extra installed") from None
        with self._lock:
            if not ray.is_initialized():
                if self._address in (None, "local"):  # this call starts a head here
                    ensure_ray_token()
                try:
                    ray.init(address=self._address, **self._init_options)
                except ConnectionError as exc:
                    raise ServiceUnavailable(f"cannot reach the Ray cluster: {exc}") from None
                self._owns_connection = True
            if self._actor_class is None:
                from shamal.executors._ray_worker import RankProcess

                self._actor_class = ray.remote(max_restarts=0)(RankProcess)
        return ray

    def close(self) -> None:
        """Disconnect if this executor connected; running attempts keep running."""
        with self._lock:
            if self._owns_connection:
                import ray

                ray.shutdown()
                self._owns_connection = False

    # ------------------------------------------------------------------ launch
    def launch(self, spec: LaunchSpec) -> Handle:
        """See :meth:`Executor.launch`."""
        namespace, names, pg_name = _names(spec.job_id, spec.attempt, spec.world_size)
        existing = self._existing_run(spec, namespace, names)
        if existing is not None:
            return existing
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._remove_stale_placement_group(pg_name)
        pg = self._placement_group(spec, pg_name)
        actors: list[Any] = []
        try:
            actors = self._create_actors(spec, namespace, names, pg)
            self._start(spec, actors)
        except BaseException as exc:
            self._teardown(actors, pg.id.hex())
            if isinstance(exc, LaunchFailed):
                raise
            if isinstance(exc, Exception):
                raise LaunchFailed(f"Ray could not start the job: {type(exc).__name__}") from exc
            raise
        return self._handle(spec, namespace, names, pg.id.hex())

    def _existing_run(self, spec: LaunchSpec, namespace: str, names: list[str]) -> Handle | None:
        """The handle of this attempt if it was launched already.

        Remains of a launch that died half-way (some actors missing, or not started) are
        torn down instead, so that the caller launches afresh.
        """
        ray = self._ray()
        found = [self._lookup(namespace, name) for name in names]
        actors = [a for a in found if a is not None]
        if not actors:
            return None
        pg_id = str(ray.get(actors[0].placement_group.remote(), timeout=_CALL_TIMEOUT_S))
        if len(actors) == len(names):
            states = ray.get([a.status.remote() for a in actors], timeout=_CALL_TIMEOUT_S)
            if all(s["started"] or s["done"] for s in states):
                return self._handle(spec, namespace, names, pg_id)
        logger.warning("job %s attempt %d: clearing a half-done launch", spec.job_id, spec.attempt)
        self._teardown(actors, pg_id)
        return None

    def _handle(self, spec: LaunchSpec, namespace: str, names: list[str], pg_id: str) -> Handle:
        return Handle(
            executor=self.name,
            job_id=spec.job_id,
            attempt=spec.attempt,
            log_path=spec.log_path,
            data={
                "namespace": namespace,
                "actors": names,
                "placement_group": pg_id,
                "grace_s": spec.grace_s,
            },
        )

    def _placement_group(self, spec: LaunchSpec, pg_name: str) -> Any:
        ray = self._ray()
        from ray.util.placement_group import placement_group, remove_placement_group

        pg = placement_group(
            [bundle_for(slot) for slot in spec.placement.slots],
            strategy=strategy_for(spec.placement),
            name=pg_name,
            lifetime="detached",
        )
        ready, _ = ray.wait([pg.ready()], timeout=self._start_timeout_s)
        if not ready:
            remove_placement_group(pg)
            raise LaunchFailed("the Ray cluster cannot place the job's workers now")
        return pg

    def _remove_stale_placement_group(self, pg_name: str) -> None:
        """A placement group left by a launch that died before its actors existed."""
        ray = self._ray()
        from ray.util.placement_group import PlacementGroup, remove_placement_group

        for pg_id, info in ray.util.placement_group_table().items():
            if info.get("name") == pg_name and info.get("state") != "REMOVED":
                logger.info("removing stale placement group %s", pg_name)
                remove_placement_group(PlacementGroup(ray.PlacementGroupID.from_hex(pg_id)))

    def _create_actors(
        self, spec: LaunchSpec, namespace: str, names: list[str], pg: Any
    ) -> list[Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actors = []
        for rank, slot in enumerate(spec.placement.slots):
            bundle = bundle_for(slot)
            options: dict[str, Any] = {
                "name": names[rank],
                "namespace": namespace,
                "lifetime": "detached",
                "num_cpus": bundle.get("CPU", 0),
                "num_gpus": bundle.get("GPU", 0),
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=rank
                ),
            }
            if "memory" in bundle:
                options["memory"] = int(bundle["memory"])
            actor = self._actor_class.options(**options).remote(
                namespace, names, rank, pg.id.hex(), self._node_tmpdir
            )
            actors.append(actor)
        return actors

    def _start(self, spec: LaunchSpec, actors: list[Any]) -> None:
        ray = self._ray()
        nodes = ray.get([a.node.remote() for a in actors], timeout=self._start_timeout_s)
        master = None
        if spec.world_size > 1:
            port = ray.get(actors[0].free_port.remote(), timeout=_CALL_TIMEOUT_S)
            master = (str(nodes[0]["ip"]), int(port))
        layout = gang_layout([str(n["node_id"]) for n in nodes])
        archive = ray.put(_archive(spec.workdir)) if self._ship else None
        calls = []
        for rank, slot in enumerate(spec.placement.slots):
            platform = platform_variables(
                spec.job_id,
                spec.attempt,
                rank=rank,
                world_size=spec.world_size,
                layout=layout[rank],
                master=master,
                gpu_milli=slot.gpu_milli,
            )
            env = {"user": dict(spec.env), "platform": platform}
            workdir = None if self._ship else str(spec.workdir)
            limits = (spec.time_limit_s, spec.grace_s)
            confinement = None
            if self._sandbox is not None:
                confinement = {
                    "sandbox": self._sandbox.to_dict(),
                    "tenant": spec.tenant,
                    "limits": asdict(
                        Limits(slot.memory_mib * _MIB, self._sandbox.pids_max, slot.cpu_milli)
                    ),
                }
            calls.append(
                actors[rank].start.remote(
                    list(spec.command),
                    env,
                    self._passthrough,
                    workdir,
                    archive,
                    limits,
                    confinement,
                )
            )
        ray.get(calls, timeout=self._start_timeout_s)

    # ------------------------------------------------------------------ observe
    def poll(self, handle: Handle) -> ExitStatus | None:
        """See :meth:`Executor.poll`; also pulls new output into the log."""
        status_path = _sibling(handle.log_path, ".status.json")
        status = _read_status(status_path)
        if status is not None:
            return status
        ray = self._ray()
        actors = self._actors(handle)
        if actors is None:
            return self._declare_lost(handle, "a worker's actor is gone")
        try:
            states = ray.get([a.status.remote() for a in actors], timeout=_CALL_TIMEOUT_S)
            finished = all(s["done"] for s in states)
            self._pull_output(handle, actors, until_end=finished)
        except ray.exceptions.GetTimeoutError:
            return None  # the cluster is slow to answer: ask again later
        except ray.exceptions.RayActorError:
            return self._declare_lost(handle, "a worker's actor died")
        if not finished:
            self._stop_gang_if_failed(handle, actors, states)
            return None
        status = _outcome(states)
        atomic_write_json(status_path, {**status.to_dict(), "finished_at": time.time()})
        self._teardown(actors, str(handle.data.get("placement_group", "")))
        return status

    def wait(self, handle: Handle, timeout: float | None = None) -> ExitStatus | None:
        """See :meth:`Executor.wait`."""
        return poll_until(
            self.poll, handle, timeout, first_delay=0.02, max_delay=self._poll_interval_s
        )

    def reattach(self, handle_json: str) -> Handle | None:
        """See :meth:`Executor.reattach`."""
        handle = Handle.from_json(handle_json)
        self._check(handle)
        status = _read_status(_sibling(handle.log_path, ".status.json"))
        if status is None and self._actors(handle) is None:
            status = self._declare_lost(handle, "its actors are gone")
        if status is not None and status.reason is ExitReason.LOST:
            return None
        return handle

    # ------------------------------------------------------------------ control
    def preempt(self, handle: Handle, grace_s: float | None = None) -> None:
        """See :meth:`Executor.preempt`; returns once every actor has the request."""
        grace = float(handle.data.get("grace_s", 30.0)) if grace_s is None else grace_s
        self._stop_all(handle, StopCause.PREEMPT, grace)

    def cancel(self, handle: Handle) -> None:
        """See :meth:`Executor.cancel`."""
        self._stop_all(handle, StopCause.CANCEL, self._cancel_grace_s)

    def _stop_all(self, handle: Handle, cause: StopCause, grace_s: float) -> None:
        if _sibling(handle.log_path, ".status.json").exists():
            return
        ray = self._ray()
        actors = self._actors(handle) or []
        refs = [a.stop.remote(cause.value, max(grace_s, 0.0)) for a in actors]
        try:
            ray.get(refs, timeout=_CALL_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            logger.warning("job %s: not every worker got the %s", handle.job_id, cause.value)

    # ------------------------------------------------------------------ helpers
    def _check(self, handle: Handle) -> None:
        if handle.executor != self.name:
            raise InvalidParameter(f"a {handle.executor!r} handle given to the ray executor")
        if not isinstance(handle.data.get("actors"), list) or "namespace" not in handle.data:
            raise InvalidParameter("the handle does not name the job's actors")

    def _lookup(self, namespace: str, name: str) -> Any | None:
        ray = self._ray()
        try:
            return ray.get_actor(name, namespace=namespace)
        except ValueError:
            return None

    def _actors(self, handle: Handle) -> list[Any] | None:
        """Every rank's actor, or ``None`` when any of them is gone."""
        self._check(handle)
        namespace = str(handle.data["namespace"])
        actors = [self._lookup(namespace, str(name)) for name in handle.data["actors"]]
        return None if any(a is None for a in actors) else actors

    def _pull_output(self, handle: Handle, actors: list[Any], *, until_end: bool) -> None:
        ray = self._ray()
        offsets_path = _sibling(handle.log_path, ".offsets.json")
        with self._pull_lock:
            offsets = read_json(offsets_path) or {}
            with open(handle.log_path, "ab") as log:
                for rank, actor in enumerate(actors):
                    offset = int(offsets.get(str(rank), 0))
                    while True:
                        ref = actor.read_output.remote(offset, _CHUNK)
                        data, offset = ray.get(ref, timeout=_CALL_TIMEOUT_S)
                        log.write(data)
                        if len(data) < _CHUNK and not (until_end and data):
                            break
                    offsets[str(rank)] = offset
                log.flush()
            atomic_write_json(offsets_path, offsets)

    def _stop_gang_if_failed(self, handle: Handle, actors: list[Any], states: list[Any]) -> None:
        """A backstop for the actors' own gang stop (a peer they could not reach)."""
        if any(s["failed_at"] is not None for s in states):
            grace = float(handle.data.get("grace_s", 30.0))
            for actor, state in zip(actors, states, strict=True):
                if not state["done"] and state["cause"] is None:
                    actor.stop.remote(StopCause.GANG.value, grace)

    def _declare_lost(self, handle: Handle, detail: str) -> ExitStatus:
        self._check(handle)
        namespace = str(handle.data["namespace"])
        found = [self._lookup(namespace, str(name)) for name in handle.data["actors"]]
        pg_id = str(handle.data.get("placement_group", ""))
        self._teardown([a for a in found if a is not None], pg_id)
        world = len(handle.data["actors"])
        status = ExitStatus(ExitReason.LOST, (None,) * world, False, None, detail)
        atomic_write_json(
            _sibling(handle.log_path, ".status.json"),
            {**status.to_dict(), "finished_at": time.time()},
        )
        logger.warning("job %s attempt %d is lost: %s", handle.job_id, handle.attempt, detail)
        return status

    def _teardown(self, actors: list[Any], pg_id: str) -> None:
        """Kill the workers' processes, the actors and the placement group (best effort)."""
        ray = self._ray()
        from ray.util.placement_group import PlacementGroup, remove_placement_group

        try:
            ray.get([a.terminate.remote() for a in actors], timeout=_CALL_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            logger.warning("some workers could not clean up after themselves")
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except ValueError:  # not an actor any more
                logger.debug("actor already gone", exc_info=True)
        if pg_id:
            try:
                remove_placement_group(PlacementGroup(ray.PlacementGroupID.from_hex(pg_id)))
            except Exception:  # removed already
                logger.debug("placement group %s not removed", pg_id, exc_info=True)


def _sibling(log_path: Path, suffix: str) -> Path:
    return log_path.with_name(log_path.name + suffix)


def _read_status(path: Path) -> ExitStatus | None:
    data = read_json(path)
    if data is None:
        return None
    try:
        return ExitStatus.from_dict(data)
    except ValueError:
        return ExitStatus(ExitReason.LOST, detail="unreadable status file")


def _outcome(states: Sequence[Mapping[str, Any]]) -> ExitStatus:
    """One status from every rank's (see :func:`decide_outcome`)."""
    cause: StopCause | None = None
    for state in states:
        if state["cause"] is not None and stronger(cause, StopCause(state["cause"])):
            cause = StopCause(state["cause"])
    failures = [(s["failed_at"], r) for r, s in enumerate(states) if s["failed_at"] is not None]
    culprit = min(failures)[1] if failures else None
    if culprit is not None and cause is StopCause.GANG:
        cause = None  # the gang stop follows from the culprit's failure
    status = decide_outcome([s["exit_code"] for s in states], cause, culprit)
    if status.reason is ExitReason.FAILED and any(s.get("out_of_memory") for s in states):
        status = dataclasses.replace(status, detail=OUT_OF_MEMORY)
    return status
