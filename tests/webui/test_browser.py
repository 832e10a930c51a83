"""The web UI in a real browser: Debian's Chromium, headless, driven through its
chromedriver against a real server process. Sign in, follow the mlflow client's link,
filter a run table, see a run's curve drawn (and zoom it), hostile names inert, forms
without their token refused, signed-out and revoked sessions sent to sign in."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import pytest

from tests import needs
from tests.live import LiveServer
from tests.webui.conftest import screenshot

pytestmark = pytest.mark.slow

webdriver = needs.module("selenium.webdriver")
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
HOSTILE = '<img src=x onerror="window.__xss=1">'
JS_LINK = "javascript:alert(1)"
WAIT_S = 20
ARTIFACTS = "/api/2.0/mlflow-artifacts/artifacts"
#: Artifacts whose names or contents are HTML and script: each is shown as text.
HOSTILE_FILES = {
    f"{HOSTILE}.txt": HOSTILE.encode(),
    "page.html": b"<script>window.__xss=1</script><a href='javascript:alert(1)'>go</a>",
    "logo.svg": b'<svg xmlns="http://www.w3.org/2000/svg" onload="window.__xss=1"/>',
}


class Site:
    """The live server and the ids of what the module made on it."""

    def __init__(self, server: LiveServer) -> None:
        self.server = server
        self.url = server.url
        self.admin = httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=30
        )
        self.experiment = ""
        self.runs: dict[str, str] = {}

    def mlflow(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.admin.post(f"/api/2.0/mlflow/{path}", json=body)
        answer.raise_for_status()
        result: dict[str, Any] = answer.json()
        return result

    def run(
        self, name: str, params: dict[str, str], tags: dict[str, str], curve: list[float]
    ) -> str:
        info = self.mlflow("runs/create", {"experiment_id": self.experiment, "run_name": name})
        run_id: str = info["run"]["info"]["run_id"]
        self.mlflow(
            "runs/log-batch",
            {
                "run_id": run_id,
                "params": [{"key": k, "value": v} for k, v in params.items()],
                "tags": [{"key": k, "value": v} for k, v in tags.items()],
            },
        )
        for start in range(0, len(curve), 1000):
            points = [
                {"key": "loss", "value": v, "timestamp": 1, "step": start + i}
                for i, v in enumerate(curve[start : start + 1000])
            ]
            self.mlflow("runs/log-batch", {"run_id": run_id, "metrics": points})
        self.runs[name] = run_id
        return run_id

    def artifacts(self, run_id: str, files: dict[str, bytes]) -> None:
        """Upload ``files`` as the run's artifacts, as the MLflow client does."""
        info = self.admin.get("/api/2.0/mlflow/runs/get", params={"run_id": run_id})
        root = info.raise_for_status().json()["run"]["info"]["artifact_uri"]
        for path, data in files.items():
            where = quote(path, safe="")
            put = self.admin.put(
                f"{ARTIFACTS}/{root.removeprefix('mlflow-artifacts:/')}/{where}", content=data
            )
            put.raise_for_status()

    def token_for(self, user: str) -> tuple[str, str]:
        self.admin.post("/api/v1/users", json={"name": user}).raise_for_status()
        issued = self.admin.post("/api/v1/tokens", json={"name": "ui", "user": user})
        body = issued.raise_for_status().json()
        return str(body["secret"]), str(body["id"])


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    home = tmp_path_factory.mktemp("webui-home")
    # MLflow's own UI off: the client's links open Shamal's pages (test_mlflow_ui.py has it on).
    with LiveServer(home, env={"SHAMAL_MLFLOW_UI": "false"}, args=["--sign-in-link"]) as server:
        made = Site(server)
        with made.admin:
            made.experiment = made.mlflow("experiments/create", {"name": "browser-journeys"})[
                "experiment_id"
            ]
            curve = [1.0 / (1 + i / 100) for i in range(5000)]
            curve[3210] = 9.0  # a spike the chart must show
            made.run("fast", {"lr": "0.1"}, {"stage": "dev"}, curve)
            made.run("slow", {"lr": "0.001"}, {"stage": "dev"}, [2.0 - i / 100 for i in range(50)])
            hostile = made.run(
                HOSTILE, {HOSTILE: JS_LINK, "link": JS_LINK}, {HOSTILE: HOSTILE}, [1.0, 0.5]
            )
            made.artifacts(hostile, HOSTILE_FILES)
            yield made


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    needs.path(CHROMIUM, "Debian's chromium (apt-get install chromium)")
    needs.path(CHROMEDRIVER, "Debian's chromium-driver (apt-get install chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ["--headless=new", "--disable-dev-shm-usage", "--window-size=1400,1000"]:
        options.add_argument(flag)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # Chromium's sandbox refuses to run as root
    options.unhandled_prompt_behavior = "ignore"  # an alert stays open for the test to see
    service = webdriver.ChromeService(executable_path=str(CHROMEDRIVER))
    browser = webdriver.Chrome(options=options, service=service)
    browser.set_page_load_timeout(WAIT_S)
    try:
        yield browser
    finally:
        browser.quit()


def _wait(driver: Any, condition: Any) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(condition)


def _by_css(driver: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, css)


def _all_css(driver: Any, css: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, css))


def _sign_in(driver: Any, site: Site, token: str, start: str = "/") -> None:
    driver.delete_all_cookies()
    driver.get(site.url + start)
    _wait(driver, lambda d: "/ui/sign-in" in d.current_url)
    _by_css(driver, "#token").send_keys(token)
    _by_css(driver, "form.sign-in button[type=submit]").click()
    _wait(driver, lambda d: "/ui/sign-in" not in d.current_url)


def _no_script_ran(driver: Any) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert  # noqa: B018 - reading it is the check
    assert driver.execute_script("return typeof window.__xss") == "undefined"


def test_sign_in_and_the_mlflow_clients_link(driver: Any, site: Site) -> None:
    run = site.runs["fast"]
    # Signed out, the link the mlflow client printed leads through the sign-in form to its run.
    _sign_in(driver, site, site.server.token, f"/#/experiments/{site.experiment}/runs/{run}")
    _wait(driver, lambda d: d.current_url.endswith(f"/ui/experiments/{site.experiment}/runs/{run}"))
    assert _by_css(driver, "h1").text == "fast"
    driver.get(site.url + "/ui/experiments")
    assert "browser-journeys" in _by_css(driver, "table.grid").text
    # Signed in, the home page's script follows the fragment.
    driver.get(f"{site.url}/#/experiments/{site.experiment}")
    _wait(driver, lambda d: d.current_url.endswith(f"/ui/experiments/{site.experiment}"))


def test_filter_a_runs_table_and_open_a_run_whose_curve_is_drawn(
    driver: Any, site: Site, tmp_path: Path
) -> None:
    _sign_in(driver, site, site.server.token)
    driver.get(f"{site.url}/ui/experiments/{site.experiment}")
    assert len(_all_css(driver, "a.run-link")) == 3
    box = _by_css(driver, "#filter")
    box.send_keys("params.lr = '0.001'")
    box.submit()
    _wait(driver, lambda d: "filter=" in d.current_url)
    assert [a.text for a in _all_css(driver, "a.run-link")] == ["slow"]

    driver.get(f"{site.url}/ui/experiments/{site.experiment}/runs/{site.runs['fast']}")
    figure = _wait(
        driver, lambda d: d.find_element("css selector", "figure.chart[data-state=drawn]")
    )
    shown = int(figure.get_attribute("data-points"))
    assert 100 < shown <= 1280  # downsampled on the server from 5,000
    path = _by_css(driver, "figure.chart svg path.line").get_attribute("d")
    assert path.startswith("M")
    assert path.count("L") == shown - 1
    assert "of 5,000 points (downsampled" in _by_css(driver, ".chart-status").text
    top = float(_by_css(driver, "svg .tick.end").text)
    assert top == 9.0  # the spike survived the cut
    screenshot(driver, tmp_path, "run")

    # Zoom: drag across the plot; the narrower range comes back at full resolution.
    from selenium.webdriver.common.action_chains import ActionChains

    svg = _by_css(driver, "figure.chart svg")
    ActionChains(driver).move_to_element_with_offset(svg, -100, 0).click_and_hold().move_by_offset(
        60, 0
    ).release().perform()
    _wait(driver, lambda d: not d.find_element("css selector", ".reset").get_attribute("hidden"))
    _wait(driver, lambda d: d.find_element("css selector", "figure.chart[data-state=drawn]"))
    status = _by_css(driver, ".chart-status").text
    assert "downsampled" not in status
    _no_script_ran(driver)


def test_compare_two_runs_checked_in_the_table(driver: Any, site: Site, tmp_path: Path) -> None:
    _sign_in(driver, site, site.server.token)
    driver.get(f"{site.url}/ui/experiments/{site.experiment}")
    for name in ("fast", "slow"):
        _by_css(driver, f"input[name=run][value='{site.runs[name]}']").click()
    _by_css(driver, "form[action='/ui/compare'] button[type=submit]").click()
    _wait(driver, lambda d: "/ui/compare?" in d.current_url)
    # The param that differs, side by side; both runs' curves overlaid in one chart.
    diff = _by_css(driver, "table.diff").text
    assert "lr" in diff
    assert "0.1" in diff
    assert "0.001" in diff
    figure = _wait(
        driver, lambda d: d.find_element("css selector", "figure.chart[data-state=drawn]")
    )
    assert len(figure.find_elements("css selector", "svg path.line")) == 2
    screenshot(driver, tmp_path, "compare")
    _no_script_ran(driver)


def test_hostile_names_tags_and_params_render_inert(driver: Any, site: Site) -> None:
    _sign_in(driver, site, site.server.token)
    hostile = site.runs[HOSTILE]
    pages = [
        f"/ui/experiments/{site.experiment}?param={httpx.QueryParams({'p': HOSTILE})['p']}",
        f"/ui/experiments/{site.experiment}/runs/{hostile}",
        f"/ui/compare?run={hostile}&run={site.runs['slow']}",
        f"/ui/experiments/{site.experiment}/runs/{hostile}/artifacts",
        *(
            f"/ui/experiments/{site.experiment}/runs/{hostile}/artifacts/preview?"
            + urlencode({"path": name})
            for name in HOSTILE_FILES
        ),
    ]
    for page in pages:
        driver.get(site.url + page.replace("<", "%3C").replace(">", "%3E").replace('"', "%22"))
        _wait(driver, lambda d: d.find_element("css selector", "h1"))
        _no_script_ran(driver)
        assert not _all_css(driver, "main img")
        assert not [
            a
            for a in _all_css(driver, "a")
            if (a.get_attribute("href") or "").startswith("javascript")
        ]
    driver.get(f"{site.url}/ui/experiments/{site.experiment}/runs/{hostile}")
    assert _by_css(driver, "h1").text == HOSTILE  # shown as the text it is
    assert JS_LINK in _by_css(driver, "main").text
    driver.get(f"{site.url}/ui/experiments/{site.experiment}/runs/{hostile}/artifacts")
    assert f"{HOSTILE}.txt" in _by_css(driver, "main").text  # the artifact's name, as text
    preview = f"/ui/experiments/{site.experiment}/runs/{hostile}/artifacts/preview"
    driver.get(f"{site.url}{preview}?path=page.html")  # its markup, shown as text
    assert "<script>window.__xss=1</script>" in _by_css(driver, "main").text
    answer = site.admin.get(f"/ui/experiments/{site.experiment}", follow_redirects=False)
    assert "default-src 'none'" in answer.headers["content-security-policy"]


def test_a_form_without_its_token_is_refused(driver: Any, site: Site) -> None:
    _sign_in(driver, site, site.server.token)
    driver.get(site.url + "/ui/experiments")
    # A page of another site would post this form: the same fields, without the token.
    driver.execute_script(
        "const f = document.createElement('form'); f.method = 'post';"
        "f.action = '/ui/sign-out'; document.body.appendChild(f); f.submit();"
    )
    _wait(driver, lambda d: "was refused" in d.find_element("css selector", "main").text)
    driver.get(site.url + "/ui/experiments")
    assert "/ui/experiments" in driver.current_url  # still signed in
    _by_css(driver, "form.who button").click()  # the real form carries its token
    _wait(driver, lambda d: "/ui/sign-in" in d.current_url)


def test_signed_out_and_revoked_sessions_go_to_sign_in(driver: Any, site: Site) -> None:
    driver.delete_all_cookies()
    driver.get(f"{site.url}/ui/experiments/{site.experiment}")
    _wait(driver, lambda d: "/ui/sign-in" in d.current_url)
    assert driver.current_url.endswith(f"/ui/sign-in?next=/ui/experiments/{site.experiment}")

    secret, token_id = site.token_for("rhea")
    _sign_in(driver, site, secret)
    assert "/ui/experiments" in driver.current_url
    site.admin.delete(f"/api/v1/tokens/{token_id}").raise_for_status()
    driver.get(site.url + "/ui/experiments")
    _wait(driver, lambda d: "/ui/sign-in" in d.current_url)


def test_the_one_time_sign_in_link_works_once(driver: Any, site: Site) -> None:
    """`shamal server --sign-in-link` (and `make run`) print a link that signs the admin in
    with a click, once: the code travels in the fragment, which no server log sees."""
    printed = re.search(
        r"http://127\.0\.0\.1:\d+/ui/sign-in#once=[\w-]+", site.server.log.read_text()
    )
    assert printed is not None
    link = printed[0]
    driver.delete_all_cookies()
    driver.get(link)
    _wait(driver, lambda d: d.current_url.endswith("/ui/experiments"))
    assert "Signed in as admin" in _by_css(driver, "header").text
    assert "once=" not in site.server.log.read_text().split(link, 1)[1]  # not in the access log
    driver.delete_all_cookies()
    driver.get(link)
    _wait(driver, lambda d: "used already or has expired" in d.page_source)
    assert "/ui/sign-in" in driver.current_url
    assert not [c for c in driver.get_cookies() if c["name"] == "shamal_session"]
