"""Trusted pickles are loaded only in the sandboxed child (hostile-inputs.md §4): never in
this process, with no inherited secrets, no network where the platform allows it, a working
directory of its own that is removed, and memory, CPU and wall-clock limits that end in a
clear InvalidParameter.

The payloads use only what any Python has (``builtins.exec``, ``operator.itemgetter``): the
child cannot import this test module. ``_Then`` unpickles to a real estimator after running its
code, so the conversion succeeds and the test can check what the code could and could not do.
"""

from __future__ import annotations

import copy
import json
import operator
import os
import pickle
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from shamal.errors import InvalidParameter
from shamal.optimize import (
    OptimizeRequest,
    SandboxLimits,
    convert_trusted_pickle,
    export_mlflow_sklearn,
    load_source,
    optimize_model,
    read_model_folder,
)
from shamal.optimize._sandbox import SANDBOX_USER_ENV
from tests import needs

PROJECT = Path(__file__).resolve().parents[2]
FAST = SandboxLimits(wall_seconds=60)


class _Code:
    """Unpickles to ``exec(code)`` (None)."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return exec, (self.code,)


class _Then:
    """Unpickles to ``model``, after running ``code``."""

    def __init__(self, code: str, model: object) -> None:
        self.code, self.model = code, model

    def __reduce__(self) -> tuple[object, tuple[tuple[object, object]]]:
        return operator.itemgetter(1), ((_Code(self.code), self.model),)


def _folder(tmp_path: Path, payload: object, name: str = "sk") -> Path:
    """An MLflow sklearn folder whose pickle is ``payload``."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "MLmodel").write_text(
        "flavors:\n  sklearn:\n    pickled_model: model.pkl\n"
        "    serialization_format: cloudpickle\n    sklearn_version: 1.5.0\n"
    )
    (folder / "model.pkl").write_bytes(pickle.dumps(payload, protocol=4))
    return folder


def _onnx_labels(folder: Path, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(["label"], {"input": x.astype(np.float32)})[0])


@pytest.fixture
def iris_tree() -> tuple[object, np.ndarray]:
    from sklearn.datasets import load_iris
    from sklearn.tree import DecisionTreeClassifier

    x, y = load_iris(return_X_y=True)
    return DecisionTreeClassifier(max_depth=3, random_state=0).fit(x, y), x.astype(np.float32)


@pytest.fixture(autouse=True)
def _no_sandbox_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SANDBOX_USER_ENV, raising=False)


@pytest.fixture
def parent_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This process's cwd for the test; SENTINEL must appear neither here nor in the project."""
    cwd = tmp_path / "parent-cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield cwd
    assert not (cwd / "SENTINEL").exists(), "the payload wrote into the parent's cwd"
    assert not (PROJECT / "SENTINEL").exists(), "the payload wrote into the project"


# ---------------------------------------------------------------------- honest models
@pytest.mark.filterwarnings("ignore::UserWarning")  # mlflow warns that pickle is unsafe
def test_trusted_pickle_converts_outside_this_process(
    tmp_path: Path, wine_mlp: object, wine: tuple[np.ndarray, ...]
) -> None:
    import mlflow.sklearn

    folder = tmp_path / "mlflow"
    mlflow.sklearn.save_model(
        wine_mlp, str(folder), serialization_format="pickle", pip_requirements=[]
    )
    record = tmp_path / "pid"
    code = f"open({str(record)!r}, 'w').write(str(__import__('os').getpid()))"
    (folder / "model.pkl").write_bytes(pickle.dumps(_Then(code, wine_mlp), protocol=4))
    x_test = wine[1]
    dest = export_mlflow_sklearn(folder, tmp_path / "out", trust_pickle=True, limits=FAST)
    np.testing.assert_array_equal(_onnx_labels(dest, x_test), wine_mlp.predict(x_test))  # type: ignore[attr-defined]
    assert int(record.read_text()) != os.getpid()
    classes = [str(c) for c in wine_mlp.classes_]  # type: ignore[attr-defined]
    assert read_model_folder(dest).labels == {"probabilities": classes}


def test_class_names_from_the_sandbox_are_checked(
    tmp_path: Path, iris_tree: tuple[object, np.ndarray]
) -> None:
    estimator = copy.deepcopy(iris_tree[0])
    estimator.classes_ = np.array(["x" * 5000, "b", "c"])  # type: ignore[attr-defined]
    with pytest.raises(InvalidParameter, match="labels"):
        convert_trusted_pickle(_folder(tmp_path, estimator), trust_pickle=True, limits=FAST)


def test_served_predictions_match_the_estimator(
    tmp_path: Path, iris_tree: tuple[object, np.ndarray]
) -> None:
    from shamal.serving._backends import BackendOptions
    from shamal.serving._repository import ModelSource, load_repository

    estimator, x = iris_tree
    record = tmp_path / "pid"
    code = f"open({str(record)!r}, 'w').write(str(__import__('os').getpid()))"
    folder = _folder(tmp_path, _Then(code, estimator))
    repository = load_repository(
        [ModelSource("m", None, str(folder))],
        BackendOptions(threads=1),
        trusted=["m"],
        work_dir=tmp_path / "work",
    )
    out = repository.get("m", "1").backend.run({"input": x[:20]})
    np.testing.assert_array_equal(out["label"], estimator.predict(x[:20]))  # type: ignore[attr-defined]
    assert int(record.read_text()) != os.getpid()


def test_optimizer_reference_comes_from_the_sandbox(
    tmp_path: Path, wine_mlp: object, wine: tuple[np.ndarray, ...]
) -> None:
    folder = _folder(tmp_path, wine_mlp)
    _, x_test, _, y_test = wine
    data = tmp_path / "eval.npz"
    np.savez(data, input=x_test.astype(np.float32), y=y_test)
    source = load_source(folder, eval_data=data, trust_pickle=True, sandbox=FAST)
    reference = source.reference(source.eval_set.feeds)
    np.testing.assert_array_equal(reference["label"], wine_mlp.predict(x_test))  # type: ignore[attr-defined]
    np.testing.assert_allclose(
        reference["probabilities"],
        wine_mlp.predict_proba(x_test.astype(np.float32)),  # type: ignore[attr-defined]
        rtol=1e-5,
    )
    with pytest.raises(InvalidParameter, match="held-out rows"):
        source.reference({"input": x_test[:3].astype(np.float32)})
    report = optimize_model(
        folder,
        tmp_path / "variants",
        OptimizeRequest(trust_pickle=True, timed=False, sandbox=FAST),
    )
    assert report.kind == "sklearn"
    assert report.task == "classification"
    fp32 = report.variants[0].fidelity
    assert fp32.origin == "synthetic N(0,1)"
    assert fp32.rows == 256
    assert fp32.max_abs_diff < 1e-4
    assert not fp32.blocked


def test_untrusted_pickle_never_reaches_the_sandbox(tmp_path: Path, parent_cwd: Path) -> None:
    folder = _folder(tmp_path, _Code("open('SENTINEL', 'w')"))
    with pytest.raises(InvalidParameter, match="trust-pickle"):
        convert_trusted_pickle(folder, trust_pickle=False)


# ---------------------------------------------------------------------- hostile payloads
def test_payload_cannot_write_into_the_parents_cwd(
    tmp_path: Path, parent_cwd: Path, iris_tree: tuple[object, np.ndarray]
) -> None:
    record = tmp_path / "child-cwd"
    code = f"open('SENTINEL', 'w').write('x'); open({str(record)!r}, 'w').write(os.getcwd())"
    made = convert_trusted_pickle(
        _folder(tmp_path, _Then("import os; " + code, iris_tree[0])),
        trust_pickle=True,
        limits=FAST,
    )
    assert made.task == "classification"
    child_cwd = Path(record.read_text())
    assert child_cwd != parent_cwd
    assert not child_cwd.exists()
    assert not child_cwd.parent.exists()


def test_payload_sees_no_secret_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, iris_tree: tuple[object, np.ndarray]
) -> None:
    secret = "fake-secret-7d1f0c"
    for name in ("SHAMAL_FAKE_SECRET", "SHAMAL_TOKEN", "MLFLOW_TRACKING_TOKEN", "AWS_SECRET_KEY"):
        monkeypatch.setenv(name, secret)
    leak = tmp_path / "leak.json"
    code = (
        "import json, os; "
        f"open({str(leak)!r}, 'w').write(json.dumps("
        "{'secret': os.environ.get('SHAMAL_FAKE_SECRET'), 'env': dict(os.environ)}))"
    )
    convert_trusted_pickle(
        _folder(tmp_path, _Then(code, iris_tree[0])), trust_pickle=True, limits=FAST
    )
    seen = json.loads(leak.read_text())
    assert seen["secret"] is None
    assert secret not in leak.read_text()
    allowed = {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "LC_CTYPE"}
    allowed |= {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}
    allowed |= {"KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"}  # set by sklearn's own import
    assert set(seen["env"]) <= allowed


def test_payload_cannot_reach_a_loopback_listener(
    tmp_path: Path, iris_tree: tuple[object, np.ndarray]
) -> None:
    record = tmp_path / "connect"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        code = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=5).close()\n"
            "    outcome = 'connected'\n"
            "except OSError as exc:\n"
            "    outcome = type(exc).__name__\n"
            f"open({str(record)!r}, 'w').write(outcome)\n"
        )
        made = convert_trusted_pickle(
            _folder(tmp_path, _Then(code, iris_tree[0])), trust_pickle=True, limits=FAST
        )
        listener.setblocking(False)
        try:
            listener.accept()[0].close()
            arrived = True
        except BlockingIOError:
            arrived = False
    outcome = record.read_text()
    if made.network_isolated:
        assert not arrived
        assert outcome != "connected"
    else:  # no namespaces here: the sandbox said so, and the connection went through
        assert arrived
        assert outcome == "connected"


def test_payload_allocating_20_gib_fails_cleanly(tmp_path: Path) -> None:
    folder = _folder(tmp_path, _Code("bytearray(20 * 2**30)"))
    started = time.monotonic()
    with pytest.raises(InvalidParameter, match="more memory than the sandbox allows") as caught:
        convert_trusted_pickle(folder, trust_pickle=True, limits=FAST)
    assert time.monotonic() - started < 30
    assert "Traceback" not in caught.value.message
    assert str(tmp_path) not in caught.value.message


def test_payload_spinning_forever_is_killed_at_the_timeout(tmp_path: Path) -> None:
    folder = _folder(tmp_path, _Code("while True: pass"))
    limits = SandboxLimits(wall_seconds=6, cpu_seconds=120)
    started = time.monotonic()
    with pytest.raises(InvalidParameter, match="6 s time limit"):
        convert_trusted_pickle(folder, trust_pickle=True, limits=limits)
    assert 6 <= time.monotonic() - started < 20


def test_payload_spinning_is_stopped_by_the_cpu_limit(tmp_path: Path) -> None:
    folder = _folder(tmp_path, _Code("while True: pass"))
    limits = SandboxLimits(wall_seconds=60, cpu_seconds=4)
    started = time.monotonic()
    with pytest.raises(InvalidParameter, match="4 CPU seconds"):
        convert_trusted_pickle(folder, trust_pickle=True, limits=limits)
    assert time.monotonic() - started < 40


def test_payload_that_raises_gets_a_fixed_message(tmp_path: Path) -> None:
    folder = _folder(tmp_path, _Code(f"raise RuntimeError('boom at {tmp_path}')"))
    with pytest.raises(InvalidParameter, match="could not be loaded in the sandbox") as caught:
        convert_trusted_pickle(folder, trust_pickle=True, limits=FAST)
    assert "boom" not in caught.value.message


def test_loader_refusals_pass_through_but_forged_ones_do_not(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameter, match="does not say how many features"):
        convert_trusted_pickle(_folder(tmp_path, {"not": "a model"}), trust_pickle=True)
    forged = _Code(
        "from shamal.errors import InvalidParameter\n"
        "raise InvalidParameter('leaked ' + open('/etc/hostname').read().strip())\n"
    )
    with pytest.raises(InvalidParameter) as caught:
        convert_trusted_pickle(_folder(tmp_path, forged, "forged"), trust_pickle=True)
    assert "leaked" not in caught.value.message
    assert "could not be loaded in the sandbox" in caught.value.message


def test_eval_data_of_the_wrong_width_is_refused(
    tmp_path: Path, iris_tree: tuple[object, np.ndarray]
) -> None:
    data = tmp_path / "eval.npy"
    np.save(data, np.zeros((5, 3), dtype=np.float32))
    with pytest.raises(InvalidParameter, match="eval data has 3 columns; the model takes 4"):
        load_source(_folder(tmp_path, iris_tree[0]), eval_data=data, trust_pickle=True)


@pytest.mark.parametrize("swap", ["os.mkfifo(p)", "os.symlink('/etc/passwd', p)"])
def test_outputs_swapped_at_exit_are_refused_without_hanging(
    tmp_path: Path, iris_tree: tuple[object, np.ndarray], swap: str
) -> None:
    # Runs after the child wrote its outputs: a FIFO would block a plain open() forever.
    code = (
        "import atexit, sys\n"
        "def swap(out=sys.argv[sys.argv.index('--out') + 1]):\n"
        "    import os\n"
        "    p = os.path.join(out, 'model.onnx')\n"
        "    os.unlink(p)\n"
        f"    {swap}\n"
        "atexit.register(swap)\n"
    )
    started = time.monotonic()
    with pytest.raises(InvalidParameter, match="no usable output"):
        convert_trusted_pickle(
            _folder(tmp_path, _Then(code, iris_tree[0])), trust_pickle=True, limits=FAST
        )
    assert time.monotonic() - started < 30


def _readable_by_others(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o005 == 0o005 for p in [path, *path.parents])


def test_as_root_the_payload_runs_as_the_sandbox_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, iris_tree: tuple[object, np.ndarray]
) -> None:
    needs.root("dropping privileges needs root")
    if not _readable_by_others(Path(sys.prefix)):
        why = f"the sandbox user must read the Python tree at {sys.prefix}"
        if needs.IN_CI:
            pytest.fail(f"{why}; CI's is readable, and this test must run there")
        pytest.skip(why)
    import tempfile

    monkeypatch.setenv(SANDBOX_USER_ENV, "nobody")
    shared = Path(tempfile.mkdtemp(prefix="shamal-sandbox-test-"))
    shared.chmod(0o777)
    try:
        target = tmp_path / "SENTINEL"
        code = (
            "import os\n"
            f"open({str(shared / 'uid')!r}, 'w').write(str(os.getuid()))\n"
            "try:\n"
            f"    open({str(target)!r}, 'w')\n"
            "except OSError:\n"
            "    pass\n"
        )
        made = convert_trusted_pickle(
            _folder(tmp_path, _Then(code, iris_tree[0])), trust_pickle=True, limits=FAST
        )
        uid = int((shared / "uid").read_text())
    finally:
        for child in shared.iterdir():
            child.unlink()
        shared.rmdir()
    assert uid == made.uid != 0
    assert not target.exists()
