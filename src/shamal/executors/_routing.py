"""Several executors behind one: each job runs on the executor it names.

A server runs a default executor (``scheduler.executor``) and may run others beside it
(``scheduler.executors``); the live scheduler talks to one :class:`ExecutorSet` of them all.
An attempt is launched on the executor its :attr:`LaunchSpec.executor` names (``None``: the
default); every later call follows the handle, whose :attr:`Handle.executor` says which
executor made it. A stored handle that names no executor of the set (one written by another
build, or a server whose executors were changed) goes to the default, which is where every
job ran before jobs could name one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from shamal.errors import InvalidParameter
from shamal.executors._protocol import Executor, ExitStatus, Handle, LaunchSpec

__all__ = ["ExecutorSet", "check_executor"]

logger = logging.getLogger(__name__)


def check_executor(name: str | None, available: Sequence[str]) -> None:
    """Refuse a job naming an executor that is not among ``available`` (the default first).

    ``None`` (the default executor) is always accepted.

    Raises:
        InvalidParameter: saying which executors this server runs and how to enable another.
    """
    if name is None or name in available:
        return
    others = list(available[1:])
    listed = ", ".join(repr(n) for n in available)
    raise InvalidParameter(
        f"this server runs jobs on the executor(s) {listed} (default {available[0]!r}), not "
        f"{name!r}: leave the executor out to use the default, or ask an admin to add it with "
        f"SHAMAL_SCHEDULER__EXECUTORS='{json.dumps([*others, name])}'"
    )


class ExecutorSet:
    """Executors by name, routing each call to the one that owns the attempt.

    Implements the :class:`~shamal.executors.Executor` contract (see its module): thread
    safety, idempotence and the rest hold because every member keeps them; handles are
    the members' own, unchanged, so one stored by a server running a single executor is
    reattached by this set (and the reverse).

    Args:
        default: runs every attempt whose spec names no executor, and every handle that
            names none of the set.
        others: further executors, each under its own :attr:`Executor.name` (one per name).

    Raises:
        InvalidParameter: two members share a name.
    """

    def __init__(self, default: Executor, *others: Executor) -> None:
        self._default = default
        self._members: dict[str, Executor] = {default.name: default}
        for executor in others:
            if executor.name in self._members:
                raise InvalidParameter(f"executor {executor.name!r} is given twice")
            self._members[executor.name] = executor

    @property
    def name(self) -> str:
        """The default executor's name (what runs a job that names none)."""
        return self._default.name

    @property
    def names(self) -> tuple[str, ...]:
        """Every member's name, the default first."""
        return tuple(self._members)

    def member(self, name: str | None) -> Executor:
        """The executor called ``name`` (``None``: the default).

        Raises:
            InvalidParameter: no member has that name.
        """
        check_executor(name, self.names)
        return self._default if name is None else self._members[name]

    def _owner(self, handle: Handle) -> Executor:
        return self._members.get(handle.executor, self._default)

    def launch(self, spec: LaunchSpec) -> Handle:
        """Launch on the executor ``spec.executor`` names; see :meth:`Executor.launch`.

        Raises:
            InvalidParameter: the spec names an executor this set does not hold.
        """
        return self.member(spec.executor).launch(spec)

    def poll(self, handle: Handle) -> ExitStatus | None:
        return self._owner(handle).poll(handle)

    def wait(self, handle: Handle, timeout: float | None = None) -> ExitStatus | None:
        return self._owner(handle).wait(handle, timeout)

    def preempt(self, handle: Handle, grace_s: float | None = None) -> None:
        self._owner(handle).preempt(handle, grace_s)

    def cancel(self, handle: Handle) -> None:
        self._owner(handle).cancel(handle)

    def reattach(self, handle_json: str) -> Handle | None:
        """Reattach through the executor the stored handle names; one that names none of
        the set (or none at all) goes to the default, which then judges it."""
        try:
            named = json.loads(handle_json).get("executor")
        except (ValueError, AttributeError):
            named = None
        owner = self._members.get(named) if isinstance(named, str) else None
        if owner is None:
            logger.debug("handle names executor %r: reattaching through the default", named)
            owner = self._default
        return owner.reattach(handle_json)

    def close(self) -> None:
        """Close every member; one failing does not keep the others open."""
        for executor in self._members.values():
            try:
                executor.close()
            except Exception:
                logger.exception("could not close executor %s", executor.name)
