"""Preemption: finish the current step, checkpoint, exit with the requeue code.

The scheduler preempts with SIGTERM and sends SIGKILL after its grace period
(``SHAMAL_SCHEDULER__GRACE_S``, 30 s by default). :class:`PreemptionGuard` turns the
signal into a flag that the training loop polls between steps; the loop then saves a
checkpoint and calls :meth:`PreemptionGuard.exit`, which exits with
:data:`REQUEUE_EXIT_CODE` (75), so the job is queued again without spending a retry and
restarts with ``SHAMAL_ATTEMPT`` + 1.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

__all__ = ["REQUEUE_EXIT_CODE", "PreemptionGuard", "attempt"]

logger = logging.getLogger(__name__)

REQUEUE_EXIT_CODE = 75
"""Same value as :data:`shamal.executors.REQUEUE_EXIT_CODE` (kept here so the runtime
does not import the server side)."""


def attempt() -> int:
    """This job's attempt number (``SHAMAL_ATTEMPT``; 1 outside the scheduler)."""
    return int(os.environ.get("SHAMAL_ATTEMPT", "1"))


class PreemptionGuard:
    """Catches SIGTERM (and SIGINT if asked) and remembers it until the loop looks.

    Use as a context manager, or call :meth:`install` / :meth:`uninstall`. Callbacks
    registered with :meth:`on_stop` run in :meth:`exit` before the process ends (e.g.
    flushing metrics). ``grace_s`` is the time the loop has once the signal came; the
    guard only reports it (:meth:`time_left`), the scheduler enforces it.
    """

    def __init__(self, *, signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
        self._signals = signals
        self._event = threading.Event()
        self._at: float | None = None
        self._previous: dict[int, object] = {}
        self._callbacks: list[Callable[[], None]] = []
        self.grace_s = float(os.environ.get("SHAMAL_SCHEDULER__GRACE_S", "30"))

    def install(self) -> PreemptionGuard:
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def __enter__(self) -> PreemptionGuard:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self._event.is_set():
            self._at = time.monotonic()
            self._event.set()
        logger.warning("signal %d received: will checkpoint after this step", signum)

    def request(self) -> None:
        """Ask for a stop as if the signal had come (tests, custom triggers)."""
        self._handle(signal.SIGTERM, None)

    @property
    def requested(self) -> bool:
        """Whether a stop was requested in *this* process."""
        return self._event.is_set()

    def should_stop(self) -> bool:
        """Whether any rank was asked to stop; collective in a distributed run.

        Every rank must call it at the same step (it all-reduces one flag), so that all
        ranks checkpoint and exit together instead of deadlocking in a collective.
        """
        from shamal.train._dist import any_rank

        return any_rank(self.requested)

    def time_left(self) -> float | None:
        """Seconds left of the grace period, or None before any signal."""
        if self._at is None:
            return None
        return self.grace_s - (time.monotonic() - self._at)

    def on_stop(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def exit(self, code: int = REQUEUE_EXIT_CODE) -> NoReturn:
        """Run the callbacks, flush stdio and exit with ``code`` (75: requeue me)."""
        for callback in self._callbacks:
            try:
                callback()
            except Exception:
                logger.exception("stop callback failed")
        sys.stdout.flush()
        sys.stderr.flush()
        raise SystemExit(code)
