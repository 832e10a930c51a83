"""The trial side: what a script running as a trial job uses. Needs no Optuna.

``current_trial()`` reads the trial id the job was given (``TUNE_TRIAL_ID``) and talks
to the platform at ``SHAMAL_URL`` with ``SHAMAL_TOKEN``, as the job's submitter::

    trial = shamal.tune.current_trial()
    lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True) if trial else 1e-3
    for epoch in range(epochs):
        ...
        if trial:
            trial.report(epoch, val_loss)
            if trial.should_prune():
                trial.prune()
                sys.exit(0)
    if trial:
        trial.complete(val_loss)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from shamal.client import ShamalClient
from shamal.tune._entities import NO_TEAM, TRIAL_ENV

logger = logging.getLogger(__name__)

Choice = None | bool | int | float | str


class Trial:
    """One trial of a study, driven over HTTP. Not thread-safe (one per process).

    Suggestions are remembered by the platform: asking again for a name returns the
    same value, so a requeued job resumes with the parameters it started with.
    """

    def __init__(self, trial_id: int, client: ShamalClient | None = None) -> None:
        self.id = trial_id
        self._client = client or ShamalClient()
        self._prune = False
        self._cache: dict[str, Any] = {}

    def close(self) -> None:
        self._client.close()

    def _post(self, what: str, body: dict[str, Any]) -> Any:
        return self._client.request("POST", f"/api/v1/tune/trials/{self.id}/{what}", json=body)

    def info(self) -> dict[str, Any]:
        """The trial as stored (number, state, params, intermediate values, ...)."""
        result: dict[str, Any] = self._client.request("GET", f"/api/v1/tune/trials/{self.id}")
        return result

    @property
    def number(self) -> int:
        return int(self.info()["number"])

    def _suggest(self, name: str, distribution: dict[str, Any]) -> Any:
        if name not in self._cache:
            body = {"name": name, "distribution": distribution}
            self._cache[name] = self._post("suggest", body)["value"]
        return self._cache[name]

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float:
        dist = {"type": "float", "low": low, "high": high, "step": step, "log": log}
        return float(self._suggest(name, dist))

    def suggest_int(
        self, name: str, low: int, high: int, *, step: int = 1, log: bool = False
    ) -> int:
        dist = {"type": "int", "low": low, "high": high, "step": step, "log": log}
        return int(self._suggest(name, dist))

    def suggest_categorical(self, name: str, choices: Sequence[Choice]) -> Any:
        return self._suggest(name, {"type": "categorical", "choices": list(choices)})

    def report(self, step: int, value: float) -> None:
        """Report the intermediate ``value`` at ``step``; the pruner's answer is kept for
        :meth:`should_prune`."""
        self._prune = bool(
            self._post("report", {"step": int(step), "value": float(value)})["prune"]
        )

    def should_prune(self) -> bool:
        """Whether the pruner said, at the last report, to stop this trial."""
        return self._prune

    def set_user_attr(self, key: str, value: Choice) -> None:
        """E.g. ``set_user_attr("run_id", run.info.run_id)``: which tracked run is the trial's."""
        self._client.request(
            "POST", f"/api/v1/tune/trials/{self.id}/attrs", json={"key": key, "value": value}
        )

    def set_run(self, run_id: str) -> None:
        """Name the trial's tracked run (what ``shamal tune --register-best`` registers)."""
        self.set_user_attr("run_id", run_id)

    def run_tags(self) -> dict[str, str]:
        """Tags for the trial's tracked run: its study and trial number."""
        return {
            "shamal.tune.study": os.environ.get("TUNE_STUDY", ""),
            "shamal.tune.trial": os.environ.get("TUNE_TRIAL_NUMBER", ""),
            "shamal.tune.trial_id": str(self.id),
        }

    def complete(self, value: float) -> None:
        """Finish the trial with its objective ``value``."""
        self._post("tell", {"state": "complete", "value": float(value)})

    def prune(self) -> None:
        """Finish the trial as pruned (after :meth:`should_prune` said so)."""
        self._post("tell", {"state": "pruned"})

    def fail(self) -> None:
        self._post("tell", {"state": "fail"})


_current: Trial | None = None


def current_trial() -> Trial | None:
    """The trial this process runs (from ``TUNE_TRIAL_ID``), or None outside a study.

    The same object on every call in a process.
    """
    global _current
    raw = os.environ.get(TRIAL_ENV)
    if not raw:
        return None
    if _current is None or str(_current.id) != raw:
        _current = Trial(int(raw))
    return _current


class TuneClient:
    """Studies and trials for drivers (the CLI): create, ask, attach, list."""

    def __init__(self, client: ShamalClient) -> None:
        self._client = client

    @staticmethod
    def _study_path(team: str, name: str) -> str:
        return f"/api/v1/tune/studies/{quote(team or NO_TEAM, safe='')}/{quote(name, safe='')}"

    def create_study(self, name: str, **options: Any) -> dict[str, Any]:
        body = {"name": name, **{k: v for k, v in options.items() if v is not None}}
        result: dict[str, Any] = self._client.request("POST", "/api/v1/tune/studies", json=body)
        return result

    def get_study(self, team: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._client.request("GET", self._study_path(team, name))
        return result

    def list_trials(self, team: str, name: str) -> list[dict[str, Any]]:
        """Every trial of the study, following its pages."""
        return self._client.list_pages(self._study_path(team, name) + "/trials")

    def ask(self, team: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._client.request(
            "POST", self._study_path(team, name) + "/trials"
        )
        return result

    def attach_job(self, trial_id: int, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._client.request(
            "POST", f"/api/v1/tune/trials/{trial_id}/job", json={"job_id": job_id}
        )
        return result

    def tell(self, trial_id: int, state: str, value: float | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self._client.request(
            "POST", f"/api/v1/tune/trials/{trial_id}/tell", json={"state": state, "value": value}
        )
        return result
