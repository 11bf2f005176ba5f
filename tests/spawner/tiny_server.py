"""A stand-in single-user server for hub tests: answers every GET with 200 and writes its
environment to ``server-env.json`` in its working directory (the user's home) at start.

Run as ``python tiny_server.py``; it listens where ``JUPYTERHUB_SERVICE_URL`` says, as a
JupyterLab started by the hub would.
"""

from __future__ import annotations

import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def main() -> None:
    url = urlsplit(os.environ["JUPYTERHUB_SERVICE_URL"])
    Path("server-env.json").write_text(json.dumps(dict(os.environ), indent=1, sort_keys=True))
    ThreadingHTTPServer((url.hostname or "127.0.0.1", url.port or 80), Handler).serve_forever()


if __name__ == "__main__":
    main()
