"""Journeys over the platform's pages in a real browser (Debian's Chromium, headless, through
its chromedriver, against a real server process): follow lineage from a deployment down to
its data, watch a job's log as it is written, promote an alias as a maintainer and be refused
as a viewer; axe-core's accessibility rules on every page, none of them broken at the
serious or critical level, and nothing of a page's own blocked by its Content-Security-Policy;
no write form on any page a viewer sees; live parts that keep a single poll however often the
tab is hidden and shown.

Screenshots of the main pages are taken on the way; with ``UI_SCREENSHOTS=DIR`` they are
also written to ``DIR`` (``docs/screenshots`` holds the README's).
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from shamal.client import ShamalClient
from tests import needs
from tests.live import LiveServer, exchange_folder
from tests.webui.conftest import screenshot
from tests.webui.test_browser import _by_css, _wait, driver

__all__ = ["driver"]

pytestmark = pytest.mark.slow

TEAM = "journeys"
FAST = {"SHAMAL_SCHEDULER__TICK_S": "0.2", "SHAMAL_SCHEDULER__GRACE_S": "5"}
#: axe-core's impacts that fail a page.
FAILING = ("serious", "critical")


#: A feature view and a service over the ``spend`` dataset (for their pages).
FEATURES: dict[str, Any] = {
    "entities": [{"name": "customer", "join_keys": ["customer_id"], "description": ""}],
    "feature_views": [
        {
            "name": "customer_stats",
            "entities": ["customer"],
            "source": "data:spend/1",
            "timestamp_field": "ts",
            "features": [
                {"name": "total", "dtype": "float64"},
                {"name": "orders", "dtype": "int64"},
            ],
            "owner": TEAM,
            "ttl_seconds": 86400,
            "online": False,
            "sql": "SELECT customer_id, ts, total, orders FROM source",
            "description": "what a customer spent",
            "tags": {},
        }
    ],
    "feature_services": [
        {
            "name": "churn_model",
            "features": ["customer_stats:*"],
            "owner": TEAM,
            "description": "the churn model's features",
        }
    ],
}
#: A two-step pipeline (for its page and its run's DAG).
PIPELINE: dict[str, Any] = {
    "name": "nightly",
    "team": TEAM,
    "steps": [
        {"name": "prep", "command": ["true"]},
        {"name": "train", "command": ["true"], "after": ["prep"]},
    ],
}


class Journeys:
    """A live server with one team's chain: a dataset version read by a run that logged a
    model, registered in two versions, the first deployed; a maintainer and a viewer."""

    def __init__(self, server: LiveServer, shots: Path) -> None:
        self.server = server
        self.url = server.url
        self.shots = shots
        self.admin = ShamalClient(server.url, server.token)
        self.secrets: dict[str, str] = {}
        self.ids: dict[str, str] = {}

    @property
    def mia(self) -> ShamalClient:
        """The team's maintainer, who makes the team's objects."""
        return ShamalClient(self.url, self.secrets["mia"])

    def mlflow(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.mia as mia:
            found: dict[str, Any] = mia.request("POST", f"/api/2.0/mlflow/{path}", json=body)
        return found

    def person(self, user: str, role: str) -> None:
        self.admin.create_user(user)
        self.admin.set_member(TEAM, user, role)
        self.secrets[user] = self.admin.create_token("ui", user=user)["secret"]

    def build(self, folder: Path) -> None:
        self.admin.create_team(TEAM)
        self.person("mia", "maintainer")
        self.person("vic", "viewer")
        csv = folder / "customers.csv"
        csv.write_text("id,spend,region\n1,10.5,north\n2,3.25,south\n3,7.0,north\n")
        with self.mia as mia:
            mia.create_dataset("customers", team=TEAM)
            version = mia.ingest_file("customers", csv)
        tags = [{"key": "shamal.team", "value": TEAM}]
        experiment = self.mlflow("experiments/create", {"name": "churn", "tags": tags})
        self.ids["experiment"] = str(experiment["experiment_id"])
        run = self.mlflow(
            "runs/create", {"experiment_id": self.ids["experiment"], "run_name": "train"}
        )["run"]["info"]["run_id"]
        self.ids["run"] = run
        source = json.dumps({"uri": version["uri"]})
        dataset = {"name": "customers", "digest": version["digest"], "source_type": "shamal"}
        self.mlflow(
            "runs/log-inputs",
            {"run_id": run, "datasets": [{"dataset": {**dataset, "source": source}}]},
        )
        self.mlflow(
            "runs/log-batch",
            {"run_id": run, "metrics": [{"key": "auc", "value": 0.91, "timestamp": 1, "step": 0}]},
        )
        logged = self.mlflow(
            "logged-models",
            {"experiment_id": self.ids["experiment"], "name": "model", "source_run_id": run},
        )["model"]["info"]["model_id"]
        self.mlflow("registered-models/create", {"name": "churn", "tags": tags})
        for source_uri in (f"models:/{logged}", f"runs:/{run}/model"):
            body = {"name": "churn", "source": source_uri, "run_id": run}
            if source_uri.startswith("models:/"):
                body["model_id"] = logged
            self.mlflow("model-versions/create", body)
        self.mlflow(
            "registered-models/alias", {"name": "churn", "alias": "champion", "version": "1"}
        )
        with self.mia as mia:
            mia.deploy("churn-api", {"primary": [{"model": "models:/churn/1"}], "team": TEAM})
        self.ids["data"] = str(version["uri"])

    def submit_following_job(self, folder: Path) -> str:
        """A job that prints a line, waits for ``go`` in the shared folder, then prints more."""
        code = folder / "code"
        code.mkdir()
        go = exchange_folder(folder / "exchange") / "go"
        (code / "job.py").write_text(
            textwrap.dedent(
                f"""
                import os, sys, time
                print("first line from the job", flush=True)
                deadline = time.monotonic() + 120
                while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:
                    time.sleep(0.05)
                print("after go: the second line", flush=True)
                """
            )
        )
        with self.mia as mia:
            digest = mia.upload_snapshot(code, team=TEAM)
            job = mia.submit_job(
                ["python", "job.py"],
                snapshot=digest,
                team=TEAM,
                cpus=0.5,
                memory_mib=64,
                name="followed",
            )
        return str(job["id"])

    def more_pages(self, folder: Path) -> None:
        """Once, what the remaining pages show: a second run and an artifact (compare, a
        preview), a second data version (a diff), a feature view and service over a dataset
        of its own, a pipeline run and a monitor."""
        if "pipeline_run" in self.ids:
            return
        run = self.ids["run"]
        baseline = self.mlflow(
            "runs/create", {"experiment_id": self.ids["experiment"], "run_name": "baseline"}
        )["run"]["info"]["run_id"]
        self.ids["baseline"] = baseline
        with self.mia as mia:
            found = mia.request("GET", "/api/2.0/mlflow/runs/get", params={"run_id": run})
            root = found["run"]["info"]["artifact_uri"].removeprefix("mlflow-artifacts:/")
            mia.request(
                "PUT", f"/api/2.0/mlflow-artifacts/artifacts/{root}/notes.txt", content=b"hi\n"
            )
            csv = folder / "customers-2.csv"
            csv.write_text("id,spend,region\n1,10.5,north\n4,8.0,east\n")
            mia.ingest_file("customers", csv)
            spend = folder / "spend.csv"
            spend.write_text(
                "customer_id,ts,total,orders\n1,2026-01-01T00:00:00,1.5,1\n"
                "2,2026-01-02T00:00:00,2.5,2\n"
            )
            mia.create_dataset("spend", team=TEAM)
            mia.ingest_file("spend", spend)
            mia.request("POST", "/api/v1/features/apply", json={"definitions": FEATURES})
            mia.request("POST", "/api/v1/pipelines", json={"spec": PIPELINE})
            started = mia.request("POST", "/api/v1/pipelines/nightly/runs", json={"params": {}})
            mia.request(
                "POST",
                "/api/v1/monitor-references/churn/versions/1/build",
                json={"dataset": "customers/1"},
            )
            mia.request(
                "POST",
                "/api/v1/monitors",
                json={"deployment": "churn-api", "schedule_s": 3600, "name": "watch"},
            )
        self.ids["pipeline_run"] = str(started["id"])

    def shot(self, browser: Any, name: str) -> None:
        screenshot(browser, self.shots, name)


@pytest.fixture(scope="module")
def journeys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Journeys]:
    folder = tmp_path_factory.mktemp("journeys")
    with LiveServer(folder / "home", env=FAST) as server:
        made = Journeys(server, tmp_path_factory.mktemp("screenshots"))
        with made.admin:
            made.build(folder)
            yield made


def _sign_in(browser: Any, site: Journeys, token: str) -> None:
    browser.delete_all_cookies()
    browser.get(site.url + "/ui/sign-in")
    _by_css(browser, "#token").send_keys(token)
    _by_css(browser, "form.sign-in button[type=submit]").click()
    _wait(browser, lambda d: "/ui/sign-in" not in d.current_url)


def test_follow_lineage_from_a_deployment_down_to_its_data(driver: Any, journeys: Journeys) -> None:
    _sign_in(driver, journeys, journeys.secrets["vic"])
    driver.get(journeys.url + "/ui/deployments/churn-api")
    _by_css(driver, "a[href*='/ui/lineage?uri=deployments']").click()
    _wait(driver, lambda d: "/ui/lineage" in d.current_url)
    # Upstream, box by box: the deployment, its model version, the run, the data.
    graph = _by_css(driver, "svg.graph")
    assert "churn-api" in graph.text
    journeys.shot(driver, "lineage")
    version = journeys.ids["data"].removeprefix("data:/")  # customers/1
    _by_css(
        driver, f"svg.graph a[href='/ui/datasets/{version.replace('/', '/versions/')}']"
    ).click()
    _wait(driver, lambda d: d.current_url.endswith("/ui/datasets/customers/versions/1"))
    assert "spend" in _by_css(driver, "main").text  # the version's profile


def test_watch_a_jobs_log_as_it_is_written(driver: Any, journeys: Journeys, tmp_path: Path) -> None:
    job = journeys.submit_following_job(journeys.server.home.parent)
    journeys.ids["job"] = job
    _sign_in(driver, journeys, journeys.server.token)
    driver.get(f"{journeys.url}/ui/jobs/{job}")
    log = _by_css(driver, "pre.log")
    _wait(driver, lambda d: "first line from the job" in log.text)
    driver.execute_script("window.__same_page = true;")
    (journeys.server.home.parent / "exchange" / "go").write_text("go")
    _wait(driver, lambda d: "after go: the second line" in log.text)
    _wait(driver, lambda d: "succeeded" in _by_css(d, "main").text)
    assert driver.execute_script("return window.__same_page") is True  # never reloaded
    journeys.shot(driver, "job")


def test_promote_an_alias_as_a_maintainer_and_be_refused_as_a_viewer(
    driver: Any, journeys: Journeys
) -> None:
    page = f"{journeys.url}/ui/models/churn"
    _sign_in(driver, journeys, journeys.secrets["vic"])
    driver.get(page)
    assert "champion" in _by_css(driver, "main").text
    assert not driver.find_elements("css selector", "form[action$='/aliases']")
    # A viewer who forges the form with their own session's token is refused by the server.
    status = driver.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const csrf = document.querySelector("input[name=csrf]").value;
        const body = new URLSearchParams({csrf, alias: "champion", version: "2"});
        fetch("/ui/models/churn/aliases", {method: "POST", body}).then(r => done(r.status));
        """
    )
    assert status == 403
    _sign_in(driver, journeys, journeys.secrets["mia"])
    driver.get(page)
    form = _by_css(driver, "form[action$='/aliases']")
    form.find_element("css selector", "[name=alias]").send_keys("champion")
    from selenium.webdriver.support.ui import Select

    Select(form.find_element("css selector", "select[name=version]")).select_by_value("2")
    form.find_element("css selector", "button[type=submit]").click()
    _wait(driver, lambda d: d.current_url.endswith("/ui/models/churn"))
    aliases = journeys.admin.request(
        "GET",
        "/api/2.0/mlflow/registered-models/alias",
        params={"name": "churn", "alias": "champion"},
    )
    assert aliases["model_version"]["version"] == "2"
    journeys.shot(driver, "model")


#: Run before a page's own scripts: counts its fetches and holds each until released, and
#: counts the polls it schedules (live.js and job-log.js both name theirs ``tick``).
HOLD_FETCHES = """
window.__fetches = 0;
window.__ticks = 0;
window.__release = [];
const realFetch = window.fetch.bind(window);
window.fetch = (...args) => {
  window.__fetches += 1;
  return new Promise(resolve => window.__release.push(() => resolve(realFetch(...args))));
};
const realSetTimeout = window.setTimeout.bind(window);
window.setTimeout = (fn, ms, ...rest) => {
  if (fn && fn.name === "tick") window.__ticks += 1;
  return realSetTimeout(fn, ms, ...rest);
};
"""


def _held_polls_stay_single(driver: Any, polls: int) -> None:
    """With the page's ``polls`` first requests held in flight, the tab hidden and shown five
    times starts no other request and schedules no other poll."""
    _wait(driver, lambda d: d.execute_script("return window.__fetches") == polls)
    scheduled = driver.execute_script("return window.__ticks")
    for _ in range(5):
        driver.execute_script("document.dispatchEvent(new Event('visibilitychange'))")
    assert driver.execute_script("return [window.__fetches, window.__ticks]") == [
        polls,
        scheduled,
    ]
    driver.execute_script("window.__release.splice(0).forEach(go => go())")


def test_live_parts_keep_one_poll_however_often_the_tab_comes_back(
    driver: Any, journeys: Journeys, tmp_path: Path
) -> None:
    """The queue's rows (live.js), a running job's state (live.js) and its log (job-log.js)
    follow the server by polling; the tab shown again while a poll is in flight must start
    no second one (loops would multiply on a page left open, and a log could be appended
    twice)."""
    job = journeys.submit_following_job(tmp_path)
    _sign_in(driver, journeys, journeys.server.token)
    hold = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": HOLD_FETCHES})
    try:
        driver.get(journeys.url + "/ui/jobs")
        live = _by_css(driver, "tbody[data-live]")
        _held_polls_stay_single(driver, 1)
        _wait(driver, lambda _: live.get_attribute("data-live-state"))  # the poll came back
        driver.get(f"{journeys.url}/ui/jobs/{job}")
        assert _by_css(driver, "pre.log[data-log]")
        assert _by_css(driver, "[data-live]")
        _held_polls_stay_single(driver, 2)  # the log's and the state's
        log = _by_css(driver, "pre.log")
        _wait(driver, lambda _: "first line from the job" in log.text)
        assert log.text.count("first line from the job") == 1
    finally:
        driver.execute_cdp_cmd(
            "Page.removeScriptToEvaluateOnNewDocument", {"identifier": hold["identifier"]}
        )
        (tmp_path / "exchange" / "go").write_text("go")


def _pages(site: Journeys) -> list[str]:
    experiment, run = site.ids["experiment"], site.ids["run"]
    return [
        "/ui/experiments",
        f"/ui/experiments/{experiment}",
        f"/ui/experiments/{experiment}/runs/{run}",
        f"/ui/experiments/{experiment}/runs/{run}/artifacts",
        "/ui/models",
        "/ui/models/churn",
        "/ui/models/churn/versions/1",
        "/ui/datasets",
        "/ui/datasets/customers",
        "/ui/datasets/customers/versions/1",
        "/ui/features",
        f"/ui/lineage?uri={quote('deployments:/churn-api')}&direction=up",
        "/ui/jobs",
        "/ui/jobs/usage",
        "/ui/teams",
        "/ui/pipelines",
        "/ui/deployments",
        "/ui/deployments/churn-api",
        "/ui/monitors",
        "/ui/audit",
        *([f"/ui/jobs/{site.ids['job']}"] if "job" in site.ids else []),
        f"/ui/compare?run={run}&run={site.ids['baseline']}",
        f"/ui/experiments/{experiment}/runs/{run}/artifacts/preview?path=notes.txt",
        "/ui/datasets/customers/diff?a=1&b=2",
        "/ui/features/views/customer_stats",
        "/ui/features/services/churn_model",
        "/ui/pipelines/nightly",
        f"/ui/pipelines/runs/{site.ids['pipeline_run']}",
        "/ui/monitors/watch",
    ]


def _axe(browser: Any) -> list[str]:
    """axe-core's violations on the page, those at a failing impact, described."""
    source = resources.files("axe_core_python").joinpath("axe.min.js").read_text()
    browser.execute_script(source)
    found = browser.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        axe.run(document, {resultTypes: ["violations"]})
          .then(r => done(r.violations.map(v => ({id: v.id, impact: v.impact,
                targets: v.nodes.slice(0, 3).map(n => n.target.join(" "))}))))
          .catch(e => done([{id: "axe did not run: " + e, impact: "critical", targets: []}]));
        """
    )
    return [f"{v['id']} ({v['impact']}): {v['targets']}" for v in found if v["impact"] in FAILING]


#: Run before each page's own scripts: records what the Content-Security-Policy blocked.
CSP_WATCH = """
window.__csp = [];
document.addEventListener("securitypolicyviolation",
    e => window.__csp.push(e.violatedDirective + " " + e.blockedURI));
"""


def test_no_page_breaks_axe_cores_serious_rules(
    driver: Any, journeys: Journeys, tmp_path: Path
) -> None:
    """axe-core on every page; and no page's own script or style is one the strict
    Content-Security-Policy blocks (nothing inline, nothing from elsewhere)."""
    needs.module("axe_core_python")
    journeys.more_pages(tmp_path)
    watch = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CSP_WATCH})
    try:
        driver.delete_all_cookies()
        driver.get(journeys.url + "/ui/sign-in")
        blocked = {"/ui/sign-in": driver.execute_script("return window.__csp")}
        broken = {"/ui/sign-in": _axe(driver)}
        _sign_in(driver, journeys, journeys.server.token)
        for path in _pages(journeys):
            driver.get(journeys.url + path)
            assert driver.execute_script("return document.title"), path
            blocked[path] = driver.execute_script("return window.__csp")
            broken[path] = _axe(driver)
    finally:
        driver.execute_cdp_cmd(
            "Page.removeScriptToEvaluateOnNewDocument", {"identifier": watch["identifier"]}
        )
    assert len(blocked) == len(_pages(journeys)) + 1
    assert {path: found for path, found in blocked.items() if found != []} == {}
    assert {path: found for path, found in broken.items() if found} == {}
    driver.get(journeys.url + "/ui/deployments/churn-api")
    journeys.shot(driver, "deployment")


def test_every_page_answers_a_viewer_with_no_write_controls(
    journeys: Journeys, tmp_path: Path
) -> None:
    """The same pages fetched with a viewer's session: each answers (200, or 403 for the
    audit log, which is the admins'), never a 500, and offers no form that changes
    anything (sign out aside); the maintainer's pages do offer them."""
    journeys.more_pages(tmp_path)
    posts = re.compile(r'<form[^>]*method="post"[^>]*action="([^"]*)"')

    def forms(secret: str) -> dict[str, list[str]]:
        with httpx.Client(base_url=journeys.url, timeout=30, follow_redirects=False) as client:
            form = client.get("/ui/sign-in")
            csrf = form.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
            signed = client.post("/ui/sign-in", data={"token": secret, "csrf": csrf})
            assert signed.status_code == 303
            found = {}
            for path in _pages(journeys):
                answer = client.get(path)
                expected = 403 if path == "/ui/audit" and secret != journeys.server.token else 200
                assert answer.status_code == expected, (path, answer.text[-500:])
                found[path] = [a for a in posts.findall(answer.text) if a != "/ui/sign-out"]
            return found

    assert {path: found for path, found in forms(journeys.secrets["vic"]).items() if found} == {}
    offered = forms(journeys.secrets["mia"])  # the team's maintainer
    assert "/ui/models/churn/aliases" in offered["/ui/models/churn"]
