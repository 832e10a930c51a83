"""The server starts on an install without the optional extras: each optional dependency
is blocked in turn (a meta-path finder in a fresh interpreter, as if it were not installed),
the app is built and started, and the features that need the missing extra answer with an
error that names what to install."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts servers (or fuzzes every route) for minutes

OPTIONAL = [
    "optuna",
    "cmaes",
    "ray",
    "torch",
    "safetensors",
    "skl2onnx",
    "onnxscript",
    "sklearn",
    "tritonclient",
    "mlflow",
]

_PROBE = textwrap.dedent(
    """
    import importlib.abc, json, sys
    from pathlib import Path

    BLOCKED = set(sys.argv[1].split(","))

    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    from fastapi.testclient import TestClient
    from shamal.config import Settings
    from shamal.server import create_app, start_platform

    platform = start_platform(Settings(home=Path(sys.argv[2]), allowed_hosts=("*",)))
    out = {}
    try:
        with TestClient(create_app(platform.settings, platform)) as client:
            client.headers["Authorization"] = f"Bearer {platform.admin_secret}"
            out["ready"] = client.get("/ready").status_code
            out["experiments"] = client.get(
                "/api/2.0/mlflow/experiments/search", params={"max_results": 10}
            ).status_code
            out["jobs"] = client.get("/api/v1/jobs").status_code
            for sampler in ("tpe", "cmaes", "gp"):
                study = client.post(
                    "/api/v1/tune/studies", json={"name": f"s-{sampler}", "sampler": sampler}
                )
                out[sampler] = [study.status_code, study.json().get("message", "")]
    finally:
        platform.close()
    out["leaked"] = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    print(json.dumps(out))
    """
)


def _start_without(modules: list[str], home: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, ",".join(modules), str(home)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("missing", OPTIONAL)
def test_the_server_starts_without_each_optional_dependency(missing: str, tmp_path: Path) -> None:
    out = _start_without([missing], tmp_path)
    assert (out["ready"], out["experiments"], out["jobs"]) == (200, 200, 200)
    assert out["leaked"] == []
    if missing == "optuna":
        for sampler in ("tpe", "cmaes", "gp"):
            status, message = out[sampler]  # type: ignore[misc]
            assert status == 501
            assert "pip install 'shamal[tune]'" in message
        return
    assert out["tpe"] == [200, ""]
    if missing == "cmaes":
        assert out["cmaes"] == [501, _needs("cmaes", "cmaes", "'shamal[tune]'")]
    if missing == "torch":
        assert out["gp"] == [501, _needs("gp", "torch", "'shamal[train]'")]


def _needs(sampler: str, module: str, extra: str) -> str:
    return (
        f"the {sampler} sampler needs {module}, which this server lacks: "
        f"pip install {extra} on the server (or choose another sampler)"
    )


def test_the_server_starts_without_any_optional_dependency(tmp_path: Path) -> None:
    out = _start_without(OPTIONAL, tmp_path)
    assert (out["ready"], out["experiments"], out["jobs"]) == (200, 200, 200)
    assert out["tpe"][0] == 501  # type: ignore[index]
    assert out["leaked"] == []
