"""Tracking benchmark: Shamal's MLflow REST API against a stock ``mlflow server``.

One run drives both servers with the same stock MLflow client (``MlflowClient`` from
mlflow-skinny in Shamal's venv) and the same data, and prints both figures side by side with
their ratio and the target for that ratio.

Nothing is timed on one server while the other's figure is taken at another time. The speed of
a shared machine drifts over seconds and minutes (the client alone moves between about 20 and
35 ms a log_batch call here): timed one after the other, the fast server's second would land in
one phase and MLflow's minutes in others. So every timed figure is taken in turns: the servers
(and ``bench/_replay.py``, below) run together, each is first left to finish its start-up work
(``mlflow server`` answers /health while its job consumers still import mlflow), and while one
takes its turn the others are paused (SIGSTOP), so nothing of theirs runs. Only the seeding is
done on each server alone, one after the other; its rates are printed without a target.

1. ``log_batch`` of 1,000 metrics per call (100 keys x 10 steps): metrics/s over the timed calls,
   warm-up calls excluded. Target: Shamal >= 10x MLflow. Shamal, MLflow and ``bench/_replay.py``
   take turns of at least 1 s of calls each, in a rotating order, until each has had 20 calls
   and MLflow 10 s of them. (Turns of one call each would put every fast call right after a
   long one, on cold caches.) ``bench/_replay.py`` answers ``{}`` and stores nothing: the
   client's own rate, so that rate over MLflow's is the best ratio any server could reach.
2. ``search_runs`` with ``metrics.acc > 0.5``, 1,000 per page, ordered by ``metrics.acc DESC``,
   over an experiment of 10,000 runs (3 metrics, 3 params, 1 tag each): median latency of the
   first page (10 reads), and of a pass through every page (3 passes). Target: >= 5x.
3. ``get_metric_history`` of 100,000 points of one key on one run: median of 5 full reads (the
   client pages through them). Target: >= 5x. The same read is also timed against
   ``bench/_replay.py`` answering each server's recorded pages from memory: what the client
   itself costs, so MLflow's read over Shamal's replay is the best ratio any server could reach.
4. 8 concurrent logger processes, each with its own run in one experiment, each logging
   50 x ``log_batch`` of 100 metrics and 20 ``log_metric``: total metrics/s, the median of 3
   rounds. Target: >= 5x.

After seeding, the servers and the two replays are started again together; the reads of 2 and
3 (and their HTTP-only variants) go one read each per turn in a rotating order, then each round
of 4 gives every server its turn.

Seeding (runs for search, points for history) is timed and printed as well, without a target.
Results are checked too: both servers must return the same matches in the same order and every
point of the history; a wrong answer fails its row whatever its speed.

Run from the repository root with Shamal's venv (see ``bench/README.md``)::

    .venv/bin/python bench/tracking.py --quick
    .venv/bin/python bench/tracking.py [--backend postgres] [--workers N] [--runs N] [--json]

Exit status: 0 once the benchmark ran, pass or fail; 2 when a server or the stock MLflow venv
could not be set up.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import queue
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from importlib.metadata import version
from pathlib import Path
from typing import Any

import _servers
import httpx
from _servers import ServerProcess
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

TS0 = 1_700_000_000_000  # a fixed epoch (ms) so both servers store identical points
SEARCH_FILTER = "metrics.acc > 0.5"
SEARCH_ORDER = ["metrics.acc DESC"]
HISTORY_PAGE = 25_000  # the page size MlflowClient.get_metric_history asks for
# Rows whose two figures come from different measures: (Shamal's, MLflow's).
CROSS_ROWS = {
    "log_batch_ceiling": ("log_batch_floor", "log_batch"),
    "history_ceiling": ("history_floor", "history"),
}


@dataclass(frozen=True)
class Sizes:
    """How much work each measurement does; ``FULL`` is the benchmark, ``QUICK`` a smoke run."""

    batch_size: int
    batch_warmup: int
    batch_calls: int
    batch_seconds: float
    batch_block_seconds: float
    search_runs: int
    search_page: int
    searches: int
    search_passes: int
    history_points: int
    history_reads: int
    loggers: int
    logger_batches: int
    logger_batch_size: int
    logger_singles: int
    concurrent_rounds: int
    seed_threads: int


FULL = Sizes(
    batch_size=1000,
    batch_warmup=3,
    batch_calls=20,
    batch_seconds=10.0,
    batch_block_seconds=1.0,
    search_runs=10_000,
    search_page=1000,
    searches=10,
    search_passes=3,
    history_points=100_000,
    history_reads=5,
    loggers=8,
    logger_batches=50,
    logger_batch_size=100,
    logger_singles=20,
    concurrent_rounds=3,
    seed_threads=8,
)
QUICK = replace(
    FULL,
    batch_warmup=1,
    batch_calls=5,
    batch_seconds=1.0,
    batch_block_seconds=0.2,
    search_runs=500,
    search_page=100,
    searches=3,
    search_passes=1,
    history_points=10_000,
    history_reads=3,
    loggers=4,
    logger_batches=5,
    logger_singles=5,
    concurrent_rounds=1,
    seed_threads=4,
)


@dataclass(frozen=True)
class Measure:
    """One row of the report: how a figure reads and what the Shamal/MLflow ratio must reach."""

    key: str
    label: str
    unit: str
    higher_is_better: bool
    target: float | None


def measures(sizes: Sizes) -> list[Measure]:
    return [
        Measure(
            "log_batch",
            f"log_batch, {sizes.batch_size:,} metrics/call, in turns over "
            f">= {sizes.batch_seconds:g} s",
            "metrics/s",
            True,
            10.0,
        ),
        Measure(
            "log_batch_floor",
            "  same calls to a server that stores nothing (client's own work)",
            "metrics/s",
            True,
            None,
        ),
        Measure(
            "log_batch_ceiling",
            "  best ratio any server can reach: the client alone / MLflow",
            "metrics/s",
            True,
            None,
        ),
        Measure(
            "search",
            f"search_runs '{SEARCH_FILTER}', {sizes.search_page:,}/page, "
            f"{sizes.search_runs:,} runs (median, in turns)",
            "s",
            False,
            5.0,
        ),
        Measure("search_http", "  same page, HTTP only (no client parsing)", "s", False, None),
        Measure("search_all", "search_runs, every page of the matches (median)", "s", False, None),
        Measure(
            "history",
            f"get_metric_history, {sizes.history_points:,} points (median, in turns)",
            "s",
            False,
            5.0,
        ),
        Measure("history_http", "  same reads, HTTP only (no client parsing)", "s", False, None),
        Measure(
            "history_floor",
            "  same reads, its answers replayed from memory (client's own work)",
            "s",
            False,
            None,
        ),
        Measure(
            "history_ceiling",
            "  best ratio any server can reach: MLflow's read / Shamal's replay",
            "s",
            False,
            None,
        ),
        Measure(
            "concurrent",
            f"{sizes.loggers} concurrent loggers, {sizes.logger_batches} x log_batch("
            f"{sizes.logger_batch_size}) + {sizes.logger_singles} log_metric each",
            "metrics/s",
            True,
            5.0,
        ),
        Measure(
            "seed_search",
            f"seed {sizes.search_runs:,} runs ({sizes.seed_threads} threads)",
            "runs/s",
            True,
            None,
        ),
        Measure(
            "seed_history",
            f"seed {sizes.history_points:,} points by log_batch ({sizes.seed_threads} threads)",
            "metrics/s",
            True,
            None,
        ),
    ]


@dataclass
class ServerResult:
    """What one server did: figures by measure key, failed checks and errors."""

    figures: dict[str, float] = field(default_factory=dict)
    wrong: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    http_errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    # What the seeding left to read again in turns: the search experiment, the history run.
    search_experiment: str | None = None
    history_run: str | None = None


# ---------------------------------------------------------------------------- workloads
@dataclass
class Bench:
    """One server under test and what the workloads share: the client, the sizes, the results."""

    server: ServerProcess
    client: MlflowClient
    raw: RawApi
    sizes: Sizes
    result: ServerResult
    console: Console


class RawApi:
    """The requests the client sends, sent by httpx and left unparsed.

    Only for the "HTTP only" rows, which split a client figure into server time and the client's
    own protobuf parsing; the measured rows all go through :class:`MlflowClient`.
    """

    def __init__(self, server: ServerProcess) -> None:
        headers = {"Authorization": f"Bearer {server.token}"} if server.token else {}
        self.http = httpx.Client(
            base_url=f"{server.url}/api/2.0/mlflow", headers=headers, timeout=600.0
        )

    def search_page(self, experiment_id: str, page_size: int) -> int:
        body = {
            "experiment_ids": [experiment_id],
            "filter": SEARCH_FILTER,
            "run_view_type": "ACTIVE_ONLY",
            "max_results": page_size,
            "order_by": SEARCH_ORDER,
        }
        return len(self._ok(self.http.post("/runs/search", json=body)).get("runs", []))

    def history(self, run_id: str, key: str) -> int:
        return sum(len(body.get("metrics", [])) for _, _, body in self._history_pages(run_id, key))

    def record_history(self, run_id: str, key: str, folder: Path) -> None:
        """Write every page of a history read as sent, for :mod:`_replay` (``index.json`` maps
        each page's token, "" for the first, to its file)."""
        folder.mkdir(parents=True, exist_ok=True)
        index = {}
        for number, (token, raw, _) in enumerate(self._history_pages(run_id, key)):
            name = f"page-{number}.json"
            (folder / name).write_bytes(raw)
            index[token] = name
        (folder / "index.json").write_text(json.dumps(index))

    def _history_pages(self, run_id: str, key: str) -> Iterable[tuple[str, bytes, dict[str, Any]]]:
        token = ""
        while True:
            params = {"run_id": run_id, "metric_key": key, "max_results": HISTORY_PAGE}
            if token:
                params["page_token"] = token
            response = self.http.get("/metrics/get-history", params=params)
            body = self._ok(response)
            yield token, response.content, body
            token = body.get("next_page_token") or ""
            if not token:
                return

    @staticmethod
    def _ok(response: httpx.Response) -> dict[str, Any]:
        if response.status_code != 200:
            raise RuntimeError(
                f"{response.request.method} {response.request.url} -> "
                f"{response.status_code} {response.text[:500]}"
            )
        body: dict[str, Any] = response.json()
        return body

    def close(self) -> None:
        self.http.close()


def _timed(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = call()
    return time.perf_counter() - start, value


def _parallel(bench: Bench, jobs: Sequence[Callable[[], object]], description: str) -> float:
    """Run ``jobs`` on the seeding thread pool with a progress bar; returns the wall seconds."""
    progress = Progress(
        TextColumn("  {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=bench.console,
        transient=True,
        disable=not bench.console.is_terminal,  # no bar in a log file
    )
    with progress, ThreadPoolExecutor(bench.sizes.seed_threads) as pool:
        task = progress.add_task(description, total=len(jobs))
        start = time.perf_counter()
        futures = [pool.submit(job) for job in jobs]
        for future in as_completed(futures):
            future.result()  # the first failure ends the seeding and is reported
            progress.advance(task)
        return time.perf_counter() - start


def log_batch_in_turns(
    servers: list[ServerProcess], workdir: Path, sizes: Sizes, console: Console
) -> dict[str, ServerResult]:
    """``log_batch`` on every server and on :mod:`_replay`, all running, the calls in turn.

    See :func:`_rates_in_turn`. Returns each server's result with its rate
    (``log_batch``) and the replay's (``log_batch_floor``, the same figure for both).
    """
    results = {server.name: ServerResult() for server in servers}
    replay = _servers.replay_server(workdir / "replay", _empty_pages(workdir / "replay"))
    started: list[ServerProcess] = []
    try:
        _start_together([*servers, replay], started, "log_batch", console)
        try:
            rates = _rates_in_turn(_targets(servers, replay), sizes)
        except Exception as exc:  # recorded like any workload's failure; the others still run
            for server in servers:
                results[server.name].errors.append(
                    f"log_batch: {exc!r}\n--- last lines of {server.log}:\n{server.log_tail()}"
                )
            console.print(f"[red]log_batch: {exc!r}[/]", markup=False)
            return results
    finally:
        for server in started:
            server.stop()
    for server in servers:
        result = results[server.name]
        result.figures["log_batch"] = rates[server.name]
        result.figures["log_batch_floor"] = rates["replay"]
    return results


def _targets(servers: list[ServerProcess], replay: ServerProcess) -> list[Target]:
    """A client and a new run on each server; the replay stores nothing and answers any run,
    so it takes the first server's run id."""
    targets = []
    for server in servers:
        client = MlflowClient(tracking_uri=server.url)
        run_id = client.create_run(client.create_experiment("bench-log-batch")).info.run_id
        targets.append(Target(server, client, run_id))
    targets.append(Target(replay, MlflowClient(tracking_uri=replay.url), targets[0].run_id))
    return targets


@dataclass(frozen=True)
class Target:
    """A server that ``log_batch`` takes turns on, with the client and run it logs to."""

    server: ServerProcess
    client: MlflowClient
    run_id: str

    def log(self, call: int, sizes: Sizes) -> float:
        """Seconds of one ``log_batch`` of the ``call``-th batch (built before the clock)."""
        metrics = _batch(call, sizes.batch_size)
        seconds, _ = _timed(lambda: self.client.log_batch(self.run_id, metrics=metrics))
        return seconds


def _rates_in_turn(targets: list[Target], sizes: Sizes) -> dict[str, float]:
    """Metrics/s of each target's timed ``log_batch`` calls, sent in turns of at least
    ``batch_block_seconds`` each, in a rotating order, while every other server is paused
    (SIGSTOP): each figure is its own server's alone, and all of them span the same stretch
    of the machine's time. Each target logs its own batches in order."""
    names = [t.server.name for t in targets]
    calls = dict.fromkeys(names, 0)
    elapsed = dict.fromkeys(names, 0.0)
    turn = 0
    try:
        while (
            min(calls.values()) < sizes.batch_calls or max(elapsed.values()) < sizes.batch_seconds
        ):
            first = turn % len(targets)
            for target in targets[first:] + targets[:first]:
                name = target.server.name
                _alone(target.server, [t.server for t in targets])
                if calls[name] == 0:
                    for call in range(sizes.batch_warmup):
                        target.log(call, sizes)
                spent = 0.0
                while spent < sizes.batch_block_seconds:
                    spent += target.log(sizes.batch_warmup + calls[name], sizes)
                    calls[name] += 1
                elapsed[name] += spent
            turn += 1
    finally:
        for target in targets:
            target.server.resume()
    return {name: calls[name] * sizes.batch_size / elapsed[name] for name in names}


def _batch(call: int, size: int) -> list[Metric]:
    """The ``call``-th batch: 10 steps of ``size // 10`` keys, the same on every server."""
    steps_per_call = 10
    return [
        Metric(f"m{k:03d}", (step * 7 + k) % 1000 / 1000, TS0 + step, step)
        for step in range(call * steps_per_call, (call + 1) * steps_per_call)
        for k in range(size // steps_per_call)
    ]


def _empty_pages(home: Path) -> Path:
    """A page folder with no history pages, for a _replay that only answers log-batch."""
    folder = home / "no-pages"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "index.json").write_text("{}")
    return folder


def search_accuracies(runs: int) -> list[float]:
    """The ``acc`` metric of each seeded run, the same on both servers."""
    return [random.Random(i).random() for i in range(runs)]


def _seed_one_run(client: MlflowClient, experiment_id: str, i: int) -> None:
    rng = random.Random(i)
    acc = rng.random()
    run = client.create_run(experiment_id, run_name=f"run-{i:05d}", tags={"group": f"g{i % 10}"})
    client.log_batch(
        run.info.run_id,
        metrics=[
            Metric("acc", acc, TS0, 0),
            Metric("loss", 1 - acc + rng.random() / 10, TS0, 0),
            Metric("f1", rng.random(), TS0, 0),
        ],
        params=[
            Param("lr", str(rng.choice([0.1, 0.01, 0.001]))),
            Param("depth", str(rng.randint(2, 12))),
            Param("optimizer", rng.choice(["adam", "sgd", "lion"])),
        ],
    )


def bench_search(bench: Bench) -> None:
    """Seed the search experiment and check both answers (first page, every page); the timed
    searches come later, in turns with the other server (:func:`timed_in_turns`)."""
    client, sizes, figures = bench.client, bench.sizes, bench.result.figures
    experiment_id = client.create_experiment("bench-search")
    jobs = [lambda i=i: _seed_one_run(client, experiment_id, i) for i in range(sizes.search_runs)]
    seconds = _parallel(bench, jobs, f"seeding {sizes.search_runs:,} runs")
    figures["seed_search"] = sizes.search_runs / seconds

    expected = sorted((a for a in search_accuracies(sizes.search_runs) if a > 0.5), reverse=True)
    got = _first_page(client, experiment_id, sizes.search_page)
    if got != expected[: sizes.search_page]:
        bench.result.wrong["search"] = (
            f"first page: {len(got)} runs, expected {min(len(expected), sizes.search_page)} "
            f"in descending acc order; first values {got[:3]} vs {expected[:3]}"
        )
    every = _all_pages(client, experiment_id, sizes.search_page)
    if every != expected:
        bench.result.wrong["search_all"] = (
            f"paging returned {len(every)} runs ({len(set(every))} distinct), "
            f"expected {len(expected)} in descending acc order"
        )
    bench.result.search_experiment = experiment_id


def _first_page(client: MlflowClient, experiment_id: str, page_size: int) -> list[float]:
    page = client.search_runs(
        [experiment_id], SEARCH_FILTER, max_results=page_size, order_by=SEARCH_ORDER
    )
    return [run.data.metrics["acc"] for run in page]


def _all_pages(client: MlflowClient, experiment_id: str, page_size: int) -> list[float]:
    values: list[float] = []
    token = None
    while True:
        page = client.search_runs(
            [experiment_id],
            SEARCH_FILTER,
            max_results=page_size,
            order_by=SEARCH_ORDER,
            page_token=token,
        )
        values.extend(run.data.metrics["acc"] for run in page)
        token = page.token
        if not token:
            return values


def bench_history(bench: Bench) -> None:
    """Seed the history run, check a read of it and record its pages for :mod:`_replay`; the
    timed reads come later, in turns with the other server (:func:`timed_in_turns`)."""
    client, sizes, figures = bench.client, bench.sizes, bench.result.figures
    run_id = client.create_run(client.create_experiment("bench-history")).info.run_id
    jobs = [
        lambda first=first: client.log_batch(
            run_id,
            metrics=[
                Metric("loss", 1 / (1 + step), TS0 + step, step)
                for step in range(first, min(first + sizes.batch_size, sizes.history_points))
            ],
        )
        for first in range(0, sizes.history_points, sizes.batch_size)
    ]
    seconds = _parallel(bench, jobs, f"seeding {sizes.history_points:,} points")
    figures["seed_history"] = sizes.history_points / seconds

    points = client.get_metric_history(run_id, "loss")
    steps = sorted(point.step for point in points)
    if steps != list(range(sizes.history_points)):
        bench.result.wrong["history"] = (
            f"{len(points)} points, {len(set(steps))} distinct steps, "
            f"expected steps 0..{sizes.history_points - 1} once each"
        )
    bench.raw.record_history(run_id, "loss", _pages_folder(bench.server))
    bench.result.history_run = run_id


def _pages_folder(server: ServerProcess) -> Path:
    return server.log.parent / "history-pages"


# ---------------------------------------------------------------------------- timed in turns
@dataclass(frozen=True)
class Reader:
    """One timed read that takes turns: the process that answers it (awake, the others
    paused), the figure it feeds, how many timed reads it gets, the read, and what the read
    must return (checked after the clock stops)."""

    server: ServerProcess
    result: ServerResult
    key: str
    reads: int
    read: Callable[[], Any]
    returns: Callable[[Any], bool]


def _readers(
    seeded: list[ServerProcess],
    replays: dict[str, ServerProcess],
    sizes: Sizes,
    results: dict[str, ServerResult],
    raws: list[RawApi],
) -> list[Reader]:
    """The timed reads of every seeded server (see :func:`_server_readers`)."""
    readers = []
    for server in seeded:
        raw = RawApi(server)
        raws.append(raw)
        replay = replays.get(server.name)
        readers += _server_readers(server, replay, results[server.name], sizes, raw)
    return readers


def _server_readers(
    server: ServerProcess,
    replay: ServerProcess | None,
    result: ServerResult,
    sizes: Sizes,
    raw: RawApi,
) -> list[Reader]:
    """One server's timed reads: its search and history reads through the client, the same
    over plain HTTP, and the history read against ``replay``, which answers its pages."""
    Spec = tuple[ServerProcess, str, int, Callable[[], Any], Callable[[Any], bool]]
    specs: list[Spec] = []
    client = MlflowClient(tracking_uri=server.url)
    experiment, page = result.search_experiment, sizes.search_page
    if experiment is not None:
        matches = sum(a > 0.5 for a in search_accuracies(sizes.search_runs))
        first = min(matches, page)
        first_page = partial(_first_page, client, experiment, page)
        every_page = partial(_all_pages, client, experiment, page)
        specs += [
            (server, "search", sizes.searches, first_page, lambda got: len(got) == first),
            (server, "search_http", sizes.searches, partial(raw.search_page, experiment, page),
             lambda got: got == first),
            (server, "search_all", sizes.search_passes, every_page,
             lambda got: len(got) == matches),
        ]  # fmt: skip
    run_id, points = result.history_run, sizes.history_points
    if run_id is not None and replay is not None:
        read = partial(client.get_metric_history, run_id, "loss")
        replayed = partial(MlflowClient(tracking_uri=replay.url).get_metric_history, run_id, "loss")
        specs += [
            (server, "history", sizes.history_reads, read, lambda got: len(got) == points),
            (server, "history_http", sizes.history_reads, partial(raw.history, run_id, "loss"),
             lambda got: got == points),
            (replay, "history_floor", sizes.history_reads, replayed,
             lambda got: len(got) == points),
        ]  # fmt: skip
    return [Reader(on, result, key, reads, call, ok) for on, key, reads, call, ok in specs]


def _reads_in_turns(readers: list[Reader], awake: list[ServerProcess]) -> None:
    """One read of each reader per turn, in a rotating order, each with only its own server
    awake; the first turn warms up, and each figure is the median of its timed reads."""
    seconds: list[list[float]] = [[] for _ in readers]
    for turn in range(1 + max(reader.reads for reader in readers)):
        first = turn % len(readers)
        for i in [*range(first, len(readers)), *range(first)]:
            reader = readers[i]
            if turn > reader.reads:
                continue
            _alone(reader.server, awake)
            took, got = _timed(reader.read)
            if not reader.returns(got):
                raise RuntimeError(f"{reader.server.name} {reader.key}: unexpected answer")
            if turn:
                seconds[i].append(took)
    for reader, taken in zip(readers, seconds, strict=True):
        reader.result.figures[reader.key] = statistics.median(taken)


def timed_in_turns(
    servers: list[ServerProcess],
    sizes: Sizes,
    only: Iterable[str],
    console: Console,
    results: dict[str, ServerResult],
) -> None:
    """The timed search and history reads and the concurrent loggers, on every server that
    seeded (and a :mod:`_replay` of each one's history pages), started again together and left
    to go quiet: the reads in turns (:func:`_reads_in_turns`), then the loggers in rounds
    (:func:`concurrent_in_turns`), so every figure spans the same stretch of the machine's
    time as its peer's."""
    concurrent = "concurrent" in only
    seeded = [
        s
        for s in servers
        if concurrent or results[s.name].search_experiment or results[s.name].history_run
    ]
    replays = {
        s.name: _servers.replay_server(s.log.parent, _pages_folder(s))
        for s in seeded
        if results[s.name].history_run
    }
    started: list[ServerProcess] = []
    raws: list[RawApi] = []
    try:
        _start_together([*seeded, *replays.values()], started, "the timed reads", console)
        readers = _readers(seeded, replays, sizes, results, raws)
        if readers:
            console.print("[bold]search and history reads[/]: every server in turn")
            try:
                _reads_in_turns(readers, started)
            except Exception as exc:  # recorded like a workload's failure; the loggers still run
                for server in seeded:
                    results[server.name].errors.append(f"timed reads: {exc!r}")
                console.print(f"[red]timed reads: {exc!r}[/]", markup=False)
        if concurrent:
            concurrent_in_turns(seeded, started, sizes, console, results)
    finally:
        for raw in raws:
            raw.close()
        for server in started:
            server.resume()
            server.stop()


def _start_together(
    servers: list[ServerProcess], started: list[ServerProcess], what: str, console: Console
) -> None:
    """Start ``servers`` (each added to ``started`` once up, for the caller to stop), wait for
    all of them to go quiet, and give the client the token: the stock server ignores it, so
    one token serves all and the requests match."""
    for server in servers:
        console.print(f"[bold]{server.name}[/]: starting for {what}")
        server.start(deadline_s=180.0)
        started.append(server)
    for server in started:
        _settle(server, console)
    os.environ["MLFLOW_TRACKING_TOKEN"] = next((s.token for s in servers if s.token), "")


def _alone(target: ServerProcess, servers: list[ServerProcess]) -> None:
    """Pause every server but ``target`` (SIGSTOP to their groups) and wake ``target``."""
    for other in servers:
        if other is not target:
            other.pause()
    target.resume()


# ---------------------------------------------------------------------- concurrent loggers
def logger_process(
    url: str,
    experiment_id: str,
    index: int,
    sizes: Sizes,
    barrier: Any,
    results: Any,
) -> None:
    """One concurrent logger: its own run, then the timed logging once every logger is ready."""
    try:
        client = MlflowClient(tracking_uri=url)
        run_id = client.create_run(experiment_id, run_name=f"logger-{index}").info.run_id
        keys = 10
        steps = sizes.logger_batch_size // keys
        batches = [
            [
                Metric(f"k{k}", random.random(), TS0 + b * steps + s, b * steps + s)
                for s in range(steps)
                for k in range(keys)
            ]
            for b in range(sizes.logger_batches)
        ]
        barrier.wait(timeout=600)
        for metrics in batches:
            client.log_batch(run_id, metrics=metrics)
        for step in range(sizes.logger_singles):
            client.log_metric(run_id, "single", float(step), timestamp=TS0 + step, step=step)
        logged = sum(len(b) for b in batches) + sizes.logger_singles
        results.put((index, logged, None))
    except Exception as exc:  # reported by the parent, with the server log
        barrier.abort()
        results.put((index, 0, repr(exc)))


def concurrent_in_turns(
    servers: list[ServerProcess],
    awake: list[ServerProcess],
    sizes: Sizes,
    console: Console,
    results: dict[str, ServerResult],
) -> None:
    """``concurrent_rounds`` rounds of the concurrent loggers; in each, every server takes its
    turn (rotating order) with the others paused. The figure is the median round's rate. A
    server whose loggers fail has its error recorded and leaves the rounds."""
    rates: dict[str, list[float]] = {s.name: [] for s in servers}
    running = list(servers)
    for turn in range(sizes.concurrent_rounds):
        first = turn % len(running) if running else 0
        for server in running[first:] + running[:first]:
            _alone(server, awake)
            console.print(
                f"[bold]{server.name}[/]: {sizes.loggers} concurrent loggers, "
                f"round {turn + 1} of {sizes.concurrent_rounds}"
            )
            try:
                rates[server.name].append(_concurrent_once(server, sizes, turn))
            except Exception as exc:
                message = f"{server.name} concurrent: {exc!r}"
                results[server.name].errors.append(
                    f"{message}\n--- last lines of {server.log}:\n{server.log_tail()}"
                )
                console.print(f"[red]{message}[/]", markup=False)
                running.remove(server)
    for name, taken in rates.items():
        if taken and name in {s.name for s in running}:
            results[name].figures["concurrent"] = statistics.median(taken)


def _concurrent_once(server: ServerProcess, sizes: Sizes, turn: int) -> float:
    """One round of the loggers against ``server``: metrics/s from the moment every logger
    has imported mlflow and created its run until the last one is done."""
    experiment_id = MlflowClient(tracking_uri=server.url).create_experiment(
        f"bench-concurrent-{turn}"
    )
    ctx = multiprocessing.get_context("spawn")  # no fork of a process with client threads
    barrier = ctx.Barrier(sizes.loggers + 1)
    results = ctx.Queue()
    processes = [
        ctx.Process(
            target=logger_process,
            args=(server.url, experiment_id, i, sizes, barrier, results),
        )
        for i in range(sizes.loggers)
    ]
    for process in processes:
        process.start()
    try:
        barrier.wait(timeout=600)  # every logger has imported mlflow and created its run
        start = time.perf_counter()
        outcomes = [results.get(timeout=600) for _ in processes]
        elapsed = time.perf_counter() - start
    except Exception:
        outcomes = _drain(results, len(processes))
        failures = [f"logger {i}: {error}" for i, _, error in outcomes if error]
        raise RuntimeError("; ".join(failures) or "the loggers did not all start") from None
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    failures = [f"logger {i}: {error}" for i, _, error in outcomes if error]
    if failures:
        raise RuntimeError("; ".join(failures))
    return float(sum(logged for _, logged, _ in outcomes) / elapsed)


def _drain(results: Any, most: int, wait_s: float = 10.0) -> list[tuple[int, int, str | None]]:
    """What the loggers reported after a failure, waiting up to ``wait_s`` for stragglers."""
    outcomes = []
    end = time.monotonic() + wait_s
    while len(outcomes) < most and time.monotonic() < end:
        try:
            outcomes.append(results.get(timeout=max(0.0, end - time.monotonic())))
        except queue.Empty:
            break
    return outcomes


# ---------------------------------------------------------------------------- one server
# Seeding, on each server alone, one after the other; everything timed runs in turns.
SEEDING: dict[str, Callable[[Bench], None]] = {
    "search": bench_search,
    "history": bench_history,
}
ALL_WORKLOADS = ["log_batch", *SEEDING, "concurrent"]
HTTP_STATUS = re.compile(r'" ([45]\d\d)\b')


def seed_server(
    server: ServerProcess, sizes: Sizes, only: Iterable[str], console: Console, result: ServerResult
) -> ServerResult:
    """Every selected seeding workload against ``server``, into ``result``; a failing one is
    recorded, the rest still run."""
    raw = RawApi(server)
    client = MlflowClient(tracking_uri=server.url)
    bench = Bench(server, client, raw, sizes, result, console)
    start = time.perf_counter()
    try:
        for name, workload in SEEDING.items():
            if name not in only:
                continue
            console.print(f"[bold]{server.name}[/]: {name}, seeding")
            try:
                workload(bench)
            except Exception as exc:
                message = f"{server.name} {name}: {exc!r}"
                bench.result.errors.append(
                    f"{message}\n--- last lines of {server.log}:\n{server.log_tail()}"
                )
                console.print(f"[red]{message}[/]", markup=False)
    finally:
        raw.close()
    bench.result.seconds = time.perf_counter() - start
    return bench.result


def _http_errors(server: ServerProcess) -> list[str]:
    """Access-log lines of the server that answered 4xx/5xx (the client retries some 5xx)."""
    try:
        lines = server.log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in lines if HTTP_STATUS.search(line)]


def _settle(server: ServerProcess, console: Console) -> None:
    """Wait for the server's start-up work to end before anything is timed."""
    seconds = server.settle()
    console.print(f"[bold]{server.name}[/]: quiet after {seconds:.1f} s more")


def benchmark_server(
    server: ServerProcess, sizes: Sizes, only: Iterable[str], console: Console, result: ServerResult
) -> ServerResult:
    console.print(f"[bold]{server.name}[/]: starting ({' '.join(server.argv)})")
    try:
        seconds, _ = _timed(server.start)
        console.print(f"[bold]{server.name}[/]: ready in {seconds:.1f} s at {server.url}")
        _settle(server, console)
        if server.token:
            # Read per request by the client; the stock server ignores the header, so both
            # servers receive byte-identical requests.
            os.environ["MLFLOW_TRACKING_TOKEN"] = server.token
        return seed_server(server, sizes, only, console, result)
    finally:
        server.stop()


# ---------------------------------------------------------------------------- report
def _ratio(measure: Measure, shamal: float | None, mlflow: float | None) -> float | None:
    if not shamal or not mlflow:
        return None
    return shamal / mlflow if measure.higher_is_better else mlflow / shamal


def report_rows(
    sizes: Sizes, results: dict[str, ServerResult], only: Iterable[str]
) -> list[dict[str, Any]]:
    workload_of = {
        "log_batch_floor": "log_batch",
        "log_batch_ceiling": "log_batch",
        "search_http": "search",
        "search_all": "search",
        "seed_search": "search",
        "history_http": "history",
        "history_floor": "history",
        "history_ceiling": "history",
        "seed_history": "history",
    }
    rows = []
    for measure in measures(sizes):
        if workload_of.get(measure.key, measure.key) not in only:
            continue
        # A ceiling row sets MLflow's whole call against Shamal's replayed one.
        shamal_key, mlflow_key = CROSS_ROWS.get(measure.key, (measure.key, measure.key))
        shamal = results["Shamal"].figures.get(shamal_key)
        mlflow = results["MLflow"].figures.get(mlflow_key)
        ratio = _ratio(measure, shamal, mlflow)
        wrong = {
            name: r.wrong[measure.key] for name, r in results.items() if measure.key in r.wrong
        }
        passed = None
        if measure.target is not None:
            passed = ratio is not None and ratio >= measure.target and "Shamal" not in wrong
        rows.append(
            {
                "key": measure.key,
                "operation": measure.label,
                "unit": measure.unit,
                "higher_is_better": measure.higher_is_better,
                "shamal": shamal,
                "mlflow": mlflow,
                "ratio": ratio,
                "target": measure.target,
                "pass": passed,
                "wrong_results": wrong,
            }
        )
    return rows


def _figure(value: float | None, unit: str) -> str:
    if value is None:
        return "error"
    if unit == "s":
        return f"{value * 1000:,.1f} ms" if value < 1 else f"{value:,.2f} s"
    return f"{value:,.0f} {unit}"


def print_table(console: Console, rows: list[dict[str, Any]], title: str) -> None:
    table = Table(title=title)
    for name, justify in [
        ("operation", "left"),
        ("Shamal", "right"),
        ("MLflow", "right"),
        ("ratio", "right"),
        ("target", "right"),
        ("result", "center"),
    ]:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        verdict = {True: "[green]PASS[/]", False: "[red]FAIL[/]", None: "-"}[row["pass"]]
        if row["wrong_results"]:
            verdict += " [red](wrong result)[/]"
        table.add_row(
            row["operation"],
            _figure(row["shamal"], row["unit"]),
            _figure(row["mlflow"], row["unit"]),
            "-" if row["ratio"] is None else f"{row['ratio']:.1f}x",
            "-" if row["target"] is None else f">= {row['target']:g}x",
            verdict,
        )
    console.print(table)


def print_problems(console: Console, results: dict[str, ServerResult]) -> None:
    for name, result in results.items():
        for key, text in result.wrong.items():
            console.print(f"[red]{name} returned a wrong result for {key}:[/] {text}")
        for error in result.errors:
            console.print(f"[red]error:[/] {error}", markup=False, highlight=False)
        if result.http_errors:
            console.print(
                f"[yellow]{name} answered {len(result.http_errors)} requests with 4xx/5xx;"
                " the first ones:[/]"
            )
            for line in result.http_errors[:5]:
                console.print("  " + line, markup=False, highlight=False)


# ---------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Shamal's tracking server against a stock `mlflow server`, "
        "both driven by the stock MLflow client.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--runs", type=int, help="runs in the search experiment (default 10000)")
    parser.add_argument(
        "--workers", type=int, default=1, help="server worker processes, both servers (1)"
    )
    parser.add_argument(
        "--backend",
        choices=["sqlite", "postgres"],
        default="sqlite",
        help="both on SQLite files, or both on fresh PostgreSQL databases (127.0.0.1:5432)",
    )
    parser.add_argument(
        "--only",
        default=",".join(ALL_WORKLOADS),
        help=f"comma-separated workloads to run (default: {','.join(ALL_WORKLOADS)})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")
    parser.add_argument(
        "--keep", action="store_true", help="keep the temp dir (server logs, SQLite files)"
    )
    args = parser.parse_args(argv)
    unknown = set(args.only.split(",")) - set(ALL_WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    if args.runs is not None and args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def make_servers(
    args: argparse.Namespace, workdir: Path, databases: _servers.PostgresDatabases | None
) -> list[ServerProcess]:
    shamal_db = databases.create("shamal") if databases else None
    mlflow_db = databases.create("mlflow") if databases else None
    return [
        _servers.shamal_server(workdir / "shamal", args.workers, shamal_db),
        _servers.mlflow_server(workdir / "mlflow", args.workers, mlflow_db),
    ]


def run(
    args: argparse.Namespace, console: Console
) -> tuple[dict[str, Any], dict[str, ServerResult]]:
    sizes = QUICK if args.quick else FULL
    if args.runs:
        sizes = replace(sizes, search_runs=args.runs)
    only = args.only.split(",")
    workdir = Path(tempfile.mkdtemp(prefix="shamal-bench-tracking-"))
    postgres = args.backend == "postgres"
    databases = _servers.PostgresDatabases(f"bench_tracking_{os.getpid()}") if postgres else None
    load = os.getloadavg()
    started = time.perf_counter()
    try:
        servers = make_servers(args, workdir, databases)
        if "log_batch" in only:
            results = log_batch_in_turns(servers, workdir, sizes, console)
        else:
            results = {server.name: ServerResult() for server in servers}
        if set(only) & set(SEEDING):
            for server in servers:
                benchmark_server(server, sizes, only, console, results[server.name])
        if databases and set(only) & set(SEEDING) and databases.analyze_if_autovacuum_is_off():
            console.print("autovacuum is off on this PostgreSQL: ran ANALYZE on both databases")
        if set(only) & {*SEEDING, "concurrent"}:
            timed_in_turns(servers, sizes, only, console, results)
        for server in servers:  # every phase's requests: the log is appended to on each start
            results[server.name].http_errors = _http_errors(server)
    finally:
        if databases:
            databases.drop_all()
        if args.keep:
            console.print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    report = {
        "benchmark": "tracking",
        "config": {
            "mode": "quick" if args.quick else "full",
            "backend": args.backend,
            "workers": args.workers,
            "workloads": only,
            "sizes": asdict(sizes),
            "client": f"mlflow-skinny {version('mlflow-skinny')}",
            "peer": f"mlflow {_servers.MLFLOW_VERSION} (mlflow server)",
            "shamal": version("shamal"),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_at_start": [round(x, 2) for x in load],
        },
        "results": report_rows(sizes, results, only),
        "seconds": {
            "total": time.perf_counter() - started,
            **{name: r.seconds for name, r in results.items()},
        },
        "errors": [e for r in results.values() for e in r.errors],
        "http_errors": {name: r.http_errors[:20] for name, r in results.items()},
    }
    return report, results


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    progress_console = Console(stderr=True)

    def say(text: str) -> None:
        progress_console.print(text, markup=False, highlight=False)

    os.environ.update(_servers.QUIET_ENV)
    # SIGTERM unwinds like Ctrl-C, so the servers (own sessions) and temp dirs go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        _servers.ensure_mlflow_venv(say, postgres=args.backend == "postgres")
        report, results = run(args, progress_console)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        say(f"benchmark could not run: {exc}")
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    console = Console(width=None if sys.stdout.isatty() else 140)
    config = report["config"]
    title = (
        f"Tracking: Shamal vs MLflow {_servers.MLFLOW_VERSION} ({config['mode']}, "
        f"{config['backend']}, {config['workers']} worker(s), client {config['client']})"
    )
    print_table(console, report["results"], title)
    print_problems(console, results)
    load = ", ".join(f"{x:.2f}" for x in config["loadavg_at_start"])
    console.print(
        f"{config['cpus']} CPUs, load average at start {load}; "
        f"total {report['seconds']['total']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
