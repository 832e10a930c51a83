"""A stream consumer: a broker's deliveries, micro-batched, written, then acknowledged.

The loop receives from a :class:`Broker`, closes a batch by size or age, decodes each
payload (one JSON object is one row; what is not is sent as a dead letter), hands the batch
to a :data:`Sink` that commits it (the server records the batch's keys in the transaction of
its version), and only then acknowledges every delivery of the batch. Killed between the two,
the broker delivers the batch again; the server skips the keys it committed, and the
consumer acknowledges them: each record is written once. A sink that fails leaves the batch
unacknowledged, for the broker to deliver again.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shamal.datasets._batcher import MicroBatcher, decode, row_digest
from shamal.datasets._brokers import Broker
from shamal.datasets._entities import DeadLetter
from shamal.errors import PayloadTooLarge

__all__ = ["Consumer", "Sink", "Totals"]

_TOO_LARGE = "the record is larger than the server takes in one request"

#: Commits a batch: (stream, [(key, row)], [dead letter]) -> the server's answer
#: (``written``, ``skipped``, ``parked``, ``version``).
Sink = Callable[
    [str, Sequence[tuple[str, dict[str, Any]]], Sequence[DeadLetter]], Mapping[str, Any]
]


@dataclass(slots=True)
class Totals:
    """What a consumer did so far."""

    batches: int = 0
    written: int = 0
    skipped: int = 0
    parked: int = 0
    duplicates: int = 0


class Consumer:
    """Micro-batches ``broker``'s deliveries into ``sink``: a batch closes at ``max_rows``
    distinct records or ``max_seconds`` after its first delivery."""

    def __init__(
        self,
        broker: Broker,
        sink: Sink,
        *,
        max_rows: int = 1000,
        max_seconds: float = 5.0,
        poll: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._broker = broker
        self._sink = sink
        self._batcher = MicroBatcher(max_rows, max_seconds, clock)
        self._poll = poll
        self._clock = clock
        self.totals = Totals()
        #: When the last delivery came (the clock's time).
        self.last_delivery = clock()

    @property
    def pending(self) -> int:
        """Deliveries in the open batch (duplicates included)."""
        return self._batcher.pending

    def step(self) -> Mapping[str, Any] | None:
        """Receive once (at most ``poll`` seconds); commit the batch if it is due. The
        server's answer for a committed batch, else None."""
        wait = min(self._poll, self._batcher.time_left())
        got = self._broker.receive(max(1, self._batcher.room()), wait)
        if got:
            self.last_delivery = self._clock()
        for message in got:
            if not self._batcher.add(message):
                self.totals.duplicates += 1
        return self.flush() if self._batcher.due() else None

    def flush(self) -> Mapping[str, Any] | None:
        """Commit the open batch, then acknowledge it; None when none is open."""
        if not self._batcher.pending:
            return None
        batch = self._batcher.take()
        rows, dead = decode(batch.unique)
        answer = self._commit(rows, dead)
        self._broker.ack(batch.all)  # only now: the batch is committed
        self.totals.batches += 1
        self.totals.written += int(answer.get("written", 0))
        self.totals.skipped += int(answer.get("skipped", 0))
        self.totals.parked += int(answer.get("parked", 0))
        return answer

    def _commit(
        self, rows: list[tuple[str, dict[str, Any]]], dead: list[DeadLetter]
    ) -> Mapping[str, Any]:
        """Write a batch; one the server finds too large is written in halves (each half's
        keys commit with its own version), and a single record too large is parked."""
        try:
            return self._sink(self._broker.stream, rows, dead)
        except PayloadTooLarge:
            if len(rows) > 1:
                half = len(rows) // 2
                return _added(self._commit(rows[:half], dead), self._commit(rows[half:], []))
            if not rows:
                raise
        key, row = rows[0]
        size = len(json.dumps(row, default=str))
        letter = DeadLetter(key, _TOO_LARGE, row_digest(row), size)
        return self._sink(self._broker.stream, [], [*dead, letter])

    def run(
        self,
        stop: threading.Event,
        *,
        on_batch: Callable[[Mapping[str, Any]], None] | None = None,
        idle_exit: float | None = None,
    ) -> Totals:
        """Consume until ``stop`` is set (or nothing came for ``idle_exit`` seconds), then
        commit what is open and return the totals."""
        while not stop.is_set():
            answer = self.step()
            if answer is not None and on_batch is not None:
                on_batch(answer)
            idle = self._clock() - self.last_delivery
            if idle_exit is not None and not self._batcher.pending and idle >= idle_exit:
                break
        answer = self.flush()
        if answer is not None and on_batch is not None:
            on_batch(answer)
        return self.totals


def _added(first: Mapping[str, Any], second: Mapping[str, Any]) -> dict[str, Any]:
    """Two answers as one: counts summed, the later version."""
    total = {key: int(first.get(key, 0)) + int(second.get(key, 0)) for key in _COUNTS}
    return {**total, "version": second.get("version") or first.get("version"), "replayed": False}


_COUNTS = ("written", "skipped", "parked")
