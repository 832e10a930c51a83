"""The inference core: the :class:`InferenceService` every protocol front end calls.

It validates a decoded request against the model's metadata (names, datatypes, ranks, fixed
dims, batch limits, the NaN/Inf policy), picks the version through the traffic router, queues the
request on that version's batcher, mirrors it to shadow versions off the response path, and
keeps the metrics. It never coerces: an FP64 tensor sent to an FP32 input is a 400, not a cast.

Versions may be installed and retired while it serves (:meth:`InferenceCore.install`,
:meth:`InferenceCore.retire`, called from a loader thread): each version has a slot (batcher,
worker thread, count of requests using it) created and removed on the event loop, and a retired
version's slot lives until the requests that had already picked it are answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shamal.errors import (
    InternalError,
    InvalidParameter,
    NotFound,
    ServiceUnavailable,
    ShamalError,
)
from shamal.serving._batching import Batcher, BatchPolicy
from shamal.serving._classification import check_classifiable, top_classes
from shamal.serving._datatypes import numpy_dtype
from shamal.serving._features import FeatureLookup, with_features
from shamal.serving._metrics import ServerMetrics
from shamal.serving._repository import ModelRepository, ServedModel
from shamal.serving._routing import TrafficRouter
from shamal.serving._types import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    OutputTensor,
    ServerMetadata,
    TensorSpec,
)

__all__ = ["CoreOptions", "InferenceCore"]

logger = logging.getLogger(__name__)

EXTENSIONS = ("binary_tensor_data",)
_MAX_TIMEOUT_S = 3600.0
#: Longest wait for the event loop to start a new version's batcher.
_INSTALL_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class CoreOptions:
    """Server-wide serving knobs.

    Attributes:
        max_queue_delay_s: batch gathering delay for every batching model.
        queue_delays_s: served name -> its own gathering delay, in place of the default.
        queue_size: most waiting requests per model version.
        allow_nonfinite: accept NaN/Inf in float inputs (the default) or answer 400.
        server_version: reported by server metadata.
        drain_retry_after_s: ``Retry-After`` sent while draining.
    """

    max_queue_delay_s: float = 0.0
    queue_delays_s: Mapping[str, float] = field(default_factory=dict)
    queue_size: int = 256
    allow_nonfinite: bool = True
    server_version: str = "0.1.0"
    drain_retry_after_s: float = 5.0


class InferenceCore:
    """Implements :class:`shamal.serving._types.InferenceService` over a model repository.

    Build it, then call :meth:`start` on the serving event loop before the first request.
    """

    def __init__(
        self,
        repository: ModelRepository,
        router: TrafficRouter,
        *,
        options: CoreOptions | None = None,
        metrics: ServerMetrics | None = None,
        features: FeatureLookup | None = None,
    ) -> None:
        self.repository = repository
        self.router = router
        #: Where a deployment's feature service is read from (None: requests carry features).
        self.features = features
        self.options = options or CoreOptions()
        self.metrics = metrics or ServerMetrics()
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start_lock = threading.Lock()  # install() before start() vs start()
        self._draining = False
        self._stopped = False
        self._in_flight = 0
        self._idle: asyncio.Event | None = None
        self._shadow_tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Create and start one batcher per model version on the running loop."""
        self._idle = asyncio.Event()
        self._idle.set()
        with self._start_lock:
            self._loop = asyncio.get_running_loop()
            for served in self.repository.all():
                self._open_slot(served)

    def _open_slot(self, served: ServedModel) -> None:
        """The version's batcher and worker thread, started on the running loop."""
        policy = BatchPolicy(
            max_batch_size=served.backend.max_batch_size,
            max_queue_delay_s=self.options.queue_delays_s.get(
                served.name, self.options.max_queue_delay_s
            ),
            queue_size=self.options.queue_size,
        )
        labels = (served.name, served.version)
        # One worker per version: a batcher runs one batch at a time.
        executor = ThreadPoolExecutor(1, thread_name_prefix=f"shamal-model-{served.name}")
        batcher = Batcher(
            served.backend, policy, executor=executor, metrics=self.metrics, labels=labels
        )
        batcher.start()
        self._slots[labels] = _Slot(batcher, executor)

    # ------------------------------------------------------------------ versions while serving
    def install(self, served: ServedModel) -> None:
        """Serve a newly loaded version: its batcher starts on the event loop, then the
        repository lists it. Call from any thread but the loop's; blocks until done.

        Raises:
            InvalidParameter: that version is already served.
        """
        with self._start_lock:
            loop = self._loop
            if loop is None:  # not serving yet: start() makes its batcher
                self.repository.add(served)
                return
        asyncio.run_coroutine_threadsafe(self._install(served), loop).result(_INSTALL_TIMEOUT_S)

    async def _install(self, served: ServedModel) -> None:
        key = (served.name, served.version)
        if key in self._slots:
            raise InvalidParameter(f"Model '{served.name}' version {served.version} is served.")
        self._open_slot(served)
        try:
            self.repository.add(served)
        except BaseException:
            await self._close_slot(key)
            raise

    def retire(self, name: str, version: str, grace_s: float) -> None:
        """Stop serving a version: the repository drops it at once (new requests cannot pick
        it), requests that already did are answered, then its batcher stops and its backend
        closes. Waits at most ``grace_s`` for that; stragglers then finish in the background.
        Call from any thread but the loop's."""
        served = self.repository.withdraw(name, version)
        loop = self._loop
        if loop is None or self._stopped:
            if served is not None:
                served.backend.close()
            return
        done = asyncio.run_coroutine_threadsafe(self._retire((name, version), served), loop)
        try:
            done.result(grace_s)
        except FutureTimeout:
            logger.warning(
                "Model %s version %s still has requests after %.0f s; it closes when they end",
                name,
                version,
                grace_s,
            )

    async def _retire(self, key: tuple[str, str], served: ServedModel | None) -> None:
        slot = self._slots.get(key)
        if slot is not None:
            await slot.idle.wait()
            await slot.batcher.wait_idle()
            await self._close_slot(key)
        if served is not None:
            # Closing may block (a runtime freeing memory): off the loop.
            await asyncio.get_running_loop().run_in_executor(None, served.backend.close)

    async def _close_slot(self, key: tuple[str, str]) -> None:
        slot = self._slots.pop(key, None)
        if slot is None:
            return
        await slot.batcher.stop()
        slot.executor.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(KeyError):  # never seen a request: no gauge yet
            self.metrics.queue_depth.remove(*key)

    def begin_drain(self) -> None:
        """Readiness answers false and new inference requests 503 from now on."""
        self._draining = True
        for served in self.repository.all():
            served.ready = False

    @property
    def draining(self) -> bool:
        return self._draining

    async def drain(self, timeout_s: float) -> bool:
        """Wait until in-flight requests, queued batches and shadows are done.

        Returns:
            True when everything finished within ``timeout_s``.
        """
        self.begin_drain()

        async def settle() -> None:
            if self._idle is not None:
                await self._idle.wait()
            for slot in list(self._slots.values()):
                await slot.batcher.wait_idle()
            if self._shadow_tasks:
                await asyncio.gather(*self._shadow_tasks, return_exceptions=True)

        try:
            await asyncio.wait_for(settle(), timeout_s)
        except TimeoutError:
            logger.warning("Drain timed out after %.1f s with requests still running", timeout_s)
            return False
        return True

    async def stop(self) -> None:
        """Stop the batchers and the worker threads (after :meth:`drain`)."""
        self._stopped = True
        for key in list(self._slots):
            await self._close_slot(key)

    # ------------------------------------------------------------------ health and metadata
    def live(self) -> bool:
        return not self._stopped

    def ready(self) -> bool:
        return not self._draining and all(served.ready for served in self.repository.all())

    def model_ready(self, model: str, version: str | None) -> bool:
        if self._draining:
            return False
        versions = self.repository.models.get(model)
        if not versions:
            return False
        if version is None:
            return any(served.ready for served in versions.values())
        served = versions.get(version)
        return served is not None and served.ready

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata("shamal", self.options.server_version, EXTENSIONS)

    def model_metadata(self, model: str, version: str | None) -> ModelMetadata:
        return self._served(model, version, {}).metadata

    def raw_input(
        self, model: str, version: str | None, headers: Mapping[str, str]
    ) -> tuple[TensorSpec, bool]:
        """The one input a raw binary request fills, and whether its first dim is the batch.

        Raises:
            NotFound: no such model or version.
            InvalidParameter: the model has more than one input.
        """
        served = self._served(model, version, headers)
        inputs = served.metadata.inputs
        if len(inputs) != 1:
            raise InvalidParameter(
                f"Model '{model}' has {len(inputs)} inputs; a raw binary request "
                "(Inference-Header-Content-Length: 0) fills exactly one. Send a JSON header "
                "with binary_data_size on each input."
            )
        return inputs[0], served.backend.max_batch_size > 0

    def check_served(self, model: str, version: str | None) -> None:
        """Raise unless ``model`` (and ``version``, when given) is served here: front ends
        call it before they read a body, so an unknown model is a 404 whatever the body holds.

        Raises:
            NotFound: no such model or version.
        """
        versions = self.repository.models.get(model)
        if versions is None:
            raise NotFound(f"Model '{model[:128]}' is not served here.")
        if version is not None and version not in versions:
            raise NotFound(f"Model '{model[:128]}' has no version '{version[:32]}' here.")

    def model_names(self) -> list[str]:
        return sorted(self.repository.models)

    # ------------------------------------------------------------------ inference
    async def infer(self, request: InferRequest) -> InferResponse:
        """Run one request (gRPC and other callers; the REST front end says its protocol)."""
        return await self.infer_via(request, "grpc")

    async def infer_via(self, request: InferRequest, protocol: str) -> InferResponse:
        """Run one request and count it under ``protocol``.

        Raises:
            NotFound, InvalidParameter, TooManyRequests, ServiceUnavailable, DeadlineExceeded,
            InternalError: see :class:`InferenceService`.
        """
        started = time.perf_counter()
        version: str | None = None  # the version that took the request, once routed
        status = 500
        self._enter()
        try:
            if self._draining:
                raise ServiceUnavailable(
                    "The server is shutting down; retry on another replica.",
                    retry_after_s=self.options.drain_retry_after_s,
                )
            served, shadows = self._route(request)
            version = served.version
            response = await self._run(served, request, shadows)
            status = 200
            return response
        except ShamalError as exc:
            status = exc.status
            raise
        except Exception:
            logger.exception("Inference on model %s failed", request.model)
            raise InternalError("The model failed to answer this request.") from None
        finally:
            self._leave()
            elapsed = time.perf_counter() - started
            if version is None:  # refused before routing: the request's names are unchecked
                self.count(request.model, request.version or "", protocol, status, elapsed)
            else:  # counted under the version that answered, even one retired meanwhile
                self._record(request.model, version, protocol, status, elapsed)

    def count(self, model: str, version: str, protocol: str, status: int, elapsed: float) -> None:
        """Record one finished call (front ends call it for requests they refused to decode)."""
        versions = self.repository.models.get(model)
        if versions is None:
            model, version = "_unknown", ""  # never a label per hostile model name
        elif version not in versions:
            version = ""
        self._record(model, version, protocol, status, elapsed)

    def _record(self, model: str, version: str, protocol: str, status: int, elapsed: float) -> None:
        """Count a call under labels already known to be served names."""
        self.metrics.requests.labels(model, version, protocol, str(status)).inc()
        if status == 200:
            self.metrics.latency.labels(model, version, protocol).observe(elapsed)
        if not version:
            return
        try:
            self.router.observe(model, version, latency_s=elapsed, ok=status < 500, shadow=False)
        except Exception:  # a monitor's failure never fails the caller
            logger.exception("The traffic router failed to record a call")

    def _enter(self) -> None:
        self._in_flight += 1
        if self._idle is not None:
            self._idle.clear()

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0 and self._idle is not None:
            self._idle.set()

    def _route(self, request: InferRequest) -> tuple[ServedModel, tuple[str, ...]]:
        if request.version is not None:
            return self._served(request.model, request.version, request.headers), ()
        if request.model not in self.repository.models:
            raise NotFound(f"Model '{request.model}' is not served here.")
        choice = self.router.choose(request.model, request.headers)
        served = self.repository.models.get(request.model, {}).get(choice.version)
        if served is None:  # retired between the router's choice and now: ask again
            choice = self.router.choose(request.model, request.headers)
            served = self.repository.get(request.model, choice.version)
        return served, choice.shadows

    def _served(self, model: str, version: str | None, headers: Mapping[str, str]) -> ServedModel:
        if version is None:
            if model not in self.repository.models:
                raise NotFound(f"Model '{model}' is not served here.")
            version = self.router.choose(model, headers).version
        return self.repository.get(model, version)

    async def _run(
        self, served: ServedModel, request: InferRequest, shadows: tuple[str, ...]
    ) -> InferResponse:
        if self.features is not None:
            request = await with_features(self.features, served, request)
        inputs, rows = validate_inputs(served, request, self.options.allow_nonfinite)
        wanted = requested_outputs(served.metadata.outputs, request)
        deadline = request_deadline(request)
        slot = self._slots[(served.name, served.version)]
        slot.enter()
        try:
            results = await slot.batcher.submit(inputs, rows, deadline)
        finally:
            slot.leave()
        for shadow in shadows:
            self._mirror(served.name, shadow, request)
        specs = {spec.name: spec for spec in served.metadata.outputs}
        counts = {wanted.name: wanted.class_count for wanted in request.outputs}
        outputs = []
        for name in wanted:
            data, datatype = results[name], specs[name].datatype
            if counts.get(name):
                batched = served.backend.max_batch_size > 0
                labels = served.labels.get(name, ())
                data = top_classes(data, counts[name], batched=batched, labels=labels)
                datatype = "BYTES"
            outputs.append(OutputTensor(name, datatype, tuple(data.shape), data))
        try:
            self.router.sample(served.name, served.version, inputs, results, request.id)
        except Exception:  # a monitor's failure never fails the caller
            logger.exception("The traffic router failed to take a sample")
        return InferResponse(served.name, served.version, request.id, outputs)

    def _mirror(self, model: str, version: str, request: InferRequest) -> None:
        """Run ``request`` on shadow ``version`` in the background; its answer is dropped."""
        slot = self._slots.get((model, version))
        served = self.repository.models.get(model, {}).get(version)
        if slot is None or served is None:
            return  # not loaded (yet), or retired: nothing to mirror to
        slot.enter()  # from now until the shadow call ends: a retire waits for it
        task = asyncio.get_running_loop().create_task(self._shadow(slot, served, request))
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)

    async def _shadow(self, slot: _Slot, served: ServedModel, request: InferRequest) -> None:
        model, version = served.name, served.version
        started = time.perf_counter()
        ok = True
        try:
            # Checked against the shadow's own tensors: a shadow may differ from the primary.
            inputs, rows = validate_inputs(served, request, self.options.allow_nonfinite)
            await slot.batcher.submit(inputs, rows, None)
        except InvalidParameter:
            ok = False  # the request fitted the primary: a mismatch is the shadow's failure
        except ShamalError as exc:
            ok = exc.status < 500
        except Exception:
            logger.debug("Shadow version %s of %s failed", version, model, exc_info=True)
            ok = False
        finally:
            slot.leave()
        try:
            self.router.observe(
                model, version, latency_s=time.perf_counter() - started, ok=ok, shadow=True
            )
        except Exception:
            logger.exception("The traffic router failed to record a shadow call")


class _Slot:
    """One served version's batcher and worker, and how many requests are using it."""

    __slots__ = ("batcher", "executor", "idle", "users")

    def __init__(self, batcher: Batcher, executor: ThreadPoolExecutor) -> None:
        self.batcher = batcher
        self.executor = executor
        self.users = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def enter(self) -> None:
        self.users += 1
        self.idle.clear()

    def leave(self) -> None:
        self.users -= 1
        if self.users == 0:
            self.idle.set()


def validate_inputs(
    served: ServedModel, request: InferRequest, allow_nonfinite: bool
) -> tuple[dict[str, np.ndarray], int]:
    """The request's tensors by name, checked against the model; and its batch rows.

    Raises:
        InvalidParameter: unknown, duplicate or missing inputs; another datatype; another rank
            or fixed dim; an empty tensor; more rows than the model batches; NaN/Inf refused.
    """
    specs = {spec.name: spec for spec in served.metadata.inputs}
    max_batch = served.backend.max_batch_size
    arrays: dict[str, np.ndarray] = {}
    rows = 1
    for tensor in request.inputs:
        spec = specs.get(tensor.name)
        if spec is None:
            raise InvalidParameter(
                f"Model '{served.name}' has no input {tensor.name[:64]!r}; it takes "
                f"{sorted(specs)}."
            )
        if tensor.name in arrays:
            raise InvalidParameter(f"Input {tensor.name!r} is given twice.")
        _check_tensor(spec, tensor.datatype, tensor.data, allow_nonfinite)
        arrays[tensor.name] = tensor.data
        if max_batch > 0:
            rows = _check_rows(spec, tensor.data, rows if len(arrays) > 1 else None, max_batch)
    missing = sorted(set(specs) - set(arrays))
    if missing:
        raise InvalidParameter(f"Model '{served.name}' needs the inputs {missing}.")
    return arrays, rows


def _check_tensor(spec: TensorSpec, datatype: str, data: np.ndarray, allow_nonfinite: bool) -> None:
    if datatype != spec.datatype:
        raise InvalidParameter(
            f"Input '{spec.name}' must be {spec.datatype}, not {datatype[:16]}; "
            "convert it before sending (the server does not cast)."
        )
    if data.dtype != numpy_dtype(datatype) and datatype != "BYTES":
        raise InvalidParameter(f"Input '{spec.name}' does not hold {datatype} data.")
    if len(data.shape) != len(spec.shape):
        raise InvalidParameter(
            f"Input '{spec.name}' must have rank {len(spec.shape)} (shape {list(spec.shape)}), "
            f"not {len(data.shape)}."
        )
    for got, want in zip(data.shape, spec.shape, strict=True):
        if want >= 0 and got != want:
            raise InvalidParameter(
                f"Input '{spec.name}' has shape {list(data.shape)}; the model takes "
                f"{list(spec.shape)} (-1 = any)."
            )
    if data.size == 0:
        raise InvalidParameter(f"Input '{spec.name}' is empty; send at least one element.")
    if not allow_nonfinite and data.dtype.kind == "f" and not np.isfinite(data).all():
        raise InvalidParameter(f"Input '{spec.name}' holds NaN or infinite values.")


def _check_rows(spec: TensorSpec, data: np.ndarray, rows: int | None, max_batch: int) -> int:
    count = int(data.shape[0])
    if count > max_batch:
        raise InvalidParameter(
            f"Input '{spec.name}' has {count} rows; this model takes at most {max_batch} per "
            "request. Split the batch."
        )
    if rows is not None and count != rows:
        raise InvalidParameter("Every input must have the same number of rows (first dim).")
    return count


def requested_outputs(outputs: tuple[TensorSpec, ...], request: InferRequest) -> list[str]:
    """Names of the outputs to return, in request order (model order when none is asked for).

    Raises:
        InvalidParameter: an unknown or duplicate output name.
    """
    if not request.outputs:
        return [spec.name for spec in outputs]
    known = {spec.name: spec for spec in outputs}
    names: list[str] = []
    for wanted in request.outputs:
        if wanted.name not in known:
            raise InvalidParameter(
                f"The model has no output {wanted.name[:64]!r}; it returns {sorted(known)}."
            )
        if wanted.class_count:
            check_classifiable(wanted.name, known[wanted.name].datatype)
        if wanted.name in names:
            raise InvalidParameter(f"Output {wanted.name!r} is requested twice.")
        names.append(wanted.name)
    return names


def request_deadline(request: InferRequest) -> float | None:
    """The request's deadline on the monotonic clock, from the earliest of: the front end's
    ``deadline``, the ``x-request-timeout-ms`` header, the ``timeout`` parameter (microseconds,
    as Triton).

    Raises:
        InvalidParameter: a timeout that is not a positive number.
    """
    now = time.monotonic()
    candidates = [request.deadline] if request.deadline is not None else []
    header = request.headers.get("x-request-timeout-ms")
    if header is not None:
        candidates.append(now + _timeout_s(header, 1e-3, "x-request-timeout-ms"))
    param = request.parameters.get("timeout")
    if param is not None:
        candidates.append(now + _timeout_s(param, 1e-6, "timeout"))
    return min(candidates) if candidates else None


def _timeout_s(value: Any, unit: float, what: str) -> float:
    try:
        number = float(value) if not isinstance(value, bool) else -1.0
    except (TypeError, ValueError):
        number = -1.0
    if not number >= 0:
        raise InvalidParameter(f"{what} must be a non-negative number.")
    return min(number * unit, _MAX_TIMEOUT_S) if number > 0 else _MAX_TIMEOUT_S
