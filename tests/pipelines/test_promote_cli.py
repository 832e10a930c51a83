"""`shamal models promote` against a live server: a first promotion (exit 0), a refusal
(exit 1, the alias unmoved), a dry run, JUnit XML for CI, --json, and errors (a bad rule,
a viewer's token) with a clear message and no trace."""

from __future__ import annotations

import json
import shlex
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shamal.cli import app
from tests.pipelines._live import serving
from tests.pipelines.conftest import SUITE, TOLERANT, World, csv_bytes

Shamal = Callable[..., tuple[int, str]]
PROMOTE = ("models", "promote", "churn", "--from", "candidate", "--to", "champion")


@pytest.fixture
def url(world: World) -> Iterator[str]:
    with serving(world.platform) as found:
        yield found


@pytest.fixture
def shamal(world: World, url: str, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Shamal]:
    """``shamal ARGS...`` as ``who`` (their token), answering (exit code, output)."""
    monkeypatch.setenv("SHAMAL_URL", url)
    runner = CliRunner()

    def as_user(who: str = "mo") -> Shamal:
        def run(*args: str) -> tuple[int, str]:
            env = {"COLUMNS": "200", "SHAMAL_TOKEN": world.people.secrets[who]}
            result = runner.invoke(app, list(args), env=env)
            return result.exit_code, result.output

        return run

    return as_user


def test_promote_passes_then_refuses_with_exit_codes_and_junit(
    world: World, shamal: Callable[..., Shamal], tmp_path: Path
) -> None:
    run = shamal("mo")
    v1 = world.candidate(0.9)
    code, out = run(*PROMOTE, "--require", TOLERANT, "--junit", str(tmp_path / "first.xml"))
    assert code == 0, out
    assert f"promoted v{v1} to @champion (was no version)" in out
    assert "no champion" in out
    assert world.champion() == v1
    first = ET.parse(tmp_path / "first.xml").getroot()
    assert first.find("testsuite/testcase/failure") is None

    world.candidate(0.5)
    junit = tmp_path / "gate.xml"
    code, out = run(
        *PROMOTE,
        "--require",
        TOLERANT,
        "--require",
        "data.validation == 'passed'",
        "--junit",
        str(junit),
    )
    assert code == 1, out
    assert "refused: 2 of 2 rules failed; @champion stays at v1" in out
    assert "metrics.f1 = 0.5 >= champion.metrics.f1 - 0.01 = 0.89: failed" in out
    assert world.champion() == v1
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert suite.get("name") == "shamal.promote.churn"
    assert suite.get("failures") == "2"
    failures = [c.find("failure") for c in suite.findall("testcase")]
    assert all(f is not None for f in failures)


def test_dry_run_and_json(world: World, shamal: Callable[..., Shamal]) -> None:
    world.candidate(0.9)
    code, out = shamal("vi")(*PROMOTE, "--require", "metrics.f1 > 0.8", "--dry-run")
    assert code == 0, out
    assert "(dry run)" in out
    assert world.champion() is None
    code, out = shamal("mo")(*PROMOTE, "--require", "metrics.f1 > 0.95", "--json")
    assert code == 1
    report = json.loads(out)
    assert (report["passed"], report["promoted"]) == (False, False)
    assert report["results"][0]["values"] == {"metrics.f1": 0.9}


@pytest.mark.parametrize(
    ("who", "args", "says"),
    [
        ("mo", ("--require", "exec('rm -rf /') > 0"), "unknown function"),
        ("mo", ("--require", "metrics.f1 >"), "expected a value"),
        ("vi", ("--require", TOLERANT), "PERMISSION_DENIED"),
        ("bo", ("--require", TOLERANT), "RESOURCE_DOES_NOT_EXIST"),
    ],
)
def test_errors_are_one_clear_line(
    world: World, shamal: Callable[..., Shamal], who: str, args: tuple[str, ...], says: str
) -> None:
    world.candidate(0.9)
    code, out = shamal(who)(*PROMOTE, *args)
    assert code == 1
    assert says in out
    assert "Traceback" not in out
    assert world.champion() is None


def test_a_rule_is_required(world: World, shamal: Callable[..., Shamal]) -> None:
    code, out = shamal("mo")(*PROMOTE)
    assert code == 2  # a usage error: --require is required
    assert "--require" in out


def _example_gate(junit: Path) -> list[str]:
    """The `shamal models promote` command of examples/ci/promote.sh, as argv."""
    script = (Path(__file__).resolve().parents[2] / "examples/ci/promote.sh").read_text()
    joined = script.replace("\\\n", " ")
    line = next(x for x in joined.splitlines() if x.strip().startswith("shamal models promote"))
    words = shlex.split(line.replace('"$MODEL"', "churn").replace('"$JUNIT"', str(junit)))
    assert words[:3] == ["shamal", "models", "promote"]
    return words[1:]


def test_the_ci_example_runs_as_written(
    world: World, shamal: Callable[..., Shamal], tmp_path: Path
) -> None:
    datasets = world.platform.datasets
    datasets.create(world.ctx("mo"), "customers", "red")
    data = datasets.ingest(world.ctx("mo"), "customers", csv_bytes([0.5]), "csv")
    datasets.set_suite(world.ctx("rita"), "customers", SUITE)
    checked = datasets.ingest(world.ctx("mo"), "customers", csv_bytes([1.5]), "csv")
    assert data.validation is None
    assert checked.validation is not None
    world.candidate(0.9, data=f"customers/{checked.version}")
    junit = tmp_path / "gate.xml"
    code, out = shamal("mo")(*_example_gate(junit))
    assert code == 0, out
    assert ET.parse(junit).getroot().find("testsuite/testcase/failure") is None
    world.candidate(0.95, data=f"customers/{data.version}")  # better, but unvalidated data
    code, out = shamal("mo")(*_example_gate(junit))
    assert code == 1, out
    assert "data.validation = 'none' == 'passed': failed" in out
