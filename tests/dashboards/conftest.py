"""A real portal API (allocator on SQLite, the seeded dataset, telemetry on the seed's clock)
served by uvicorn on loopback, and sources that speak to it over HTTP as each seeded viewer.
``AGENT_TOKEN`` is a node agent's: it posts telemetry samples."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dashboards.sources import ApiSource
from portal.accounting.service import Accounting
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import Caller, CallerKind, StaticAuthenticator
from portal.api.auth import Scope as ApiScope
from portal.api.cost import use_accounting
from portal.api.telemetry import use_telemetry
from portal.inference.controller import ServiceController
from portal.jobs.controller import JobController
from portal.store.writer import Store
from portal.telemetry.service import Telemetry
from tests.dashboards.seed import PRICES, VIEWERS, SeedClock, seed
from tests.support.ports import free_port

AGENT_TOKEN = "tok-agent"
AGENT = Caller("node-agent", CallerKind.SERVICE, frozenset({ApiScope.TELEMETRY_WRITE.value}))


@dataclass(frozen=True)
class Exchange:
    """One request the portal received and the body it answered."""

    method: str
    path: str
    query: str
    token: str
    body: bytes


class Recorder:
    """ASGI wrapper around the portal API: records every exchange as the server saw it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: list[Exchange] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = bytearray()
        auth = dict(scope["headers"]).get(b"authorization", b"").decode()

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.body":
                body.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    # Recorded before the last byte leaves: once the client holds the answer,
                    # the exchange is already in ``seen`` (appending after the app returned
                    # raced the test's next read).
                    self.seen.append(
                        Exchange(
                            scope["method"],
                            scope["path"],
                            scope["query_string"].decode(),
                            auth.partition(" ")[2],
                            bytes(body),
                        )
                    )
            await send(message)

        await self.app(scope, receive, capture)


@dataclass
class Portal:
    url: str
    allocator: Allocator
    clock: SeedClock
    recorder: Recorder
    telemetry: Telemetry
    jobs: JobController | None = None
    services: ServiceController | None = None

    def source(self, token: str) -> ApiSource:
        """A source acting as the viewer of ``token``."""
        return ApiSource(self.url, token)

    def seen(self, token: str) -> list[Exchange]:
        """What the portal received with ``token``, in order."""
        return [e for e in self.recorder.seen if e.token == token]

    def ingest(self, node: str, samples: list[dict[str, object]]) -> None:
        """Post ``samples`` of ``node`` through the ingest route as its agent would (all must
        be accepted)."""
        reply = httpx.post(
            f"{self.url}/api/v1/telemetry/samples",
            json={"node": node, "source": "nvml", "samples": samples},
            headers={"Authorization": f"token {AGENT_TOKEN}"},
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["accepted"] == len(samples), reply.text


@contextmanager
def running_portal(
    folder: Path,
    jobs: Callable[[Allocator], JobController] | None = None,
    services: Callable[[Allocator], ServiceController] | None = None,
) -> Iterator[Portal]:
    """The seeded portal API on SQLite in ``folder``, served by uvicorn on loopback; with
    ``jobs`` (``services``), ``/jobs`` (``/services``) runs the controller it makes (stepped
    by the test, no loop)."""
    store = Store(f"sqlite:///{folder / 'portal.db'}")
    clock = SeedClock()
    alloc = Allocator(store, clock=clock)
    seed(alloc, clock)
    controller = jobs(alloc) if jobs is not None else None
    if controller is not None:
        controller.start()
    serving = services(alloc) if services is not None else None
    if serving is not None:
        serving.start()
    app = create_app(
        alloc,
        StaticAuthenticator({**VIEWERS, AGENT_TOKEN: AGENT}),
        job_controller=controller,
        service_controller=serving,
    )
    use_accounting(app, Accounting(store, PRICES, clock=clock))
    telemetry = Telemetry(alloc, clock=lambda: clock.now.timestamp(), attribution_ttl_s=0)
    use_telemetry(app, telemetry)
    recorder = Recorder(app)
    port = free_port()
    config = uvicorn.Config(recorder, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the portal API did not start")
            time.sleep(0.02)
        yield Portal(
            f"http://127.0.0.1:{port}", alloc, clock, recorder, telemetry, controller, serving
        )
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        store.close()


@pytest.fixture
def portal(tmp_path: Path) -> Iterator[Portal]:
    with running_portal(tmp_path) as p:
        yield p


@pytest.fixture
def source(portal: Portal) -> Callable[[str], ApiSource]:
    return portal.source
