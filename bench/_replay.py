"""A server that does next to nothing for the stock client: the client's floor.

``bench/tracking.py`` records the pages a real server sent for one ``get_metric_history`` read,
then points the same stock client at this process. Each request is answered with the bytes
recorded for its ``page_token`` (the first page has none), so the time the client then takes is
its own work (HTTP, ``json.loads``, protobuf parsing, ``Metric`` objects) with next to nothing
left on the server side: the least any server can take through this client.

``POST .../runs/log-batch`` reads the body and answers ``{}`` as a server does once it stored
the batch, storing nothing: what a ``log_batch`` call costs the client itself (building the
protobuf, writing it as JSON, HTTP).

Run as ``python bench/_replay.py PORT PAGES_DIR``, where ``PAGES_DIR/index.json`` maps each page
token ("" for the first page) to a file of the same folder holding that page's body. ``GET
/health`` answers 200 once it listens. Everything else, unknown tokens included, is a 404.
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

HISTORY_PATH = "/api/2.0/mlflow/metrics/get-history"
LOG_BATCH_PATH = "/api/2.0/mlflow/runs/log-batch"


def load_pages(folder: Path) -> dict[str, bytes]:
    """The recorded bodies by page token, read once, before the server listens."""
    index: dict[str, str] = json.loads((folder / "index.json").read_text())
    return {token: (folder / Path(name).name).read_bytes() for token, name in index.items()}


def handler_for(pages: dict[str, bytes]) -> type[BaseHTTPRequestHandler]:
    class Replay(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the stock client's session expects
        # TCP_NODELAY, as uvicorn and the stock server's gunicorn set it: without it a reply's
        # second segment can wait out the client's delayed ACK (about 40 ms on Linux).
        disable_nagle_algorithm = True

        def do_GET(self) -> None:  # noqa: N802 - the name http.server dispatches to
            url = urlsplit(self.path)
            if url.path == "/health":
                self._send(200, b"OK", "text/plain")
                return
            token = parse_qs(url.query).get("page_token", [""])[0]
            body = pages.get(token) if url.path == HISTORY_PATH else None
            if body is None:
                self._send(404, b'{"error_code": "ENDPOINT_NOT_FOUND"}', "application/json")
            else:
                self._send(200, body, "application/json")

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if urlsplit(self.path).path == LOG_BATCH_PATH:
                self._send(200, b"{}", "application/json")
            else:
                self._send(404, b'{"error_code": "ENDPOINT_NOT_FOUND"}', "application/json")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # quiet: the benchmark reads the real servers' logs, not this one's

    return Replay


def main(argv: list[str]) -> int:
    port, folder = int(argv[1]), Path(argv[2])
    server = ThreadingHTTPServer(("127.0.0.1", port), handler_for(load_pages(folder)))
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
