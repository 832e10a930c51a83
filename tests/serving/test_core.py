"""The inference core in-process, through the protocol-independent ``InferenceService`` API
(what the gRPC front end calls): validation, policies, routing, shadows, samples."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from shamal.errors import InternalError, InvalidParameter, NotFound, ServiceUnavailable
from shamal.serving._backends import BackendOptions
from shamal.serving._core import CoreOptions, InferenceCore
from shamal.serving._repository import ModelSource, load_repository
from shamal.serving._routing import LatestVersionRouter, RouteChoice
from shamal.serving._types import InferInput, InferRequest, RequestedOutput
from tests.serving.models import add_sub_model, scale_model

T = TypeVar("T")


class RecordingRouter:
    """A real router: version 1 answers, version 2 shadows; it records what it hears."""

    def __init__(self) -> None:
        self.observed: list[tuple[str, bool, bool]] = []
        self.samples: list[tuple[str, dict[str, np.ndarray], str | None]] = []

    def choose(self, model: str, headers: Mapping[str, str]) -> RouteChoice:
        return RouteChoice("1", ("2",))

    def observe(
        self, model: str, version: str, *, latency_s: float, ok: bool, shadow: bool
    ) -> None:
        self.observed.append((version, ok, shadow))

    def sample(
        self,
        model: str,
        version: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray],
        request_id: str | None = None,
    ) -> None:
        self.samples.append((version, dict(outputs), request_id))


def _core(tmp_path: Path, router: Any = None, **options: Any) -> InferenceCore:
    sources = [
        ModelSource("scale", "1", str(scale_model(tmp_path / "s1.onnx", 2.0))),
        ModelSource("scale", "2", str(scale_model(tmp_path / "s2.onnx", 3.0))),
        ModelSource("add_sub", None, str(add_sub_model(tmp_path / "a.onnx"))),
    ]
    repository = load_repository(sources, BackendOptions(threads=1), work_dir=tmp_path)
    router = router or LatestVersionRouter(repository.version_map())
    return InferenceCore(repository, router, options=CoreOptions(**options))


def _run(core: InferenceCore, work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    async def main() -> T:
        core.start()
        try:
            return await work()
        finally:
            await core.drain(10)
            await core.stop()

    return asyncio.run(main())


def _x(values: list[float], datatype: str = "FP32", name: str = "x") -> InferInput:
    array = np.array([values], dtype=np.float32 if datatype == "FP32" else np.float64)
    return InferInput(name, datatype, array.shape, array)


def _request(*inputs: InferInput, model: str = "scale", **kw: Any) -> InferRequest:
    return InferRequest(
        model=model, version=kw.pop("version", None), id="r1", inputs=list(inputs), **kw
    )


def test_latest_version_answers_and_id_is_echoed(tmp_path: Path) -> None:
    core = _core(tmp_path)
    response = _run(core, lambda: core.infer(_request(_x([1.0, 2.0]))))
    assert response.model_version == "2"
    assert response.id == "r1"
    assert response.outputs[0].data.tolist() == [[3.0, 6.0]]
    pinned = _run(
        core := _core(tmp_path), lambda: core.infer(_request(_x([1.0, 2.0]), version="1"))
    )
    assert pinned.outputs[0].data.tolist() == [[2.0, 4.0]]


def test_requested_outputs_subset_in_request_order(tmp_path: Path) -> None:
    core = _core(tmp_path)
    a = InferInput("INPUT0", "FP32", (1, 4), np.ones((1, 4), np.float32))
    b = InferInput("INPUT1", "FP32", (1, 4), np.ones((1, 4), np.float32))
    wanted = [RequestedOutput("OUTPUT1"), RequestedOutput("OUTPUT0")]
    response = _run(core, lambda: core.infer(_request(a, b, model="add_sub", outputs=wanted)))
    assert [o.name for o in response.outputs] == ["OUTPUT1", "OUTPUT0"]
    assert response.outputs[0].data.tolist() == [[0.0] * 4]


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        (_request(_x([1.0, 2.0], "FP64")), InvalidParameter),
        (_request(_x([1.0, 2.0, 3.0])), InvalidParameter),
        (_request(_x([1.0, 2.0], name="nope")), InvalidParameter),
        (_request(_x([1.0, 2.0]), model="ghost"), NotFound),
        (_request(_x([1.0, 2.0]), version="9"), NotFound),
        (_request(_x([1.0, 2.0]), outputs=[RequestedOutput("z")]), InvalidParameter),
        (_request(_x([1.0, 2.0]), parameters={"timeout": -5}), InvalidParameter),
        (_request(_x([1.0, 2.0]), headers={"x-request-timeout-ms": "soon"}), InvalidParameter),
    ],
)
def test_invalid_requests(tmp_path: Path, request_: InferRequest, error: type[Exception]) -> None:
    core = _core(tmp_path)
    with pytest.raises(error):
        _run(core, lambda: core.infer(request_))


def test_timeout_zero_means_no_deadline(tmp_path: Path) -> None:
    core = _core(tmp_path)
    response = _run(core, lambda: core.infer(_request(_x([1.0, 1.0]), parameters={"timeout": 0})))
    assert response.outputs[0].data.tolist() == [[3.0, 3.0]]


def test_nonfinite_policy(tmp_path: Path) -> None:
    nan = _request(_x([float("nan"), 1.0]))
    allowed = _core(tmp_path)
    assert np.isnan(_run(allowed, lambda: allowed.infer(nan)).outputs[0].data[0, 0])
    strict = _core(tmp_path, allow_nonfinite=False)
    with pytest.raises(InvalidParameter, match="NaN"):
        _run(strict, lambda: strict.infer(nan))


def test_shadow_runs_off_the_response_path(tmp_path: Path) -> None:
    router = RecordingRouter()
    core = _core(tmp_path, router=router)
    response = _run(core, lambda: core.infer(_request(_x([1.0, 2.0]))))
    assert response.model_version == "1"
    assert response.outputs[0].data.tolist() == [[2.0, 4.0]]
    assert ("1", True, False) in router.observed
    assert ("2", True, True) in router.observed  # drained before stop: the shadow finished
    # the caller's request id goes with the sample: labels posted later name it
    assert [(version, request_id) for version, _, request_id in router.samples] == [("1", "r1")]


def test_draining_refuses_with_retry_after(tmp_path: Path) -> None:
    core = _core(tmp_path)

    async def work() -> None:
        core.begin_drain()
        assert not core.ready()
        assert not core.model_ready("scale", None)
        with pytest.raises(ServiceUnavailable) as caught:
            await core.infer(_request(_x([1.0, 2.0])))
        assert caught.value.retry_after_s

    _run(core, work)


def test_a_shadow_that_does_not_fit_fails_alone(tmp_path: Path) -> None:
    sources = [
        ModelSource("mixed", "1", str(scale_model(tmp_path / "s.onnx", 2.0))),
        ModelSource("mixed", "2", str(add_sub_model(tmp_path / "a.onnx"))),
    ]
    repository = load_repository(sources, BackendOptions(threads=1), work_dir=tmp_path)
    router = RecordingRouter()
    core = InferenceCore(repository, router)
    response = _run(core, lambda: core.infer(_request(_x([1.0, 2.0]), model="mixed")))
    assert response.outputs[0].data.tolist() == [[2.0, 4.0]]
    assert ("2", False, True) in router.observed
    assert ("1", True, False) in router.observed


def test_a_call_is_counted_under_its_version_even_if_that_version_left_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollback withdraws a canary while its last requests are still running: their
    failures stay the canary's, in the metrics and in what the router hears."""
    router = RecordingRouter()
    core = _core(tmp_path, router=router)
    entered, release = threading.Event(), threading.Event()

    def failing_kernel(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        entered.set()
        release.wait(10)
        raise RuntimeError("index out of range")

    monkeypatch.setattr(core.repository.get("scale", "2").backend, "run", failing_kernel)

    async def work() -> None:
        call = asyncio.create_task(core.infer(_request(_x([1.0, 2.0]), version="2")))
        assert await asyncio.to_thread(entered.wait, 10)
        assert core.repository.withdraw("scale", "2") is not None
        release.set()
        with pytest.raises(InternalError):
            await call

    _run(core, work)
    failed = core.metrics.registry.get_sample_value(
        "shamal_inference_requests_total",
        {"model": "scale", "version": "2", "protocol": "grpc", "status": "500"},
    )
    assert failed == 1.0
    assert ("2", False, False) in router.observed
