"""The trial side needs no Optuna and nothing outside a trial job."""

from __future__ import annotations

import subprocess
import sys

import pytest

import shamal.tune
from shamal.errors import InvalidParameter
from shamal.tune._entities import check_distribution


def test_the_trial_side_imports_without_optuna() -> None:
    code = (
        "import sys; sys.modules['optuna'] = None\n"
        "import shamal.tune, shamal.tune._driver\n"
        "print(shamal.tune.current_trial())\n"
    )
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(  # noqa: S603 - our own interpreter
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"


def test_current_trial_reads_the_jobs_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(shamal.tune.TRIAL_ENV, raising=False)
    assert shamal.tune.current_trial() is None
    monkeypatch.setenv(shamal.tune.TRIAL_ENV, "17")
    monkeypatch.setenv("SHAMAL_URL", "http://127.0.0.1:9")
    trial = shamal.tune.current_trial()
    assert trial is not None
    assert trial.id == 17
    assert shamal.tune.current_trial() is trial
    assert trial.should_prune() is False  # nothing reported yet
    trial.close()


def test_distributions_are_normalised() -> None:
    assert check_distribution({"type": "int", "low": 1.0, "high": 4}) == {
        "type": "int",
        "low": 1,
        "high": 4,
        "log": False,
        "step": 1,
    }
    assert check_distribution({"type": "float", "low": 0.5, "high": 0.5})["high"] == 0.5
    with pytest.raises(InvalidParameter, match="log"):
        check_distribution({"type": "float", "low": 1e-3, "high": 1.0, "log": True, "step": 0.1})
