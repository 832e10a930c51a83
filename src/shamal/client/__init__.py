"""The HTTP client shared by the SDK and the CLI.

``ShamalClient()`` with no arguments talks to ``SHAMAL_URL`` (default
``http://127.0.0.1:8600``) with the token in ``SHAMAL_TOKEN``, falling back to
the admin token the embedded server wrote to ``SHAMAL_HOME/token``. Errors the
server sends come back as the matching :class:`shamal.errors.ShamalError`
subclass.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import httpx

from shamal.client._calls import CHUNK, NEXT_PAGE_HEADER, raise_for
from shamal.client._compare import (
    best_value,
    extremes,
    goal_of,
    metrics_to_draw,
    missing_metrics,
    status_rank,
    summarize_experiment,
)
from shamal.client._datasets import DatasetCalls, has_password, is_remote, redact, source_format
from shamal.client._deployments import DeploymentCalls
from shamal.client._events import EventCalls
from shamal.client._features import FeatureCalls
from shamal.client._lineage import LineageCalls
from shamal.client._models import ModelCalls, ModelRef
from shamal.client._monitors import MonitorCalls
from shamal.client._pipelines import PipelineCalls
from shamal.client._tracking import MIN_RUN_ID_PREFIX, AmbiguousRunId, TrackingCalls
from shamal.errors import InvalidParameter, NotFound, ServiceUnavailable
from shamal.jobs import snapshot

__all__ = [
    "DEFAULT_URL",
    "DatasetCalls",
    "EventCalls",
    "LineageCalls",
    "has_password",
    "is_remote",
    "redact",
    "source_format",
    "best_value",
    "extremes",
    "goal_of",
    "metrics_to_draw",
    "missing_metrics",
    "status_rank",
    "summarize_experiment",
    "MIN_RUN_ID_PREFIX",
    "AmbiguousRunId",
    "ModelCalls",
    "ModelRef",
    "ShamalClient",
    "TrackingCalls",
    "default_token",
]

logger = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:8600"


def default_token() -> str | None:
    """``SHAMAL_TOKEN``, else the token file of the local embedded server."""
    token = os.environ.get("SHAMAL_TOKEN")
    if token:
        return token.strip()
    home = Path(os.environ.get("SHAMAL_HOME") or Path.home() / ".shamal")
    try:
        return (home / "token").read_text().strip() or None
    except OSError:
        return None


class ShamalClient(
    TrackingCalls,
    ModelCalls,
    DeploymentCalls,
    DatasetCalls,
    LineageCalls,
    FeatureCalls,
    PipelineCalls,
    EventCalls,
    MonitorCalls,
):
    """A thin, typed-by-convention client of the native ``/api/v1`` API.

    Args:
        url: base URL of the server; default ``SHAMAL_URL`` or ``DEFAULT_URL``.
        token: bearer token; default :func:`default_token`.
        timeout: seconds per request (uploads and downloads stream without a total cap).
        transport: an httpx transport (tests pass an in-process ASGI transport).
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = (url or os.environ.get("SHAMAL_URL") or DEFAULT_URL).rstrip("/")
        self._token = token if token is not None else default_token()
        headers = {"User-Agent": "shamal-client"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    # ------------------------------------------------------------------ plumbing
    @property
    def token(self) -> str | None:
        """The bearer token this client sends (for handing to other clients, e.g. mlflow)."""
        return self._token

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ShamalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send one request; return the decoded JSON (None for 204).

        Raises:
            ShamalError: the server's error, as its subclass.
            ServiceUnavailable: the server could not be reached.
            InvalidParameter: the ``json`` body holds NaN or an infinity, which JSON cannot
                carry (nothing is sent).
        """
        if "json" in kwargs:
            try:
                body = json.dumps(kwargs.pop("json"), allow_nan=False).encode()
            except ValueError:
                raise InvalidParameter(
                    "a number in the request is NaN or infinite; give finite numbers"
                ) from None
            headers = {"Content-Type": "application/json", **(kwargs.pop("headers", None) or {})}
            kwargs.update(content=body, headers=headers)
        response = self._send(method, path, **kwargs)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServiceUnavailable(
                f"cannot reach Shamal at {self.url} ({exc.__class__.__name__}); "
                "is `shamal server` running, and is SHAMAL_URL right?"
            ) from exc
        raise_for(response)
        return response

    def list_pages(
        self, path: str, params: dict[str, Any] | None = None, *, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Every item of a native list (a JSON array), following its pages: the server stops
        a page early past its byte bound and names the next in ``X-Shamal-Next-Page-Token``.

        Args:
            limit: the most items wanted in all, sent as each page's ``limit`` (None: every
                item, in the server's default page size).
        """
        items: list[dict[str, Any]] = []
        query = dict(params or {})
        while limit is None or len(items) < limit:
            if limit is not None:
                query["limit"] = limit - len(items)
            response = self._send("GET", path, params=query)
            items += response.json()
            token = response.headers.get(NEXT_PAGE_HEADER)
            if not token:
                break
            query["page_token"] = token
        return items

    def health(self) -> bool:
        try:
            return self._http.get("/health").is_success
        except httpx.TransportError:
            return False

    # ------------------------------------------------------------------ identity
    def whoami(self) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", "/api/v1/whoami")
        return result

    def create_user(self, name: str, *, service: bool = False, admin: bool = False) -> Any:
        body = {"name": name, "kind": "service" if service else "user", "is_admin": admin}
        return self.request("POST", "/api/v1/users", json=body)

    def list_users(self) -> list[dict[str, Any]]:
        return self.list_pages("/api/v1/users")

    def set_user_disabled(self, name: str, disabled: bool) -> Any:
        verb = "disable" if disabled else "enable"
        return self.request("POST", f"/api/v1/users/{quote(name, safe='')}/{verb}")

    def set_user_grant(self, name: str, grant: str, granted: bool) -> Any:
        """Give (or take back) a platform-level grant such as ``privacy-officer``."""
        path = f"/api/v1/users/{quote(name, safe='')}/grants/{quote(grant, safe='')}"
        return self.request("PUT" if granted else "DELETE", path)

    # ------------------------------------------------------------------ teams
    def create_team(self, name: str, description: str = "") -> Any:
        return self.request(
            "POST", "/api/v1/teams", json={"name": name, "description": description}
        )

    def list_teams(self) -> list[dict[str, Any]]:
        return self.list_pages("/api/v1/teams")

    def get_team(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/api/v1/teams/{quote(name, safe='')}")
        return result

    def delete_team(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/teams/{quote(name, safe='')}")

    def set_member(self, team: str, user: str, role: str) -> Any:
        path = f"/api/v1/teams/{quote(team, safe='')}/members/{quote(user, safe='')}"
        return self.request("PUT", path, json={"role": role})

    def remove_member(self, team: str, user: str) -> None:
        path = f"/api/v1/teams/{quote(team, safe='')}/members/{quote(user, safe='')}"
        self.request("DELETE", path)

    def invitations(self) -> list[dict[str, Any]]:
        return self.list_pages("/api/v1/invitations")

    def accept_invitation(self, team: str) -> dict[str, Any]:
        path = f"/api/v1/invitations/{quote(team, safe='')}/accept"
        result: dict[str, Any] = self.request("POST", path)
        return result

    def decline_invitation(self, team: str) -> None:
        self.request("DELETE", f"/api/v1/invitations/{quote(team, safe='')}")

    # ------------------------------------------------------------------ tokens
    def create_token(
        self, name: str, *, expires_in_s: int | None = None, user: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name, "expires_in_s": expires_in_s, "user": user}
        result: dict[str, Any] = self.request("POST", "/api/v1/tokens", json=body)
        return result

    def list_tokens(self, *, all_users: bool = False) -> list[dict[str, Any]]:
        params = {"all": "true"} if all_users else None
        return self.list_pages("/api/v1/tokens", params)

    def revoke_token(self, token_id: str) -> Any:
        return self.request("DELETE", f"/api/v1/tokens/{quote(token_id, safe='')}")

    # ------------------------------------------------------------------ audit
    def audit_entries(
        self, *, limit: int = 100, before: int | None = None, action: str | None = None
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {}
        if before is not None:
            params["before"] = before
        if action is not None:
            params["action"] = action
        return self.list_pages("/api/v1/audit", params, limit=limit)

    def verify_audit(self) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", "/api/v1/audit/verify")
        return result

    # ------------------------------------------------------------------ registry
    def list_models(self, *, search: str = "", limit: int = 100) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"search": search} if search else {}
        return self.list_pages("/api/v1/models", params, limit=limit)

    def get_model(self, name: str) -> dict[str, Any]:
        """A registered model with every version, newest first (the server's answer holds
        the newest; older ones are paged in from its ``/versions`` list)."""
        path = f"/api/v1/models/{quote(name, safe='')}"
        result: dict[str, Any] = self.request("GET", path)
        if result.pop("more_versions", False):
            result["versions"] = self.list_pages(f"{path}/versions")
        return result

    def model_version_detail(self, name: str, version: int) -> dict[str, Any]:
        """One version: its formats, signature and lineage (run, logged model, datasets)."""
        path = f"/api/v1/models/{quote(name, safe='')}/versions/{int(version)}"
        result: dict[str, Any] = self.request("GET", path)
        return result

    # ------------------------------------------------------------------ artifacts
    def _artifact_url(self, team: str, path: str) -> str:
        return f"/api/v1/artifacts/{quote(team, safe='')}/{quote(path, safe='/')}"

    def upload_artifact(
        self,
        team: str,
        path: str,
        source: IO[bytes],
        *,
        on_progress: Callable[[int], None] | None = None,
    ) -> dict[str, Any]:
        """Stream ``source`` to ``team``'s artifact ``path`` in 1 MiB chunks."""

        def chunks() -> Iterator[bytes]:
            while block := source.read(CHUNK):
                if on_progress is not None:
                    on_progress(len(block))
                yield block

        result: dict[str, Any] = self.request(
            "PUT",
            self._artifact_url(team, path),
            content=chunks(),
            headers={"Content-Type": "application/octet-stream"},
            timeout=httpx.Timeout(self._http.timeout.connect, read=None, write=None),
        )
        return result

    def download_artifact(
        self, team: str, path: str, *, on_progress: Callable[[int], None] | None = None
    ) -> Iterable[bytes]:
        """Yield the artifact's bytes as they arrive (verified by the server)."""
        try:
            with self._http.stream("GET", self._artifact_url(team, path)) as response:
                if not response.is_success:
                    raise_for(response)
                for block in response.iter_bytes(CHUNK):
                    if on_progress is not None:
                        on_progress(len(block))
                    yield block
        except httpx.TransportError as exc:
            raise ServiceUnavailable(f"download from {self.url} failed: {exc}") from exc

    def list_artifacts(
        self, team: str, prefix: str = "", *, limit: int = 1000
    ) -> list[dict[str, Any]]:
        params = {"prefix": prefix} if prefix else None
        return self.list_pages(f"/api/v1/artifacts/{quote(team, safe='')}", params, limit=limit)

    def delete_artifact(self, team: str, path: str) -> None:
        self.request("DELETE", self._artifact_url(team, path))

    # ------------------------------------------------------------------ jobs
    def upload_snapshot(self, folder: Path, team: str | None = None) -> str:
        """Pack ``folder`` (honouring .gitignore) and upload it for ``team`` (default: the
        account's only team) unless that team already did.

        Returns the snapshot's sha256, which :meth:`submit_job` takes.

        Raises:
            InvalidParameter: ``folder`` is not a readable folder, or holds more than a
                snapshot may (the message says what to do).
        """
        try:
            built = snapshot.build(folder)
        except snapshot.SnapshotError as exc:
            raise InvalidParameter(f"cannot snapshot the code: {exc}") from None
        try:
            path = f"/api/v1/snapshots/{built.digest}"
            params = {"team": team} if team else None
            try:
                self.request("GET", path, params=params)
            except NotFound:
                with built.path.open("rb") as source:
                    self.request(
                        "PUT",
                        path,
                        params=params,
                        content=iter(lambda: source.read(CHUNK), b""),
                        headers={"Content-Type": "application/octet-stream"},
                        timeout=httpx.Timeout(self._http.timeout.connect, read=None, write=None),
                    )
        finally:
            built.path.unlink(missing_ok=True)
        return built.digest

    def submit_job(self, command: Sequence[str], **options: Any) -> dict[str, Any]:
        """Queue a job; ``options`` are the fields of the API's JobIn (cpus, gpus, team, ...)."""
        body = {"command": list(command), **{k: v for k, v in options.items() if v is not None}}
        result: dict[str, Any] = self.request("POST", "/api/v1/jobs", json=body)
        return result

    def list_jobs(
        self,
        *,
        states: Sequence[str] = (),
        team: str | None = None,
        user: str | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"state": list(states)}
        if team is not None:
            params["team"] = team
        if user is not None:
            params["user"] = user
        return self.list_pages("/api/v1/jobs", params, limit=limit)

    def get_job(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/api/v1/jobs/{quote(job_id, safe='')}")
        return result

    def job_events(self, job_id: str) -> list[dict[str, Any]]:
        url = f"/api/v1/jobs/{quote(job_id, safe='')}/events"
        result: list[dict[str, Any]] = self.request("GET", url)
        return result

    def job_log(
        self, job_id: str, *, offset: int = 0, attempt: int | None = None
    ) -> tuple[bytes, int, bool, int]:
        """(bytes from ``offset``, the next offset, whether the log is complete, attempt)."""
        params: dict[str, Any] = {"offset": offset}
        if attempt is not None:
            params["attempt"] = attempt
        try:
            response = self._http.get(f"/api/v1/jobs/{quote(job_id, safe='')}/logs", params=params)
        except httpx.TransportError as exc:
            raise ServiceUnavailable(f"cannot reach Shamal at {self.url}") from exc
        raise_for(response)
        next_offset = int(response.headers.get("X-Shamal-Next-Offset", offset))
        complete = response.headers.get("X-Shamal-Complete") == "true"
        number = int(response.headers.get("X-Shamal-Attempt", attempt or 0))
        return response.content, next_offset, complete, number

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request(
            "POST", f"/api/v1/jobs/{quote(job_id, safe='')}/cancel"
        )
        return result

    def preempt_job(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request(
            "POST", f"/api/v1/jobs/{quote(job_id, safe='')}/preempt"
        )
        return result

    def cost_report(
        self, *, by: str = "team", since: datetime, until: datetime | None = None
    ) -> list[dict[str, Any]]:
        params = {"by": by, "since": since.isoformat()}
        if until is not None:
            params["until"] = until.isoformat()
        result: list[dict[str, Any]] = self.request("GET", "/api/v1/cost", params=params)
        return result

    def quotas(self) -> list[dict[str, Any]]:
        """Each team's guaranteed quota and borrow limit per pool, with what its jobs hold,
        borrow and wait for now (members see their own teams; admins every team)."""
        result: list[dict[str, Any]] = self.request("GET", "/api/v1/scheduler/quotas")
        return result

    def predictor_report(self) -> dict[str, Any]:
        """How well job runtimes are predicted from history (each predicted before it ran)."""
        result: dict[str, Any] = self.request("GET", "/api/v1/scheduler/predictor")
        return result
