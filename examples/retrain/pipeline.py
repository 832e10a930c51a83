"""A retraining pipeline: validate the newest wine data, train, evaluate, register the model
as a candidate, promote it to champion only through the gate, and (with ``deployment``) put
it on the deployment as a canary that the rollout controller promotes or rolls back.

    shamal pipeline run examples/retrain/pipeline.py:retrain --team quickstart --wait

Registered by the quickstart (`make run`), where a new version of the `wine` dataset starts a
run by itself (the `on` trigger below). Each step is a job of its own; the steps pass small
values (the dataset version, the tracking run, the model version) and the stock mlflow client
logs the training run into the step's nested run.
"""

from __future__ import annotations

from typing import Any

from shamal.pipelines import dataset, pipeline, step

MODEL = "quickstart-wine"
FEATURES = (
    "alcohol",
    "malic_acid",
    "ash",
    "alcalinity_of_ash",
    "magnesium",
    "total_phenols",
    "flavanoids",
    "nonflavanoid_phenols",
    "proanthocyanins",
    "color_intensity",
    "hue",
    "od280_od315_of_diluted_wines",
    "proline",
)


@step(cpus=1, memory_mib=1024)
def validate(data: str, min_rows: int) -> dict[str, Any]:
    """The dataset version passed its validation suite and holds enough rows."""
    from shamal.data import version

    found = version(data)
    report = found.get("validation") or {}
    if report.get("ok") is False:
        raise RuntimeError(f"{data} failed its validation suite: shamal data show {data}")
    if found["row_count"] < min_rows:
        raise RuntimeError(f"{data} holds {found['row_count']} rows, fewer than {min_rows}")
    return {"data": data, "rows": found["row_count"]}


@step(cpus=1, memory_mib=2048)
def train(checked: dict[str, Any], alpha: float) -> dict[str, Any]:
    """Train a classifier with the stock mlflow client (its run is this step's)."""
    import mlflow
    import numpy as np
    from sklearn.linear_model import SGDClassifier
    from sklearn.metrics import accuracy_score
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from shamal.data import load, mlflow_dataset

    table = load(checked["data"])
    x = np.column_stack([table[c].to_numpy() for c in FEATURES])
    y = table["target"].to_numpy()
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.3, random_state=0)
    model = make_pipeline(StandardScaler(), SGDClassifier(alpha=alpha, random_state=0))
    with mlflow.start_run() as run:  # MLFLOW_RUN_ID: the step's nested run
        mlflow.log_input(mlflow_dataset(checked["data"]), context="training")
        mlflow.log_params({"model": "SGDClassifier", "alpha": alpha})
        model.fit(x_train, y_train)
        accuracy = float(accuracy_score(y_test, model.predict(x_test)))
        mlflow.log_metric("test_accuracy", accuracy)
        info = mlflow.sklearn.log_model(
            model,
            name="model",
            input_example=x_test[:2],
            serialization_format="skops",
            pip_requirements=mlflow.sklearn.get_default_pip_requirements(include_skops=True),
        )
    return {"run_id": run.info.run_id, "model_uri": info.model_uri, "accuracy": accuracy}


@step(cpus=1, memory_mib=512)
def evaluate(trained: dict[str, Any], min_accuracy: float) -> dict[str, Any]:
    """Good enough to register at all (the gate compares with the champion later)."""
    return {"accuracy": trained["accuracy"], "passed": trained["accuracy"] >= min_accuracy}


@step(cpus=1, memory_mib=1024)
def register(trained: dict[str, Any]) -> dict[str, Any]:
    """Register the model as a new version and point @candidate at it."""
    import mlflow

    version = mlflow.register_model(trained["model_uri"], MODEL)
    mlflow.MlflowClient().set_registered_model_alias(MODEL, "candidate", version.version)
    return {"version": int(version.version)}


@step(cpus=1, memory_mib=512)
def gate(registered: dict[str, Any]) -> dict[str, Any]:
    """@champion moves to the candidate only if it is no worse than the champion."""
    from shamal.client import ShamalClient

    with ShamalClient() as api:
        report = api.promote(
            MODEL,
            from_alias="candidate",
            to_alias="champion",
            rules=["metrics.test_accuracy >= champion.metrics.test_accuracy - 0.05"],
        )
    return {"version": registered["version"], "promoted": report["promoted"]}


@step(cpus=1, memory_mib=512)
def canary(registered: dict[str, Any], deployment: str, percent: int) -> dict[str, Any]:
    """Put the new version on the deployment as its canary (none named: nothing to do). The
    rollout controller then moves it up step by step on live traffic, or rolls it back when
    it breaks the deployment's SLO: production decides, not a person."""
    version = registered["version"]
    if not deployment:
        return {"version": version, "canary": None}
    from shamal.client import ShamalClient

    uri = f"models:/{MODEL}/{version}"
    with ShamalClient() as api:
        changed = api.set_canary(deployment, uri, percent)
    return {"version": version, "canary": uri, "revision": changed["revision"]}


@pipeline(on="dataset_version_created where dataset = 'wine'")
def retrain(
    min_rows: int = 150,
    alpha: float = 1e-3,
    min_accuracy: float = 0.8,
    deployment: str = "",
    canary_percent: int = 10,
) -> None:
    checked = validate(dataset("wine"), min_rows)
    trained = train(checked, alpha)
    verdict = evaluate(trained, min_accuracy)
    registered = register.options(when="steps.evaluate.output.passed == true", after=[verdict])(
        trained
    )
    gate(registered)
    canary(registered, deployment, canary_percent)
