"""The stock mlflow client is the judge: tracking against a real server, SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import math
import os
import time
import uuid
from pathlib import Path

import httpx
import mlflow
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag, ViewType
from mlflow.exceptions import MlflowException, RestException

from tests.live import LiveServer

pytestmark = pytest.mark.slow


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_experiment_lifecycle(mlflow_env: LiveServer) -> None:
    client = MlflowClient()
    name = _name("exp")
    exp_id = client.create_experiment(name, tags={"team": "vision"})
    exp = client.get_experiment(exp_id)
    assert (exp.name, exp.lifecycle_stage, exp.tags["team"]) == (name, "active", "vision")
    assert exp.artifact_location == f"mlflow-artifacts:/{exp_id}"
    assert client.get_experiment_by_name(name).experiment_id == exp_id
    assert client.get_experiment_by_name(_name("missing")) is None
    with pytest.raises(MlflowException) as dup:
        client.create_experiment(name)
    assert dup.value.error_code == "RESOURCE_ALREADY_EXISTS"
    client.rename_experiment(exp_id, name + "-renamed")
    assert client.get_experiment(exp_id).name == name + "-renamed"
    client.set_experiment_tag(exp_id, "stage", "dev")
    assert client.get_experiment(exp_id).tags["stage"] == "dev"
    client.delete_experiment(exp_id)
    assert client.get_experiment(exp_id).lifecycle_stage == "deleted"
    active = [e.experiment_id for e in client.search_experiments()]
    assert exp_id not in active
    deleted = [e.experiment_id for e in client.search_experiments(view_type=ViewType.DELETED_ONLY)]
    assert exp_id in deleted
    client.restore_experiment(exp_id)
    assert client.get_experiment(exp_id).lifecycle_stage == "active"
    assert client.get_experiment("0").name == "Default"


def test_search_experiments_filters_order_and_pages(mlflow_env: LiveServer) -> None:
    client = MlflowClient()
    tag = uuid.uuid4().hex[:8]
    ids = [client.create_experiment(f"page-{tag}-{i:02d}", tags={"batch": tag}) for i in range(7)]
    found = client.search_experiments(filter_string=f"tags.batch = '{tag}'", order_by=["name DESC"])
    assert [e.experiment_id for e in found] == list(reversed(ids))
    seen, token = [], None
    while True:
        page = client.search_experiments(
            filter_string=f"name LIKE 'page-{tag}-%'",
            max_results=3,
            page_token=token,
            order_by=["name"],
        )
        seen += [e.experiment_id for e in page]
        token = page.token
        if not token:
            break
    assert seen == ids


def test_runs_params_metrics_tags(mlflow_env: LiveServer) -> None:
    mlflow.set_experiment(_name("runs"))
    with mlflow.start_run(run_name="first") as run:
        mlflow.log_param("lr", 0.01)
        mlflow.log_params({"depth": 3, "optimizer": "adam"})
        for step in range(5):
            mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
        mlflow.log_metrics({"acc": 0.9, "f1": 0.8}, step=4)
        mlflow.log_metric("weird", math.nan)
        mlflow.log_metric("big", math.inf)
        mlflow.set_tag("owner", "ada")
        mlflow.set_tags({"a": "1", "b": "2"})
    client = MlflowClient()
    got = client.get_run(run.info.run_id)
    assert got.info.status == "FINISHED"
    assert got.info.run_name == "first"
    assert got.info.end_time is not None
    assert got.data.params == {"lr": "0.01", "depth": "3", "optimizer": "adam"}
    assert got.data.metrics["loss"] == pytest.approx(0.2)
    assert got.data.metrics["acc"] == pytest.approx(0.9)
    assert math.isnan(got.data.metrics["weird"])
    assert got.data.metrics["big"] == math.inf
    assert got.data.tags["owner"] == "ada"
    assert got.info.artifact_uri.startswith("mlflow-artifacts:/")
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(s, 1.0 / (s + 1)) for s in range(5)]
    # Params are write-once; the same value again is fine.
    with pytest.raises(MlflowException) as changed:
        client.log_param(run.info.run_id, "lr", "0.02")
    assert changed.value.error_code == "INVALID_PARAMETER_VALUE"
    client.log_param(run.info.run_id, "lr", "0.01")
    client.delete_tag(run.info.run_id, "owner")
    assert "owner" not in client.get_run(run.info.run_id).data.tags


def test_log_batch_timestamps_and_limits(mlflow_env: LiveServer) -> None:
    client = MlflowClient()
    exp_id = client.create_experiment(_name("batch"))
    run = client.create_run(exp_id)
    ts = int(time.time() * 1000)
    metrics = [Metric("m", float(i), ts + i, i) for i in range(1000)]
    client.log_batch(
        run.info.run_id,
        metrics=metrics,
        params=[Param("p", "v")],
        tags=[RunTag("t", "1"), RunTag("t", "2")],
    )
    history = client.get_metric_history(run.info.run_id, "m")
    assert len(history) == 1000
    assert [(m.step, m.timestamp) for m in history[:3]] == [(0, ts), (1, ts + 1), (2, ts + 2)]
    got = client.get_run(run.info.run_id)
    assert got.data.metrics["m"] == 999.0
    assert got.data.tags["t"] == "2"  # last one wins
    # The client splits big batches itself; the server's own limit, over raw HTTP:
    too_many = httpx.post(
        f"{mlflow_env.url}/api/2.0/mlflow/runs/log-batch",
        headers={"Authorization": f"Bearer {mlflow_env.token}"},
        json={
            "run_id": run.info.run_id,
            "metrics": [{"key": "x", "value": 1, "timestamp": ts, "step": i} for i in range(1001)],
        },
    )
    assert (too_many.status_code, too_many.json()["error_code"]) == (400, "INVALID_PARAMETER_VALUE")
    # Identical points are appended once.
    client.log_batch(run.info.run_id, metrics=metrics[:10])
    assert len(client.get_metric_history(run.info.run_id, "m")) == 1000


def test_run_lifecycle(mlflow_env: LiveServer) -> None:
    client = MlflowClient()
    exp_id = client.create_experiment(_name("life"))
    run = client.create_run(exp_id, run_name="r1", tags={"k": "v"})
    client.update_run(run.info.run_id, status="KILLED", name="renamed")
    got = client.get_run(run.info.run_id)
    assert (got.info.status, got.info.run_name) == ("KILLED", "renamed")
    client.delete_run(run.info.run_id)
    assert client.get_run(run.info.run_id).info.lifecycle_stage == "deleted"
    with pytest.raises(MlflowException):
        client.log_metric(run.info.run_id, "x", 1.0)  # deleted runs take no data
    client.restore_run(run.info.run_id)
    client.log_metric(run.info.run_id, "x", 1.0)
    with pytest.raises(MlflowException) as missing:
        client.get_run(uuid.uuid4().hex)
    assert missing.value.error_code == "RESOURCE_DOES_NOT_EXIST"


def test_search_runs_filters_order_and_pages(mlflow_env: LiveServer) -> None:
    client = MlflowClient()
    exp_id = client.create_experiment(_name("search"))
    runs = []
    for i in range(12):
        run = client.create_run(exp_id, run_name=f"r{i:02d}", tags={"parity": str(i % 2)})
        client.log_batch(
            run.info.run_id,
            metrics=[Metric("acc", i / 10, 0, 0)],
            params=[Param("depth", str(i % 3))],
        )
        runs.append(run.info.run_id)
    by_metric = client.search_runs([exp_id], "metrics.acc >= 0.5", order_by=["metrics.acc DESC"])
    assert [r.info.run_id for r in by_metric] == list(reversed(runs[5:]))
    both = client.search_runs([exp_id], "params.depth = '0' and tags.parity = '1'")
    assert sorted(r.info.run_id for r in both) == sorted(runs[i] for i in (3, 9))
    named = client.search_runs([exp_id], "attributes.run_name LIKE 'r1%'")
    assert len(named) == 2
    paged, token = [], None
    while True:
        page = client.search_runs(
            [exp_id], order_by=["attributes.run_name ASC"], max_results=5, page_token=token
        )
        paged += [r.info.run_id for r in page]
        token = page.token
        if not token:
            break
    assert paged == runs
    df = mlflow.search_runs([exp_id], filter_string="metrics.acc < 0.2")
    assert len(df) == 2
    for hostile in (
        "name = 'x' OR 1=1",
        "metrics.acc > 0 UNION SELECT password FROM users",
        "name = 'x'; DROP TABLE runs; --",
    ):
        with pytest.raises(MlflowException) as bad:
            client.search_runs([exp_id], hostile)
        assert bad.value.error_code == "INVALID_PARAMETER_VALUE"
    assert len(client.search_runs([exp_id])) == 12  # nothing was dropped


def test_artifacts_nested_and_large(mlflow_env: LiveServer, tmp_path: Path) -> None:
    mlflow.set_experiment(_name("artifacts"))
    folder = tmp_path / "outputs"
    (folder / "plots" / "deep").mkdir(parents=True)
    (folder / "summary.txt").write_text("done\n")
    (folder / "plots" / "loss.csv").write_text("step,loss\n0,1.0\n")
    (folder / "plots" / "deep" / "x.bin").write_bytes(os.urandom(4096))
    big = tmp_path / "big.bin"
    with big.open("wb") as out:
        block = os.urandom(1024 * 1024)
        for _ in range(110):  # 110 MiB, streamed both ways
            out.write(block)
    with mlflow.start_run() as run:
        mlflow.log_artifacts(str(folder), artifact_path="outputs")
        mlflow.log_artifact(str(big))
    client = MlflowClient()
    top = {(f.path, f.is_dir) for f in client.list_artifacts(run.info.run_id)}
    assert top == {("outputs", True), ("big.bin", False)}
    nested = [f.path for f in client.list_artifacts(run.info.run_id, "outputs/plots")]
    assert nested == ["outputs/plots/deep", "outputs/plots/loss.csv"]
    local = Path(client.download_artifacts(run.info.run_id, "outputs", str(tmp_path / "dl")))
    assert (local / "plots" / "deep" / "x.bin").read_bytes() == (
        folder / "plots" / "deep" / "x.bin"
    ).read_bytes()
    got = Path(
        mlflow.artifacts.download_artifacts(
            run_id=run.info.run_id, artifact_path="big.bin", dst_path=str(tmp_path / "big")
        )
    )
    digest = hashlib.sha256()
    with got.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    expected = hashlib.sha256()
    with big.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            expected.update(chunk)
    assert digest.hexdigest() == expected.hexdigest()


def test_log_inputs_datasets(mlflow_env: LiveServer) -> None:
    import pandas as pd

    mlflow.set_experiment(_name("inputs"))
    frame = pd.DataFrame({"x": [1, 2, 3], "y": [0, 1, 0]})
    dataset = mlflow.data.from_pandas(frame, name="toy", targets="y")
    with mlflow.start_run() as run:
        mlflow.log_input(dataset, context="training")
    got = MlflowClient().get_run(run.info.run_id)
    inputs = got.inputs.dataset_inputs
    assert [(i.dataset.name, i.dataset.digest) for i in inputs] == [("toy", dataset.digest)]
    assert {t.key: t.value for t in inputs[0].tags}["mlflow.data.context"] == "training"


def test_sklearn_model_logged_registered_and_loaded_by_alias(mlflow_env: LiveServer) -> None:
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    x, y = load_iris(return_X_y=True)
    mlflow.set_experiment(_name("sklearn"))
    with mlflow.start_run():
        model = LogisticRegression(max_iter=200).fit(x, y)
        info = mlflow.sklearn.log_model(model, name="model", input_example=x[:2])
    name = _name("iris")
    version = mlflow.register_model(info.model_uri, name)
    client = MlflowClient()
    client.set_registered_model_alias(name, "champion", version.version)
    loaded = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    assert list(loaded.predict(x[:5])) == list(model.predict(x[:5]))
    logged = client.get_logged_model(info.model_id)
    assert logged.status == "READY"


def test_server_info_unknown_endpoints_and_missing_things(mlflow_env: LiveServer) -> None:
    info = httpx.get(f"{mlflow_env.url}/api/3.0/mlflow/server-info", timeout=3)
    assert info.status_code == 200
    assert info.json()["workspaces_enabled"] is False
    headers = {"Authorization": f"Bearer {mlflow_env.token}"}
    unknown = httpx.get(f"{mlflow_env.url}/api/2.0/mlflow/no-such-endpoint", headers=headers)
    assert (unknown.status_code, unknown.json()["error_code"]) == (404, "ENDPOINT_NOT_FOUND")
    missing = httpx.get(
        f"{mlflow_env.url}/api/2.0/mlflow-artifacts/artifacts/0/nope/x.txt", headers=headers
    )
    assert missing.status_code == 404
    no_token = httpx.post(f"{mlflow_env.url}/api/2.0/mlflow/runs/create", json={})
    assert no_token.status_code == 401
    with pytest.raises(RestException) as exc:
        MlflowClient().get_experiment("999999")
    assert exc.value.error_code == "RESOURCE_DOES_NOT_EXIST"


def test_search_max_results_zero_or_negative_is_400(mlflow_env: LiveServer) -> None:
    """As on a stock server: absent is the default (1000), 0 and negatives are refused."""
    client = MlflowClient()
    exp_id = client.create_experiment(_name("max-results"))
    client.create_run(exp_id)
    headers = {"Authorization": f"Bearer {mlflow_env.token}"}
    api = f"{mlflow_env.url}/api/2.0/mlflow"
    searches = [
        ("POST", "experiments/search", {}),
        ("GET", "experiments/search", {}),
        ("POST", "runs/search", {"experiment_ids": [exp_id]}),
    ]
    for method, path, body in searches:
        for value in (0, -1, "0", 50_001):
            if method == "GET":
                r = httpx.get(f"{api}/{path}", params={"max_results": value}, headers=headers)
            else:
                r = httpx.post(
                    f"{api}/{path}", json={**body, "max_results": value}, headers=headers
                )
            assert (r.status_code, r.json()["error_code"]) == (400, "INVALID_PARAMETER_VALUE"), (
                path,
                value,
            )
            assert "max_results" in r.json()["message"]
    assert len(client.search_runs([exp_id])) == 1  # absent: the default page
    with pytest.raises(MlflowException) as zero:
        client.search_runs([exp_id], max_results=0)
    assert zero.value.error_code == "INVALID_PARAMETER_VALUE"


def test_is_null_and_experiment_id_filters(mlflow_env: LiveServer) -> None:
    """What a stock server allows: IS [NOT] NULL on run tags and params and on experiment
    tags; experiment_id (quoted) with =, !=, IN and NOT IN in experiment searches."""
    client = MlflowClient()
    exp_id = client.create_experiment(_name("is-null"))
    runs = []
    for i in range(4):
        run = client.create_run(exp_id, tags={"x": str(i)} if i % 2 == 0 else {})
        if i < 2:
            client.log_param(run.info.run_id, "p", str(i))
        client.log_metric(run.info.run_id, "m", float(i))
        runs.append(run.info.run_id)

    def found(filter_string: str) -> list[int]:
        return sorted(
            runs.index(r.info.run_id) for r in client.search_runs([exp_id], filter_string)
        )

    assert found("tags.x IS NULL") == [1, 3]
    assert found("tags.x is not null") == [0, 2]
    assert found("params.p IS NULL") == [2, 3]
    assert found("params.p IS NOT NULL AND tags.x IS NULL") == [1]
    assert found("tags.`mlflow.user` IS NOT NULL AND tags.nokey IS NULL") == [0, 1, 2, 3]
    assert found("tags.x IS NULL AND tags.x IS NOT NULL") == []
    for refused in (
        "metrics.m IS NULL",
        "attributes.end_time IS NULL",
        "datasets.name IS NOT NULL",
        "tags.x IS 'a'",
        "tags.x = NULL",
        "tags.x IS NULL 1",
        "tags.x ISNULL",
    ):
        with pytest.raises(MlflowException) as bad:
            client.search_runs([exp_id], refused)
        assert bad.value.error_code == "INVALID_PARAMETER_VALUE", refused

    mark = uuid.uuid4().hex[:8]
    marked = client.create_experiment(_name("marked"), tags={mark: "1"})

    def experiments(filter_string: str) -> set[str]:
        ids = {e.experiment_id for e in client.search_experiments(filter_string=filter_string)}
        return ids & {exp_id, marked}

    assert experiments(f"tags.`{mark}` IS NOT NULL") == {marked}
    assert experiments(f"tags.`{mark}` IS NULL") == {exp_id}
    assert experiments(f"experiment_id = '{marked}'") == {marked}
    assert experiments(f"attribute.experiment_id = '{marked}'") == {marked}
    assert experiments(f"experiment_id != '{marked}'") == {exp_id}
    assert experiments(f"experiment_id IN ('{marked}', '{exp_id}')") == {marked, exp_id}
    assert experiments(f"experiment_id NOT IN ('{marked}')") == {exp_id}
    assert experiments(f"experiment_id = '{marked}' AND tags.`{mark}` = '1'") == {marked}
    for refused in (
        "experiment_id = 'abc'",
        f"experiment_id = {marked}",
        f"experiment_id > '{marked}'",
        f"experiment_id LIKE '{marked}'",
        f"experiment_id IN ({marked})",
        "name IS NULL",
    ):
        with pytest.raises(MlflowException) as bad:
            client.search_experiments(filter_string=refused)
        assert bad.value.error_code == "INVALID_PARAMETER_VALUE", refused


def test_missing_and_deleted_things_answer_as_on_a_stock_server(mlflow_env: LiveServer) -> None:
    client = MlflowClient()
    headers = {"Authorization": f"Bearer {mlflow_env.token}"}
    api = f"{mlflow_env.url}/api/2.0/mlflow"
    exp_id = client.create_experiment(_name("missing"), tags={"a": "1"})
    # A tag that is not there: 404, like the experiment that is not there.
    client.delete_experiment_tag(exp_id, "a")
    for experiment, key in ((exp_id, "a"), (exp_id, "never"), ("987654", "a")):
        gone = httpx.post(
            f"{api}/experiments/delete-experiment-tag",
            json={"experiment_id": experiment, "key": key},
            headers=headers,
        )
        assert (gone.status_code, gone.json()["error_code"]) == (404, "RESOURCE_DOES_NOT_EXIST")
    # Runs of unknown experiments: none, not an error; a malformed id is still a 400.
    run = client.create_run(exp_id)
    assert client.search_runs(["987654"]) == []
    assert [r.info.run_id for r in client.search_runs(["987654", exp_id])] == [run.info.run_id]
    assert client.search_logged_models(["987654"]) == []
    for malformed in (["abc"], ["987654", "1.5"]):
        with pytest.raises(MlflowException) as bad:
            client.search_runs(malformed)
        assert bad.value.error_code == "INVALID_PARAMETER_VALUE"
    # A deleted run cannot be updated; a deleted experiment's tags cannot change.
    client.delete_run(run.info.run_id)
    for change in (
        lambda: client.update_run(run.info.run_id, status="FINISHED"),
        lambda: client.update_run(run.info.run_id, name="renamed"),
        lambda: client.set_terminated(run.info.run_id),
    ):
        with pytest.raises(MlflowException) as refused:
            change()
        assert refused.value.error_code == "INVALID_PARAMETER_VALUE"
    empty = httpx.post(f"{api}/runs/update", json={"run_id": run.info.run_id}, headers=headers)
    assert (empty.status_code, empty.json()["error_code"]) == (400, "INVALID_PARAMETER_VALUE")
    still = client.get_run(run.info.run_id).info
    assert (still.status, still.lifecycle_stage) == ("RUNNING", "deleted")
    client.delete_experiment(exp_id)
    for change in (
        lambda: client.set_experiment_tag(exp_id, "b", "2"),
        lambda: client.delete_experiment_tag(exp_id, "b"),
    ):
        with pytest.raises(MlflowException) as refused:
            change()
        assert refused.value.error_code == "INVALID_PARAMETER_VALUE"


def test_long_run_tag_and_param_values_are_truncated_as_on_a_stock_server(
    mlflow_env: LiveServer,
) -> None:
    """A stock server keeps the first 8000 characters of a longer run tag value (notes
    included) and the first 6000 of a param value, and answers 200; the columns hold them on
    both databases."""
    client = MlflowClient()
    exp_id = client.create_experiment(_name("long-tags"))
    note = "".join(chr(0x41 + i % 26) for i in range(20_000)) + "é"
    run = client.create_run(exp_id, tags={"at-create": "c" * 9000})
    run_id = run.info.run_id
    client.set_tag(run_id, "mlflow.note.content", note)
    client.set_tag(run_id, "exact", "x" * 8000)
    client.set_tag(run_id, "huge", "h" * 200_000)
    client.log_batch(run_id, tags=[RunTag("in-batch", "b" * 9000), RunTag("one-more", "o" * 8001)])
    tags = client.get_run(run_id).data.tags
    assert tags["mlflow.note.content"] == note[:8000]
    assert tags["exact"] == "x" * 8000
    assert (tags["huge"], tags["at-create"]) == ("h" * 8000, "c" * 8000)
    assert (tags["in-batch"], tags["one-more"]) == ("b" * 8000, "o" * 8000)
    # Param values are cut at stock's 6000 characters; logging the same long value again is
    # logging the same param, not changing it.
    params = {"exact": "p" * 6000, "long": "".join(chr(0x61 + i % 26) for i in range(9000))}
    for key, value in params.items():
        client.log_param(run_id, key, value)
    client.log_param(run_id, "long", params["long"])
    client.log_batch(run_id, params=[Param("in-batch", "q" * 50_000)])
    stored = client.get_run(run_id).data.params
    assert stored == {
        "exact": params["exact"],
        "long": params["long"][:6000],
        "in-batch": "q" * 6000,
    }
    with pytest.raises(MlflowException) as changed:
        client.log_param(run_id, "long", "x" * 7000)
    assert changed.value.error_code == "INVALID_PARAMETER_VALUE"
    # Experiment tags keep stock's limit: 20,000 characters, more is refused.
    client.set_experiment_tag(exp_id, "long", "e" * 20_000)
    with pytest.raises(MlflowException) as refused:
        client.set_experiment_tag(exp_id, "longer", "e" * 20_001)
    assert refused.value.error_code == "INVALID_PARAMETER_VALUE"
