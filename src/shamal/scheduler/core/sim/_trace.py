"""Loading traces, machine lists and team quotas for the simulator.

**Job traces** use the common CSV schema of ``shared/traces`` (header required, extra
columns ignored, empty fields mean "unknown")::

    job_id, submit_time_s, duration_s, queue_s, num_gpus, num_cpus, mem_mib,
    user, vc, status, job_type, source

``duration_s`` is required (rows without it are an error); ``num_gpus`` may be a
fraction below 1 (a share of one GPU). ``vc`` is the team, ``job_type`` the command
fingerprint the runtime predictor learns from. ``status`` is kept for reference only:
failed and cancelled jobs are replayed like any other (they held GPUs too).

**Machine lists**: CSV (header required) or JSON. Columns / keys, any case, spaces or
underscores (aliases in brackets); ``gpus`` is required, every other one optional, and
a column that is none of these is refused (so a job trace or a team file given as the
machine list is caught, not read as machines)::

    gpus [number of GPUs, gpu]     GPUs on the node (a whole number >= 0): required
    name [machineId, sn, node]     node name (default: node-<row>)
    gpu_model [model]              GPU model (default "gpu")
    gpu_memory_mib [single GPU mem] MiB, or a size such as "12GB" / "24 GiB"
    cpu_milli | cpus [cores]       CPU capacity (milli-cores or cores; default 64 cores)
    memory_mib [mem_mib]           memory (default 512 GiB)
    pool                           pool name (default "default")
    count                          how many identical nodes the row stands for (default 1)

Numbers must be finite and not negative (``count`` at least 1); a bad value is refused
with the file, row (or machine) and column. A JSON machine list is a list of such
objects, or ``{"nodes": [...]}``. Philly's ``machines.csv`` and Alibaba's
``openb_node_list_*.csv`` load as they are.

**Teams** (``philly/vc_nodes.csv``: ``vc, node num``): one team per row whose quota is
its nodes x ``gpus_per_node`` GPUs; :func:`team_cluster` builds those nodes.
"""

from __future__ import annotations

import csv
import json
import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from shamal.scheduler.core._resources import GPU_MILLI, Cluster, Gpu, Node, Pool, Request, Resources
from shamal.scheduler.core._state import TeamQuota

__all__ = [
    "DEFAULT_POOL",
    "TraceError",
    "TraceJob",
    "assign_teams",
    "gang_request",
    "load_machines",
    "load_teams",
    "load_trace",
    "team_cluster",
]

DEFAULT_POOL = "default"
_DEFAULT_CPU_MILLI = 64_000
_DEFAULT_MEMORY_MIB = 512 * 1024


class TraceError(ValueError):
    """A trace, machine list or team file that cannot be used (with the reason)."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace."""

    id: str
    submit_s: float
    duration_s: float
    gpus: float
    cpus: float | None = None
    memory_mib: int | None = None
    user: str = ""
    team: str = ""
    status: str = ""
    job_type: str = ""


def _float(value: str | None) -> float | None:
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        raise TraceError(f"not a number: {value!r}") from None
    if not math.isfinite(number):
        raise TraceError(f"not a finite number: {value!r}")
    return number


def _column(row: Mapping[str, str | None], column: str) -> float | None:
    try:
        return _float(row.get(column))
    except TraceError as exc:
        raise TraceError(f"column {column!r}: {exc}") from None


def load_trace(path: str | Path, *, limit: int | None = None) -> list[TraceJob]:
    """The jobs of a trace CSV, sorted by submission time (then file order).

    ``limit`` keeps the first ``limit`` jobs by submission time.

    Raises:
        TraceError: missing file or column, a row without a duration, bad numbers.
    """
    path = Path(path)
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    try:
        return _read_trace(path, handle, limit)
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text file (expected a trace CSV)") from None


_TRACE_COLUMNS = frozenset({"job_id", "submit_time_s", "duration_s", "num_gpus"})


def _read_trace(path: Path, handle: IO[str], limit: int | None) -> list[TraceJob]:
    jobs: list[TraceJob] = []
    with handle:
        reader = csv.DictReader(handle)
        fields = {name.strip() for name in reader.fieldnames or ()}
        missing = _TRACE_COLUMNS - fields
        if missing:
            raise TraceError(
                f"{path} lacks column(s) {', '.join(sorted(missing))} of the trace schema"
            )
        for row_number, row in enumerate(reader, start=2):
            jobs.append(_trace_job(path, row_number, row))
    jobs.sort(key=lambda j: j.submit_s)
    if limit is not None:
        jobs = jobs[:limit]
    return jobs


def _trace_job(path: Path, row_number: int, raw: Mapping[str | None, str | None]) -> TraceJob:
    """The job of one trace row (``row_number`` counts the header as row 1)."""
    row = {k.strip(): v for k, v in raw.items() if k is not None}
    try:
        submit, duration, gpus, cpus, memory = _trace_numbers(row)
    except TraceError as exc:
        raise TraceError(f"{path}:{row_number}: {exc}") from None

    def text(column: str) -> str:
        return (row.get(column) or "").strip()

    return TraceJob(
        id=(row.get("job_id") or str(row_number - 2)).strip(),
        submit_s=submit,
        duration_s=duration,
        gpus=gpus,
        cpus=cpus,
        memory_mib=None if memory is None else int(memory),
        user=text("user"),
        team=text("vc"),
        status=text("status"),
        job_type=text("job_type"),
    )


def _trace_numbers(
    row: Mapping[str, str | None],
) -> tuple[float, float, float, float | None, float | None]:
    """Submit time, duration, GPUs, CPUs and memory of a trace row, checked."""
    submit = _column(row, "submit_time_s")
    duration = _column(row, "duration_s")
    gpus = _column(row, "num_gpus") or 0.0
    cpus = _column(row, "num_cpus")
    memory = _column(row, "mem_mib")
    if submit is None or duration is None:
        raise TraceError(
            "no submit_time_s or duration_s (the simulator replays jobs of known duration)"
        )
    if duration < 0 or gpus < 0 or (cpus or 0) < 0 or (memory or 0) < 0:
        raise TraceError("negative duration_s, num_gpus, num_cpus or mem_mib")
    return submit, duration, gpus, cpus, memory


def gang_request(job: TraceJob, node_gpus: Sequence[int]) -> Request:
    """The request of a trace job on nodes with ``node_gpus`` GPUs each.

    A fraction below one GPU is a share of one GPU; a whole number of GPUs that fits
    one node (the largest) is one worker; more GPUs become a gang of equal workers:
    the largest divisor of the GPU count that fits a node (16 GPUs on 8-GPU machines:
    2 workers of 8). CPU and memory are split evenly across workers.
    """
    largest = max(node_gpus, default=0)
    cpu_total = int(round((job.cpus or 0) * 1000))
    memory_total = job.memory_mib or 0
    if 0 < job.gpus < 1:
        milli = max(1, min(GPU_MILLI - 1, int(round(job.gpus * GPU_MILLI))))
        return Request(cpu_milli=cpu_total, memory_mib=memory_total, gpu_milli=milli)
    gpus = int(math.ceil(job.gpus))
    if gpus <= largest or largest == 0:
        return Request(cpu_milli=cpu_total, memory_mib=memory_total, gpus=gpus)
    per_worker = next(d for d in range(largest, 0, -1) if gpus % d == 0)
    workers = gpus // per_worker
    return Request(
        cpu_milli=-(-cpu_total // workers),
        memory_mib=-(-memory_total // workers),
        gpus=per_worker,
        workers=workers,
    )


# ----------------------------------------------------------------- machines

_ALIASES = {
    "name": "name",
    "machineid": "name",
    "machine": "name",
    "sn": "name",
    "node": "name",
    "nodename": "name",
    "gpus": "gpus",
    "numberofgpus": "gpus",
    "numgpus": "gpus",
    "gpu": "gpus",
    "gpumodel": "gpu_model",
    "model": "gpu_model",
    "gpumemorymib": "gpu_memory_mib",
    "singlegpumem": "gpu_memory_mib",
    "gpumemory": "gpu_memory_mib",
    "gpumem": "gpu_memory_mib",
    "cpumilli": "cpu_milli",
    "cpus": "cpus",
    "cores": "cpus",
    "memorymib": "memory_mib",
    "memmib": "memory_mib",
    "pool": "pool",
    "count": "count",
}


_EXPECTED = (
    "a GPU count column (gpus, 'number of GPUs' or gpu) and optionally: name (machineId, "
    "sn, node), gpu_model (model), gpu_memory_mib ('single GPU mem'), cpus or cpu_milli, "
    "memory_mib, pool, count; e.g. philly/machines.csv or "
    "alibaba_openb/openb_node_list_gpu_node.csv"
)


def _canonical(key: str) -> str | None:
    return _ALIASES.get(re.sub(r"[\s_\-]", "", key.strip().lower()))


def _size_mib(value: Any) -> int:
    """MiB from a number (MiB) or a size such as ``12GB`` / ``24 GiB`` / ``16384MiB``."""
    if isinstance(value, bool):
        raise TraceError(f"not a memory size: {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise TraceError(f"not a memory size >= 0: {value!r}")
        return int(value)
    text = str(value).strip()
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)", text)
    if not match:
        raise TraceError(f"not a memory size >= 0: {text!r} (a number of MiB, or e.g. '12GB')")
    number = float(match.group(1))
    unit = match.group(2).lower().rstrip("b").rstrip("i")
    factor = {"": 1, "m": 1, "g": 1024, "t": 1024 * 1024}.get(unit)
    if factor is None:
        raise TraceError(f"unknown memory unit in {text!r} (MiB, GB/GiB or TB/TiB)")
    return int(number * factor)


MAX_GPUS_PER_MACHINE = 1024
MAX_MACHINES_PER_ROW = 100_000
"""Caps on what one row of a machine list may declare: each GPU and each machine is an
object of the simulation, so a count of 10^14 would exhaust memory before it started."""


def _number(value: Any, *, whole: bool = False, least: float = 0, most: float = math.inf) -> float:
    """A finite number in [``least``, ``most``] (and whole, if asked) from a cell or JSON
    value."""
    if isinstance(value, bool):
        raise TraceError(f"not a number: {value!r}")
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise TraceError(f"not a number: {value!r}") from None
    if not math.isfinite(number) or number < least:
        raise TraceError(f"not a number >= {least:g}: {value!r}")
    if whole and not number.is_integer():
        raise TraceError(f"not a whole number: {value!r}")
    if number > most:
        raise TraceError(f"more than {most:,g}: {value!r}")
    return number


def _columns(keys: Iterable[Any], where: str) -> dict[str, str]:
    """Canonical name -> the column (or key) as written; refuses a list that is not a
    machine list, naming what is expected."""
    columns: dict[str, str] = {}
    unknown: list[str] = []
    for key in keys:
        if key is None:
            continue
        canonical = _canonical(str(key))
        if canonical is None:
            unknown.append(str(key).strip())
        elif canonical in columns:
            raise TraceError(
                f"{where}: columns {columns[canonical]!r} and {str(key).strip()!r} both give "
                f"{canonical}; keep one"
            )
        else:
            columns[canonical] = str(key)
    if "cpus" in columns and "cpu_milli" in columns:
        raise TraceError(f"{where}: give the CPUs as cpus or as cpu_milli, not both")
    if unknown or "gpus" not in columns:
        found = ", ".join(repr(u) for u in unknown)
        problem = f"unexpected column(s) {found}" if unknown else "no GPU count column"
        lowered = {u.lower() for u in unknown}
        if "submit_time_s" in lowered or "job_id" in lowered:
            problem += " (this looks like a job trace: give it as --trace)"
        elif "vc" in lowered:
            problem += " (this looks like a team file: give it as --teams)"
        raise TraceError(f"{where} is not a machine list: {problem}; expected {_EXPECTED}")
    return columns


def _node(
    row: Mapping[str, Any], columns: Mapping[str, str], number: int, where: str
) -> list[Node]:
    """The nodes one row (or JSON object) stands for; ``where`` names it in errors."""

    def get(key: str) -> Any:
        column = columns.get(key)
        value = None if column is None else row.get(column)
        return None if value is None or (isinstance(value, str) and not value.strip()) else value

    def parse(key: str, read: Any) -> Any:
        try:
            return read(get(key))
        except TraceError as exc:
            raise TraceError(f"{where}, column {columns[key].strip()!r}: {exc}") from None

    if get("gpus") is None:
        raise TraceError(f"{where}, column {columns['gpus'].strip()!r}: no GPU count")
    gpus = int(parse("gpus", lambda v: _number(v, whole=True, most=MAX_GPUS_PER_MACHINE)))
    model = str(get("gpu_model") or "gpu").strip()
    gpu_memory = parse("gpu_memory_mib", _size_mib) if get("gpu_memory_mib") is not None else 0
    if get("cpu_milli") is not None:
        cpu = int(parse("cpu_milli", _number))
    elif get("cpus") is not None:
        cpu = int(round(parse("cpus", _number) * 1000))
    else:
        cpu = _DEFAULT_CPU_MILLI
    memory = (
        parse("memory_mib", _size_mib) if get("memory_mib") is not None else _DEFAULT_MEMORY_MIB
    )
    count = (
        int(parse("count", lambda v: _number(v, whole=True, least=1, most=MAX_MACHINES_PER_ROW)))
        if get("count")
        else 1
    )
    base = str(get("name") or f"node-{number}").strip()
    pool = str(get("pool") or DEFAULT_POOL).strip()
    return [
        Node(
            name=base if count == 1 else f"{base}-{i}",
            pool=pool,
            cpu_milli=cpu,
            memory_mib=memory,
            gpus=[Gpu(index=g, model=model, memory_mib=gpu_memory) for g in range(gpus)],
        )
        for i in range(count)
    ]


def load_machines(path: str | Path) -> Cluster:
    """A cluster from a machine list (CSV or JSON, see the module docstring).

    Raises:
        TraceError: unreadable file, not a machine list (the columns expected are
            named), no machines, duplicate names, a bad value (file, row, column).
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError(f"cannot read machine list {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text file (expected a CSV or JSON machine list)") from None
    nodes = _json_nodes(path, text) if path.suffix.lower() == ".json" else _csv_nodes(path, text)
    if not nodes:
        raise TraceError(f"{path}: no machines")
    seen: set[str] = set()
    for node in nodes:
        if node.name in seen:
            raise TraceError(f"{path}: duplicate machine name {node.name!r}")
        seen.add(node.name)
    pools = [Pool(name) for name in dict.fromkeys(n.pool for n in nodes)]
    return Cluster.of(pools, nodes)


def _json_nodes(path: Path, text: str) -> list[Node]:
    """The nodes of a JSON machine list: a list of machines or ``{"nodes": [...]}``."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise TraceError(f"{path}: not JSON: {exc}") from None
    items = data.get("nodes") if isinstance(data, dict) else data
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise TraceError(f"{path}: expected a list of machines or {{'nodes': [...]}}")
    nodes: list[Node] = []
    for number, item in enumerate(items):
        where = f"{path}, machine {number}"
        nodes.extend(_node(item, _columns(item, where), number, where))
    return nodes


def _csv_nodes(path: Path, text: str) -> list[Node]:
    """The nodes of a CSV machine list (header required)."""
    reader = csv.DictReader(text.splitlines())
    columns = _columns(reader.fieldnames or (), str(path))
    nodes: list[Node] = []
    for number, row in enumerate(reader):
        nodes.extend(_node(row, columns, number, f"{path}, row {number + 2}"))
    return nodes


# ----------------------------------------------------------------- teams


def _read_teams(path: str | Path) -> dict[str, int]:
    """Team -> nodes from a ``vc, node num`` CSV."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError(f"cannot read team file {path}: {exc.strerror or exc}") from None
    teams: dict[str, int] = {}
    for row in csv.reader(text.splitlines()[1:]):
        if not row or not row[0].strip():
            continue
        try:
            teams[row[0].strip()] = int(float(row[1]))
        except (IndexError, ValueError):
            raise TraceError(f"{path}: expected rows of 'team, nodes', got {row!r}") from None
    if not teams:
        raise TraceError(f"{path}: no teams")
    return teams


def load_teams(
    path: str | Path,
    *,
    gpus_per_node: int = 8,
    pool: str = DEFAULT_POOL,
    borrow: bool = True,
    borrow_limit_gpus: int | None = None,
) -> dict[tuple[str, str], TeamQuota]:
    """Team quotas from a ``vc, node num`` CSV: each team is guaranteed its nodes x
    ``gpus_per_node`` GPUs in ``pool``, all in one cohort.

    ``borrow``: teams may borrow idle quota of the others, up to ``borrow_limit_gpus``
    more each (default: the whole cohort's quota); ``borrow=False``: isolated quotas.
    """
    teams = _read_teams(path)
    total = sum(teams.values()) * gpus_per_node
    limit = (total if borrow_limit_gpus is None else borrow_limit_gpus) if borrow else 0
    return {
        (team, pool): TeamQuota(
            team=team,
            pool=pool,
            guaranteed=Resources(gpu_milli=nodes * gpus_per_node * GPU_MILLI),
            borrow_limit=Resources(gpu_milli=limit * GPU_MILLI),
            cohort="teams",
        )
        for team, nodes in teams.items()
    }


def team_cluster(path: str | Path, *, gpus_per_node: int = 8, pool: str = DEFAULT_POOL) -> Cluster:
    """The nodes of a team file: each team's nodes, ``gpus_per_node`` GPUs each."""
    teams = _read_teams(path)
    nodes = [
        Node(
            name=f"{team}-{i}",
            pool=pool,
            cpu_milli=_DEFAULT_CPU_MILLI,
            memory_mib=_DEFAULT_MEMORY_MIB,
            gpus=[Gpu(index=g, model="gpu", memory_mib=0) for g in range(gpus_per_node)],
        )
        for team, count in teams.items()
        for i in range(count)
    ]
    return Cluster.of([Pool(pool)], nodes)


def assign_teams(
    jobs: Iterable[TraceJob], quotas: Mapping[tuple[str, str], TeamQuota], *, seed: int = 0
) -> list[TraceJob]:
    """Give each job a team at random (seeded), with probability proportional to the
    team's guaranteed GPUs, among the teams whose guarantee can hold the job.

    Raises:
        TraceError: a job larger than every team's guarantee.
    """
    sizes = sorted(
        ((q.guaranteed.gpu_milli / GPU_MILLI, q.team) for q in quotas.values()), reverse=True
    )
    rng = random.Random(seed)
    eligible_cache: dict[float, tuple[list[str], list[float]]] = {}
    out: list[TraceJob] = []
    for job in jobs:
        need = math.ceil(job.gpus) if job.gpus >= 1 else job.gpus
        choice = eligible_cache.get(need)
        if choice is None:
            eligible = [(gpus, team) for gpus, team in sizes if gpus >= need]
            if not eligible:
                raise TraceError(f"job {job.id} asks for {job.gpus} GPUs, more than any team has")
            choice = eligible_cache[need] = (
                [team for _, team in eligible],
                [gpus for gpus, _ in eligible],
            )
        team = rng.choices(choice[0], weights=choice[1])[0]
        out.append(replace(job, team=team))
    return out
