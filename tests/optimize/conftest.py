"""Optimizer fixtures: a live server, models logged with the stock mlflow client, and the
SENTINEL check that no hostile pickle ever ran."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.live import LiveServer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# The MLP's optimizer state is a scikit-learn type that skops asks its saver to trust.
MLP_TRUSTED = ["sklearn.neural_network._stochastic_optimizers.AdamOptimizer"]


class Hostile:
    """Pickles to a call of ``os.system(command)``: what a malicious model file does."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (self.command,)


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[Path]:
    """A path that a hostile payload would create; asserted absent after the test."""
    path = tmp_path / "SENTINEL"
    yield path
    assert not path.exists(), "a hostile pickle ran"


@pytest.fixture(scope="module")
def wine() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Wine data split into train and held-out halves (fixed seed)."""
    from sklearn.datasets import load_wine
    from sklearn.model_selection import train_test_split

    x, y = load_wine(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.4, random_state=0)
    return x_train, x_test, y_train, y_test


@pytest.fixture(scope="module")
def wine_mlp(wine: tuple[np.ndarray, ...]) -> object:
    """A scaled MLP classifier on wine: its MatMul weights quantize and prune."""
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x_train, _, y_train, _ = wine
    mlp = MLPClassifier(hidden_layer_sizes=(32,), max_iter=2000, random_state=0)
    return make_pipeline(StandardScaler(), mlp).fit(x_train, y_train)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One real server for the module (SQLite)."""
    with LiveServer(tmp_path_factory.mktemp("optimize-home")) as server:
        yield server


@pytest.fixture(scope="module")
def wine_folder(tmp_path_factory: pytest.TempPathFactory, wine_mlp: object) -> Path:
    """The wine MLP saved as an MLflow sklearn model folder (module scope)."""
    import mlflow.sklearn

    folder = tmp_path_factory.mktemp("wine") / "model"
    mlflow.sklearn.save_model(
        wine_mlp, str(folder), skops_trusted_types=MLP_TRUSTED, pip_requirements=[]
    )
    return folder


@pytest.fixture
def mlflow_live(live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    """The stock mlflow client and the Shamal client pointed at the live server."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", live.url)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", live.token)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("SHAMAL_URL", live.url)
    monkeypatch.setenv("SHAMAL_TOKEN", live.token)
    import mlflow

    mlflow.set_tracking_uri(live.url)
    mlflow.set_registry_uri(live.url)
    return live
