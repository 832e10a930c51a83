"""Client calls about tracked work: experiments, runs and their metrics, on the native API.

Runs are named by their 32-character hex id; people copy the short form the CLI prints (the
first 12 characters), so :meth:`TrackingCalls.resolve_run_id` turns a unique prefix of at
least :data:`MIN_RUN_ID_PREFIX` characters into the full id, the way git resolves short ids.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any, Final
from urllib.parse import quote

from shamal.client._calls import ClientCalls
from shamal.errors import InvalidParameter, NotFound

__all__ = ["MIN_RUN_ID_PREFIX", "AmbiguousRunId", "TrackingCalls"]

logger = logging.getLogger(__name__)

#: The shortest run id prefix the server looks up (as git's short ids: shorter match too much).
MIN_RUN_ID_PREFIX: Final = 8
#: How many of the runs an ambiguous prefix matches are fetched and named.
CANDIDATES: Final = 10
_FULL_RUN_ID: Final = re.compile(r"[0-9a-f]{32}")
_RUN_ID_PREFIX: Final = re.compile(rf"[0-9a-f]{{{MIN_RUN_ID_PREFIX},31}}")


class AmbiguousRunId(InvalidParameter):
    """A run id prefix that more than one run the caller can see starts with.

    Attributes:
        prefix: the prefix, as looked up (lower case).
        candidates: the matching runs as the API returns them, at most :data:`CANDIDATES`.
        more: whether further runs match beyond ``candidates``.
    """

    def __init__(self, prefix: str, candidates: Sequence[dict[str, Any]], more: bool) -> None:
        self.prefix = prefix
        self.candidates = list(candidates)
        self.more = more
        count = f"{len(self.candidates)}{' or more' if more else ''}"
        lines = [f"  {_candidate_line(run)}" for run in self.candidates]
        super().__init__(
            f"run id prefix '{prefix}' is ambiguous: {count} runs start with it\n"
            + "\n".join(lines)
            + "\ngive more characters of the id (or all 32)"
        )


def _candidate_line(run: dict[str, Any]) -> str:
    deleted = ", deleted" if run.get("lifecycle_stage") == "deleted" else ""
    return (
        f"{run['run_id']}  {run['run_name']}  "
        f"(experiment {run['experiment_id']}, {run['status']}{deleted})"
    )


class TrackingCalls(ClientCalls):
    """Experiments and runs through ``/api/v1``; every answer is the API's JSON, as dicts."""

    def list_experiments(
        self, *, filter_string: str | None = None, view: str = "ACTIVE_ONLY", limit: int = 100
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` experiments, by name, following pages (the server stops one
        early past its byte bound)."""
        params: dict[str, Any] = {"view": view}
        if filter_string:
            params["filter"] = filter_string
        items: list[dict[str, Any]] = []
        while len(items) < limit:
            params["max_results"] = limit - len(items)
            result: dict[str, Any] = self.request("GET", "/api/v1/experiments", params=params)
            items += result["items"]
            if not result.get("next_page_token"):
                break
            params["page_token"] = result["next_page_token"]
        return items

    def get_experiment(self, experiment_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request(
            "GET", f"/api/v1/experiments/{quote(experiment_id, safe='')}"
        )
        return result

    def experiment_id_of(self, id_or_name: str) -> str:
        """An experiment id from an id or an exact name.

        Raises:
            NotFound: no experiment the caller can see has that name.
        """
        if id_or_name.isdigit():
            return id_or_name
        escaped = id_or_name.replace("'", "''")
        found = self.list_experiments(filter_string=f"name = '{escaped}'", view="ALL", limit=1)
        if not found:
            raise NotFound(f"no experiment named {id_or_name!r}")
        return str(found[0]["experiment_id"])

    def list_runs(
        self,
        experiment_id: str,
        *,
        filter_string: str | None = None,
        order_by: list[str] | None = None,
        view: str = "ACTIVE_ONLY",
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` of an experiment's runs (newest first unless ``order_by`` says
        otherwise), following pages (the server stops one early past its byte bound)."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while len(items) < limit:
            page, token = self._runs_page(
                experiment_id, filter_string, order_by, view, limit - len(items), token
            )
            items += page
            if token is None:
                break
        return items

    def iter_runs(
        self,
        experiment_id: str,
        *,
        filter_string: str | None = None,
        view: str = "ACTIVE_ONLY",
        page_size: int = 1000,
    ) -> Iterator[dict[str, Any]]:
        """Every run of an experiment, page after page (newest first)."""
        token: str | None = None
        while True:
            items, token = self._runs_page(
                experiment_id, filter_string, None, view, page_size, token
            )
            yield from items
            if token is None:
                return

    def _runs_page(
        self,
        experiment_id: str,
        filter_string: str | None,
        order_by: list[str] | None,
        view: str,
        limit: int,
        page_token: str | None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        params: dict[str, Any] = {"max_results": limit, "view": view}
        if filter_string:
            params["filter"] = filter_string
        if order_by:
            params["order_by"] = order_by
        if page_token:
            params["page_token"] = page_token
        url = f"/api/v1/experiments/{quote(experiment_id, safe='')}/runs"
        result: dict[str, Any] = self.request("GET", url, params=params)
        return list(result["items"]), result.get("next_page_token")

    def get_run(self, run_id: str) -> dict[str, Any]:
        """A run by its full id (see :meth:`resolve_run_id` for short ones)."""
        result: dict[str, Any] = self.request("GET", f"/api/v1/runs/{quote(run_id, safe='')}")
        return result

    def find_runs(self, id_prefix: str, *, limit: int = CANDIDATES) -> list[dict[str, Any]]:
        """The runs the caller can see whose id starts with ``id_prefix`` (at least
        :data:`MIN_RUN_ID_PREFIX` lower-case hex characters), at most ``limit``, by id."""
        params = {"id_prefix": id_prefix, "max_results": limit}
        result: dict[str, Any] = self.request("GET", "/api/v1/runs", params=params)
        return list(result["items"])

    def resolve_run_id(self, id_or_prefix: str) -> str:
        """The full id of the run ``id_or_prefix`` names: a full id is returned as it is,
        without a request; a shorter one must be the start of exactly one visible run's id.

        Raises:
            InvalidParameter: not hex, or shorter than :data:`MIN_RUN_ID_PREFIX`.
            AmbiguousRunId: more than one run starts with the prefix.
            NotFound: no run the caller can see starts with it.
        """
        text = id_or_prefix.strip().lower()
        if _FULL_RUN_ID.fullmatch(text):
            return text
        if not _RUN_ID_PREFIX.fullmatch(text):
            raise InvalidParameter(
                f"{id_or_prefix.strip()[:40]!r} is not a run id: give its 32 hex characters "
                f"or at least the first {MIN_RUN_ID_PREFIX} (the CLI shows the first 12)"
            )
        found = self.find_runs(text, limit=CANDIDATES + 1)
        if not found:
            raise NotFound(f"no run you can see has an id starting with '{text}'")
        if len(found) > 1:
            raise AmbiguousRunId(text, found[:CANDIDATES], more=len(found) > CANDIDATES)
        run_id: str = found[0]["run_id"]
        logger.debug("run id prefix %s is run %s", text, run_id)
        return run_id

    def metric_history(
        self, run_id: str, key: str, *, page_size: int = 100_000
    ) -> list[dict[str, Any]]:
        """Every point of a metric (``step``, ``timestamp``, ``value``; ``value`` is None
        for NaN and the infinities, named in ``special``), in step order, read
        ``page_size`` points a request."""
        url = f"/api/v1/runs/{quote(run_id, safe='')}/metrics/{quote(key, safe='')}"
        points: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            params: dict[str, Any] = {"max_results": page_size}
            if token:
                params["page_token"] = token
            result: dict[str, Any] = self.request("GET", url, params=params)
            points.extend(result["items"])
            token = result.get("next_page_token")
            if not token:
                return points
