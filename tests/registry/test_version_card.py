"""A version says what it is and where it came from; copies and ``models:/`` sources work.

Judged with the stock mlflow client against a real server (SQLite, and PostgreSQL with
``CI=true``): ``copy_model_version`` and versions registered from ``models:/<name>/<version>``,
``models:/<name>@<alias>`` and ``models:/<name>/latest``; the formats and signature a version's
``MLmodel`` declares and the datasets its run read, read back through the native API.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import mlflow
import pytest
import yaml
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from shamal.registry._card import MAX_MLMODEL_BYTES, ModelCard, parse_mlmodel
from tests.live import LiveServer

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*Any type hint is inferred:UserWarning"),
]


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _version(server: LiveServer, name: str, version: int | str) -> httpx.Response:
    return httpx.get(
        f"{server.url}/api/v1/models/{name}/versions/{version}",
        headers={"Authorization": f"Bearer {server.token}"},
        timeout=30,
    )


def _iris_run(dataset_context: str = "training") -> tuple[Any, Any, Any]:
    """A run that read the iris frame and logged a classifier with a signature."""
    import pandas as pd
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    frame = load_iris(as_frame=True).frame
    dataset = mlflow.data.from_pandas(frame, name="iris", targets="target")
    features = frame.drop(columns="target")
    mlflow.set_experiment(_name("card"))
    with mlflow.start_run() as run:
        mlflow.log_input(dataset, context=dataset_context)
        model = LogisticRegression(max_iter=300).fit(features, frame["target"])
        info = mlflow.sklearn.log_model(model, name="model", input_example=features.head(2))
    assert isinstance(features, pd.DataFrame)
    return run, info, dataset


@pytest.mark.slow
def test_a_version_carries_its_formats_signature_and_lineage(mlflow_env: LiveServer) -> None:
    run, info, dataset = _iris_run()
    name = _name("iris")
    registered = mlflow.register_model(info.model_uri, name)
    folder = Path(mlflow.artifacts.download_artifacts(info.model_uri))
    mlmodel = yaml.safe_load((folder / "MLmodel").read_text())
    answer = _version(mlflow_env, name, registered.version)
    assert answer.status_code == 200, answer.text
    got = answer.json()
    assert got["formats"] == sorted(mlmodel["flavors"])
    assert {"sklearn", "python_function"} <= set(got["formats"])
    assert got["signature"]["inputs"] == json.loads(mlmodel["signature"]["inputs"])
    assert got["signature"]["outputs"] == json.loads(mlmodel["signature"]["outputs"])
    assert [c["name"] for c in got["signature"]["inputs"]][:1] == ["sepal length (cm)"]
    lineage = got["lineage"]
    assert (lineage["run_id"], lineage["run_visible"]) == (run.info.run_id, True)
    assert lineage["experiment_id"] == run.info.experiment_id
    assert lineage["logged_model_id"] == info.model_id
    assert [(d["name"], d["digest"], d["context"]) for d in lineage["datasets"]] == [
        ("iris", dataset.digest, "training")
    ]
    # A copy is the same model: same card, same lineage.
    copy = MlflowClient().copy_model_version(f"models:/{name}/{registered.version}", f"{name}-c")
    copied = _version(mlflow_env, f"{name}-c", copy.version).json()
    assert (copied["formats"], copied["signature"]) == (got["formats"], got["signature"])
    assert copied["lineage"]["datasets"] == lineage["datasets"]
    assert _version(mlflow_env, name, 99).status_code == 404
    assert _version(mlflow_env, _name("nope"), 1).status_code == 404


@pytest.mark.slow
def test_copies_and_registry_sources_resolve_to_the_named_version(
    mlflow_env: LiveServer,
) -> None:
    import mlflow.pyfunc

    _run, info, _dataset = _iris_run()
    client = MlflowClient()
    source, target = _name("src"), _name("dst")
    first = mlflow.register_model(info.model_uri, source)
    client.set_registered_model_alias(source, "champion", first.version)
    copy = client.copy_model_version(f"models:/{source}/{first.version}", target)
    assert (copy.name, copy.version, copy.source) == (target, "1", f"models:/{source}/1")
    assert copy.run_id == first.run_id
    by_alias = client.create_model_version(target, f"models:/{source}@champion")
    latest = client.create_model_version(target, f"models:/{source}/latest")
    assert (by_alias.version, latest.version) == ("2", "3")
    assert by_alias.run_id == first.run_id  # lineage kept though the caller named no run
    original = mlflow.pyfunc.load_model(f"models:/{source}/1")
    row = {"sepal length (cm)": 5.1, "sepal width (cm)": 3.5}
    row |= {"petal length (cm)": 1.4, "petal width (cm)": 0.2}
    import pandas as pd

    frame = pd.DataFrame([row])
    for version in ("1", "2", "3"):
        loaded = mlflow.pyfunc.load_model(f"models:/{target}/{version}")
        assert list(loaded.predict(frame)) == list(original.predict(frame))
    refused = {
        f"models:/{source}/abc": "INVALID_PARAMETER_VALUE",
        f"models:/{source}/0": "RESOURCE_DOES_NOT_EXIST",
        f"models:/{source}@missing": "RESOURCE_DOES_NOT_EXIST",
        f"models:/{_name('nope')}/1": "RESOURCE_DOES_NOT_EXIST",
        f"models:/{_name('nope')}/latest": "RESOURCE_DOES_NOT_EXIST",
    }
    for bad, code in refused.items():
        with pytest.raises(MlflowException) as exc:
            client.create_model_version(target, bad)
        assert str(exc.value.error_code) == code, bad
    assert len(client.search_model_versions(f"name = '{target}'")) == 3  # nothing stored


@pytest.mark.slow
def test_a_hostile_mlmodel_registers_with_no_card(mlflow_env: LiveServer) -> None:
    laughs = "a: &a ['lol','lol','lol','lol','lol','lol','lol','lol','lol']\n"
    for level in "bcdefghi":
        prev = chr(ord(level) - 1)
        laughs += f"{level}: &{level} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"
    laughs += "flavors: {python_function: *i, '../../etc': {}}\n"
    laughs += "signature: {inputs: *i, outputs: 'not json'}\n"
    mlflow.set_experiment(_name("hostile"))
    with mlflow.start_run() as run:
        mlflow.log_text(laughs, "model/MLmodel")
    name = _name("hostile")
    registered = mlflow.register_model(f"runs:/{run.info.run_id}/model", name)
    got = _version(mlflow_env, name, registered.version).json()
    assert (got["formats"], got["signature"]) == (["python_function"], None)


# ---------------------------------------------------------------------- the parser alone
def test_parse_mlmodel_takes_flavours_and_signature_only() -> None:
    text = (
        "artifact_path: model\n"
        "flavors:\n  sklearn: {pickled_model: model.pkl}\n  python_function: {loader_module: x}\n"
        "signature:\n"
        '  inputs: \'[{"type": "double", "name": "x", "required": true}]\'\n'
        '  outputs: \'[{"type": "long", "required": true}]\'\n'
        "  params: null\n"
    )
    card = parse_mlmodel(text.encode())
    assert card == ModelCard(
        ("python_function", "sklearn"),
        {
            "inputs": [{"type": "double", "name": "x", "required": True}],
            "outputs": [{"type": "long", "required": True}],
        },
    )


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xfe not utf-8",
        b"- a list\n- not a mapping\n",
        b"flavors: [sklearn]\nsignature: 'inputs'\n",
        b"key: !!python/object/apply:os.system ['touch /tmp/x']\n",
        b"a: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[" * 2000,
        b"flavors: {sklearn: {}}\n#" + b"x" * MAX_MLMODEL_BYTES,
    ],
)
def test_parse_mlmodel_gives_an_empty_card_for_anything_else(data: bytes) -> None:
    assert parse_mlmodel(data) == ModelCard()
