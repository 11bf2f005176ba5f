"""What a standby replica serves while another holds the Lease (``portal.service.leader``).

``/health`` 200 (the process is alive: no restart), ``/ready`` 503 (the platform routes
nothing to it), and every other request 503 ``unavailable`` with ``Retry-After`` in the usual
JSON error body, naming the leader. A standby holds no state of its own, so it serves no
reads either: a read from a replica that has not rebuilt from the database would be stale.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from policies.errors import Unavailable
from portal.api.errors import body_of, error_response

RETRY_AFTER_S = 2
STARTUP_S = 30.0


def standby_app(leader: Callable[[], str], prefix: str = "/") -> Starlette:
    """The standby's answers under ``prefix``; ``leader()`` names the current holder."""
    base = prefix.rstrip("/")

    def health(_request: Request) -> Response:
        return JSONResponse({"status": "ok", "role": "standby"})

    def ready(_request: Request) -> Response:
        return JSONResponse({"status": "standby", "leader": leader() or None}, status_code=503)

    def refuse(_request: Request) -> Response:
        who = leader()
        named = f"the leader is {who}" if who else "no leader yet"
        exc = Unavailable(
            f"this portal replica is a standby ({named}); the Service routes requests to the "
            "leader: retry",
            retry_after_s=RETRY_AFTER_S,
        )
        return error_response(body_of(exc))

    methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    return Starlette(
        routes=[
            Route(f"{base}/health", health),
            Route(f"{base}/ready", ready),
            Route("/{rest:path}", refuse, methods=methods),
        ]
    )


class StandbyServer:
    """The standby app served in a thread on the portal's address until ``stop``."""

    def __init__(self, app: Starlette, ip: str, port: int) -> None:
        self._server = uvicorn.Server(
            uvicorn.Config(
                app, host=ip, port=port, log_config=None, access_log=False, lifespan="off"
            )
        )
        # Run in a thread, uvicorn leaves the signals to the process's own handlers (serve's).
        self._thread = threading.Thread(target=self._server.run, name="standby", daemon=True)

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + STARTUP_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise Unavailable("the standby server did not start (is the port taken?)")
            time.sleep(0.05)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
