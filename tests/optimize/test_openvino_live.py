"""`shamal optimize --choose` registers the variant set it chose, with the CPU it was measured
on, and `shamal serve` loads the build for its CPU from the registry: the stock tritonclient
reads the answers, the stock mlflow client reads the tags."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest
import typer
from mlflow import MlflowClient
from typer.testing import CliRunner

from shamal.cli.optimize import optimize
from shamal.modelformat import host_cpu
from tests.live import LiveServer
from tests.needs import module
from tests.optimize.test_openvino import _inputs, _mlp_onnx, _ort
from tests.serving.conftest import ServerProcess

module("openvino")
triton = module("tritonclient.http")

pytestmark = [pytest.mark.slow]


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("optimize")(optimize)
    app.command("noop")(lambda: None)  # two commands: the first is called by name
    return app


@pytest.mark.timeout(240)
def test_the_chosen_set_is_registered_and_served_for_this_cpu(
    mlflow_live: LiveServer, tmp_path: Path
) -> None:
    source = _mlp_onnx(tmp_path / "src" / "model.onnx")
    name = f"mlp-{uuid.uuid4().hex[:8]}"
    args = ["optimize", str(source.parent), "--choose", "--batch-sizes", "1,8",
            "--threads", "1", "-o", str(tmp_path / "out"), "--register-as", name,
            "--json"]  # fmt: skip
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    chosen = report["chosen"]
    here = host_cpu()
    assert chosen["cpu"]["kind"] == here.kind
    assert report["registered"] == {"name": name, "version": 1}
    tags = MlflowClient().get_model_version(name, "1").tags
    assert tags["shamal.variant"] == chosen["variant"]
    assert tags["shamal.cpu.kind"] == here.kind
    assert tags["shamal.cpu.model"] == here.model
    assert set(tags["shamal.cpu.isa"].split(",")) == set(here.isa)
    assert tags["shamal.variant_set.portable"] == chosen["portable"]

    env = {"SHAMAL_URL": mlflow_live.url, "SHAMAL_TOKEN": mlflow_live.token}
    server = ServerProcess(["--model", f"mlp=models:/{name}/1", "--threads", "1"], env=env)
    client = triton.InferenceServerClient(server.host_port)
    try:
        headers = {"Authorization": f"Bearer {mlflow_live.token}"}
        x = _inputs(4)
        given = triton.InferInput("x", list(x.shape), "FP32")
        given.set_data_from_numpy(x)
        answer = client.infer("mlp", [given], headers=headers).as_numpy("y")
        assert answer is not None
        expected = _ort(source, x)
        cosines = (answer * expected).sum(1)
        cosines /= np.linalg.norm(answer, axis=1) * np.linalg.norm(expected, axis=1)
        assert cosines.min() > 0.97
    finally:
        client.close()
        assert server.stop() == 0
    said = "".join(server.stderr_lines)
    assert f"serving variant {chosen['variant']}" in said
    assert here.kind in said
