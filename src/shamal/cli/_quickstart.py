"""The quickstart `make run` shows: each capability adds its step here."""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.panel import Panel

from shamal.cli._quickstart_wine import (
    MODEL,
    QUICKSTART_TEAM,
    SERVED_AS,
    TRAINING_DATA,
    Served,
    wine_csv,
    wine_measurements,
)
from shamal.client import ShamalClient
from shamal.errors import AlreadyExists, ServiceUnavailable


def wait_until_up(client: ShamalClient, deadline_s: float = 60.0) -> None:
    """Poll /health until the server answers or the deadline passes."""
    end = time.monotonic() + deadline_s
    while not client.health():
        if time.monotonic() > end:
            raise ServiceUnavailable(f"the server at {client.url} did not come up")
        time.sleep(0.1)


#: The expectations every version of the quickstart's training data must meet.
WINE_SUITE = """
version: 1
expectations:
  - kind: row_count
    min: 150
    max: 10000
  - kind: not_null
    column: alcohol
  - kind: range
    column: alcohol
    min: 5
    max: 20
  - kind: range
    column: color_intensity
    min: 0
  - kind: in_set
    column: target
    values: [0, 1, 2]
  - kind: column_type
    column: target
    arrow_type: int64
"""


#: Who tasted a sample is personal: stored only as a keyed token (the same taster, the same
#: token, so rows still group by taster), never in clear.
WINE_PRIVACY = """
version: 1
columns:
  taster: {action: hmac, purpose: quickstart}
"""


def ingest_training_data(client: ShamalClient, folder: Path) -> list[str]:
    """The training data as a validated, pseudonymized dataset version: created once, then a
    new version (overwrite) each run, its ``taster`` column turned into keyed tokens before
    any byte is stored (:data:`WINE_PRIVACY`), checked against :data:`WINE_SUITE`."""
    with contextlib.suppress(AlreadyExists):
        client.create_dataset(
            TRAINING_DATA, team=QUICKSTART_TEAM, description="scikit-learn's wine data"
        )
    client.set_dataset_privacy(TRAINING_DATA, WINE_PRIVACY)
    client.set_dataset_suite(TRAINING_DATA, WINE_SUITE)
    found = client.ingest_file(TRAINING_DATA, wine_csv(folder), mode="overwrite")
    checks = (found.get("validation") or {}).get("results", [])
    masked = ", ".join(f"{t['column']} ({t['action']})" for t in found["transformations"])
    return [
        f"ingested the training data as [bold]{found['uri']}[/] ({found['row_count']} rows, "
        f"{len(checks)} expectations met, status {found['status']}; pseudonymized: {masked})"
    ]


#: The feature store's view of the wine samples, the service a model reads, and the training
#: set a point-in-time join builds from them.
FEATURE_VIEW = "wine_measurements"
FEATURE_SERVICE = "wine_classifier"
TRAINING_SET = "wine-training"


def define_features(client: ShamalClient) -> list[str]:
    """Feature definitions as code: the wine samples as entities, their measurements as an
    online feature view over the wine dataset, and the service the classifier reads; applied
    (a second run finds nothing to change)."""
    definitions = {
        "entities": [{"name": "wine_sample", "join_keys": ["sample_id"]}],
        "feature_views": [
            {
                "name": FEATURE_VIEW,
                "entities": ["wine_sample"],
                "source": f"data:{TRAINING_DATA}",
                "timestamp_field": "measured_at",
                "owner": QUICKSTART_TEAM,
                "features": [{"name": n, "dtype": "float64"} for n in wine_measurements()],
            }
        ],
        "feature_services": [
            {"name": FEATURE_SERVICE, "owner": QUICKSTART_TEAM, "features": [f"{FEATURE_VIEW}:*"]}
        ],
    }
    done = client.apply_features(definitions)
    changed = f"registry number {done['number']}" if done["number"] else "no change"
    return [
        f"defined feature view [bold]{FEATURE_VIEW}[/] (13 measurements of each wine sample, "
        f"over {TRAINING_DATA}) and service [bold]{FEATURE_SERVICE}[/] ({changed})"
    ]


def build_training_set(client: ShamalClient) -> tuple[Any, list[str]]:
    """The training set by a point-in-time join: each sample's label at this instant, joined
    with its measurements as of then, saved as a dataset version whose source names the
    feature view version and the dataset version it read."""
    from datetime import UTC, datetime

    import pyarrow as pa

    from shamal import data as shamal_data  # pyarrow: loaded for the quickstart only

    with contextlib.suppress(AlreadyExists):
        client.create_dataset(
            TRAINING_SET, team=QUICKSTART_TEAM, description="the classifier's training set"
        )
    labels = shamal_data.load(TRAINING_DATA, client=client).select(["sample_id", "target"])
    now = datetime.now(UTC)
    entities = labels.append_column(
        "event_timestamp", pa.array([now] * labels.num_rows, pa.timestamp("us", tz="UTC"))
    )
    table, headers = client.historical_features(
        entities, feature_service=FEATURE_SERVICE, save_as=TRAINING_SET
    )
    saved = headers.get("x-shamal-saved-as", "")
    return table, [
        f"built the training set by a point-in-time join ({table.num_rows} rows x "
        f"{table.num_columns - 3} features from {headers.get('x-shamal-views', '')}), "
        f"saved as [bold]{saved}[/]"
    ]


def track_a_model(url: str, token: str) -> list[str]:
    """Train a classifier on the quickstart's training set (the point-in-time join of the wine
    samples' labels with their measurements) with the stock mlflow client: the training set's
    dataset version read as the run's input, params, per-epoch metric curves, the model as an
    artifact, registered as `champion`."""
    os.environ["MLFLOW_TRACKING_TOKEN"] = token
    # Imported here: the server process loads mlflow and scikit-learn only for the quickstart.
    import mlflow
    import numpy as np
    from mlflow.models import infer_signature
    from sklearn.linear_model import SGDClassifier
    from sklearn.metrics import accuracy_score, log_loss
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from shamal import data as shamal_data  # pyarrow: loaded for the quickstart only

    mlflow.set_tracking_uri(url)
    mlflow.set_registry_uri(url)  # both: a process may have pointed the registry elsewhere
    mlflow.set_experiment("quickstart")
    with ShamalClient(url, token) as api:
        _, built = build_training_set(api)
    with mlflow.start_run(run_name="wine-sgd") as run, ShamalClient(url, token) as api:
        # Read inside the run, so the run's lineage starts at the exact version it trained on
        # (and through it, the feature view and the wine data it was joined from).
        read = shamal_data.version(TRAINING_SET, client=api)
        table = shamal_data.load(f"{TRAINING_SET}/{read['version']}", client=api)
        frame = table.to_pandas()
        x, y = frame[wine_measurements()], frame["target"].to_numpy()
        x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.3, random_state=0)
        scaler = StandardScaler().fit(x_train)
        classifier = SGDClassifier(loss="log_loss", alpha=1e-3, random_state=0)
        classes = np.unique(y)
        mlflow.log_params(
            {"model": "SGDClassifier", "alpha": 1e-3, "epochs": 20, "dataset": read["uri"]}
        )
        for epoch in range(20):
            classifier.partial_fit(scaler.transform(x_train), y_train, classes=classes)
            probs = classifier.predict_proba(scaler.transform(x_test))
            mlflow.log_metrics(
                {
                    "test_log_loss": float(log_loss(y_test, probs, labels=classes)),
                    "test_accuracy": float(accuracy_score(y_test, classes[probs.argmax(1)])),
                },
                step=epoch,
            )
        pipeline = make_pipeline(scaler, classifier)
        # Declared, not inferred: inference loads the model in a subprocess (about 30 s) and
        # lists whatever that interpreter imported (torch, pytest, ...).
        requirements = mlflow.sklearn.get_default_pip_requirements(include_skops=True)
        info = mlflow.sklearn.log_model(
            pipeline,
            name="model",
            # Named columns: the drift monitor names the served tensor's columns by them.
            signature=infer_signature(x_test, pipeline.predict(x_test)),
            serialization_format="skops",  # never pickle; the requirements name skops
            pip_requirements=requirements,
        )
    version = mlflow.register_model(info.model_uri, "quickstart-wine")
    mlflow.MlflowClient().set_registered_model_alias("quickstart-wine", "champion", version.version)
    accuracy = mlflow.get_run(run.info.run_id).data.metrics["test_accuracy"]
    with ShamalClient(url, token) as api:
        profiled = _reference(api, int(version.version), read["uri"], pipeline.predict(x))
    return [
        *built,
        f"tracked run [bold]{run.info.run_id[:12]}[/] ({read['uri']}, 20 epochs, "
        f"test accuracy {accuracy:.3f}) with the stock mlflow client",
        f"registered [bold]quickstart-wine[/] version {version.version} as [bold]@champion[/]",
        profiled,
    ]


def _reference(api: ShamalClient, version: int, training: str, answers: Any) -> str:
    """The version's reference profile: sketches of the training set it read (the server
    streams it) and of the model's answers on it (sketched here, only sketches sent): what
    the drift monitor compares its served traffic with."""
    from shamal.monitoring import upload_predictions  # numpy, scipy: quickstart only

    api.build_reference(
        MODEL, version, training.removeprefix("data:/"), label="target", columns=wine_measurements()
    )
    profile = upload_predictions(MODEL, version, {"label": answers}, client=api)
    return (
        f"built its reference profile for drift monitoring: {len(profile['columns'])} columns "
        f"sketched from {training} and the model's answers on it (no rows kept)"
    )


EXAMPLE_JOB = Path(__file__).resolve().parents[3] / "examples" / "pytorch"


def submit_a_training_job(client: ShamalClient) -> list[str]:
    """Submit the PyTorch example (checkpoints, preemption-safe, tracked) as a scheduled job."""
    if not (EXAMPLE_JOB / "train.py").is_file():
        return ["the PyTorch example job is part of a source checkout: skipped here"]
    digest = client.upload_snapshot(EXAMPLE_JOB)
    job = client.submit_job(
        # This interpreter: the scheduler runs jobs on this machine, with this install.
        [sys.executable, "train.py", "--steps", "120"],
        name="quickstart-pytorch",
        snapshot=digest,
        team=QUICKSTART_TEAM,
        cpus=1,
        memory_mib=2048,
        time_limit_s=900,
    )
    return [
        f"submitted job [bold]{job['id'][:12]}[/] (the PyTorch example: checkpoints, resumes "
        f"when preempted); follow it: shamal job logs -f {job['id'][:12]}"
    ]


#: The `shamal serve` children this process started; stopped at exit, or by the caller.
MODEL_SERVERS: list[subprocess.Popen[bytes]] = []


def stop_model_servers() -> None:
    """Stop every `shamal serve` the quickstart started (SIGTERM: they drain, then exit)."""
    while MODEL_SERVERS:
        child = MODEL_SERVERS.pop()
        child.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=30)
        if child.poll() is None:
            child.kill()
            child.wait()


atexit.register(stop_model_servers)


def _port(preferred: int) -> int:
    """``preferred`` when nothing listens there, else a free port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", preferred))
        except OSError:
            sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _start_model_server(client: ShamalClient, http_port: int, grpc_port: int, caller: str) -> None:
    """`shamal serve` for the deployment, a child of this server that ends with it."""
    argv = [
        sys.executable,
        "-m",
        "shamal",
        "serve",
        "--deployment",
        SERVED_AS,
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
    ]
    env = {**os.environ, "SHAMAL_URL": client.url, "SHAMAL_TOKEN": client.token or ""}
    log_path = Path(os.environ.get("SHAMAL_HOME", Path.home() / ".shamal")) / "quickstart-serve.log"
    with log_path.open("ab") as log:
        child = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    MODEL_SERVERS.append(child)
    ready = f"http://127.0.0.1:{http_port}/v2/models/{SERVED_AS}/ready"
    end = time.monotonic() + 180.0
    while time.monotonic() < end:
        if child.poll() is not None:
            raise ServiceUnavailable(f"`shamal serve` exited; its log is {log_path}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(ready, headers=_bearer(caller), timeout=2.0).status_code == 200:
                return
        time.sleep(0.2)  # readiness poll, bounded by the deadline
    stop_model_servers()
    raise ServiceUnavailable(f"`shamal serve` did not become ready; its log is {log_path}")


def _bearer(token: str) -> dict[str, str]:
    """The header `shamal serve` asks for when it serves from the platform."""
    return {"Authorization": f"Bearer {token}"}


def serve_the_champion(client: ShamalClient) -> tuple[list[str], Served]:
    """Serve `quickstart-wine@champion` over OIP and ask it twice: tritonclient and curl."""
    import numpy as np
    from sklearn.datasets import load_wine

    http_port, grpc_port = _port(8000), _port(8001)
    (materialized,) = client.materialize_features([FEATURE_VIEW])
    client.deploy(
        SERVED_AS,
        {
            "primary": [{"model": "models:/quickstart-wine@champion"}],
            "feature_service": FEATURE_SERVICE,
            # Every request is kept for the drift monitor (a busy service keeps 1-5%), and a
            # canary moves up after short healthy steps: the quickstart's loop takes minutes.
            "sample_rate": 1.0,
            "rollout": {"steps": [25, 50], "interval_s": 5},
            "slo": {"max_error_rate": 0.01, "max_p99_ms": 1000, "min_requests": 20},
        },
    )
    # What the deployment's callers hold: a token that may call its models and nothing else.
    caller = client.create_deployment_token(SERVED_AS, "quickstart-callers")["secret"]
    _start_model_server(client, http_port, grpc_port, caller)
    x, y = load_wine(return_X_y=True)
    steps = [
        f"materialized {FEATURE_VIEW} into the online store ({materialized['rows']} samples)",
        f"deployed [bold]models:/quickstart-wine@champion[/] as [bold]{SERVED_AS}[/] with feature "
        f"service {FEATURE_SERVICE} (callers send a sample id), served over "
        f"the Open Inference Protocol: REST 127.0.0.1:{http_port}, gRPC 127.0.0.1:{grpc_port}",
        f"a token for its callers, which may call deployment {SERVED_AS} and nothing else "
        f"(`shamal deployments token {SERVED_AS}` makes more):\n    {caller}",
    ]
    try:
        import tritonclient.http as triton_http
    except ImportError:
        steps.append("tritonclient is not installed: `pip install tritonclient[http]` to try it")
    else:
        triton = triton_http.InferenceServerClient(f"127.0.0.1:{http_port}")
        # Only the sample's id: the model server reads its 13 measurements online.
        tensor = triton_http.InferInput("sample_id", [1], "INT64")
        tensor.set_data_from_numpy(np.array([0], dtype=np.int64))
        label = triton.infer(SERVED_AS, [tensor], headers=_bearer(caller)).as_numpy("label")
        triton.close()
        steps.append(
            f"tritonclient: wine sample 0 -> class {int(np.asarray(label).reshape(-1)[0])} "
            f"(true class {int(y[0])}), sent its id only: its features were read online"
        )
    body = json.dumps(
        {
            "inputs": [
                {"name": "input", "shape": [1, 13], "datatype": "FP32", "data": x[0].tolist()}
            ],
            "outputs": [{"name": "label"}],
        }
    )
    url = f"http://127.0.0.1:{http_port}/v2/models/{SERVED_AS}/infer"
    # The served model asks for a token: the callers' one above.
    curl = ["curl", "-s", url, "-H", "Content-Type: application/json", "-d", body]
    shown = shlex.join(curl[:3]) + ' -H "Authorization: Bearer $TOKEN" '
    shown += shlex.join(curl[3:])
    auth = f"Authorization: Bearer {caller}"
    if shutil.which("curl"):
        # The token goes through a config on stdin, never on a command line others can read.
        config = f'header = "{auth}"\n'
        done = subprocess.run(
            [*curl, "-K", "-"],
            input=config,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        answer = done.stdout.strip()
    else:
        answer = httpx.post(url, content=body, headers=_bearer(caller), timeout=30).text
    steps.append(f"curl: {shown}\n    -> {answer}")
    return steps, Served(http_port, caller)


def run_quickstart(client: ShamalClient, console: Console) -> None:
    """The quickstart: a team, an artifact stored and read back, the wine data ingested and
    its features defined, a tracked scikit-learn run registered as
    ``quickstart-wine@champion``, a training job on the scheduler, the champion served over
    REST and gRPC (one panel); then the loop, each step printed as it happens (drift,
    retraining, canary, promotion, the new champion's lineage), and the audit chain verified."""
    steps: list[str] = []
    try:
        client.create_team(QUICKSTART_TEAM, "made by the quickstart")
        steps.append(f"created team [bold]{QUICKSTART_TEAM}[/]")
    except AlreadyExists:
        steps.append(f"team [bold]{QUICKSTART_TEAM}[/] exists already")
    payload = b"Hello from the Shamal quickstart.\n"
    stored = client.upload_artifact(QUICKSTART_TEAM, "hello/greeting.txt", io.BytesIO(payload))
    echoed = b"".join(client.download_artifact(QUICKSTART_TEAM, "hello/greeting.txt"))
    assert echoed == payload, "the artifact store returned different bytes"
    steps.append(
        f"stored artifact hello/greeting.txt (sha256 {stored['digest'][:12]}...) and read it back"
    )
    with tempfile.TemporaryDirectory(prefix="shamal-quickstart-") as folder:
        steps.extend(ingest_training_data(client, Path(folder)))
    steps.extend(define_features(client))
    steps.extend(track_a_model(client.url, client.token or ""))
    steps.extend(submit_a_training_job(client))
    served, where = serve_the_champion(client)
    steps.extend(served)
    console.print(Panel("\n".join(f"- {s}" for s in steps), title="quickstart", title_align="left"))
    from shamal.cli._quickstart_loop import close_the_loop

    console.print(
        "[bold]the loop, unattended[/]: callers keep asking; a monitor watches for drift "
        "(this takes a few minutes)"
    )
    with tempfile.TemporaryDirectory(prefix="shamal-quickstart-") as folder:
        tree = close_the_loop(client, where, Path(folder), say=lambda s: console.print(f"- {s}"))
    if tree is not None:
        console.print(Panel(tree, title="the new champion's lineage", title_align="left"))
    report = client.verify_audit()
    console.print(
        f"- audit chain verified: {report['entries_checked']} entries, intact={report['ok']}"
    )
