"""Admission: team quotas per pool, borrowing idle quota, reclaim, and fair-share usage.

A team's :class:`~shamal.scheduler.core._state.TeamQuota` in a pool guarantees it
``guaranteed`` resources. Beyond that it may *borrow* the idle guaranteed quota of the
other teams of its cohort, up to ``borrow_limit`` more; what it runs beyond its
guarantee is reclaimable: when a team within its guarantee cannot start a job, the
scheduler preempts jobs of teams running over their own guarantee (see
:mod:`shamal.scheduler.core._engine`, which also lets every job within its guarantee go
before any job that would borrow, and keeps a team that capacity is being reclaimed
from from borrowing more there meanwhile: :attr:`QuotaBook.no_borrow`).

Conventions:

* A pool where no team has a quota is not quota-managed: every job is admitted.
* In a quota-managed pool, a team without a quota there has a zero guarantee and
  may borrow without limit from the ``"default"`` cohort.
* A resource component (CPU, memory, GPU) is limited only when the quota sets it
  (non-zero ``guaranteed`` or ``borrow_limit``); a quota of GPUs alone leaves CPU and
  memory to placement.

Everything here is pure bookkeeping over :class:`Resources`; the :class:`QuotaBook`
is a scratch copy a policy charges tentatively while it decides.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass

from shamal.scheduler.core._resources import Resources
from shamal.scheduler.core._state import SchedJob, TeamQuota

__all__ = [
    "Admission",
    "QuotaBook",
    "decay_all",
    "decayed_usage",
]

_NONE = Resources()
_BEST_EFFORT_COHORT = "default"


class Admission(enum.Enum):
    """What quotas say about starting a job now."""

    WITHIN = "within"
    """Fits in the team's guarantee (or the pool has no quotas)."""
    BORROW = "borrow"
    """Fits only by borrowing idle quota of the cohort: reclaimable."""
    WAIT = "wait"
    """Over the team's guarantee plus borrow limit, or the cohort has nothing idle."""
    NEVER = "never"
    """Larger than the team's guarantee plus borrow limit even on an idle cluster."""


def _limited_fits(amount: Resources, limit: Resources, mask: Resources) -> bool:
    """``amount <= limit`` on the components ``mask`` marks as limited (non-zero)."""
    return (
        (not mask.cpu_milli or amount.cpu_milli <= limit.cpu_milli)
        and (not mask.memory_mib or amount.memory_mib <= limit.memory_mib)
        and (not mask.gpu_milli or amount.gpu_milli <= limit.gpu_milli)
    )


def _over(amount: Resources, limit: Resources, mask: Resources) -> bool:
    """``amount`` exceeds ``limit`` on some limited component."""
    return not _limited_fits(amount, limit, mask)


def _own_quota(quota: TeamQuota, held: Resources, need: Resources) -> Admission | None:
    """The verdict of a team's own quota on holding ``held`` (``need`` included), or
    ``None`` when only borrowing could admit it."""
    mask = quota.guaranteed + quota.borrow_limit
    if _limited_fits(held, quota.guaranteed, mask):
        return Admission.WITHIN
    if _over(need, mask, mask):
        return Admission.NEVER
    if _over(held, mask, mask):
        return Admission.WAIT
    return None


@dataclass(slots=True)
class _Pool:
    """Quota totals of one pool: per cohort, the guarantees and what is held."""

    guaranteed: dict[str, Resources]
    held: dict[str, Resources]
    mask: dict[str, Resources]


class QuotaBook:
    """Quotas and current holdings; :meth:`charge` / :meth:`refund` track tentative changes.

    Built from a state's quotas and what its running jobs hold per (team, pool).
    """

    def __init__(
        self,
        quotas: Mapping[tuple[str, str], TeamQuota],
        held: Mapping[tuple[str, str], Resources],
    ) -> None:
        self.quotas = quotas
        self.held: dict[tuple[str, str], Resources] = dict(held)
        self.no_borrow: set[tuple[str, str]] = set()
        """(team, pool) pairs that borrow nothing now (capacity is being reclaimed from
        the team there): :meth:`admit` answers ``WAIT`` where it would say ``BORROW``."""
        self._pools: dict[str, _Pool] = {}
        for quota in quotas.values():
            pool = self._pools.setdefault(quota.pool, _Pool({}, {}, {}))
            cohort = quota.cohort
            pool.guaranteed[cohort] = pool.guaranteed.get(cohort, _NONE) + quota.guaranteed
            pool.mask[cohort] = pool.mask.get(cohort, _NONE) + quota.guaranteed + quota.borrow_limit
        self._borrowers: dict[str, set[str]] = {name: set() for name in self._pools}
        for (team, pool_name), amount in self.held.items():
            held_pool = self._pools.get(pool_name)
            if held_pool is not None:
                cohort = self._cohort(team, pool_name)
                held_pool.held[cohort] = held_pool.held.get(cohort, _NONE) + amount
                if self._over_guarantee(team, pool_name):
                    self._borrowers[pool_name].add(team)

    @property
    def active(self) -> bool:
        """Whether any pool is quota-managed."""
        return bool(self._pools)

    def managed(self, pool: str) -> bool:
        return pool in self._pools

    def _cohort(self, team: str, pool: str) -> str:
        quota = self.quotas.get((team, pool))
        return quota.cohort if quota is not None else _BEST_EFFORT_COHORT

    def admit(self, job: SchedJob, pool: str) -> Admission:
        """Whether ``job`` of its team may start in ``pool`` now, and on what terms."""
        state = self._pools.get(pool)
        if state is None:
            return Admission.WITHIN
        need = job.request.total
        quota = self.quotas.get((job.team, pool))
        if quota is not None:
            verdict = _own_quota(quota, self.held.get((job.team, pool), _NONE) + need, need)
            if verdict is not None:
                return verdict
        cohort = quota.cohort if quota is not None else _BEST_EFFORT_COHORT
        mask = state.mask.get(cohort, _NONE)
        if mask == _NONE or (job.team, pool) in self.no_borrow:
            return Admission.WAIT  # no cohort to borrow from, or being reclaimed from
        cohort_held = state.held.get(cohort, _NONE) + need
        if _limited_fits(cohort_held, state.guaranteed.get(cohort, _NONE), mask):
            return Admission.BORROW
        return Admission.WAIT

    def over_guarantee(self, team: str, pool: str) -> bool:
        """Whether ``team`` holds more than its guarantee in ``pool`` (it is borrowing)."""
        borrowers = self._borrowers.get(pool)
        return borrowers is not None and team in borrowers

    def borrowers(self, pool: str) -> frozenset[str]:
        """The teams holding more than their guarantee in ``pool``."""
        return frozenset(self._borrowers.get(pool, ()))

    def _over_guarantee(self, team: str, pool: str) -> bool:
        held = self.held.get((team, pool), _NONE)
        quota = self.quotas.get((team, pool))
        if quota is None:
            return held != _NONE
        return _over(held, quota.guaranteed, quota.guaranteed + quota.borrow_limit)

    def charge(self, job: SchedJob, pool: str) -> None:
        """Count ``job`` as holding its resources in ``pool``."""
        self._add(job, pool, job.request.total)

    def refund(self, job: SchedJob, pool: str) -> None:
        """Stop counting ``job`` (preempted or finished)."""
        self._add(job, pool, _NONE - job.request.total)

    def _add(self, job: SchedJob, pool: str, amount: Resources) -> None:
        key = (job.team, pool)
        self.held[key] = self.held.get(key, _NONE) + amount
        state = self._pools.get(pool)
        if state is not None:
            cohort = self._cohort(job.team, pool)
            state.held[cohort] = state.held.get(cohort, _NONE) + amount
            if self._over_guarantee(job.team, pool):
                self._borrowers[pool].add(job.team)
            else:
                self._borrowers[pool].discard(job.team)

    def weight(self, team: str) -> float:
        """A team's fair-share weight: the largest of its quotas' weights (1 if none)."""
        weights = [q.weight for (t, _), q in self.quotas.items() if t == team]
        return max(weights) if weights else 1.0


def decayed_usage(usage: float, elapsed_s: float, rate: float, half_life_s: float) -> float:
    """Usage after ``elapsed_s`` more seconds at a constant ``rate`` (e.g. GPUs held).

    Past usage halves every ``half_life_s``; the usage added during the interval is
    decayed too (the exact integral of ``rate`` under the exponential decay), so the
    result does not depend on how often it is updated.
    """
    if half_life_s <= 0:
        raise ValueError("the half-life must be positive (math.inf: no decay)")
    if elapsed_s <= 0:
        return usage
    if math.isinf(half_life_s):
        return usage + rate * elapsed_s
    factor = math.pow(0.5, elapsed_s / half_life_s)
    return usage * factor + rate * (half_life_s / math.log(2)) * (1.0 - factor)


def decay_all(
    usage: Mapping[str, float],
    elapsed_s: float,
    rates: Mapping[str, float],
    half_life_s: float,
) -> dict[str, float]:
    """:func:`decayed_usage` for every team of ``usage`` or ``rates``."""
    teams = set(usage) | set(rates)
    return {
        team: decayed_usage(usage.get(team, 0.0), elapsed_s, rates.get(team, 0.0), half_life_s)
        for team in teams
    }
