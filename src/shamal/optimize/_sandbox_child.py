"""The sandboxed worker that loads a trusted pickled scikit-learn model.

Run only by :mod:`shamal.optimize._sandbox` as ``python -I -m shamal.optimize._sandbox_child
ARGS`` with a scrubbed environment, a fresh temporary working directory and no stdin. Before it
reads one byte of the pickle it:

1. sets resource limits (address space, CPU seconds, open files, file size, no core dumps);
2. tries to leave the network (a new, empty network namespace: ``unshare(CLONE_NEWNET)``, or
   ``CLONE_NEWUSER | CLONE_NEWNET`` where it is not root and user namespaces are allowed);
3. imports the libraries it needs, then drops to the unprivileged uid/gid it was given (root
   only);
4. writes one status line (JSON) to the stdout pipe it was started with, and closes it (its
   own stdout goes to stderr from the start), so that code run by the pickle cannot rewrite what
   it reported.

Then it loads the model, converts it to ONNX (``model.onnx``), computes the estimator's outputs
on the given inputs when asked (``reference.npz``, plain arrays) and writes ``result.json``. Every
failure ends in ``result.json`` holding ``{"error": message}`` and a non-zero exit status;
details go to stderr, which the parent keeps in its log and never shows to a caller.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import sys
import traceback
from pathlib import Path
from typing import Any

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
EXIT_OK = 0
EXIT_REFUSED = 2
EXIT_FAILED = 3
EXIT_MEMORY = 4

RESULT = "result.json"
ONNX_OUT = "model.onnx"
REFERENCE_OUT = "reference.npz"


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="shamal-sandbox", add_help=False)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--inputs", type=Path, default=None)
    parser.add_argument("--synthetic-rows", type=int, default=0)
    parser.add_argument("--address-space", type=int, required=True)
    parser.add_argument("--cpu-seconds", type=int, required=True)
    parser.add_argument("--open-files", type=int, required=True)
    parser.add_argument("--file-size", type=int, required=True)
    parser.add_argument("--uid", type=int, default=-1)
    parser.add_argument("--gid", type=int, default=-1)
    return parser.parse_args(argv)


def _limit(args: argparse.Namespace) -> None:
    """Resource limits; the hard CPU limit a few seconds above the soft one (SIGXCPU, then
    SIGKILL)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (args.address_space, args.address_space))
    resource.setrlimit(resource.RLIMIT_CPU, (args.cpu_seconds, args.cpu_seconds + 5))
    resource.setrlimit(resource.RLIMIT_NOFILE, (args.open_files, args.open_files))
    resource.setrlimit(resource.RLIMIT_FSIZE, (args.file_size, args.file_size))


def _isolate_network() -> bool:
    """Enter a new network namespace (only a loopback device, down). False where the kernel
    or the container refuses it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        unshare = libc.unshare
    except (OSError, AttributeError):  # no libc, or no unshare (not Linux)
        return False
    if unshare(CLONE_NEWNET) == 0:
        return True
    uid, gid = os.geteuid(), os.getegid()
    # Unprivileged: a user namespace of our own gives the capability to make a network one.
    if uid == 0 or unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        return False
    # Map our own ids into it (best effort), so that files and os.getuid() keep their owner.
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} {uid} 1"),
        ("gid_map", f"{gid} {gid} 1"),
    ):
        try:
            Path(f"/proc/self/{name}").write_text(text)
        except OSError:
            break
    return True


def _drop_privileges(uid: int, gid: int) -> None:
    if uid < 0 or os.geteuid() != 0:
        return
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.geteuid() == 0 or os.getuid() == 0:
        raise SystemExit(EXIT_FAILED)


def _report_ready(status_fd: int, isolated: bool) -> None:
    """One status line on the pipe the parent reads, which is then closed for good."""
    line = json.dumps({"network_isolated": isolated, "uid": os.geteuid()}) + "\n"
    os.write(status_fd, line.encode())
    os.close(status_fd)


def _write_result(out: Path, result: dict[str, Any]) -> None:
    (out / RESULT).write_text(json.dumps(result), encoding="utf-8")


def _reference(model: Any, graph: Any, task: str, x: Any) -> dict[str, Any]:
    """The estimator's outputs, named like the ONNX graph's (what the optimizer compares)."""
    import numpy as np

    from shamal.optimize._folder import specs_of

    names = [o.name for o in specs_of(graph)[1]]
    if task == "classification":
        return {names[0]: np.asarray(model.predict(x)), names[1]: model.predict_proba(x)}
    return {names[0]: np.asarray(model.predict(x)).reshape(len(x), -1)}


def _inputs(args: argparse.Namespace, n_features: int) -> tuple[Any, str]:
    """(rows to compute reference outputs on, "given" or "synthetic")."""
    import numpy as np

    from shamal.errors import InvalidParameter
    from shamal.optimize._sklearn import synthetic_inputs

    given = np.load(args.inputs, allow_pickle=False) if args.inputs is not None else None
    if given is not None and given.ndim == 2 and given.shape[1] == n_features:
        return given.astype(np.float32), "given"
    if args.synthetic_rows > 0:
        return synthetic_inputs(n_features, args.synthetic_rows), "synthetic"
    width = given.shape[-1] if given is not None and given.ndim else 0
    raise InvalidParameter(f"The eval data has {width} columns; the model takes {n_features}.")


def _convert(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import onnx

    from shamal.optimize._sklearn import (
        load_sklearn_model,
        sklearn_labels,
        sklearn_task,
        sklearn_to_onnx,
    )

    # The parent trusted this file explicitly; this process is the sandbox it runs in.
    model = load_sklearn_model(args.model, trust_pickle=True)
    graph = sklearn_to_onnx(model)
    task = sklearn_task(model)
    onnx.save_model(graph, str(args.out / ONNX_OUT), save_as_external_data=False)
    result: dict[str, Any] = {"task": task, "labels": sklearn_labels(model, graph)}
    if args.inputs is not None or args.synthetic_rows > 0:
        x, used = _inputs(args, int(model.n_features_in_))
        np.savez(args.out / REFERENCE_OUT, **_reference(model, graph, task, x))
        result["inputs"] = used
    return result


def main(argv: list[str] | None = None) -> int:
    """Confine this process, then load, convert and report (see the module docstring)."""
    # Only the status line goes to the parent's pipe; anything printed goes to stderr (the log).
    status_fd = os.dup(1)
    os.dup2(2, 1)
    args = _arguments(argv)
    _limit(args)
    isolated = _isolate_network()
    # Imported before the privileges go: the sandbox user may not read the interpreter's tree.
    from shamal.errors import InvalidParameter
    from shamal.optimize._lazy import module

    for name in ("onnx", "sklearn", "skl2onnx", "skl2onnx.common.data_types", "yaml"):
        module(name)

    _drop_privileges(args.uid, args.gid)
    _report_ready(status_fd, isolated)
    try:
        _write_result(args.out, _convert(args))
    except InvalidParameter as exc:
        _write_result(args.out, {"error": exc.message})
        return EXIT_REFUSED
    except MemoryError:
        _write_result(args.out, {"error": "memory"})
        return EXIT_MEMORY
    except BaseException:  # whatever the model's code raises (SystemExit included)
        traceback.print_exc(file=sys.stderr)
        _write_result(args.out, {"error": "failed"})
        return EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
