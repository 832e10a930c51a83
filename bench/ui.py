"""The web UI at scale, in a real browser: Shamal's UI against the stock MLflow UI.

Both servers get the same experiment (``--runs`` runs, 10,000 by default, with 20 metrics and
5 params each) and one run with one metric of ``--points`` points (1,000,000 by default),
logged through the same MLflow REST calls. Debian's Chromium (headless, through its
chromedriver) then opens the same views on each, one after the other, several times:

- **first page**: an experiment's runs table, from navigation until the newest run's row
  shows (Shamal: server-rendered, 50 rows; MLflow: its single-page app);
- **filter**: the same table filtered with ``metrics.m0 > 0.9`` (opened by its address, as a
  submitted filter form does), until a matching row shows;
- **chart**: the run with the large metric, until its curve is drawn (Shamal: the page
  marks ``chart-drawn:<key>`` when its SVG is in place; MLflow: until its metric chart has
  a drawn line).

Each figure is the median of ``--repeat`` timings (after one warm-up visit), read from the
page's own clock (``performance.now()``, milliseconds since navigation started). The last line
is ``first_page_ms X filter_ms Y chart_ms Z mlflow_first_page_ms W``.

Run from the repository root with Shamal's venv (the stock MLflow comes from
``bench/.mlflow-venv``, made on first use)::

    .venv/bin/python bench/ui.py              # 10,000 runs, 1,000,000 points
    .venv/bin/python bench/ui.py --quick      # 500 runs, 100,000 points
"""

from __future__ import annotations

import argparse
import concurrent.futures
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _servers  # noqa: E402  (a sibling module of this script)

TS0 = 1_700_000_000_000
METRICS = 20
FILTER = "metrics.m0 > 0.9"
BIG_KEY = "loss_curve"
Say = Callable[[str], None]


@dataclass
class Seeded:
    experiment_id: str
    newest: str  # the name of the newest run: the first row of a table ordered by start
    newest_match: str  # the newest run that the filter keeps
    newest_dropped: str  # the newest run that the filter drops
    big_run: str
    seconds: float


@dataclass
class Figures:
    first_page: list[float] = field(default_factory=list)
    filter: list[float] = field(default_factory=list)
    chart: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _metric_values(i: int) -> list[float]:
    rng = random.Random(i)
    return [rng.random() for _ in range(METRICS)]


class Rest:
    """The MLflow REST calls the seeding makes, over one pooled HTTP client."""

    def __init__(self, server: _servers.ServerProcess) -> None:
        headers = {"Authorization": f"Bearer {server.token}"} if server.token else {}
        limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
        self.http = httpx.Client(
            base_url=server.url + "/api/2.0/mlflow", headers=headers, timeout=120, limits=limits
        )

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.http.post(path, json=body)
        answer.raise_for_status()
        return dict(answer.json())

    def run(self, experiment_id: str, name: str, start: int) -> str:
        body = {"experiment_id": experiment_id, "run_name": name, "start_time": start}
        return str(self.post("/runs/create", body)["run"]["info"]["run_id"])


def _seed_run(rest: Rest, experiment_id: str, i: int) -> None:
    run_id = rest.run(experiment_id, f"run-{i:05d}", TS0 + i * 1000)
    values = _metric_values(i)
    rest.post(
        "/runs/log-batch",
        {
            "run_id": run_id,
            "metrics": [
                {"key": f"m{k}", "value": v, "timestamp": TS0, "step": 0}
                for k, v in enumerate(values)
            ],
            "params": [{"key": f"p{k}", "value": str((i + k) % 7)} for k in range(5)],
        },
    )


def seed(server: _servers.ServerProcess, runs: int, points: int, say: Say) -> Seeded:
    """The experiment, its runs and the large metric, through the MLflow REST API."""
    rest = Rest(server)
    start = time.perf_counter()
    experiment_id = str(rest.post("/experiments/create", {"name": "ui-bench"})["experiment_id"])
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: _seed_run(rest, experiment_id, i), range(runs)))
    say(f"{server.name}: {runs:,} runs in {time.perf_counter() - start:.0f} s")
    big = rest.run(experiment_id, "big-curve", TS0 - 1000)
    rng = random.Random(7)

    def batch(first: int) -> None:
        metrics = [
            {
                "key": BIG_KEY,
                "value": 1.0 / (1 + s / 1000) + rng.random() / 50,
                "timestamp": TS0,
                "step": s,
            }
            for s in range(first, min(points, first + 1000))
        ]
        rest.post("/runs/log-batch", {"run_id": big, "metrics": metrics})

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(batch, range(0, points, 1000)))
    say(f"{server.name}: seeded in {time.perf_counter() - start:.0f} s")
    matching = [i for i in range(runs) if _metric_values(i)[0] > 0.9]
    dropped = [i for i in range(runs) if _metric_values(i)[0] <= 0.9]
    return Seeded(
        experiment_id=experiment_id,
        newest=f"run-{runs - 1:05d}",
        newest_match=f"run-{matching[-1]:05d}",
        newest_dropped=f"run-{dropped[-1]:05d}",
        big_run=big,
        seconds=time.perf_counter() - start,
    )


# ---------------------------------------------------------------------------- the browser
def browser() -> Any:
    """Headless Debian Chromium through its chromedriver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))


def _since_navigation(driver: Any, ready: str, timeout_s: float) -> float:
    """Poll the page every 20 ms until the script ``ready`` returns true; the page's clock
    at that moment (ms since navigation started)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        found = driver.execute_script(f"return ({ready}) ? performance.now() : null;")
        if found is not None:
            return float(found)
        time.sleep(0.02)  # a poll of the page, bounded by the deadline
    raise TimeoutError(
        f"{driver.current_url} did not show what was awaited within {timeout_s:.0f} s"
    )


def _visits(
    driver: Any, url: str, ready: str, repeat: int, timeout_s: float, figures: list[float]
) -> None:
    for attempt in range(repeat + 1):
        driver.get("about:blank")
        driver.get(url)
        took = _since_navigation(driver, ready, timeout_s)
        if attempt:  # the first visit warms caches (both servers', the browser's)
            figures.append(took)


def _row_shows(name: str) -> str:
    return f"document.body && document.body.innerText.includes({name!r})"


def _filtered(seeded: Seeded) -> str:
    """The filtered table is on screen: a run it keeps shows, the newest it drops does not."""
    return f"({_row_shows(seeded.newest_match)}) && !({_row_shows(seeded.newest_dropped)})"


def measure_shamal(
    driver: Any, server: _servers.ServerProcess, seeded: Seeded, repeat: int
) -> Figures:
    from urllib.parse import urlencode

    figures = Figures()
    driver.get(server.url + "/ui/sign-in")
    driver.find_element("id", "token").send_keys(server.token or "")
    driver.find_element("css selector", "form.sign-in button").click()
    _since_navigation(driver, "!location.pathname.startsWith('/ui/sign-in')", 30)
    base = f"{server.url}/ui/experiments/{seeded.experiment_id}"
    _visits(driver, base, _row_shows(seeded.newest), repeat, 60, figures.first_page)
    filtered = base + "?" + urlencode({"filter": FILTER})
    _visits(driver, filtered, _filtered(seeded), repeat, 60, figures.filter)
    run = f"{base}/runs/{seeded.big_run}"
    drawn = f"performance.getEntriesByName('chart-drawn:{BIG_KEY}').length > 0"
    for attempt in range(repeat + 1):
        driver.get("about:blank")
        driver.get(run)
        _since_navigation(driver, drawn, 120)
        mark = driver.execute_script(
            f"return performance.getEntriesByName('chart-drawn:{BIG_KEY}')[0].startTime;"
        )
        if attempt:
            figures.chart.append(float(mark))
    return figures


#: MLflow's metric charts are drawn by Plotly (a trace's path in the plot's SVG).
_MLFLOW_DRAWN = "document.querySelector('.js-plotly-plot .scatterlayer .trace path.js-line')"


def measure_mlflow(
    driver: Any, server: _servers.ServerProcess, seeded: Seeded, repeat: int, say: Say
) -> Figures:
    from urllib.parse import quote

    figures = Figures()
    # MLflow 3 opens an experiment on its GenAI overview; the runs table has its own address.
    base = f"{server.url}/#/experiments/{seeded.experiment_id}"
    _visits(driver, f"{base}/runs", _row_shows(seeded.newest), repeat, 180, figures.first_page)
    filtered = f"{base}/runs?searchFilter={quote(FILTER)}"
    try:
        _visits(driver, filtered, _filtered(seeded), repeat, 180, figures.filter)
    except TimeoutError as exc:
        figures.notes.append(f"MLflow filter: {exc}")
        say(f"MLflow filter view not measured: {exc}")
    chart = f"{base}/runs/{seeded.big_run}/model-metrics"
    try:
        _visits(driver, chart, _MLFLOW_DRAWN, max(1, repeat // 2), 180, figures.chart)
    except TimeoutError as exc:
        figures.notes.append(f"MLflow chart: {exc}")
        say(f"MLflow chart not measured: {exc}")
    return figures


# ---------------------------------------------------------------------------- report
def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f} ms"


def report(console: Console, shamal: Figures, mlflow: Figures, args: argparse.Namespace) -> None:
    table = Table(
        title=f"Web UI in headless Chromium: {args.runs:,} runs x {METRICS} metrics, one metric of "
        f"{args.points:,} points (median of {args.repeat})"
    )
    for column in ("view", "target", "Shamal", "MLflow UI", "MLflow / Shamal"):
        table.add_column(column, justify="left" if column in ("view", "target") else "right")
    rows = (
        ("first page of the runs table", "< 1,000 ms", shamal.first_page, mlflow.first_page),
        (f"filtered ({FILTER})", "< 500 ms", shamal.filter, mlflow.filter),
        (f"chart of {args.points:,} points", "< 1,000 ms", shamal.chart, mlflow.chart),
    )
    for view, target, ours, theirs in rows:
        a, b = _median(ours), _median(theirs)
        ratio = f"{b / a:.1f}x" if a and b else "n/a"
        table.add_row(view, target, _cell(a), _cell(b), ratio)
    console.print(table)
    for note in shamal.notes + mlflow.notes:
        console.print(f"note: {note}", markup=False)
    first, filt, chart = (_median(shamal.first_page), _median(shamal.filter), _median(shamal.chart))
    theirs = _median(mlflow.first_page)
    print(
        f"first_page_ms {first or float('nan'):.0f} filter_ms {filt or float('nan'):.0f} "
        f"chart_ms {chart or float('nan'):.0f} mlflow_first_page_ms {theirs or float('nan'):.0f}"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000, help="runs in the experiment")
    parser.add_argument("--points", type=int, default=1_000_000, help="points of the big metric")
    parser.add_argument("--repeat", type=int, default=5, help="timed visits per view")
    parser.add_argument("--quick", action="store_true", help="500 runs, 100,000 points, 3 visits")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.points, args.repeat = 500, 100_000, 3
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(stderr=True)

    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False)

    try:
        _servers.ensure_mlflow_venv(say, postgres=False)
    except (RuntimeError, OSError) as exc:
        say(f"benchmark could not run: {exc}")
        return 2
    with tempfile.TemporaryDirectory(prefix="shamal-ui-bench-") as tmp:
        shamal = _servers.shamal_server(Path(tmp) / "shamal", 1, None)
        mlflow = _servers.mlflow_server(Path(tmp) / "mlflow", 1, None)
        driver = None
        try:
            for server in (shamal, mlflow):
                server.start()
                server.settle()
            say(f"seeding {args.runs:,} runs and {args.points:,} points on each server")
            seeded = {s.name: seed(s, args.runs, args.points, say) for s in (shamal, mlflow)}
            for server in (shamal, mlflow):
                server.settle()
            driver = browser()
            ours = measure_shamal(driver, shamal, seeded["Shamal"], args.repeat)
            theirs = measure_mlflow(driver, mlflow, seeded["MLflow"], args.repeat, say)
        except (RuntimeError, OSError, httpx.HTTPError) as exc:
            say(f"benchmark could not run: {exc}")
            return 2
        finally:
            if driver is not None:
                driver.quit()
            for server in (shamal, mlflow):
                server.stop()
    report(Console(width=140), ours, theirs, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
