"""Metric logging to the platform's tracking server, batched on a background thread.

Speaks the MLflow REST API with httpx (the runtime does not depend on mlflow).
:class:`Tracker` creates the run at construction, logs params, and queues metrics; a
daemon thread sends them with ``runs/log-batch`` every ``flush_every_s`` seconds or as
soon as ``max_batch`` metrics are waiting, so the training loop never waits on the
network. :meth:`Tracker.close` flushes and ends the run; it is registered with
``atexit`` so a normal exit loses nothing, and :meth:`Tracker.flush` is what a SIGTERM
path calls before exiting.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx

__all__ = ["Tracker"]

logger = logging.getLogger(__name__)

_MAX_METRICS = 1000  # MLflow's log-batch limits
_MAX_PARAMS = 100


def _now_ms() -> int:
    return int(time.time() * 1000)


class Tracker:
    """One tracked run. Thread-safe; metric calls never block on the network.

    Args:
        experiment: experiment name (created if missing).
        run_name: the run's name; defaults to ``job-<SHAMAL_JOB_ID>``-ish when in a job.
        params: logged at start (values are stringified).
        http: the httpx client to send with (its base URL and auth are used as-is);
            by default one for ``MLFLOW_TRACKING_URI`` with ``MLFLOW_TRACKING_TOKEN``.
        run_id: reuse an existing run (e.g. a resumed job) instead of creating one.
    """

    def __init__(
        self,
        experiment: str,
        *,
        run_name: str | None = None,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        http: httpx.Client | None = None,
        run_id: str | None = None,
        flush_every_s: float = 5.0,
        max_batch: int = 500,
    ) -> None:
        if http is None:
            base = os.environ["MLFLOW_TRACKING_URI"]
            secret = os.environ.get("MLFLOW_TRACKING_TOKEN", "")
            headers = {"Authorization": f"Bearer {secret}"} if secret else {}
            http = httpx.Client(base_url=base, headers=headers, timeout=30.0)
        self._http = http
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        self._flush_every_s = flush_every_s
        self._max_batch = min(max_batch, _MAX_METRICS)
        self._wake = threading.Event()
        self._closed = threading.Event()
        self.experiment_id = self._experiment(experiment)
        self.run_id = run_id or self._create_run(run_name, tags or {})
        if params:
            self.log_params(params)
        self._thread = threading.Thread(target=self._loop, name="shamal-tracker", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # ------------------------------------------------------------------ REST
    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self._http.request(method, f"/api/2.0/mlflow/{path}", **kwargs)
        if response.status_code >= 400:
            raise RuntimeError(f"tracking {path} failed ({response.status_code}): {response.text}")
        body: dict[str, Any] = response.json() if response.content else {}
        return body

    def _experiment(self, name: str) -> str:
        found = self._http.get(
            "/api/2.0/mlflow/experiments/get-by-name", params={"experiment_name": name}
        )
        if found.status_code == 200:
            return str(found.json()["experiment"]["experiment_id"])
        created = self._call("POST", "experiments/create", json={"name": name})
        return str(created["experiment_id"])

    def _create_run(self, run_name: str | None, tags: Mapping[str, str]) -> str:
        job = os.environ.get("SHAMAL_JOB_ID")
        all_tags = dict(tags)
        if job:
            all_tags.setdefault("shamal.job_id", job)
        body: dict[str, Any] = {
            "experiment_id": self.experiment_id,
            "start_time": _now_ms(),
            "tags": [{"key": k, "value": str(v)} for k, v in all_tags.items()],
        }
        if run_name or job:
            body["run_name"] = run_name or f"job-{job}"
        run = self._call("POST", "runs/create", json=body)
        return str(run["run"]["info"]["run_id"])

    # ------------------------------------------------------------------ logging
    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log params now (synchronously; they are few and logged once)."""
        items = [{"key": k, "value": str(v)} for k, v in params.items()]
        for i in range(0, len(items), _MAX_PARAMS):
            chunk = items[i : i + _MAX_PARAMS]
            self._call("POST", "runs/log-batch", json={"run_id": self.run_id, "params": chunk})

    def log_metric(self, key: str, value: float, step: int = 0) -> None:
        """Queue one metric; sent by the background thread."""
        self._queue.put(
            {"key": key, "value": float(value), "timestamp": _now_ms(), "step": int(step)}
        )
        if self._queue.qsize() >= self._max_batch:
            self._wake.set()

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        for key, value in metrics.items():
            self.log_metric(key, value, step)

    # ------------------------------------------------------------------ sending
    def _drain(self) -> list[dict[str, Any]]:
        batch: list[dict[str, Any]] = []
        while len(batch) < self._max_batch:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _send_pending(self) -> None:
        with self._lock:
            while batch := self._drain():
                body = {"run_id": self.run_id, "metrics": batch}
                try:
                    self._call("POST", "runs/log-batch", json=body)
                except (httpx.HTTPError, RuntimeError) as exc:
                    logger.warning("dropping %d metrics: %s", len(batch), exc)

    def _loop(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(self._flush_every_s)
            self._wake.clear()
            self._send_pending()

    def flush(self) -> None:
        """Send everything queued so far, from the calling thread."""
        self._send_pending()

    def close(self, status: str = "FINISHED") -> None:
        """Flush, end the run with ``status`` and stop the thread (idempotent)."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._wake.set()
        self._thread.join(timeout=30)
        self._send_pending()
        try:
            self._call(
                "POST",
                "runs/update",
                json={"run_id": self.run_id, "status": status, "end_time": _now_ms()},
            )
        except (httpx.HTTPError, RuntimeError) as exc:
            logger.warning("could not end run %s: %s", self.run_id, exc)
        atexit.unregister(self.close)
