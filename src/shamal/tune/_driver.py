"""The driver behind `shamal tune`: keeps K trial jobs running until N trials are done.

Needs no Optuna: it talks to the platform, which holds the study. Each trial is a job
whose environment carries ``TUNE_TRIAL_ID`` (and ``TUNE_STUDY``, ``TUNE_TRIAL_NUMBER``);
the platform settles a trial whose job ended without telling its result (see
``TuneService.fail_stale_trials``), and the driver reads those outcomes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shamal.client import ShamalClient
from shamal.errors import AlreadyExists, InvalidParameter, ShamalError
from shamal.tune._client import TuneClient
from shamal.tune._entities import TRIAL_ENV

logger = logging.getLogger(__name__)

FINISHED = ("complete", "pruned", "fail")
RUN_ID_ATTR = "run_id"
"""The user attribute a trial sets to the id of its tracked run (for ``--register-best``)."""


@dataclass(frozen=True)
class TuneOptions:
    """What `shamal tune` was asked for; ``job`` holds ``submit_job`` options (cpus, ...)."""

    study: str
    command: Sequence[str]
    trials: int
    parallel: int = 1
    team: str | None = None
    direction: str = "minimize"
    sampler: str = "tpe"
    pruner: str = "median"
    seed: int | None = None
    workdir: Path | None = Path(".")
    job: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    poll_s: float = 1.0


class TuneDriver:
    """Runs a study to ``trials`` finished trials with at most ``parallel`` jobs at once.

    ``on_trial_end`` gets each finished trial (as the API returns it) as it ends.
    :meth:`stop` (from another thread) or KeyboardInterrupt cancels the running jobs.
    """

    def __init__(
        self,
        client: ShamalClient,
        options: TuneOptions,
        on_trial_end: Callable[[dict[str, Any]], None] = lambda trial: None,
    ) -> None:
        if options.trials < 1 or options.parallel < 1:
            raise InvalidParameter("--trials and --parallel are at least 1")
        self._client = client
        self._tune = TuneClient(client)
        self._options = options
        self._on_end = on_trial_end
        self._stopped = threading.Event()
        self.running: dict[int, str] = {}  # trial id -> job id
        self.finished: list[dict[str, Any]] = []
        self.cancelled: list[str] = []  # job ids
        self.team = ""

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> dict[str, Any]:
        """Run to the end; return the study (with its best trial)."""
        o = self._options
        study = self._tune.create_study(
            o.study, team=o.team, direction=o.direction, sampler=o.sampler, pruner=o.pruner,
            seed=o.seed,
        )  # fmt: skip
        self.team = study["team"]
        digest = (
            self._client.upload_snapshot(o.workdir, self.team or None)
            if o.workdir is not None
            else None
        )
        started = 0
        try:
            while len(self.finished) < o.trials and not self._stopped.is_set():
                while len(self.running) < o.parallel and started < o.trials:
                    self._start(digest)
                    started += 1
                self._collect()
                if len(self.finished) < o.trials:
                    self._stopped.wait(o.poll_s)
        except BaseException:
            self.cancel_running()
            raise
        if self._stopped.is_set():
            self.cancel_running()
        return self._tune.get_study(self.team, o.study)

    def _start(self, digest: str | None) -> None:
        o = self._options
        trial = self._tune.ask(self.team, o.study)
        env = {
            **o.env,
            TRIAL_ENV: str(trial["id"]),
            "TUNE_STUDY": o.study,
            "TUNE_TRIAL_NUMBER": str(trial["number"]),
        }
        try:
            job = self._client.submit_job(
                list(o.command), name=f"{o.study}-trial-{trial['number']}",
                team=self.team or None, env=env, snapshot=digest, **o.job,
            )  # fmt: skip
        except ShamalError:
            self._tune.tell(trial["id"], "fail")
            raise
        self.running[trial["id"]] = job["id"]
        self._tune.attach_job(trial["id"], job["id"])
        logger.info("trial %s runs as job %s", trial["number"], job["id"])

    def _collect(self) -> None:
        """Move the trials that finished out of ``running`` (the read settles stale ones)."""
        if not self.running:
            return
        for trial in self._tune.list_trials(self.team, self._options.study):
            if trial["id"] in self.running and trial["state"] in FINISHED:
                del self.running[trial["id"]]
                self.finished.append(trial)
                self._on_end(trial)

    def cancel_running(self) -> list[str]:
        """Cancel the jobs of the trials still running; return their ids."""
        cancelled = []
        for job_id in list(self.running.values()):
            if job_id in self.cancelled:
                continue
            try:
                self._client.cancel_job(job_id)
                cancelled.append(job_id)
            except ShamalError as exc:  # finished meanwhile
                logger.info("job %s not cancelled: %s", job_id, exc.message)
        self.cancelled.extend(cancelled)
        return cancelled


def register_best(client: ShamalClient, study: dict[str, Any], model: str) -> dict[str, Any]:
    """Register ``runs:/<best trial's run>/model`` as a new version of ``model``.

    Raises:
        InvalidParameter: no completed trial, or the best one never named its run
            (the trial side sets user attribute ``run_id``).
    """
    best = study.get("best")
    if not best:
        raise InvalidParameter("no trial completed: nothing to register")
    run_id = best["user_attrs"].get(RUN_ID_ATTR)
    if not run_id:
        raise InvalidParameter(
            f"the best trial (#{best['number']}) has no tracked run: the trial sets it with "
            "trial.set_user_attr('run_id', run_id)"
        )
    with contextlib.suppress(AlreadyExists):
        client.request("POST", "/api/2.0/mlflow/registered-models/create", json={"name": model})
    body = {"name": model, "source": f"runs:/{run_id}/model", "run_id": run_id}
    answer: dict[str, Any] = client.request(
        "POST", "/api/2.0/mlflow/model-versions/create", json=body
    )
    return dict(answer.get("model_version", answer))
