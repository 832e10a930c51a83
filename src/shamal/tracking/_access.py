"""What tracking's narrower services ask of the experiments and runs they belong to.

:class:`~shamal.tracking.TrackingService` owns experiments and runs and the rules of who may
see them; the logged-model and run-artifact services it builds take it as a
:class:`RunAccess`, so that they depend on this small contract instead of importing the
service that builds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

from shamal.security import Principal, Role
from shamal.tracking._entities import Experiment, RunInfo

__all__ = ["RunAccess", "UnknownExperiments"]

#: What a search does with an experiment id that does not exist (or that the caller
#: cannot see, which is the same): "error" (NotFound) or "skip" (a stock server's way).
UnknownExperiments = Literal["error", "skip"]


class RunAccess(Protocol):
    """Experiments and runs as their owner's rules let a principal reach them."""

    def now_ms(self) -> int:
        """The owner's clock, in milliseconds since the epoch."""

    def experiment(
        self, principal: Principal, experiment_id: str, needed: Role = Role.VIEWER
    ) -> Experiment:
        """The experiment, when ``principal`` holds ``needed`` on it.

        Raises:
            NotFound: no such experiment, or one the principal may not see.
            PermissionDenied: visible, but ``needed`` is not held.
        """

    def run_info(self, principal: Principal, run_id: str, needed: Role = Role.VIEWER) -> RunInfo:
        """The run's info, when ``principal`` holds ``needed`` on its experiment (raises as
        :meth:`experiment` does)."""

    def searched_experiment_ids(
        self,
        principal: Principal,
        experiment_ids: Sequence[str],
        unknown: UnknownExperiments = "error",
    ) -> list[int]:
        """The ids a search over ``experiment_ids`` covers, as numbers, those the principal
        may see; unknown ones raise NotFound or are skipped, as ``unknown`` says."""
