"""A real portal API (allocator on SQLite, the seeded dataset) served by uvicorn on loopback,
and sources that speak to it over HTTP as each seeded viewer."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import uvicorn

from dashboards.sources import ApiSource
from portal.accounting.service import Accounting
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from portal.api.cost import use_accounting
from portal.store.writer import Store
from tests.dashboards.seed import PRICES, VIEWERS, SeedClock, seed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Portal:
    url: str
    allocator: Allocator
    seen: list[httpx.Request] = field(default_factory=list)

    def source(self, token: str) -> ApiSource:
        """A source acting as the viewer of ``token``; its requests land in ``seen``."""
        client = httpx.Client(timeout=30.0, event_hooks={"request": [self.seen.append]})
        return ApiSource(self.url, token, client=client)


@pytest.fixture
def portal(tmp_path: Path) -> Iterator[Portal]:
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    clock = SeedClock()
    alloc = Allocator(store, clock=clock)
    seed(alloc, clock)
    app = create_app(alloc, StaticAuthenticator(VIEWERS))
    use_accounting(app, Accounting(store, PRICES, clock=clock))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the portal API did not start")
        time.sleep(0.02)
    yield Portal(f"http://127.0.0.1:{port}", alloc)
    server.should_exit = True
    thread.join(timeout=10)
    store.close()


@pytest.fixture
def source(portal: Portal) -> Callable[[str], ApiSource]:
    return portal.source
