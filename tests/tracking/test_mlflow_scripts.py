"""What users' existing scripts do with the stock mlflow client, each checked against what a
stock ``mlflow server`` answers to the same calls (fluent API, run names, logged values)."""

from __future__ import annotations

import math
import uuid
from functools import partial
from pathlib import Path

import httpx
import mlflow
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, RunTag
from mlflow.exceptions import MlflowException
from sqlalchemy import insert, select

from shamal.db import open_database
from shamal.db.models import ArtifactFileRow
from tests.live import LiveServer

pytestmark = pytest.mark.slow


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _error_code(call: object) -> str:
    assert callable(call)
    with pytest.raises(MlflowException) as raised:
        call()
    return raised.value.error_code


def test_setting_the_run_name_tag_renames_the_run(mlflow_env: LiveServer) -> None:
    client = MlflowClient()
    exp_id = mlflow.set_experiment(_name("rename")).experiment_id
    with mlflow.start_run(run_name="first") as run:
        mlflow.set_tag("mlflow.runName", "by-fluent-tag")
    run_id = run.info.run_id
    got = client.get_run(run_id)
    assert (got.info.run_name, got.data.tags["mlflow.runName"]) == (
        "by-fluent-tag",
        "by-fluent-tag",
    )
    found = client.search_runs([exp_id], "attributes.run_name = 'by-fluent-tag'")
    assert [r.info.run_id for r in found] == [run_id]

    client.set_tag(run_id, "mlflow.runName", "by-client-tag")
    assert client.get_run(run_id).info.run_name == "by-client-tag"
    # In a batch the last value wins, for the tag and for the name.
    client.log_batch(run_id, tags=[RunTag("mlflow.runName", "b1"), RunTag("mlflow.runName", "b2")])
    got = client.get_run(run_id)
    assert (got.info.run_name, got.data.tags["mlflow.runName"]) == ("b2", "b2")
    # An empty value leaves the name, and its tag, as they were (a stock server's answer).
    client.set_tag(run_id, "mlflow.runName", "")
    got = client.get_run(run_id)
    assert (got.info.run_name, got.data.tags["mlflow.runName"]) == ("b2", "b2")
    # A name longer than a run name may be is refused, and nothing changes.
    code = _error_code(lambda: client.set_tag(run_id, "mlflow.runName", "x" * 251))
    assert code == "INVALID_PARAMETER_VALUE"
    got = client.get_run(run_id)
    assert (got.info.run_name, got.data.tags["mlflow.runName"]) == ("b2", "b2")


def test_a_new_run_has_one_name(mlflow_env: LiveServer) -> None:
    client = MlflowClient()
    exp_id = client.create_experiment(_name("names"))
    # The name and the tag may both be given when they agree; otherwise the request is
    # refused (a stock server's 400), and no run is created.
    same = client.create_run(exp_id, run_name="same", tags={"mlflow.runName": "same"})
    assert same.info.run_name == "same"
    code = _error_code(
        lambda: client.create_run(exp_id, run_name="name", tags={"mlflow.runName": "tag"})
    )
    assert code == "INVALID_PARAMETER_VALUE"
    code = _error_code(lambda: client.create_run(exp_id, run_name="x" * 251))
    assert code == "INVALID_PARAMETER_VALUE"
    assert [r.info.run_name for r in client.search_runs([exp_id])] == ["same"]
    # The tag alone names the run; an empty tag is no name, so the server picks one and
    # the tag says it too.
    by_tag = client.create_run(exp_id, tags={"mlflow.runName": "from-tag"})
    assert by_tag.info.run_name == "from-tag"
    unnamed = client.get_run(client.create_run(exp_id, tags={"mlflow.runName": ""}).info.run_id)
    assert unnamed.info.run_name
    assert unnamed.data.tags["mlflow.runName"] == unnamed.info.run_name


def test_metric_timestamps_are_kept_as_given(mlflow_env: LiveServer) -> None:
    client = MlflowClient()
    run_id = client.create_run(client.create_experiment(_name("ts"))).info.run_id
    # 0 is the epoch, not "now": a replayed history keeps its times.
    client.log_metric(run_id, "epoch", 1.0, timestamp=0, step=1)
    client.log_batch(run_id, metrics=[Metric("epoch", 2.0, 0, 2)])
    history = client.get_metric_history(run_id, "epoch")
    assert [(m.step, m.timestamp) for m in history] == [(1, 0), (2, 0)]
    assert client.get_run(run_id).data.metrics["epoch"] == 2.0
    # A negative time is refused, alone or in a batch, and nothing of the batch is kept.
    code = _error_code(lambda: client.log_metric(run_id, "neg", 1.0, timestamp=-1))
    assert code == "INVALID_PARAMETER_VALUE"
    batch = [Metric("neg", 1.0, 5, 0), Metric("neg", 2.0, -5, 1)]
    assert _error_code(lambda: client.log_batch(run_id, metrics=batch)) == "INVALID_PARAMETER_VALUE"
    assert client.get_metric_history(run_id, "neg") == []
    assert "neg" not in client.get_run(run_id).data.metrics


def test_run_and_model_listings_of_a_file_path_are_empty(
    mlflow_env: LiveServer, tmp_path: Path
) -> None:
    """The UI's listings (``artifacts/list``, ``logged-models/<id>/artifacts/directories``)
    answer a file's path with no files, as a stock server does; they named the file
    ``<path>/<name>``, a file that does not exist."""
    client = MlflowClient()
    exp_id = client.create_experiment(_name("listing"))
    run_id = client.create_run(exp_id).info.run_id
    client.log_text(run_id, "x", "d/a.txt")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "w.bin").write_bytes(b"123")
    model_id = client.create_logged_model(exp_id).model_id
    client.log_model_artifacts(model_id, str(tmp_path))
    headers = {"Authorization": f"Bearer {mlflow_env.token}"}

    def run_listing(path: str) -> list[tuple[str, bool]]:
        answer = httpx.get(
            f"{mlflow_env.url}/api/2.0/mlflow/artifacts/list",
            params={"run_id": run_id, "path": path},
            headers=headers,
        )
        assert answer.status_code == 200, answer.text
        return [(f["path"], f["is_dir"]) for f in answer.json().get("files", [])]

    def model_listing(path: str) -> list[tuple[str, bool]]:
        answer = httpx.get(
            f"{mlflow_env.url}/api/2.0/mlflow/logged-models/{model_id}/artifacts/directories",
            params={"artifact_directory_path": path},
            headers=headers,
        )
        assert answer.status_code == 200, answer.text
        return [(f["path"], f["is_dir"]) for f in answer.json().get("files", [])]

    assert run_listing("d") == [("d/a.txt", False)]
    assert run_listing("d/a.txt") == []
    assert model_listing("sub") == [("sub/w.bin", False)]
    assert model_listing("sub/w.bin") == []
    # The client's own listing (mlflow-artifacts) is unchanged: a file's path lists nothing.
    assert client.list_artifacts(run_id, "d/a.txt") == []
    assert [f.path for f in client.list_artifacts(run_id, "d")] == ["d/a.txt"]


def test_artifact_names_with_a_colon_are_kept(mlflow_env: LiveServer) -> None:
    """Time stamps in file names ("2024-01-01T12:00:00") are common; a stock server keeps
    them."""
    client = MlflowClient()
    run_id = client.create_run(client.create_experiment(_name("colon"))).info.run_id
    stamped = "reports/2026-11-22T05:20:00.json"
    mlflow.log_dict({"ok": True}, stamped, run_id=run_id)
    assert mlflow.artifacts.load_dict(f"runs:/{run_id}/{stamped}") == {"ok": True}
    listed = client.list_artifacts(run_id, "reports")
    assert [(f.path, f.is_dir) for f in listed] == [(stamped, False)]
    # The drive/scheme refusal of a path's first segment is the path rule's, tested in
    # tests/artifacts/test_paths.py: through mlflow-artifacts the first segment is always
    # the experiment id.
    assert [f.path for f in client.list_artifacts(run_id)] == ["reports"]


def test_a_malformed_experiment_id_is_a_400_and_an_unknown_one_a_404(
    mlflow_env: LiveServer,
) -> None:
    """A stock server tells "not an id" (400) from "no such experiment" (404); scripts
    that catch RESOURCE_DOES_NOT_EXIST to create the experiment rely on the difference."""
    client = MlflowClient()
    for malformed in ("abc", "1.5", "１"):
        for call in (
            partial(client.get_experiment, malformed),
            partial(client.delete_experiment, malformed),
            partial(client.set_experiment_tag, malformed, "k", "v"),
            partial(client.create_run, malformed),
        ):
            assert _error_code(call) == "INVALID_PARAMETER_VALUE", (malformed, call)
    for unknown in ("987654321", "-1", "9" * 30):
        code = _error_code(partial(client.get_experiment, unknown))
        assert code == "RESOURCE_DOES_NOT_EXIST", unknown
    assert client.get_experiment("0").name == "Default"


def test_a_folder_lists_whole_however_many_files_lie_below_it(mlflow_env: LiveServer) -> None:
    """Listings read at most 10,000 files below the folder, so 10,001 files in a
    subfolder hid the files after it (and the last file of the subfolder itself):
    download_artifacts silently left them out. A stock server lists them all."""
    client = MlflowClient()
    run_id = client.create_run(client.create_experiment(_name("wide"))).info.run_id
    client.log_text(run_id, "x", "frames/f00000.txt")
    count = 10_001
    # Set-up in the server's own database: the index rows of 10,000 more files with the
    # same content (10,000 uploads would take minutes; what is read back is the same).
    url = mlflow_env.env.get("SHAMAL_DATABASE_URL") or f"sqlite:///{mlflow_env.home / 'shamal.db'}"
    database = open_database(url)
    try:
        with database.unit_of_work() as s:
            first = s.scalars(
                select(ArtifactFileRow).where(ArtifactFileRow.path.endswith("/frames/f00000.txt"))
            ).one()
            folder = first.path.removesuffix("f00000.txt")
            s.execute(
                insert(ArtifactFileRow),
                [
                    {
                        "namespace": first.namespace,
                        "path": f"{folder}f{i:05d}.txt",
                        "digest": first.digest,
                        "size": first.size,
                        "created_at": first.created_at,
                        "created_by": first.created_by,
                    }
                    for i in range(1, count)
                ],
            )
    finally:
        database.dispose()
    client.log_text(run_id, "done", "summary.txt")
    top = client.list_artifacts(run_id)
    assert [(f.path, f.is_dir) for f in top] == [("frames", True), ("summary.txt", False)]
    frames = client.list_artifacts(run_id, "frames")
    assert len(frames) == count
    assert frames[-1].path == f"frames/f{count - 1:05d}.txt"


def test_ordering_on_a_metric_puts_nan_before_runs_without_it(mlflow_env: LiveServer) -> None:
    """A stock server orders by a metric: its numbers in the asked direction, then the runs
    whose value is NaN, then the runs that never logged it (in both directions)."""
    client = MlflowClient()
    exp_id = client.create_experiment(_name("nan-order"))
    for name, value in (("one", 1.0), ("nan", math.nan), ("none", None), ("two", 2.0)):
        run_id = client.create_run(exp_id, run_name=name).info.run_id
        if value is not None:
            client.log_metric(run_id, "m", value)
    client.log_metric(client.create_run(exp_id, run_name="ninf").info.run_id, "m", -math.inf)
    names = {r.info.run_id: r.info.run_name for r in client.search_runs([exp_id])}

    def order(by: str) -> list[str]:
        return [names[r.info.run_id] for r in client.search_runs([exp_id], order_by=[by])]

    assert order("metrics.m ASC") == ["ninf", "one", "two", "nan", "none"]
    assert order("metrics.m DESC") == ["two", "one", "ninf", "nan", "none"]


def test_an_artifact_download_is_an_attachment_and_never_sniffed(mlflow_env: LiveServer) -> None:
    """A logged HTML file, fetched through the mlflow-artifacts proxy by a browser (the
    client prints links to this server), is saved under its name, never rendered."""
    client = MlflowClient()
    run = client.create_run(client.create_experiment(_name("download")))
    page = "<html><script>alert(document.cookie)</script></html>"
    client.log_text(run.info.run_id, page, "report/index.html")
    prefix = run.info.artifact_uri.removeprefix("mlflow-artifacts:/")
    got = httpx.get(
        f"{mlflow_env.url}/api/2.0/mlflow-artifacts/artifacts/{prefix}/report/index.html",
        headers={"Authorization": f"Bearer {mlflow_env.token}"},
    )
    assert (got.status_code, got.text) == (200, page)
    assert got.headers["content-type"] == "application/octet-stream"
    assert got.headers["content-disposition"].startswith('attachment; filename="index.html"')
    assert got.headers["x-content-type-options"] == "nosniff"
    # The client still downloads it as it was.
    assert mlflow.artifacts.load_text(f"{run.info.artifact_uri}/report/index.html") == page
