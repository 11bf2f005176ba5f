"""The real portal API (a started allocator's app, telemetry included) served by uvicorn on a
loopback port under the hub's service prefix, for tests that talk to it over HTTP: the node
agent and the Prometheus source.

Tokens: ``agent`` may send samples (``telemetry:write``), ``ops`` may read usage.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from portal.api.telemetry import use_telemetry
from portal.telemetry.service import Telemetry

PREFIX = "/services/gpuportal"
TOKENS = {
    "agent": Caller("node-agent", CallerKind.SERVICE, frozenset({Scope.TELEMETRY_WRITE})),
    "ops": Caller("ops", CallerKind.SERVICE, frozenset({Scope.USAGE_READ})),
}


@contextmanager
def serve(alloc: Allocator, port: int) -> Iterator[str]:
    """The portal API under the hub's service prefix on ``port``; yields its base URL."""
    app = create_app(alloc, StaticAuthenticator(TOKENS))
    use_telemetry(app, Telemetry(alloc, attribution_ttl_s=0))
    server = uvicorn.Server(
        uvicorn.Config(
            Starlette(routes=[Mount(PREFIX, app=app)]),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}{PREFIX}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
