"""The data plane's side of a deployment: route by its split, report to the control plane.

:class:`DeploymentRouter` is the :class:`~shamal.serving._routing.TrafficRouter` of a serve
process started with ``--deployment NAME``. It holds the deployment's spec in memory (fetched
from the control plane, the last good one kept when the control plane cannot be reached), picks
versions with the same pure :func:`shamal.deployments.choose_route` the control plane documents,
counts calls per version in a window, keeps a sample of requests, and ships both from a
background thread. The control plane runs the rollout controller on each report; a rollback or
a step up is a new revision the router picks up on its next refresh (at once when a report's
answer says the revision moved).

With a :class:`VersionSource` attached (:meth:`DeploymentRouter.attach`), the router also keeps
the serve process's loaded versions in step with the spec: it asks the loader for every version
the spec lists, routes only to versions that are loaded (a canary's share goes to the primaries
and a shadow is skipped until then; while no primary of a new spec is loaded, the split served
before keeps serving), and tells the control plane which versions are still loading or failed
to load, so the controller neither judges a canary that had no traffic nor keeps one that
cannot load.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Set
from datetime import datetime
from typing import Any, Protocol

import numpy as np

from shamal.client import ShamalClient
from shamal.deployments import (
    LATENCY_SLOTS,
    Deployment,
    RolloutPhase,
    RolloutPlan,
    RolloutState,
    Route,
    RouteRole,
    Slo,
    TrafficSplit,
    choose_route,
    latency_slot,
)
from shamal.errors import NotFound, ServiceUnavailable, ShamalError
from shamal.serving._repository import MAX_REASON, LoadState, VersionStatus
from shamal.serving._routing import RouteChoice

logger = logging.getLogger(__name__)

#: Values kept per tensor in a sample, and characters per string value.
SAMPLE_VALUES = 256
SAMPLE_TEXT = 256
#: Samples waiting to be shipped; older ones are dropped when the control plane is slow.
SAMPLE_BUFFER = 200
_PUSH_BATCH = 100
_RETRY_AFTER_S = 5.0


class VersionSource(Protocol):
    """What the router needs of a loader (:class:`shamal.serving._repository.VersionLoader`)."""

    def want(self, versions: Mapping[str, str], *, retry_failed: bool = False) -> None: ...

    def statuses(self) -> dict[str, VersionStatus]: ...

    def subscribe(self, listener: Callable[[], None]) -> None: ...


def routable_split(
    split: TrafficSplit, loaded: Set[int], fallback: TrafficSplit | None
) -> TrafficSplit | None:
    """The part of ``split`` that can take traffic now: its loaded primaries, and its canary
    and shadows if loaded (an unloaded canary's share goes to the primaries). With no primary
    loaded, ``fallback`` (what served before) serves on; None when there is none either."""
    primaries = tuple(r for r in split.primaries if r.version in loaded)
    if not primaries:
        return fallback
    others = tuple(
        r for r in split.routes if r.role is not RouteRole.PRIMARY and r.version in loaded
    )
    return TrafficSplit(primaries + others)


def deployment_from_json(body: Mapping[str, Any]) -> Deployment:
    """A deployment as the API answers it (``GET /api/v1/deployments/{name}``)."""
    routes = tuple(
        Route(
            model_name=str(r["model"]),
            version=int(r["version"]),
            weight=int(r["weight"]),
            role=RouteRole(r["role"]),
            uri=str(r.get("uri", "")),
        )
        for r in body["routes"]
    )
    slo, plan, state = body["slo"], body["rollout"], body["state"]
    return Deployment(
        name=str(body["name"]),
        team=str(body.get("team", "")),
        split=TrafficSplit(routes),
        slo=Slo(float(slo["max_error_rate"]), float(slo["max_p99_ms"]), int(slo["min_requests"])),
        plan=RolloutPlan(tuple(int(s) for s in plan["steps"]), float(plan["interval_s"])),
        state=RolloutState(
            RolloutPhase(state["phase"]),
            int(state["canary_weight"]),
            int(state["step_index"]),
            datetime.fromisoformat(str(state["since"])),
        ),
        revision=int(body["revision"]),
        sticky_header=str(body.get("sticky_header", "")).lower(),
        sample_rate=float(body.get("sample_rate", 0.0)),
        feature_service=body.get("feature_service") or None,
    )


class _Window:
    """Calls to one version since the last report."""

    __slots__ = ("counts", "errors", "ok")

    def __init__(self) -> None:
        self.ok = 0
        self.errors = 0
        self.counts = [0] * LATENCY_SLOTS

    def as_report(self, version: str) -> dict[str, Any]:
        last = max((i for i, c in enumerate(self.counts) if c), default=-1)
        return {
            "version": version,
            "ok": self.ok,
            "errors": self.errors,
            "latency_counts": self.counts[: last + 1],
        }


def tensor_excerpt(array: np.ndarray) -> dict[str, Any]:
    """A small JSON-able excerpt of a tensor: shape, dtype and its first whole rows.

    ``shape`` is the whole tensor's; ``data`` holds its first ``rows`` rows along the first
    axis, flattened, as many as fit in :data:`SAMPLE_VALUES` values (a monitor reads rows,
    never a part of one). A tensor whose single row is larger keeps its first values and
    ``rows`` 0. Non-finite floats become None; bytes are decoded (invalid bytes replaced);
    strings are cut at 256 characters.
    """
    values = np.asarray(array)
    row_size = int(np.prod(values.shape[1:], dtype=np.int64)) if values.ndim else 1
    if values.ndim == 0:
        rows = 1
    elif 0 < row_size <= SAMPLE_VALUES:
        rows = min(values.shape[0], SAMPLE_VALUES // row_size)
    else:
        rows = 0
    flat = values.reshape(-1)[: rows * row_size if rows else SAMPLE_VALUES]
    return {
        "shape": [int(d) for d in values.shape][:16],
        "datatype": str(values.dtype.str if flat.dtype.kind in "SUO" else flat.dtype)[:32],
        "rows": rows,
        "data": [_plain(v) for v in flat.tolist()],
    }


def _plain(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")[:SAMPLE_TEXT]
    return str(value)[:SAMPLE_TEXT]


class DeploymentRouter:
    """Routes requests by a deployment's split and reports to the control plane.

    Thread-safe. ``choose``, ``observe`` and ``sample`` touch memory only; ``refresh`` and
    ``push`` talk to the control plane and are called by the background thread (or by hand).

    Args:
        client: a client of the control plane, with a token of a member of the deployment's team.
        name: the deployment.
        interval_s: seconds between two rounds of push + refresh in the background thread.
        clock: monotonic seconds; says how old the spec in use is (:meth:`spec_age_s`).
        rng: the randomness for requests without a sticky key, and for sampling.
    """

    def __init__(
        self,
        client: ShamalClient,
        name: str,
        *,
        interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be positive")
        self._client = client
        self.name = name
        self._interval_s = interval_s
        self._clock = clock
        self._rng = rng or random.Random()  # noqa: S311 - routing and sampling, not secrets
        self._lock = threading.Lock()
        self._deployment: Deployment | None = None
        self._serving: TrafficSplit | None = None
        self._loader: VersionSource | None = None
        self._fetched_at: float | None = None
        self._windows: dict[str, _Window] = {}
        self._samples: deque[dict[str, Any]] = deque(maxlen=SAMPLE_BUFFER)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ spec
    @property
    def deployment(self) -> Deployment | None:
        """The spec in use (None until the first successful refresh)."""
        return self._deployment

    def spec_age_s(self) -> float | None:
        """Seconds since the spec in use was fetched (None: never)."""
        return None if self._fetched_at is None else self._clock() - self._fetched_at

    def refresh(self) -> bool:
        """Fetch the spec; keep the one in use if the control plane fails. True on success.

        A new revision starts a new statistics window: calls counted under the old split
        describe traffic the control plane no longer routes.
        """
        try:
            fetched = deployment_from_json(self._client.get_deployment(self.name))
        except (ShamalError, KeyError, TypeError, ValueError) as exc:
            logger.warning(
                "deployment %r: could not refresh the spec (%s); keeping revision %s",
                self.name,
                getattr(exc, "code", exc.__class__.__name__),
                self._deployment.revision if self._deployment else None,
            )
            return False
        with self._lock:
            current = self._deployment
            moved = current is None or fetched.revision != current.revision
            if moved:
                self._windows = {}
                logger.info("deployment %r: revision %d", self.name, fetched.revision)
            self._deployment = fetched
            self._fetched_at = self._clock()
        self._follow(retry_failed=moved)
        return True

    def attach(self, loader: VersionSource) -> None:
        """Load versions through ``loader`` from now on, and route only to loaded ones."""
        with self._lock:
            self._loader = loader
            self._serving = None  # until now every version counted as loaded: none is
        loader.subscribe(self._follow)
        self._follow()

    @property
    def serving(self) -> TrafficSplit | None:
        """The split requests are routed by: the spec's loaded part (None: nothing loaded)."""
        return self._serving

    def _follow(self, retry_failed: bool = False) -> None:
        """Recompute the routable split, then ask the loader for every version the spec or
        that split names (the rest is unloaded once no request uses it)."""
        with self._lock:
            deployment, loader = self._deployment, self._loader
            if deployment is None:
                return
            if loader is None:
                self._serving = deployment.split
                return
            loaded = {
                int(v)
                for v, status in loader.statuses().items()
                if status.state is LoadState.LOADED and v.isdigit()
            }
            self._serving = routable_split(deployment.split, loaded, self._serving)
            routes = deployment.split.routes + (self._serving.routes if self._serving else ())
            # Under the lock, so two rounds cannot hand the loader their wishes out of order
            # (the loader calls listeners outside its own lock: no lock-order inversion).
            loader.want({r.version_key: r.concrete_uri for r in routes}, retry_failed=retry_failed)

    def versions(self) -> dict[str, list[str]]:
        """Model name (the deployment's) -> the versions a serve process must load."""
        deployment = self._deployment
        if deployment is None:
            return {}
        return {deployment.name: [str(v) for v in deployment.split.versions()]}

    def model_uris(self) -> dict[str, str]:
        """Version -> the ``models:/<model>/<version>`` URI to load it from."""
        deployment = self._deployment
        if deployment is None:
            return {}
        return {r.version_key: r.concrete_uri for r in deployment.split.routes}

    # ------------------------------------------------------------------ request path
    def choose(self, model: str, headers: Mapping[str, str]) -> RouteChoice:
        """The version for a request to the deployment (by its name or its model's name).

        Raises:
            NotFound: another model, or no spec fetched yet.
        """
        deployment, serving = self._deployment, self._serving
        if deployment is None or model not in (deployment.name, deployment.model_name):
            raise NotFound(f"Model '{model}' is not served here.")
        if serving is None:
            raise ServiceUnavailable(
                f"No version of deployment '{self.name}' is loaded yet; retry shortly.",
                retry_after_s=_RETRY_AFTER_S,
            )
        key = headers.get(deployment.sticky_header) or None
        choice = choose_route(serving, key, draw=self._rng.random)
        return RouteChoice(choice.version, choice.shadows)

    def observe(
        self, model: str, version: str, *, latency_s: float, ok: bool, shadow: bool
    ) -> None:
        """Count one finished call in its version's window (shadow calls too)."""
        del model, shadow  # windows are per version; a version has one role at a time
        slot = latency_slot(max(latency_s, 0.0) * 1000.0)
        with self._lock:
            window = self._windows.get(version)
            if window is None:
                window = self._windows[version] = _Window()
            if ok:
                window.ok += 1
            else:
                window.errors += 1
            window.counts[slot] += 1

    def sample(
        self,
        model: str,
        version: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray],
        request_id: str | None = None,
    ) -> None:
        """Keep this request at the deployment's sample rate (small excerpts of each tensor),
        with the caller's request id, by which labels that arrive later are joined to it."""
        deployment = self._deployment
        if deployment is None or deployment.sample_rate <= 0:
            return
        if self._rng.random() >= deployment.sample_rate:
            return
        shadow = any(r.version_key == version for r in deployment.split.shadows)
        record = {
            "revision": deployment.revision,
            "version": version,
            "shadow": shadow,
            "request_id": request_id[:128] if request_id else None,
            "inputs": {k[:128]: tensor_excerpt(v) for k, v in list(inputs.items())[:32]},
            "outputs": {k[:128]: tensor_excerpt(v) for k, v in list(outputs.items())[:32]},
        }
        with self._lock:
            self._samples.append(record)

    # ------------------------------------------------------------------ shipping
    def push(self) -> dict[str, Any] | None:
        """Ship the window and the samples; refresh at once if the answer names a newer
        revision. Returns the control plane's answer to the report (None if nothing was
        sent or it failed: the failure is logged and that window's counts are dropped, as
        they would be at the next revision anyway)."""
        with self._lock:
            deployment = self._deployment
            windows, self._windows = self._windows, {}
            samples = list(self._samples)
            self._samples.clear()
        if deployment is None:
            return None
        self._push_samples(samples)
        known = {r.version_key for r in deployment.split.routes}
        try:
            answer = self._client.report_deployment(
                self.name,
                deployment.revision,
                [w.as_report(v) for v, w in sorted(windows.items()) if v in known],
                **self._load_report(known),
            )
        except ShamalError as exc:
            logger.warning("deployment %r: report failed (%s)", self.name, exc.code)
            return None
        if int(answer.get("revision", 0)) != deployment.revision:
            logger.info("deployment %r: %s", self.name, answer.get("reason", ""))
            self.refresh()
        return answer

    def _load_report(self, known: Set[str]) -> dict[str, Any]:
        """The spec's versions still loading here, and those that failed to load (and why)."""
        loader = self._loader
        if loader is None:
            return {}
        statuses = loader.statuses()
        waiting = VersionStatus(LoadState.LOADING)  # asked for, not yet picked up
        mine = sorted((v, statuses.get(v, waiting)) for v in known)
        return {
            "loading": [v for v, s in mine if s.state is LoadState.LOADING],
            "failed": [
                {"version": v, "reason": s.reason[:MAX_REASON] or "failed to load"}
                for v, s in mine
                if s.state is LoadState.FAILED
            ],
        }

    def _push_samples(self, samples: list[dict[str, Any]]) -> None:
        for start in range(0, len(samples), _PUSH_BATCH):
            try:
                self._client.push_deployment_samples(
                    self.name, samples[start : start + _PUSH_BATCH]
                )
            except ShamalError as exc:
                logger.warning("deployment %r: samples dropped (%s)", self.name, exc.code)
                return

    def tick(self) -> None:
        """One round of the background thread: push, then refresh."""
        self.push()
        self.refresh()

    def start(self) -> None:
        """Fetch the spec (if not yet) and start the background thread."""
        if self._thread is not None:
            return
        if self._deployment is None:
            self.refresh()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"deployment-router-{self.name}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the router must outlive any one failure
                logger.exception("deployment %r: background round failed", self.name)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the background thread, then ship what is left (best effort)."""
        thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None:
            thread.join(timeout_s)
        try:
            self.push()
        except Exception:  # noqa: BLE001 - shutting down: log and go
            logger.exception("deployment %r: final report failed", self.name)
