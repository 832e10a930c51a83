"""Loading trusted pickles in a sandboxed child process, never in the calling one.

A pickled scikit-learn model runs whatever code its file names when it is loaded. Even when a
user trusts the file (``shamal optimize --trust-pickle``, ``shamal serve --trust NAME``), the
long-running process that holds tokens and answers requests must not load it
(hostile-inputs.md §4). :func:`convert_in_sandbox` starts
:mod:`shamal.optimize._sandbox_child` instead:

- ``python -I`` (isolated mode), argv list, no shell, stdin closed, its own session (process
  group), ``cwd``/``HOME``/``TMPDIR`` a fresh temporary directory that is removed afterwards;
- an environment holding only ``PATH``, ``LANG``/``LC_ALL``, ``HOME``, ``TMPDIR`` and
  single-thread settings for the maths libraries (nothing inherited: no ``SHAMAL_*``,
  ``MLFLOW_*``, ``AWS_*`` or tokens);
- a copy of just ``MLmodel`` and the model file, read-only, in a folder the parent owns;
- resource limits (:class:`SandboxLimits`) set by the child before it unpickles, and a wall
  clock enforced here (the whole process group is killed);
- no network where the platform allows a new network namespace (root, or user namespaces);
  where it does not, the result says so and a warning is logged once per process;
- as root, an unprivileged uid/gid when ``SHAMAL_SANDBOX_USER`` names one.

What comes back is treated as hostile: sizes are capped, the ONNX file goes through
:func:`~shamal.optimize._safety.load_onnx`, reference outputs are loaded with
``allow_pickle=False`` and checked against the graph's outputs and the number of input rows.
Nothing is ever unpickled here.

Known limits: without ``SHAMAL_SANDBOX_USER`` the child runs as the caller's user and can read
and write what that user can (the process's own secrets are not handed to it, but files such as
``SHAMAL_HOME`` stay readable); a grandchild that starts its own session escapes the
process-group kill (it keeps the resource limits and the network namespace).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import select
import shutil
import signal
import stat
import subprocess  # nosec B404
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shamal.errors import InvalidParameter
from shamal.optimize._folder import checked_labels, specs_of
from shamal.optimize._safety import load_onnx

__all__ = ["SANDBOX_USER_ENV", "SandboxLimits", "SandboxedModel", "convert_in_sandbox"]

logger = logging.getLogger(__name__)

SANDBOX_USER_ENV = "SHAMAL_SANDBOX_USER"
_CHILD_MODULE = "shamal.optimize._sandbox_child"
_RESULT, _ONNX, _REFERENCE = "result.json", "model.onnx", "reference.npz"
_EXIT_REFUSED, _EXIT_MEMORY = 2, 4
_MAX_RESULT_BYTES = 64 * 1024
_MAX_STATUS_BYTES = 4096
_MAX_LOG_TAIL = 4000
_MAX_MESSAGE = 300
# Messages of InvalidParameter raised by shamal.optimize._sklearn in the child, shown as is.
_REFUSALS = (
    "skl2onnx cannot convert a ",
    "The estimator does not say how many features it takes.",
    "The eval data has ",
    "The sklearn flavor ",
    "The MLmodel file ",
    "The model file is not a pickle",
    "A model file path must ",
)
_GiB = 1024**3


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """What the sandboxed loader may use.

    Attributes:
        address_space: bytes of virtual memory (``RLIMIT_AS``).
        cpu_seconds: CPU time (``RLIMIT_CPU``; SIGXCPU, then SIGKILL 5 s later).
        wall_seconds: wall-clock time, enforced by the parent (SIGKILL to the process group).
        open_files: file descriptors (``RLIMIT_NOFILE``).
        file_size: bytes of any one file it writes (``RLIMIT_FSIZE``); also the cap on the
            ONNX file and the reference outputs it returns.
    """

    address_space: int = 4 * _GiB
    cpu_seconds: int = 240
    wall_seconds: float = 300.0
    open_files: int = 256
    file_size: int = _GiB

    def __post_init__(self) -> None:
        values = (self.address_space, self.cpu_seconds, self.open_files, self.file_size)
        if min(values) < 1 or not self.wall_seconds > 0:
            raise InvalidParameter("Sandbox limits must be positive.")

    def argv(self) -> list[str]:
        return [
            f"--address-space={self.address_space}",
            f"--cpu-seconds={self.cpu_seconds}",
            f"--open-files={self.open_files}",
            f"--file-size={self.file_size}",
        ]


@dataclass(frozen=True)
class SandboxedModel:
    """What the sandboxed loader produced.

    Attributes:
        graph: the ONNX graph (checked; input ``input`` FP32 [N, n_features]).
        task: classification, regression or other.
        reference: the estimator's outputs on the inputs, keyed by the graph's output names;
            None when no inputs were asked for.
        synthetic: the outputs are for :func:`~shamal.optimize._sklearn.synthetic_inputs`
            rather than for the inputs given.
        network_isolated: the loader ran in a network namespace of its own.
        uid: the user id the loader ran as.
        labels: the classifier's class names for its score output (untrusted text, checked
            for shape only).
    """

    graph: Any
    task: str
    reference: dict[str, np.ndarray] | None
    synthetic: bool
    network_isolated: bool
    uid: int
    labels: dict[str, list[str]] = field(default_factory=dict)


@functools.cache
def _warn_network_once() -> None:
    logger.warning(
        "The sandbox for trusted pickles could not isolate the network on this machine (it "
        "needs root or user namespaces); the model's code could open connections."
    )


def _sandbox_user() -> tuple[int, int] | None:
    """(uid, gid) to drop to: only as root, and only when ``SHAMAL_SANDBOX_USER`` is set."""
    name = os.environ.get(SANDBOX_USER_ENV, "").strip()
    if not name or os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, ValueError):
        raise InvalidParameter(f"{SANDBOX_USER_ENV} names no user on this machine.") from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise InvalidParameter(f"{SANDBOX_USER_ENV} must name an unprivileged user.")
    return entry.pw_uid, entry.pw_gid


def _child_env(home: Path) -> dict[str, str]:
    """Only what Python needs; one thread per maths library keeps the address space small."""
    return {
        "PATH": os.defpath,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": str(home),
        "TMPDIR": str(home),
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _stage(work: Path, mlmodel: Path, model_file: Path, relpath: str) -> Path:
    """A read-only copy of ``MLmodel`` and the model file (at the same relative path)."""
    staged = work / "model"
    target = staged / relpath
    target.parent.mkdir(parents=True)
    shutil.copyfile(mlmodel, staged / "MLmodel")
    shutil.copyfile(model_file, target)
    for path in [staged, *staged.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    return staged


def _prepare(work: Path, user: tuple[int, int] | None) -> tuple[Path, Path]:
    """(child cwd, output folder); owned by the sandbox user when there is one."""
    home, out = work / "cwd", work / "out"
    home.mkdir()
    out.mkdir()
    if user is not None:
        work.chmod(0o711)
        for path in (home, out):
            os.chown(path, *user)
    return home, out


def _read_status(fd: int, deadline: float) -> dict[str, Any] | None:
    """The child's status line from pipe ``fd``, or None when it ended or the deadline passed
    first."""
    buf = b""
    while b"\n" not in buf and len(buf) < _MAX_STATUS_BYTES:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, _MAX_STATUS_BYTES)
        if not chunk:
            return None
        buf += chunk
    try:
        status = json.loads(buf.split(b"\n", 1)[0])
    except ValueError:
        return None
    return status if isinstance(status, dict) else None


def _netns_differs(pid: int) -> bool | None:
    """Whether the kernel says ``pid`` lives in another network namespace than this process;
    None when it cannot tell (the child already ended)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    except OSError:
        return None


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _log_tail(log: Path) -> str:
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - _MAX_LOG_TAIL))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


@dataclass(frozen=True)
class _Run:
    returncode: int
    timed_out: bool
    ready: bool
    network_isolated: bool
    uid: int


def _run_child(argv: list[str], home: Path, log: Path, limits: SandboxLimits) -> _Run:
    """Start the child, read its status line, wait for it within the wall clock."""
    deadline = time.monotonic() + limits.wall_seconds
    with log.open("wb") as err:
        # A fixed argv (this interpreter, our module), no shell, a scrubbed environment.
        proc = subprocess.Popen(  # nosec B603
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            cwd=home,
            env=_child_env(home),
            start_new_session=True,
            close_fds=True,
        )
    stdout = proc.stdout
    if stdout is None:  # cannot happen with stdout=PIPE; keeps the types honest
        _kill_group(proc)
        raise InvalidParameter("The sandbox could not be started.")
    try:
        status = _read_status(stdout.fileno(), deadline)
        # The line was written before the pickle ran (and its pipe closed), so code from the
        # pickle cannot forge it; the kernel confirms it while the child lives.
        isolated = bool(status and status.get("network_isolated") is True)
        isolated = isolated and _netns_differs(proc.pid) is not False
        uid = status.get("uid") if status else None
        try:
            code = proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            code, timed_out = proc.wait(), True
    finally:
        _kill_group(proc)  # stragglers it forked; and the child itself on any error here
        if proc.poll() is None:
            proc.wait()
        stdout.close()
    uid = uid if isinstance(uid, int) and not isinstance(uid, bool) else -1
    return _Run(code, timed_out, status is not None, isolated, uid)


def _failure(run: _Run, out: Path, log: Path, limits: SandboxLimits) -> InvalidParameter:
    """The error for the user: fixed wording, except the loader's own refusal messages."""
    logger.warning(
        "sandboxed model loader failed (exit %s, timed out %s): %s",
        run.returncode,
        run.timed_out,
        _log_tail(log),
    )
    if run.timed_out:
        where = "while loading it" if run.ready else "before it could load it"
        return InvalidParameter(
            f"The sandbox stopped the trusted model {where}: it ran past the "
            f"{limits.wall_seconds:g} s time limit."
        )
    if run.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return InvalidParameter(
            "The sandbox stopped the trusted model: it used more than its "
            f"{limits.cpu_seconds} CPU seconds (or was killed)."
        )
    error = _result(out).get("error")
    if run.returncode == _EXIT_MEMORY or error == "memory":
        return InvalidParameter(
            "The trusted model asked for more memory than the sandbox allows "
            f"({limits.address_space / _GiB:g} GiB); it was not loaded."
        )
    if run.returncode == _EXIT_REFUSED and isinstance(error, str) and _known_refusal(error):
        return InvalidParameter(error)
    return InvalidParameter(
        "The trusted model could not be loaded in the sandbox (its code failed or it is not "
        "a scikit-learn estimator); see the server log."
    )


def _known_refusal(text: str) -> bool:
    """One of the loader's own refusals (the child's code could forge others)."""
    return len(text) <= _MAX_MESSAGE and text.isprintable() and text.startswith(_REFUSALS)


def _result(out: Path) -> dict[str, Any]:
    """The child's ``result.json`` (capped, no symlink), or {}."""
    try:
        found = json.loads(_read_capped(out / _RESULT, _MAX_RESULT_BYTES))
    except (InvalidParameter, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _open_regular(path: Path) -> int:
    """A read-only descriptor of a regular file the child wrote: no symlink followed, and no
    FIFO or device (opened non-blocking, so a FIFO cannot hang this process)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        raise InvalidParameter("The sandboxed loader returned no usable output.") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InvalidParameter("The sandboxed loader returned no usable output.")
    return fd


def _read_capped(path: Path, cap: int) -> bytes:
    """A regular file's bytes (see :func:`_open_regular`), refused past ``cap`` bytes."""
    with os.fdopen(_open_regular(path), "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise InvalidParameter("The sandboxed loader returned outputs over the size limit.")
    return data


def _copy_capped(src: Path, dest: Path, cap: int) -> None:
    """Copy a regular file the child wrote into a folder only this process writes to."""
    with os.fdopen(_open_regular(src), "rb") as f, dest.open("wb") as out:
        copied = 0
        while chunk := f.read(1024 * 1024):
            copied += len(chunk)
            if copied > cap:
                raise InvalidParameter("The sandboxed loader returned a file over the size limit.")
            out.write(chunk)


def _load_reference(path: Path, names: list[str], rows: int, cap: int) -> dict[str, np.ndarray]:
    """Plain arrays (no pickle), one per graph output, one row per input row."""
    import io

    raw = io.BytesIO(_read_capped(path, cap))
    bad = InvalidParameter("The sandboxed loader returned unusable reference outputs.")
    try:
        with zipfile.ZipFile(raw) as archive:
            members = archive.infolist()
            if len(members) > 16 or sum(m.file_size for m in members) > cap:
                raise bad
        with np.load(raw, allow_pickle=False) as found:
            arrays = {k: np.asarray(found[k]) for k in found.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile):
        raise bad from None
    if set(arrays) != set(names):
        raise bad
    for array in arrays.values():
        if array.ndim == 0 or len(array) != rows or array.dtype.kind not in "biufU":
            raise bad
    return arrays


def _check_graph(graph: Any) -> None:
    inputs, outputs = specs_of(graph)
    if (
        len(inputs) != 1
        or inputs[0].name != "input"
        or inputs[0].datatype != "FP32"
        or len(inputs[0].shape) != 2
        or inputs[0].shape[1] < 1
        or not outputs
    ):
        raise InvalidParameter("The sandboxed loader returned an unexpected ONNX graph.")


def _collect(
    out: Path, run: _Run, limits: SandboxLimits, given_rows: int | None, synthetic_rows: int
) -> SandboxedModel:
    """Validate what the child wrote. ``given_rows``: rows of inputs passed (None: none);
    ``synthetic_rows``: rows of synthetic inputs allowed instead (0: not allowed)."""
    result = _result(out)
    task = result.get("task")
    if task not in ("classification", "regression", "other"):
        raise InvalidParameter("The sandboxed loader returned no usable output.")
    # Checked from a copy in a folder the child cannot write to: nothing it left running can
    # swap the file between the checks and the load.
    checked = out.parent / "checked"
    checked.mkdir()
    _copy_capped(out / _ONNX, checked / _ONNX, limits.file_size)
    graph = load_onnx(checked / _ONNX, checked)
    _check_graph(graph)
    reference, synthetic = None, result.get("inputs") == "synthetic"
    if given_rows is not None or synthetic_rows > 0:
        rows = synthetic_rows if synthetic and synthetic_rows > 0 else given_rows
        if rows is None or (synthetic and synthetic_rows <= 0):
            raise InvalidParameter("The sandboxed loader returned unusable reference outputs.")
        names = [o.name for o in specs_of(graph)[1]]
        reference = _load_reference(out / _REFERENCE, names, rows, limits.file_size)
    labels = checked_labels(result.get("labels"))
    return SandboxedModel(
        graph, task, reference, synthetic, run.network_isolated, run.uid, labels=labels
    )


def _argv(
    staged: Path, out: Path, limits: SandboxLimits, user: tuple[int, int] | None
) -> list[str]:
    if not sys.executable:
        raise InvalidParameter("No Python interpreter to run the sandbox with.")
    argv = [sys.executable, "-I", "-m", _CHILD_MODULE, "--model", str(staged), "--out", str(out)]
    argv += limits.argv()
    if user is not None:
        argv += [f"--uid={user[0]}", f"--gid={user[1]}"]
    return argv


def _remove(work: Path) -> None:
    for path in (work / "model", *(work / "model").rglob("*")):
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    shutil.rmtree(work, ignore_errors=True)
    if work.exists():
        logger.warning("could not remove the sandbox folder %s", work)


def convert_in_sandbox(
    folder: Path,
    model_file: Path,
    relpath: str,
    *,
    inputs: np.ndarray | None = None,
    synthetic_rows: int = 0,
    limits: SandboxLimits | None = None,
) -> SandboxedModel:
    """Load a trusted pickled MLflow sklearn model in a sandboxed child and convert it.

    Args:
        folder: the MLflow model folder (holding ``MLmodel``), already resolved.
        model_file: the pickle, already checked to lie inside ``folder`` and to be a pickle.
        relpath: the path ``MLmodel`` gives for it.
        inputs: rows (FP32, [N, n_features]) to compute the estimator's outputs on.
        synthetic_rows: when > 0, rows of
            :func:`~shamal.optimize._sklearn.synthetic_inputs` are used instead of ``inputs``
            when those are absent or of the wrong width.
        limits: the sandbox's limits; default :class:`SandboxLimits`.

    Returns:
        The checked ONNX graph, the task and, when inputs were asked for, the outputs.

    Raises:
        InvalidParameter: the child timed out, ran out of memory or CPU, failed (its code
            raised, or no converter), or returned something that fails the checks.
    """
    limits = limits or SandboxLimits()
    user = _sandbox_user()
    work = Path(tempfile.mkdtemp(prefix="shamal-sandbox-"))
    try:
        home, out = _prepare(work, user)
        staged = _stage(work, folder / "MLmodel", model_file, relpath)
        argv, rows = _argv(staged, out, limits, user), None
        if inputs is not None:
            np.save(work / "inputs.npy", np.asarray(inputs, dtype=np.float32), allow_pickle=False)
            (work / "inputs.npy").chmod(0o444)
            argv.append(f"--inputs={work / 'inputs.npy'}")
            rows = len(inputs)
        if synthetic_rows > 0:
            argv.append(f"--synthetic-rows={synthetic_rows}")
        run = _run_child(argv, home, work / "child.log", limits)
        logger.info(
            "sandboxed loader: exit %s, uid %s, network isolated %s",
            run.returncode,
            run.uid,
            run.network_isolated,
        )
        if not run.network_isolated:
            _warn_network_once()
        if run.timed_out or run.returncode != 0:
            raise _failure(run, out, work / "child.log", limits)
        return _collect(out, run, limits, rows, synthetic_rows)
    finally:
        _remove(work)
