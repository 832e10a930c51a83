"""The inference core: the :class:`InferenceService` every protocol front end calls.

It validates a decoded request against the model's metadata (names, datatypes, ranks, fixed
dims, batch limits, the NaN/Inf policy), picks the version through the traffic router, queues the
request on that version's batcher, mirrors it to shadow versions off the response path, and
keeps the metrics. It never coerces: an FP64 tensor sent to an FP32 input is a 400, not a cast.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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
from shamal.serving._datatypes import numpy_dtype
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


@dataclass(frozen=True)
class CoreOptions:
    """Server-wide serving knobs.

    Attributes:
        max_queue_delay_s: batch gathering delay for every batching model.
        queue_size: most waiting requests per model version.
        allow_nonfinite: accept NaN/Inf in float inputs (the default) or answer 400.
        server_version: reported by server metadata.
        drain_retry_after_s: ``Retry-After`` sent while draining.
    """

    max_queue_delay_s: float = 0.0
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
    ) -> None:
        self.repository = repository
        self.router = router
        self.options = options or CoreOptions()
        self.metrics = metrics or ServerMetrics()
        count = sum(1 for _ in repository.all())
        self._executor = ThreadPoolExecutor(max(1, count), thread_name_prefix="shamal-model")
        self._batchers: dict[tuple[str, str], Batcher] = {}
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
        for served in self.repository.all():
            policy = BatchPolicy(
                max_batch_size=served.backend.max_batch_size,
                max_queue_delay_s=self.options.max_queue_delay_s,
                queue_size=self.options.queue_size,
            )
            labels = (served.name, served.version)
            batcher = Batcher(
                served.backend, policy, executor=self._executor, metrics=self.metrics, labels=labels
            )
            batcher.start()
            self._batchers[labels] = batcher

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
            for batcher in self._batchers.values():
                await batcher.wait_idle()
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
        for batcher in self._batchers.values():
            await batcher.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)

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
        version = request.version or ""
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
            self.count(request.model, version, protocol, status, elapsed)

    def count(self, model: str, version: str, protocol: str, status: int, elapsed: float) -> None:
        """Record one finished call (front ends call it for requests they refused to decode)."""
        versions = self.repository.models.get(model)
        if versions is None:
            model, version = "_unknown", ""  # never a label per hostile model name
        elif version not in versions:
            version = ""
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
        inputs, rows = validate_inputs(served, request, self.options.allow_nonfinite)
        wanted = requested_outputs(served.metadata.outputs, request)
        deadline = request_deadline(request)
        batcher = self._batchers[(served.name, served.version)]
        results = await batcher.submit(inputs, rows, deadline)
        for shadow in shadows:
            self._mirror(served.name, shadow, request)
        specs = {spec.name: spec for spec in served.metadata.outputs}
        outputs = [
            OutputTensor(name, specs[name].datatype, tuple(results[name].shape), results[name])
            for name in wanted
        ]
        try:
            self.router.sample(served.name, served.version, inputs, results)
        except Exception:  # a monitor's failure never fails the caller
            logger.exception("The traffic router failed to take a sample")
        return InferResponse(served.name, served.version, request.id, outputs)

    def _mirror(self, model: str, version: str, request: InferRequest) -> None:
        """Run ``request`` on shadow ``version`` in the background; its answer is dropped."""
        batcher = self._batchers.get((model, version))
        if batcher is None:
            return
        task = asyncio.get_running_loop().create_task(
            self._shadow(batcher, model, version, request)
        )
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)

    async def _shadow(
        self, batcher: Batcher, model: str, version: str, request: InferRequest
    ) -> None:
        started = time.perf_counter()
        ok = True
        try:
            # Checked against the shadow's own tensors: a shadow may differ from the primary.
            served = self.repository.get(model, version)
            inputs, rows = validate_inputs(served, request, self.options.allow_nonfinite)
            await batcher.submit(inputs, rows, None)
        except InvalidParameter:
            ok = False  # the request fitted the primary: a mismatch is the shadow's failure
        except ShamalError as exc:
            ok = exc.status < 500
        except Exception:
            logger.debug("Shadow version %s of %s failed", version, model, exc_info=True)
            ok = False
        try:
            self.router.observe(
                model, version, latency_s=time.perf_counter() - started, ok=ok, shadow=True
            )
        except Exception:
            logger.exception("The traffic router failed to record a shadow call")


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
    known = {spec.name for spec in outputs}
    names: list[str] = []
    for wanted in request.outputs:
        if wanted.name not in known:
            raise InvalidParameter(
                f"The model has no output {wanted.name[:64]!r}; it returns {sorted(known)}."
            )
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
