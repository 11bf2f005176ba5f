"""Loopback TCP ports for test servers (hub, PostgreSQL, apiserver, uvicorn, Prometheus)."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port free on loopback right now (the caller binds it soon after; the kernel may
    hand it to someone else in between, which on a test machine it practically never does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])
