"""The pages: experiments, an experiment's runs, a run, two runs compared.

Each page calls the tracking service as the API routes do, with the signed-in principal,
so what a person sees is exactly what their token may read through the API.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Path, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from shamal.artifacts import PrincipalSlots
from shamal.errors import InvalidParameter
from shamal.security import Principal
from shamal.tracking import Experiment, Run, TrackingService
from shamal.webui._common import STOCK_UI_PATH, Route, context, service_of, stock_ui
from shamal.webui._render import page, redirect
from shamal.webui._session import SessionPrincipal

RUNS_PER_PAGE = 50
EXPERIMENTS_PER_PAGE = 100
#: Columns a person may add to the runs table, each of params and metrics.
MAX_CHOSEN = 30
#: Keys offered in the column chooser (those of the runs on the page).
MAX_OFFERED = 200
#: Runs a comparison overlays.
MAX_COMPARED = 8

ExperimentId = Annotated[str, Path(pattern=r"^[0-9]{1,18}$")]
RunId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")]
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
Chosen = Annotated[list[str] | None, Query(max_length=MAX_CHOSEN)]
_BASE_COLUMNS = (
    ("Run", "attributes.run_name"),
    ("Status", "attributes.status"),
    ("Started", "attributes.start_time"),
    ("Duration", ""),
    ("User", "attributes.user_id"),
)


def _tracking(request: Request) -> TrackingService:
    return service_of(request, "tracking", TrackingService)


def _slots(request: Request) -> PrincipalSlots:
    return service_of(request, "search_slots", PrincipalSlots)


# ---------------------------------------------------------------------------- experiments
async def experiments_page(
    request: Request, principal: Principal, page_token: str | None, *, follow_hash: bool = False
) -> Response:
    tracking = _tracking(request)

    def search() -> Any:
        with _slots(request).hold(f"user:{principal.user.id}"):
            return tracking.search_experiments(
                principal,
                filter_string=None,
                order_by=["name ASC"],
                view="active",
                max_results=EXPERIMENTS_PER_PAGE,
                page_token=page_token,
            )

    found = await run_in_threadpool(search)
    values = context(
        request,
        principal,
        "Experiments",
        experiments=found.items,
        next_page_token=found.next_page_token,
        follow_hash=follow_hash,
        stock_ui=STOCK_UI_PATH if stock_ui(request) is not None else "",
    )
    return page("experiments.html", values)


async def home(request: Request, principal: SessionPrincipal) -> Response:
    """``/``: the experiments list, whose script follows an MLflow link's fragment
    (``#/experiments/1/runs/<id>``) to the matching page: MLflow's own UI's when it is
    installed (``/mlflow/#/experiments/...``), else Shamal's. Signed out, the sign-in form,
    which keeps the fragment for after signing in."""
    return await experiments_page(request, principal, None, follow_hash=True)


async def experiments(
    request: Request,
    principal: SessionPrincipal,
    page_token: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    return await experiments_page(request, principal, page_token)


# ---------------------------------------------------------------------------- runs table
@dataclass(frozen=True)
class Column:
    """A column of the runs table: its header, its sort key (empty: not sortable) and
    where a run's value comes from."""

    title: str
    sort_key: str
    kind: str  # "attribute", "param" or "metric"
    key: str = ""


def _quoted(kind: str, key: str) -> str:
    """The sort key of a param or metric, back-quoted for the MLflow grammar; empty when
    the key cannot be quoted (it holds a back quote)."""
    return "" if "`" in key else f"{kind}.`{key}`"


def _columns(params: list[str], metrics: list[str]) -> list[Column]:
    columns = [Column(title, key, "attribute", key) for title, key in _BASE_COLUMNS]
    columns += [Column(k, _quoted("params", k), "param", k) for k in params]
    columns += [Column(k, _quoted("metrics", k), "metric", k) for k in metrics]
    return columns


def _next_order(current: str, sort_key: str) -> str:
    """The order a click on a column's header asks for: descending first, then ascending."""
    if not sort_key:
        return ""
    return f"{sort_key} ASC" if current == f"{sort_key} DESC" else f"{sort_key} DESC"


def _latest(run: Run) -> dict[str, float]:
    return {m.key: m.value for m in run.metrics}


def _offered(runs: list[Run]) -> tuple[list[str], list[str]]:
    params = sorted({k for r in runs for k in r.params})[:MAX_OFFERED]
    metrics = sorted({m.key for r in runs for m in r.metrics})[:MAX_OFFERED]
    return params, metrics


def _unique(values: list[str] | None) -> list[str]:
    return list(dict.fromkeys(v for v in values or [] if v))[:MAX_CHOSEN]


async def runs_table(
    request: Request,
    principal: SessionPrincipal,
    experiment_id: ExperimentId,
    filter_text: Annotated[str, Query(alias="filter", max_length=2000)] = "",
    order: Annotated[str, Query(max_length=600)] = "",
    page_token: Annotated[str | None, Query(max_length=200)] = None,
    param: Chosen = None,
    metric: Chosen = None,
) -> Response:
    """An experiment's runs, 50 a page: filtered with the MLflow filter grammar, ordered by
    a column, with the params and metrics chosen as columns. A filter the grammar refuses
    shows its error above an empty table (400)."""
    tracking = _tracking(request)
    params, metrics = _unique(param), _unique(metric)

    def search() -> tuple[Experiment, Any]:
        experiment = tracking.experiment(principal, experiment_id)
        with _slots(request).hold(f"user:{principal.user.id}"):
            found = tracking.search_runs(
                principal,
                experiment_ids=[experiment_id],
                filter_string=filter_text or None,
                view="active",
                max_results=RUNS_PER_PAGE,
                order_by=[order] if order else ["attributes.start_time DESC"],
                page_token=page_token,
            )
        return experiment, found

    error = ""
    runs: list[Run] = []
    next_token = None
    try:
        experiment, found = await run_in_threadpool(search)
        runs, next_token = list(found.items), found.next_page_token
    except InvalidParameter as exc:
        experiment = await run_in_threadpool(tracking.experiment, principal, experiment_id)
        error = exc.message
    offered_params, offered_metrics = _offered(runs)
    values = context(
        request,
        principal,
        experiment.name,
        experiment=experiment,
        rows=[(run, _latest(run)) for run in runs],
        columns=_columns(params, metrics),
        next_order=_next_order,
        order=order,
        filter=filter_text,
        chosen_params=params,
        chosen_metrics=metrics,
        offered_params=sorted(set(offered_params) | set(params)),
        offered_metrics=sorted(set(offered_metrics) | set(metrics)),
        next_page_token=next_token,
        page_token=page_token or "",
        error=error,
    )
    return page("runs.html", values, 400 if error else 200)


# ---------------------------------------------------------------------------- a run
def _finite(value: float) -> bool:
    return math.isfinite(value)


async def run_page(
    request: Request,
    principal: SessionPrincipal,
    experiment_id: ExperimentId,
    run_id: RunId,
) -> Response:
    """A run: its params, latest metrics, tags, and each metric's curve."""
    tracking = _tracking(request)

    def read() -> tuple[Run, Experiment]:
        run = tracking.get_run(principal, run_id)
        return run, tracking.experiment(principal, run.info.experiment_id)

    run, experiment = await run_in_threadpool(read)
    if run.info.experiment_id != experiment_id:
        return redirect(f"/ui/experiments/{run.info.experiment_id}/runs/{run_id}")
    values = context(
        request,
        principal,
        run.info.run_name or run_id,
        run=run,
        experiment=experiment,
        metrics=sorted(run.metrics, key=lambda m: m.key),
        params=sorted(run.params.items()),
        tags=sorted(run.tags.items()),
        finite=_finite,
    )
    return page("run.html", values)


def _compared_ids(run: list[str] | None) -> list[str]:
    """The distinct run ids a comparison asked for, at most :data:`MAX_COMPARED`.

    Raises:
        InvalidParameter: an id that is not 32 hex characters, or fewer than two runs.
    """
    run_ids = _unique(run)[:MAX_COMPARED]
    if not all(_RUN_ID.match(r) for r in run_ids):
        raise InvalidParameter("compare runs by their 32-character ids")
    if len(run_ids) < 2:
        raise InvalidParameter("choose at least two runs to compare")
    return run_ids


ParamRow = tuple[str, list[str | None]]


def _param_rows(runs: list[Run]) -> tuple[list[ParamRow], list[ParamRow]]:
    """(the params whose values differ between the runs, those the same in all), by key."""
    keys = sorted({k for r in runs for k in r.params})
    rows = [(k, [r.params.get(k) for r in runs]) for k in keys]
    differing = [row for row in rows if len(set(row[1])) > 1]
    return differing, [row for row in rows if len(set(row[1])) <= 1]


async def compare_page(
    request: Request,
    principal: SessionPrincipal,
    run: Annotated[list[str] | None, Query(max_length=MAX_COMPARED)] = None,
) -> Response:
    """Runs side by side: their params (the rows that differ first) and their metrics'
    curves overlaid."""
    run_ids = _compared_ids(run)
    tracking = _tracking(request)
    runs = await run_in_threadpool(lambda: [tracking.get_run(principal, r) for r in run_ids])
    differing, same = _param_rows(runs)
    values = context(
        request,
        principal,
        "Compare runs",
        runs=runs,
        differing=differing,
        same=same,
        metric_keys=sorted({m.key for r in runs for m in r.metrics}),
        run_ids=" ".join(run_ids),
    )
    return page("compare.html", values)


ROUTES = [
    Route("/ui/experiments", experiments),
    Route("/ui/experiments/{experiment_id}", runs_table),
    Route("/ui/experiments/{experiment_id}/runs/{run_id}", run_page),
    Route("/ui/compare", compare_page),
]
