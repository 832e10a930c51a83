"""The batch loop in-process: queue delay, batch limits, compatible shapes, splitting, failures.

The backend here is a real (tiny) one that doubles its input and records every batch it ran.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from shamal.errors import InternalError, TooManyRequests
from shamal.serving._batching import Batcher, BatchPolicy
from shamal.serving._metrics import ServerMetrics
from shamal.serving._types import TensorSpec


class Doubler:
    platform = "test"
    inputs = (TensorSpec("x", "FP32", (-1, -1)),)
    outputs = (TensorSpec("y", "FP32", (-1, -1)),)
    max_batch_size = 8

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[int] = []
        self.fail = fail

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.batches.append(int(inputs["x"].shape[0]))
        if self.fail:
            raise RuntimeError("secret runtime detail")
        return {"y": inputs["x"] * 2}

    def close(self) -> None:
        pass


async def _with_batcher(backend: Doubler, policy: BatchPolicy, body: object) -> object:
    with ThreadPoolExecutor(1) as pool:
        batcher = Batcher(
            backend, policy, executor=pool, metrics=ServerMetrics(), labels=("m", "1")
        )
        batcher.start()
        try:
            return await body(batcher)  # type: ignore[operator]
        finally:
            await batcher.stop()


def _rows(n: int, width: int = 2, start: float = 0.0) -> dict[str, np.ndarray]:
    return {"x": np.arange(n * width, dtype=np.float32).reshape(n, width) + start}


def test_a_full_batch_does_not_wait_for_the_delay() -> None:
    backend = Doubler()

    async def body(batcher: Batcher) -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(*(batcher.submit(_rows(2, start=i), 2, None) for i in range(4)))

    started = time.monotonic()
    results = asyncio.run(
        _with_batcher(backend, BatchPolicy(max_batch_size=8, max_queue_delay_s=30.0), body)
    )
    assert time.monotonic() - started < 10
    assert backend.batches == [8]
    for i, result in enumerate(results):  # type: ignore[arg-type]
        np.testing.assert_array_equal(result["y"], _rows(2, start=i)["x"] * 2)


def test_a_lone_request_waits_up_to_the_delay() -> None:
    backend = Doubler()

    async def body(batcher: Batcher) -> float:
        started = time.monotonic()
        await batcher.submit(_rows(1), 1, None)
        return time.monotonic() - started

    waited = asyncio.run(
        _with_batcher(backend, BatchPolicy(max_batch_size=8, max_queue_delay_s=0.2), body)
    )
    assert waited >= 0.19  # type: ignore[operator]
    assert backend.batches == [1]


def test_batches_respect_the_row_limit_and_shapes() -> None:
    backend = Doubler()

    async def body(batcher: Batcher) -> list[dict[str, np.ndarray]]:
        requests = [
            batcher.submit(_rows(5), 5, None),
            batcher.submit(_rows(5), 5, None),  # would pass 8 rows: next batch
            batcher.submit(_rows(1, width=3), 1, None),  # another width: not batched with it
        ]
        return await asyncio.gather(*requests)

    results = asyncio.run(_with_batcher(backend, BatchPolicy(max_batch_size=8), body))
    assert backend.batches == [5, 5, 1]
    assert results[2]["y"].shape == (1, 3)  # type: ignore[index]


def test_no_batching_runs_requests_one_by_one() -> None:
    backend = Doubler()

    async def body(batcher: Batcher) -> object:
        return await asyncio.gather(*(batcher.submit(_rows(1), 1, None) for _ in range(3)))

    asyncio.run(_with_batcher(backend, BatchPolicy(max_batch_size=0), body))
    assert backend.batches == [1, 1, 1]


def test_runtime_failure_is_a_generic_internal_error() -> None:
    backend = Doubler(fail=True)

    async def body(batcher: Batcher) -> object:
        return await asyncio.gather(
            batcher.submit(_rows(1), 1, None), batcher.submit(_rows(1), 1, None),
            return_exceptions=True,
        )  # fmt: skip

    errors = asyncio.run(_with_batcher(backend, BatchPolicy(max_batch_size=8), body))
    for error in errors:  # type: ignore[attr-defined]
        assert isinstance(error, InternalError)
        assert "secret" not in error.message


def test_queue_bound_and_idle_tracking() -> None:
    backend = Doubler()

    async def body(batcher: Batcher) -> None:
        waiting = [asyncio.ensure_future(batcher.submit(_rows(1), 1, None)) for _ in range(2)]
        await asyncio.sleep(0)  # let both enqueue (they never yield before enqueueing)
        with pytest.raises(TooManyRequests) as caught:
            await batcher.submit(_rows(1), 1, None)
        assert caught.value.retry_after_s is not None
        await asyncio.gather(*waiting)
        await asyncio.wait_for(batcher.wait_idle(), 10)
        assert batcher.depth == 0

    asyncio.run(_with_batcher(backend, BatchPolicy(max_batch_size=8, queue_size=2), body))
