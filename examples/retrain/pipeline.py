"""A retraining pipeline: take in the lab's newest export, validate it, build the training set
from the feature store, train, evaluate, register the model as a candidate with its reference
profile, promote it to champion only through the gate, and (with ``deployment``) put it on
the deployment as a canary that the rollout controller promotes or rolls back.

    shamal pipeline run examples/retrain/pipeline.py:retrain --team quickstart --wait

Registered by the quickstart (`make run`). Two things start it by themselves: a new version of
the `wine` dataset (the `on` trigger below; a version its own ingest step writes never starts it
again), and the quickstart's drift monitor (`--on-drift retrain:retrain`), which passes
``landing`` (the lab's export in the team's artifact store, taken in as a new version of `wine`
first) and ``deployment`` (where the new version goes as a canary). Each step is a job of its
own; the steps pass small values (dataset versions, the tracking run, the model version) and
the stock mlflow client logs the training run into the step's nested run.
"""

from __future__ import annotations

from typing import Any

from shamal.pipelines import dataset, pipeline, step

MODEL = "quickstart-wine"
DATA = "wine"
FEATURE_VIEW = "wine_measurements"
FEATURE_SERVICE = "wine_classifier"
TRAINING_SET = "wine-training"
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


@step(cpus=1, memory_mib=1024, cache=False)
def ingest(data: str, landing: str, mode: str) -> dict[str, Any]:
    """The lab's export at ``landing`` (``TEAM/PATH`` in the artifact store) as a new version
    of the data, ``append``-ed or ``overwrite``-ing; without one, the data as it is. Never
    cached: the same path may hold a newer export."""
    if not landing:
        return {"data": data, "ingested": None}
    import tempfile
    from pathlib import Path

    from shamal.client import ShamalClient

    team, _, path = landing.partition("/")
    with ShamalClient() as api, tempfile.TemporaryDirectory() as folder:
        local = Path(folder) / Path(path).name
        with local.open("wb") as out:
            for chunk in api.download_artifact(team, path):
                out.write(chunk)
        found = api.ingest_file(DATA, local, mode=mode)
    written = found["uri"].removeprefix("data:/")
    return {"data": written, "ingested": landing, "rows": found["row_count"]}


@step(cpus=1, memory_mib=1024)
def validate(ingested: dict[str, Any], min_rows: int) -> dict[str, Any]:
    """The dataset version passed its validation suite and holds enough rows."""
    from shamal.data import version

    data = ingested["data"]
    found = version(data)
    report = found.get("validation") or {}
    if report.get("ok") is False:
        raise RuntimeError(f"{data} failed its validation suite: shamal data show {data}")
    if found["row_count"] < min_rows:
        raise RuntimeError(f"{data} holds {found['row_count']} rows, fewer than {min_rows}")
    return {"data": data, "rows": found["row_count"]}


@step(cpus=1, memory_mib=1024)
def features(checked: dict[str, Any]) -> dict[str, Any]:
    """The training set by a point-in-time join of each sample's label, as of when it was
    measured, with the feature service's measurements (saved as a version of the training
    set whose source names the feature view and data versions it read); then the feature
    view's new rows go to the online store, so the deployment reads the new samples."""
    from shamal.client import ShamalClient

    with ShamalClient() as api:
        table, headers = api.historical_features(
            checked["data"],
            sql="SELECT sample_id, target, measured_at AS event_timestamp FROM source",
            feature_service=FEATURE_SERVICE,
            save_as=TRAINING_SET,
        )
        (online,) = api.materialize_features([FEATURE_VIEW], incremental=True)
    return {
        "training": headers["x-shamal-saved-as"].removeprefix("data:/"),
        "rows": table.num_rows,
        "online_rows": online["rows"],
    }


@step(cpus=1, memory_mib=2048)
def train(built: dict[str, Any], alpha: float) -> dict[str, Any]:
    """Train a classifier with the stock mlflow client (its run is this step's), and sketch
    its answers on the whole training set: the reference the drift monitor compares the
    deployed version's answers with."""
    import mlflow
    from mlflow.models import infer_signature
    from sklearn.linear_model import SGDClassifier
    from sklearn.metrics import accuracy_score
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from shamal.data import load, mlflow_dataset
    from shamal.monitoring.core import SketchBuilder

    table = load(built["training"]).to_pandas()
    x, y = table[list(FEATURES)], table["target"].to_numpy()
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.3, random_state=0)
    model = make_pipeline(StandardScaler(), SGDClassifier(alpha=alpha, random_state=0))
    with mlflow.start_run() as run:  # MLFLOW_RUN_ID: the step's nested run
        mlflow.log_input(mlflow_dataset(built["training"]), context="training")
        mlflow.log_params({"model": "SGDClassifier", "alpha": alpha, "dataset": built["training"]})
        model.fit(x_train, y_train)
        accuracy = float(accuracy_score(y_test, model.predict(x_test)))
        mlflow.log_metric("test_accuracy", accuracy)
        info = mlflow.sklearn.log_model(
            model,
            name="model",
            # Named columns: the monitor names a served tensor's columns by them.
            signature=infer_signature(x_test, model.predict(x_test)),
            serialization_format="skops",
            pip_requirements=mlflow.sklearn.get_default_pip_requirements(include_skops=True),
        )
    answers = SketchBuilder()  # named as the served model names its answer
    answers.update({"label": model.predict(x)})
    return {
        "run_id": run.info.run_id,
        "model_uri": info.model_uri,
        "accuracy": accuracy,
        "training": built["training"],
        "answers": {name: s.to_json() for name, s in answers.result().items()},
    }


@step(cpus=1, memory_mib=512)
def evaluate(trained: dict[str, Any], min_accuracy: float) -> dict[str, Any]:
    """Good enough to register at all (the gate compares with the champion later)."""
    return {"accuracy": trained["accuracy"], "passed": trained["accuracy"] >= min_accuracy}


@step(cpus=1, memory_mib=1024)
def register(trained: dict[str, Any]) -> dict[str, Any]:
    """Register the model as a new version, point @candidate at it, and give it its reference
    profile: sketches of its training set and of its answers on it."""
    import mlflow

    from shamal.client import ShamalClient

    version = int(mlflow.register_model(trained["model_uri"], MODEL).version)
    mlflow.MlflowClient().set_registered_model_alias(MODEL, "candidate", str(version))
    with ShamalClient() as api:
        training = trained["training"]
        api.build_reference(MODEL, version, training, label="target", columns=[*FEATURES])
        api.upload_sketches(MODEL, version, trained["answers"], role="prediction")
    return {"version": version}


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
    landing: str = "",
    mode: str = "append",
    min_rows: int = 150,
    alpha: float = 1e-3,
    min_accuracy: float = 0.8,
    deployment: str = "",
    canary_percent: int = 10,
) -> None:
    ingested = ingest(dataset(DATA), landing, mode)
    checked = validate(ingested, min_rows)
    built = features(checked)
    trained = train(built, alpha)
    verdict = evaluate(trained, min_accuracy)
    registered = register.options(when="steps.evaluate.output.passed == true", after=[verdict])(
        trained
    )
    gate(registered)
    canary(registered, deployment, canary_percent)
