"""The datasets pages: the datasets a person may read, one dataset's versions, one
version (schema, profile, validation, transformations) and two versions compared.

Each page calls the datasets service as the API routes do, with the signed-in principal, so
another team's dataset reads exactly as a missing one (404) and is never listed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from fastapi import Path, Query, Request
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from shamal.datasets import DataSet, DatasetService, DataVersion
from shamal.errors import NotFound
from shamal.security import Principal
from shamal.webui._common import Route, context, service_of
from shamal.webui._render import page
from shamal.webui._session import SessionPrincipal
from shamal.webui._svg import Series, line_chart

DATASETS_PER_PAGE = 50
VERSIONS_PER_PAGE = 50
#: Datasets a name filter looks through for one page before it stops and offers the rest.
MAX_SCANNED = 5000
_SCAN_BATCH = 500
#: Characters of a check's observed value or samples shown (the rest is cut).
MAX_DETAIL = 400

_NAME = r"^[a-z0-9][a-z0-9._-]{0,127}$"
#: A version within a dataset, as the API's diff takes it: a number, an alias or ``latest``.
_WITHIN = r"^([1-9][0-9]{0,8}|[a-z][a-z0-9_-]{0,63})$"
DatasetName = Annotated[str, Path(pattern=_NAME, max_length=128)]
VersionNumber = Annotated[int, Path(ge=1, le=999_999_999)]
Within = Annotated[str, Query(pattern=_WITHIN, max_length=64)]


def _datasets(request: Request) -> DatasetService:
    return service_of(request, "datasets", DatasetService)


def at(moment: datetime | None) -> str:
    """A time as the pages show it (UTC, to the second)."""
    return "" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


def shown(value: Any) -> str:
    """A profile's value as text: numbers to six significant digits, the rest as they are."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def detail(value: Any) -> str:
    """A check's observed value, samples or a record's field, as short text."""
    if value is None or value == [] or value == {}:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 1] + "…"


def _short(digest: str) -> str:
    return digest.removeprefix("sha256:")[:12]


# ---------------------------------------------------------------------------- datasets
@dataclass(frozen=True)
class DatasetRow:
    """A row of the datasets table: the dataset, and its latest valid version's rows."""

    dataset: DataSet
    rows: int | None


def _matching(
    svc: DatasetService, principal: Principal, needle: str, after: str | None
) -> tuple[list[DataSet], str | None, bool]:
    """(a page of the datasets whose name holds ``needle``, the name the next page starts
    after, whether the scan stopped at :data:`MAX_SCANNED` before the page filled)."""
    found: list[DataSet] = []
    cursor, scanned = after, 0
    while scanned < MAX_SCANNED:
        batch = svc.list_datasets(principal, after=cursor, limit=_SCAN_BATCH)
        scanned += len(batch)
        found += [d for d in batch if needle in d.name]
        if len(found) > DATASETS_PER_PAGE:
            return found[:DATASETS_PER_PAGE], found[DATASETS_PER_PAGE - 1].name, False
        if len(batch) < _SCAN_BATCH:
            return found, None, False
        cursor = batch[-1].name
    return found, cursor, True


def _rows_of(svc: DatasetService, principal: Principal, found: DataSet) -> int | None:
    if found.latest_version is None:
        return None
    try:
        return svc.version(principal, f"{found.name}/{found.latest_version}").row_count
    except NotFound:  # removed since it was listed
        return None


async def datasets_page(
    request: Request,
    principal: SessionPrincipal,
    name: Annotated[str, Query(alias="q", max_length=128)] = "",
    after: Annotated[str | None, Query(pattern=_NAME, max_length=128)] = None,
) -> Response:
    """The datasets the person may read, 50 a page, by name; ``q`` keeps those whose name
    holds it."""
    svc = _datasets(request)
    needle = name.strip().lower()

    def read() -> tuple[list[DatasetRow], str | None, bool]:
        found, next_after, stopped = _matching(svc, principal, needle, after)
        return [DatasetRow(d, _rows_of(svc, principal, d)) for d in found], next_after, stopped

    rows, next_after, stopped = await run_in_threadpool(read)
    values = context(
        request,
        principal,
        "Datasets",
        rows=rows,
        q=needle,
        after=after or "",
        next_after=next_after,
        stopped=stopped,
        max_scanned=MAX_SCANNED,
        at=at,
    )
    return page("datasets.html", values)


# ---------------------------------------------------------------------------- a dataset
def _validation_state(version: DataVersion) -> str:
    """``passed``, ``failed`` or empty (no suite judged it)."""
    if version.validation is None:
        return ""
    return "passed" if version.validation.get("ok") else "failed"


async def dataset_page(
    request: Request,
    principal: SessionPrincipal,
    name: DatasetName,
    before: Annotated[int | None, Query(ge=2, le=999_999_999)] = None,
) -> Response:
    """A dataset: its owner, residency, aliases and versions (newest first, 50 a page)."""
    svc = _datasets(request)

    def read() -> tuple[DataSet, list[DataVersion]]:
        found = svc.get(principal, name)
        return found, svc.versions(principal, name, before=before, limit=VERSIONS_PER_PAGE + 1)

    found, versions = await run_in_threadpool(read)
    more = len(versions) > VERSIONS_PER_PAGE
    versions = versions[:VERSIONS_PER_PAGE]
    values = context(
        request,
        principal,
        found.name,
        dataset=found,
        aliases=sorted(found.aliases.items()),
        versions=versions,
        validation_state=_validation_state,
        short=_short,
        next_before=versions[-1].version if more and versions else None,
        paged=before is not None,
        at=at,
    )
    return page("dataset.html", values)


# ---------------------------------------------------------------------------- a version
@dataclass(frozen=True)
class ColumnView:
    """One column of a version's profile, as the table shows it."""

    name: str
    type: str
    kind: str
    personal: bool
    count: str
    nulls: str
    distinct: str
    minimum: str
    maximum: str
    mean: str
    std: str
    quantiles: list[tuple[str, str]]
    top_values: list[tuple[str, str]]
    chart: Markup | None


def _number(raw: Any) -> float | None:
    """A profile's number (JSON keeps non-finite ones as text), or None."""
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _curve(column: dict[str, Any]) -> tuple[list[float], list[float]]:
    """The column's quantile function: (percent, value) from its 101 percentiles, else
    from its named quantiles."""
    percentiles = column.get("percentiles")
    points: list[tuple[float, float | None]] = []
    if isinstance(percentiles, list) and len(percentiles) > 1:
        step = 100 / (len(percentiles) - 1)
        points = [(i * step, _number(v)) for i, v in enumerate(percentiles)]
    elif isinstance(column.get("quantiles"), dict):
        for key, raw in column["quantiles"].items():
            rank = _number(str(key).removeprefix("p"))
            if rank is not None:
                points.append((rank, _number(raw)))
    kept = sorted((x, y) for x, y in points if y is not None)
    return [x for x, _ in kept], [y for _, y in kept]


def _chart(column: dict[str, Any]) -> Markup | None:
    if column.get("kind") not in ("numeric", "temporal") or column.get("personal"):
        return None
    xs, ys = _curve(column)
    if len(xs) < 2:
        return None
    name = str(column.get("name", ""))
    title = f"{name}: value at each percentile"
    return line_chart([Series(name, xs, ys)], title, width=320, height=140)


def _column_view(column: dict[str, Any]) -> ColumnView:
    quantiles = column.get("quantiles")
    top = column.get("top_values")
    return ColumnView(
        name=str(column.get("name", "")),
        type=str(column.get("type", "")),
        kind=str(column.get("kind", "")),
        personal=bool(column.get("personal")),
        count=shown(column.get("count")),
        nulls=shown(column.get("nulls")),
        distinct=shown(column.get("distinct")),
        minimum=shown(column.get("min")),
        maximum=shown(column.get("max")),
        mean=shown(_number(column.get("mean"))),
        std=shown(_number(column.get("std"))),
        quantiles=[(str(k), shown(_number(v))) for k, v in quantiles.items()]
        if isinstance(quantiles, dict)
        else [],
        top_values=[
            (shown(t.get("value")), shown(t.get("count"))) for t in top if isinstance(t, dict)
        ]
        if isinstance(top, list)
        else [],
        chart=_chart(column),
    )


def _profile_columns(version: DataVersion) -> list[ColumnView]:
    columns = version.profile.get("columns")
    if not isinstance(columns, list):
        return []
    return [_column_view(c) for c in columns if isinstance(c, dict)]


def _results(version: DataVersion) -> list[dict[str, Any]]:
    report = version.validation or {}
    found = report.get("results")
    return [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []


def _transformations(version: DataVersion) -> list[tuple[str, str, str]]:
    """(column, action, the rest as text) of each transformation the version records."""
    done = []
    for entry in version.transformations:
        rest = {k: v for k, v in entry.items() if k not in ("column", "action")}
        done.append((shown(entry.get("column")), shown(entry.get("action")), detail(rest)))
    return done


async def version_page(
    request: Request, principal: SessionPrincipal, name: DatasetName, version: VersionNumber
) -> Response:
    """A version: its facts, schema, column profile, validation report and transformations,
    with links to the diff against the previous version and to its lineage."""
    found = await run_in_threadpool(_datasets(request).version, principal, f"{name}/{version}")
    values = context(
        request,
        principal,
        f"{name} v{version}",
        version=found,
        columns=_profile_columns(found),
        profile_scope=shown(found.profile.get("scope")),
        results=_results(found),
        validation_state=_validation_state(found),
        transformations=_transformations(found),
        source=sorted((str(k), detail(v)) for k, v in found.source.items()),
        tags=sorted(found.tags.items()),
        short=_short,
        detail=detail,
        at=at,
    )
    return page("data_version.html", values)


# ---------------------------------------------------------------------------- a diff
def _within(name: str, ref: str) -> str:
    if ref.isdigit():
        return f"{name}/{ref}"
    return name if ref == "latest" else f"{name}@{ref}"


def psi_band(psi: float | None) -> str:
    """How the population stability index reads: stable, moderate or major."""
    if psi is None:
        return ""
    if psi > 0.25:
        return "major"
    return "moderate" if psi >= 0.1 else "stable"


async def diff_page(
    request: Request,
    principal: SessionPrincipal,
    name: DatasetName,
    a: Within,
    b: Within,
) -> Response:
    """How version ``b`` differs from version ``a``: schema, rows and each column's shift
    (as the service's diff says)."""
    svc = _datasets(request)
    found = await run_in_threadpool(svc.diff, principal, _within(name, a), _within(name, b))
    values = context(
        request,
        principal,
        f"{name}: {a} → {b}",
        name=name,
        a=a,
        b=b,
        diff=found.to_json(),
        shown=shown,
        psi_band=psi_band,
    )
    return page("data_diff.html", values)


ROUTES = [
    Route("/ui/datasets", datasets_page),
    Route("/ui/datasets/{name}", dataset_page),
    Route("/ui/datasets/{name}/versions/{version}", version_page),
    Route("/ui/datasets/{name}/diff", diff_page),
]
