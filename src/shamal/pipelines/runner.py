"""``python -m shamal.pipelines.runner``: one pipeline step, inside the job that runs it.

The server puts the call in the job's environment (``PIPELINE_STEP``: the step's function
or command and its arguments, as JSON). A function step is imported from the job's code
folder and called with the arguments; a command step runs with ``PIPELINE_ARGS`` (the
arguments as JSON) and ``PIPELINE_OUTPUT`` (a file it may write its JSON output to). The
output goes back to the server with the job's own token. Nothing is unpickled: arguments
and outputs are JSON, and a step that returns something else fails with what to do.

Exit status: the step's (a function that raises exits 1, with its traceback in the job's
log, which only its team reads).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

#: A step's output as JSON: the same limit the server holds small values to.
MAX_OUTPUT_BYTES = 16 * 1024


def _json(value: Any) -> str:
    def plain(item: Any) -> Any:
        if hasattr(item, "tolist"):  # numpy scalars and arrays
            return item.tolist()
        if isinstance(item, tuple | set | frozenset):
            return list(item)
        raise TypeError(f"a step's output cannot hold a {type(item).__name__}")

    return json.dumps(value, default=plain, allow_nan=False, separators=(",", ":"))


def _call_function(call: dict[str, Any]) -> Any:
    from shamal.pipelines._sdk import Step, import_file

    file_part, _, qualname = str(call["function"]).partition(":")
    root = Path.cwd()
    path = (root / file_part).resolve()
    if not path.is_relative_to(root.resolve()):
        raise SystemExit(f"{file_part} is outside the job's code folder")
    target: Any = import_file(path, root)
    for part in qualname.split("."):
        target = getattr(target, part)
    fn = target.fn if isinstance(target, Step) else target
    return fn(**call["args"])


def _run_command(call: dict[str, Any]) -> tuple[int, Any]:
    import subprocess  # a command step runs its own command, in its own job

    out = Path.cwd() / ".pipeline-output.json"
    out.unlink(missing_ok=True)
    env = {**os.environ, "PIPELINE_ARGS": json.dumps(call["args"]), "PIPELINE_OUTPUT": str(out)}
    env.pop("PIPELINE_STEP", None)
    code = subprocess.call(list(call["command"]), env=env)  # argv, no shell
    if code != 0 or not out.exists():
        return code, None
    return code, json.loads(out.read_text())


def _report(call: dict[str, Any], output: Any) -> None:
    body = _json(output)
    if len(body.encode()) > MAX_OUTPUT_BYTES:
        raise SystemExit(
            f"the step's output is {len(body.encode())} bytes as JSON; outputs stop at "
            f"{MAX_OUTPUT_BYTES}: save data as a dataset version or files as artifacts and "
            "return their names"
        )
    url = os.environ["SHAMAL_URL"].rstrip("/")
    path = f"/api/v1/pipeline-runs/{call['run']}/steps/{call['key']}/output"
    if not url.startswith(("http://", "https://")):
        raise SystemExit(f"SHAMAL_URL {url[:80]!r} is not an http(s) URL")
    payload = json.dumps({"job_id": os.environ.get("SHAMAL_JOB_ID", ""), "output": body}).encode()
    headers = {
        "Authorization": f"Bearer {os.environ['SHAMAL_TOKEN']}",
        "Content-Type": "application/json",
    }
    # Plain HTTP (the platform's relay inside a job's network) takes one socket: a step's
    # process then imports neither urllib.request nor ssl nor email, which is most of what
    # a no-op step would otherwise load. HTTPS takes the standard library's client.
    post = _post_plain if url.startswith("http://") else _post_tls
    status, said = post(url + path, payload, headers)
    if not 200 <= status < 300:
        raise SystemExit(f"the server refused the step's output ({status}): {said}")


def _post_plain(url: str, payload: bytes, headers: dict[str, str]) -> tuple[int, str]:
    """POST over HTTP/1.0 on a socket of its own; the status and the first 500 bytes of the
    answer's body."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    head = [f"POST {target} HTTP/1.0", f"Host: {parts.netloc}", f"Content-Length: {len(payload)}"]
    head += [f"{name}: {value}" for name, value in headers.items()]
    request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload
    with socket.create_connection((host, port), timeout=60) as sock:
        sock.sendall(request)
        answer = bytearray()
        while chunk := sock.recv(65536):  # HTTP/1.0: the server closes after its answer
            answer += chunk
            if len(answer) > 1_000_000:
                break
    status_line, _, rest = bytes(answer).partition(b"\r\n")
    fields = status_line.split(b" ", 2)
    if len(fields) < 2 or not fields[0].startswith(b"HTTP/") or not fields[1].isdigit():
        return 0, "no HTTP answer"
    _, _, content = rest.partition(b"\r\n\r\n")
    return int(fields[1]), content[:500].decode(errors="replace")


def _post_tls(url: str, payload: bytes, headers: dict[str, str]) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(  # noqa: S310 - the platform's own https URL
        url, data=payload, headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:  # nosec B310 - https
            return int(answer.status), ""
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read(500).decode(errors="replace")


def main() -> int:
    call = json.loads(os.environ["PIPELINE_STEP"])
    if call.get("command"):
        code, output = _run_command(call)
        if code != 0:
            return code
    else:
        try:
            output = _call_function(call)
        except Exception:  # the step's own failure: its log says why
            import traceback

            traceback.print_exc()
            return 1
    try:
        _report(call, output)
    except TypeError as exc:
        print(f"step output: {exc}; return JSON values", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
