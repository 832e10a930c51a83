"""MLflow's own UI on Shamal, in the real Chromium: runs, metrics and a registered model
logged by the stock client, then the experiments list, a run with its charts, the compare
view and the registered model (and its version) opened under /mlflow/ behind Shamal's
sign-in, each rendering its content with no failed request in the browser's network log
(Chromium's performance log: every response of 400 or more, every request that failed).
The client's "View run at" link opens there too."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests import needs
from tests.live import LiveServer
from tests.webui.test_browser import CHROMEDRIVER, CHROMIUM, WAIT_S, webdriver
from tests.webui.test_mlflow_ui_api import _stock_ui_index

pytestmark = pytest.mark.slow

EXPERIMENT = "stock-ui-journeys"
MODEL = "stock-ui-model"
#: Logged with the stock client, as a person's training script would.
SCRIPT = f"""
import json
import mlflow
import numpy as np
from sklearn.linear_model import LinearRegression

mlflow.set_experiment({EXPERIMENT!r})
ids = {{}}
for name, scale in [("first", 1.0), ("second", 2.0)]:
    with mlflow.start_run(run_name=name) as run:
        mlflow.log_params({{"lr": str(0.1 * scale), "layers": "3"}})
        mlflow.set_tag("stage", "dev")
        for step in range(30):
            mlflow.log_metric("loss", scale / (step + 1), step=step)
            mlflow.log_metric("accuracy", 1 - 0.5 / (step + 1) / scale, step=step)
        mlflow.log_text("hello from the stock client", "notes/readme.txt")
        if name == "first":
            X = np.array([[1.0], [2.0], [3.0]])
            model = LinearRegression().fit(X, np.array([2.0, 4.0, 6.0]))
            info = mlflow.sklearn.log_model(
                model, name="model", registered_model_name={MODEL!r}
            )
            ids["model_id"] = info.model_id
        ids[name] = run.info.run_id
ids["experiment"] = run.info.experiment_id
print("IDS " + json.dumps(ids))
"""


class Site:
    def __init__(self, server: LiveServer, ids: dict[str, str], printed: str) -> None:
        self.server = server
        self.url = server.url
        self.ids = ids
        self.printed = printed

    @property
    def experiment(self) -> str:
        return self.ids["experiment"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    needs.path(_stock_ui_index(), "MLflow's built UI (pip install 'shamal[mlflow-ui]')")
    home = tmp_path_factory.mktemp("stock-ui-home")
    with LiveServer(home) as server:
        env = {
            # No MLflow setting another test left in this worker's environment (a registry
            # URI of a server long gone sent the script's registration there).
            **{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
            "MLFLOW_TRACKING_URI": server.url,
            "MLFLOW_TRACKING_TOKEN": server.token,
            "MLFLOW_ENABLE_ASYNC_LOGGING": "false",
            "MLFLOW_DISABLE_TELEMETRY": "true",
        }
        logged = subprocess.run(
            [sys.executable, "-c", SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert logged.returncode == 0, logged.stderr[-3000:]
        found = re.search(r"^IDS (.*)$", logged.stdout, re.MULTILINE)
        assert found is not None, logged.stdout
        yield Site(server, json.loads(found.group(1)), logged.stdout)


@pytest.fixture(scope="module")
def driver(site: Site) -> Iterator[Any]:
    needs.path(CHROMIUM, "Debian's chromium (apt-get install chromium)")
    needs.path(CHROMEDRIVER, "Debian's chromium-driver (apt-get install chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ["--headless=new", "--disable-dev-shm-usage", "--window-size=1400,1000"]:
        options.add_argument(flag)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # Chromium's sandbox refuses to run as root
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    service = webdriver.ChromeService(executable_path=str(CHROMEDRIVER))
    browser = webdriver.Chrome(options=options, service=service)
    browser.set_page_load_timeout(WAIT_S)
    try:
        _sign_in(browser, site)
        yield browser
    finally:
        browser.quit()


def _wait(driver: Any, condition: Any) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(condition)


def _sign_in(driver: Any, site: Site) -> None:
    """Open /mlflow/ signed out: Shamal's sign-in form, then back to MLflow's UI."""
    from selenium.webdriver.common.by import By

    driver.get(f"{site.url}/mlflow/#/experiments")
    _wait(driver, lambda d: "/ui/sign-in" in d.current_url)
    driver.find_element(By.NAME, "token").send_keys(site.server.token)
    driver.find_element(By.CSS_SELECTOR, "form [type=submit]").click()
    _wait(driver, lambda d: "/mlflow/#/experiments" in d.current_url)


class Network:
    """The requests Chromium made since the last look, from its performance log."""

    def __init__(self, driver: Any, base: str) -> None:
        self.driver = driver
        self.base = base
        self.requests: dict[str, dict[str, Any]] = {}

    def read(self) -> None:
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            params = message.get("params", {})
            request_id = params.get("requestId")
            if message["method"] == "Network.requestWillBeSent":
                request = params["request"]
                self.requests[request_id] = {
                    "url": request["url"].replace(self.base, ""),
                    "method": request["method"],
                    "status": None,
                }
            elif request_id in self.requests and message["method"] == "Network.responseReceived":
                self.requests[request_id]["status"] = params["response"]["status"]
            elif (
                request_id in self.requests
                and message["method"] == "Network.loadingFailed"
                and not params.get("canceled")  # a fetch the page aborted itself is no failure
            ):
                self.requests[request_id]["status"] = params.get("errorText", "failed")

    def failed(self) -> list[str]:
        self.read()
        return [
            f"{r['method']} {r['url'][:200]} -> {r['status']}"
            for r in self.requests.values()
            if isinstance(r["status"], str) or (r["status"] or 0) >= 400
        ]

    def calls(self, fragment: str) -> list[str]:
        self.read()
        return [r["url"] for r in self.requests.values() if fragment in r["url"]]


def _open(driver: Any, site: Site, route: str) -> Network:
    """Open MLflow's UI at ``route`` (the part after '#') in a fresh page, its network log
    emptied first."""
    driver.get("about:blank")
    driver.get_log("performance")
    driver.get_log("browser")
    network = Network(driver, site.url)
    driver.get(f"{site.url}/mlflow/#{route}")
    return network


def _shows(*texts: str) -> Any:
    def condition(driver: Any) -> bool:
        body = driver.execute_script("return document.body ? document.body.innerText : ''")
        return all(t in body for t in texts)

    return condition


def _settled(network: Network, *needed: str) -> Any:
    """The page has made the calls that draw it (each of ``needed`` answered)."""

    def condition(_driver: Any) -> bool:
        network.read()
        answered = [r for r in network.requests.values() if r["status"] is not None]
        return all(any(n in r["url"] for r in answered) for n in needed)

    return condition


def _no_failed_request(driver: Any, network: Network) -> None:
    assert network.failed() == []
    severe = [
        e["message"][:300]
        for e in driver.get_log("browser")
        if e["level"] == "SEVERE" and "Failed to load resource" in e["message"]
    ]
    assert severe == []


def test_the_experiments_list_renders(driver: Any, site: Site) -> None:
    network = _open(driver, site, "/experiments")
    _wait(driver, _shows(EXPERIMENT, "Default"))
    _wait(driver, _settled(network, "experiments/search"))
    _no_failed_request(driver, network)


def test_a_run_renders_with_its_charts(driver: Any, site: Site) -> None:
    run = site.ids["first"]
    route = f"/experiments/{site.experiment}/runs/{run}?workflowType=machine_learning"
    network = _open(driver, site, route)
    _wait(driver, _shows("first", run, "lr", "0.1", "stage", MODEL))
    # Its metrics' charts: each curve read from the server and drawn by MLflow's plots.
    network = _open(driver, site, route.replace("?", "/model-metrics?"))
    _wait(driver, _shows("loss", "accuracy", "first (loss)"))
    _wait(driver, lambda d: d.find_elements("css selector", ".js-plotly-plot .scatterlayer"))
    assert network.calls("get-history-bulk-interval") or network.calls("graphql")
    _no_failed_request(driver, network)
    # And its artifacts, the text file shown in the viewer.
    network = _open(driver, site, route.replace("?", "/artifacts/notes/readme.txt?"))
    _wait(driver, _shows("hello from the stock client"))
    _no_failed_request(driver, network)


def test_the_experiment_runs_and_their_charts_render(driver: Any, site: Site) -> None:
    route = f"/experiments/{site.experiment}/runs?workflowType=machine_learning"
    network = _open(driver, site, route)
    _wait(driver, _shows("first", "second"))
    _wait(driver, _settled(network, "runs/search"))
    _no_failed_request(driver, network)
    network = _open(driver, site, route + "&compareRunsMode=CHART")
    _wait(driver, _shows("loss", "accuracy"))
    _wait(driver, lambda d: d.find_elements("css selector", ".js-plotly-plot .scatterlayer"))
    _no_failed_request(driver, network)


def test_the_compare_view_renders(driver: Any, site: Site) -> None:
    runs = json.dumps([site.ids["first"], site.ids["second"]])
    experiments = json.dumps([site.experiment])
    network = _open(driver, site, f"/compare-runs?runs={runs}&experiments={experiments}")
    _wait(driver, _shows("Comparing 2 Runs", "first", "second", "lr", "loss"))
    _wait(driver, _settled(network, "runs/search", "artifacts/list"))
    _no_failed_request(driver, network)


def test_the_registered_model_and_its_version_render(driver: Any, site: Site) -> None:
    network = _open(driver, site, "/models")
    _wait(driver, _shows(MODEL))
    _no_failed_request(driver, network)
    network = _open(driver, site, f"/models/{MODEL}")
    _wait(driver, _shows(MODEL, "Version 1"))
    _wait(driver, _settled(network, "registered-models/get", "model-versions/search"))
    _no_failed_request(driver, network)
    network = _open(driver, site, f"/models/{MODEL}/versions/1")
    _wait(driver, _shows("Version 1", "Source Run", "first", "Schema"))
    _wait(driver, _settled(network, "model-versions/get-artifact"))
    _no_failed_request(driver, network)


def test_a_logged_models_files_render_in_the_artifact_view(driver: Any, site: Site) -> None:
    from selenium.webdriver.common.by import By

    model = site.ids["model_id"]
    route = f"/experiments/{site.experiment}/models/{model}/artifacts?workflowType=machine_learning"
    network = _open(driver, site, route)
    _wait(driver, _shows("MLmodel", "requirements.txt"))
    driver.find_element(By.XPATH, "//*[normalize-space(text())='MLmodel']").click()
    _wait(driver, _shows("flavors", "sklearn"))
    assert network.calls(f"logged-models/{model}/artifacts/files")
    _no_failed_request(driver, network)


def test_the_view_run_link_opens_the_stock_ui(driver: Any, site: Site) -> None:
    run = site.ids["first"]
    printed = re.search(r"View run first at: (\S+)", site.printed)
    assert printed is not None, site.printed
    link = printed.group(1)
    assert link == f"{site.url}/#/experiments/{site.experiment}/runs/{run}"
    driver.get("about:blank")
    driver.get(link)
    _wait(
        driver,
        lambda d: d.current_url.endswith(f"/mlflow/#/experiments/{site.experiment}/runs/{run}"),
    )
    _wait(driver, _shows("first", run))


def test_signing_out_of_shamal_closes_the_stock_ui(driver: Any, site: Site) -> None:
    """Last: the session cookie gone, MLflow's UI and its calls are Shamal's sign-in's."""
    driver.delete_all_cookies()  # those of the page's site, the server's
    driver.get("about:blank")
    driver.get(f"{site.url}/mlflow/#/models")
    _wait(driver, lambda d: "/ui/sign-in" in d.current_url)
    assert MODEL not in driver.page_source
