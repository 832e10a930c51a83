"""How a gang's exit codes and the reason we stopped it become one :class:`ExitStatus`.

Pure functions shared by the local supervisor and the Ray executor, so both report the
same outcome for the same events.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from enum import StrEnum

from shamal.executors._protocol import REQUEUE_EXIT_CODE, ExitReason, ExitStatus

__all__ = ["StopCause", "decide_outcome", "stronger"]

logger = logging.getLogger(__name__)


class StopCause(StrEnum):
    """Why the platform stopped the workers of a gang, strongest last."""

    GANG = "gang"
    """A worker failed; the others are stopped with it."""
    TIMEOUT = "timeout"
    PREEMPT = "preempt"
    CANCEL = "cancel"


_STRENGTH = {cause: i for i, cause in enumerate(StopCause)}


def stronger(current: StopCause | None, new: StopCause) -> bool:
    """True when ``new`` should replace ``current`` as the recorded cause.

    A cancel outranks a preemption, which outranks a time limit, which outranks a gang
    failure: the report names the most deliberate decision.
    """
    return current is None or _STRENGTH[new] > _STRENGTH[current]


def decide_outcome(
    exit_codes: Sequence[int | None],
    cause: StopCause | None,
    culprit_rank: int | None,
) -> ExitStatus:
    """The attempt's status from its workers' exit codes.

    Args:
        exit_codes: one per rank (``-N`` for signal ``N``).
        cause: why we stopped the workers, if we did.
        culprit_rank: the first worker that failed on its own, if any.

    Rules: a cancel is ``killed`` whatever the codes; otherwise all zeros are
    ``succeeded`` (the job finished, even during a grace period); otherwise a
    preemption is ``preempted`` (requeue), a time limit ``timeout`` (no requeue), and
    anything else ``failed``, with ``requeue`` when the culprit exited with
    :data:`REQUEUE_EXIT_CODE` (the runtime checkpointed after someone else's SIGTERM).
    """
    codes = tuple(exit_codes)
    if cause is StopCause.CANCEL:
        return ExitStatus(ExitReason.KILLED, codes, False, culprit_rank, "cancelled")
    if codes and all(code == 0 for code in codes):
        return ExitStatus(ExitReason.SUCCEEDED, codes, False, None, "")
    if cause is StopCause.PREEMPT:
        return ExitStatus(ExitReason.PREEMPTED, codes, True, culprit_rank, "preempted")
    if cause is StopCause.TIMEOUT:
        return ExitStatus(ExitReason.TIMEOUT, codes, False, culprit_rank, "time limit reached")
    if culprit_rank is None:
        culprit_rank = next((r for r, c in enumerate(codes) if c != 0), None)
    code = codes[culprit_rank] if culprit_rank is not None else None
    detail = f"rank {culprit_rank} exited with {code}" if culprit_rank is not None else "failed"
    return ExitStatus(ExitReason.FAILED, codes, code == REQUEUE_EXIT_CODE, culprit_rank, detail)
