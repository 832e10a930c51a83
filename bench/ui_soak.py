"""A page left open: does the web UI hold its memory steady while it follows the server?

Starts a Shamal server, keeps its scheduler busy (a short job every ``--every`` seconds, each
printing for a few seconds), and leaves two pages open in headless Chromium, each in a
browser of its own (a background tab would pause its polling): the jobs queue, whose rows
follow the scheduler through ``live.js``, and a long job's page, whose state follows it and
whose log is appended by ``job-log.js`` as the job writes it. Every ``--sample`` seconds it
collects garbage in both pages (Chromium's ``gc()``, exposed by ``--js-flags=--expose-gc``)
and reads the JavaScript heap in use and the number of DOM nodes.

The last line is ``minutes M queue_heap_mb A->B job_heap_mb C->D queue_nodes E->F``: the first
and last samples. Run from the repository root with Shamal's venv::

    .venv/bin/python bench/ui_soak.py --minutes 60
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _servers  # noqa: E402  (a sibling module of this script)

from shamal.client import ShamalClient  # noqa: E402

TEAM = "soak"


def _browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        "--js-flags=--expose-gc",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))


def _sign_in(driver: Any, url: str, token: str) -> None:
    driver.get(url + "/ui/sign-in")
    driver.find_element("id", "token").send_keys(token)
    driver.find_element("css selector", "form.sign-in button").click()
    end = time.monotonic() + 30
    while "/ui/sign-in" in driver.current_url and time.monotonic() < end:
        time.sleep(0.05)  # waiting for the redirect, bounded


def _sample(driver: Any) -> tuple[float, int]:
    """(MB of JavaScript heap in use after a full collection, DOM nodes)."""
    driver.execute_script("window.gc && window.gc();")
    heap = driver.execute_script("return performance.memory.usedJSHeapSize;")
    nodes = driver.execute_script("return document.getElementsByTagName('*').length;")
    return float(heap) / 1e6, int(nodes)


def _code(folder: Path, seconds: int, name: str) -> Path:
    code = folder / name
    code.mkdir()
    (code / "job.py").write_text(
        textwrap.dedent(
            f"""
            import time
            for i in range({seconds * 2}):
                print(f"line {{i}}: the job is still working", flush=True)
                time.sleep(0.5)
            """
        )
    )
    return code


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="how long the pages stay open")
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between short jobs")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:  # noqa: PLR0915 - one straight script
    args = parse_args(argv)
    console = Console(stderr=True)
    samples: list[tuple[float, float, int, float, int]] = []
    with tempfile.TemporaryDirectory(prefix="shamal-ui-soak-") as tmp:
        folder = Path(tmp)
        server = _servers.shamal_server(folder / "home", 1, None)
        server.env = {**server.env, "SHAMAL_SCHEDULER__TICK_S": "0.5"}
        queue = job_page = None
        try:
            server.start()
            api = ShamalClient(server.url, server.token or "")
            api.create_team(TEAM)
            api.set_member(TEAM, "admin", "admin")
            short = api.upload_snapshot(_code(folder, 4, "short"), team=TEAM)
            long_seconds = int(args.minutes * 60) + 120
            long_code = api.upload_snapshot(_code(folder, long_seconds, "long"), team=TEAM)
            small = {"team": TEAM, "cpus": 0.25, "memory_mib": 64}
            long_job = api.submit_job(
                ["python", "job.py"], snapshot=long_code, name="long", **small
            )
            queue, job_page = _browser(), _browser()
            for driver in (queue, job_page):
                _sign_in(driver, server.url, server.token or "")
            queue.get(server.url + "/ui/jobs")
            job_page.get(f"{server.url}/ui/jobs/{long_job['id']}")
            start = time.monotonic()
            next_job = next_sample = start
            while (now := time.monotonic()) - start < args.minutes * 60:
                if now >= next_job:
                    api.submit_job(["python", "job.py"], snapshot=short, name="short", **small)
                    next_job = now + args.every
                if now >= next_sample:
                    q_heap, q_nodes = _sample(queue)
                    j_heap, j_nodes = _sample(job_page)
                    minute = (now - start) / 60
                    samples.append((minute, q_heap, q_nodes, j_heap, j_nodes))
                    console.print(
                        f"{minute:5.1f} min: queue {q_heap:.2f} MB / {q_nodes} nodes, "
                        f"job page {j_heap:.2f} MB / {j_nodes} nodes"
                    )
                    next_sample = now + args.sample
                time.sleep(0.2)  # the loop's pace; each action has its own schedule
            api.close()
        except (RuntimeError, OSError) as exc:
            console.print(f"soak could not run: {exc}", markup=False)
            return 2
        finally:
            for driver in (queue, job_page):
                if driver is not None:
                    driver.quit()
            server.stop()
    table = Table(title="Pages left open (heap after a full collection)")
    for column in ("minute", "queue heap", "queue DOM nodes", "job page heap", "job DOM nodes"):
        table.add_column(column, justify="right")
    for minute, q_heap, q_nodes, j_heap, j_nodes in samples:
        table.add_row(
            f"{minute:.1f}", f"{q_heap:.2f} MB", str(q_nodes), f"{j_heap:.2f} MB", str(j_nodes)
        )
    Console(width=120).print(table)
    first, last = samples[0], samples[-1]
    print(
        f"minutes {last[0]:.0f} queue_heap_mb {first[1]:.2f}->{last[1]:.2f} "
        f"job_heap_mb {first[3]:.2f}->{last[3]:.2f} queue_nodes {first[2]}->{last[2]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
