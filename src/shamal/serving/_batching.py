"""Dynamic batching: one bounded queue and one batch loop per served model version.

Requests wait in a FIFO queue of at most ``queue_size`` entries; a full queue answers
:class:`TooManyRequests` at once (never an unbounded wait). The loop takes the oldest request,
adds later ones whose non-batch dims match until ``max_batch_size`` rows are gathered or
``max_queue_delay_s`` has passed since the oldest arrived (Triton's rule: with delay 0 it takes
whatever is waiting right now), concatenates them along the first dim, runs the batch on a worker
thread, and splits every output back by rows. One batch per model runs at a time, so while one
runs the next one fills up: under load batches grow by themselves, at low load nothing waits.

A request whose deadline passes before its batch starts is dropped and answered
:class:`DeadlineExceeded`; once a batch has started, its requests are answered.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from shamal.errors import InternalError, ShamalError, TooManyRequests
from shamal.serving._backends import Backend
from shamal.serving._metrics import ServerMetrics
from shamal.serving._types import DeadlineExceeded

__all__ = ["BatchPolicy", "Batcher"]

logger = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class BatchPolicy:
    """Batching knobs of one model version.

    Attributes:
        max_batch_size: most rows per batch; 0 runs every request on its own.
        max_queue_delay_s: how long the oldest request may wait for company.
        queue_size: most requests waiting (not counting the batch that runs).
    """

    max_batch_size: int
    max_queue_delay_s: float = 0.0
    queue_size: int = 256


@dataclass(eq=False)
class _Pending:
    inputs: Mapping[str, np.ndarray]
    rows: int
    future: asyncio.Future[Outputs]
    started: bool = False
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class Batcher:
    """The queue and batch loop of one model version. Lives on one event loop.

    ``submit`` may be called only from the loop that ran :meth:`start`.
    """

    def __init__(
        self,
        backend: Backend,
        policy: BatchPolicy,
        *,
        executor: Executor,
        metrics: ServerMetrics,
        labels: tuple[str, str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backend = backend
        self._policy = policy
        self._executor = executor
        self._clock = clock
        self._queue: deque[_Pending] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._outstanding = 0
        self._task: asyncio.Task[None] | None = None
        self._depth = metrics.queue_depth.labels(*labels)
        self._batch_rows = metrics.batch_size.labels(*labels)
        self._batch_seconds = 0.001  # moving average, for Retry-After estimates
        self._name = f"{labels[0]}:{labels[1]}"

    def start(self) -> None:
        """Start the batch loop on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=self._name)

    async def stop(self) -> None:
        """Cancel the loop; call after :meth:`wait_idle`."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    @property
    def depth(self) -> int:
        return len(self._queue)

    async def wait_idle(self) -> None:
        """Return once nothing is queued or running."""
        await self._idle.wait()

    def retry_after_s(self) -> float:
        """A guess at when the queue will have room: the time to run what waits now."""
        batches = math.ceil(len(self._queue) / max(1, self._policy.max_batch_size))
        return max(1.0, math.ceil(batches * self._batch_seconds))

    async def submit(
        self, inputs: Mapping[str, np.ndarray], rows: int, deadline: float | None
    ) -> Outputs:
        """Queue one request and wait for its outputs.

        Raises:
            TooManyRequests: the queue is full.
            DeadlineExceeded: ``deadline`` (a clock value) passed before its batch started.
            InternalError: the runtime failed on its batch.
        """
        if len(self._queue) >= self._policy.queue_size:
            raise TooManyRequests(
                f"The queue of model '{self._name}' is full; retry later.",
                retry_after_s=self.retry_after_s(),
            )
        loop = asyncio.get_running_loop()
        item = _Pending(inputs, rows, loop.create_future())
        if deadline is not None:
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise DeadlineExceeded("The request's deadline passed before it could run.")
            item.timer = loop.call_later(remaining, self._expire, item)
        self._queue.append(item)
        self._outstanding += 1
        self._idle.clear()
        self._depth.inc()
        self._wake.set()
        return await item.future

    def _expire(self, item: _Pending) -> None:
        if item.started or item.future.done():
            return
        item.future.set_exception(
            DeadlineExceeded("The request's deadline passed while it waited in the queue.")
        )
        self._queue.remove(item)
        self._drop(item)

    async def _loop(self) -> None:
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._gather_delay()
            batch = self._take()
            if batch:
                await self._run(batch)

    async def _gather_delay(self) -> None:
        """Wait up to the queue delay for a full batch (no wait when the delay is 0)."""
        delay = self._policy.max_queue_delay_s
        limit = self._policy.max_batch_size
        if delay <= 0 or limit <= 0:
            return
        until = self._clock() + delay
        while sum(item.rows for item in self._queue) < limit:
            remaining = until - self._clock()
            if remaining <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except TimeoutError:
                return

    def _take(self) -> list[_Pending]:
        """Pop the next batch: compatible requests in FIFO order, dropped ones skipped."""
        batch: list[_Pending] = []
        rows = 0
        limit = self._policy.max_batch_size
        while self._queue:
            item = self._queue[0]
            if item.future.done():  # its caller went away while it waited
                self._queue.popleft()
                self._drop(item)
                continue
            if batch and (limit <= 0 or rows + item.rows > limit or not _fits(batch[0], item)):
                break
            self._queue.popleft()
            self._depth.dec()
            item.started = True
            if item.timer is not None:
                item.timer.cancel()
            batch.append(item)
            rows += item.rows
            if limit <= 0:
                break
        return batch

    def _drop(self, item: _Pending) -> None:
        """Account for a request that left the queue without running."""
        self._depth.dec()
        self._finish_started()

    async def _run(self, batch: list[_Pending]) -> None:
        rows = sum(item.rows for item in batch)
        self._batch_rows.observe(rows)
        loop = asyncio.get_running_loop()
        started = self._clock()
        try:
            if len(batch) == 1:
                outputs = await loop.run_in_executor(
                    self._executor, self._backend.run, batch[0].inputs
                )
                results = [outputs]
            else:
                merged = {
                    name: np.concatenate([item.inputs[name] for item in batch])
                    for name in batch[0].inputs
                }
                outputs = await loop.run_in_executor(self._executor, self._backend.run, merged)
                results = _split(outputs, [item.rows for item in batch])
        except Exception as exc:
            error: ShamalError = (
                exc
                if isinstance(exc, ShamalError)
                else InternalError(f"Model '{self._name}' failed to run this request.")
            )
            if not isinstance(exc, ShamalError):
                logger.exception("Model %s failed on a batch of %d rows", self._name, rows)
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(error)
                self._finish_started()
            return
        finally:
            elapsed = self._clock() - started
            self._batch_seconds = 0.8 * self._batch_seconds + 0.2 * elapsed
        for item, result in zip(batch, results, strict=True):
            if not item.future.done():
                item.future.set_result(result)
            self._finish_started()

    def _finish_started(self) -> None:
        self._outstanding -= 1
        if self._outstanding == 0:
            self._idle.set()


def _fits(first: _Pending, other: _Pending) -> bool:
    """Same inputs with the same non-batch dims: the two can share a batch."""
    for name, array in first.inputs.items():
        mine = other.inputs.get(name)
        if mine is None or mine.shape[1:] != array.shape[1:] or mine.dtype != array.dtype:
            return False
    return True


def _split(outputs: Outputs, rows: list[int]) -> list[Outputs]:
    """Cut every output of a batch back into one piece per request, by rows.

    Raises:
        InternalError: an output whose first dim is not the batch's row count.
    """
    total = sum(rows)
    bounds = np.cumsum([0, *rows])
    pieces: list[Outputs] = [{} for _ in rows]
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise InternalError(f"Output '{name}' does not have one row per batched input row.")
        for index, piece in enumerate(pieces):
            piece[name] = array[bounds[index] : bounds[index + 1]]
    return pieces
