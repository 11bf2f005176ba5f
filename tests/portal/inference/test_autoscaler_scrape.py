"""The autoscaler's scrape of a replica's metrics reuses one connection between rounds."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socket import socket

import pytest

from portal.inference.autoscaler import http_scrape, metric_sum


class _Metrics(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as an engine's server does

    def do_GET(self) -> None:
        body = b"waiting_requests 3\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base's name)
        pass


class _CountingServer(ThreadingHTTPServer):
    daemon_threads = True
    connections = 0

    def get_request(self) -> tuple[socket, object]:
        got = super().get_request()
        self.connections += 1
        return got


@pytest.fixture
def replica() -> Iterator[_CountingServer]:
    server = _CountingServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_scrapes_reuse_one_connection(replica: _CountingServer) -> None:
    url = f"http://127.0.0.1:{replica.server_address[1]}/metrics"
    for _ in range(3):
        assert metric_sum(http_scrape(url), "waiting_requests") == 3.0
    # A client per scrape would open (and set up TLS context for) a connection each round.
    assert replica.connections == 1
