"""The real API app served by uvicorn on a loopback port, for the client and the CLI.

The app runs over a real allocator on SQLite with tokens from a dict, mounted under
``/services/gpuportal/`` as the hub would proxy it, in a background thread; tests talk to it
over real HTTP.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from threading import Event

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.types import ASGIApp

from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import Authenticator, StaticAuthenticator
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, hgx, t4
from tests.portal.api.conftest import TOKENS

PREFIX = "/services/gpuportal"


@dataclass(frozen=True)
class Served:
    """A running portal: its allocator, its origin and the portal URL under the prefix."""

    allocator: Allocator
    origin: str
    port: int

    @property
    def url(self) -> str:
        return f"{self.origin}{PREFIX}/"


@pytest.fixture
def allocator(tmp_path: Path) -> Iterator[Allocator]:
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    alloc = Allocator(store, clock=ManualClock())
    alloc.start([hgx("n1"), hgx("n2"), t4("t1")])
    alloc.set_tenant("team-a")
    alloc.set_tenant("team-b")
    # team-a's admins may raise its limit up to 4 (the platform's ceiling).
    alloc.set_quota("team-a", "H100-80GB", guaranteed=2, limit=2, ceiling_limit=4)
    alloc.set_quota("team-b", "H100-80GB", guaranteed=2, limit=4)
    yield alloc
    store.close()


@contextmanager
def serving(app: ASGIApp) -> Iterator[int]:
    """Serve ``app`` with uvicorn on a free loopback port (yielded) in a background thread."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, name="uvicorn-portal", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(15)
        assert not thread.is_alive(), "uvicorn did not stop"


def mounted(allocator: Allocator, authenticator: Authenticator) -> Starlette:
    """The API app under the hub's service prefix, as the hub's proxy forwards to it."""
    return Starlette(routes=[Mount(PREFIX, app=create_app(allocator, authenticator))])


@pytest.fixture
def portal_server(allocator: Allocator) -> Iterator[Served]:
    with serving(mounted(allocator, StaticAuthenticator(TOKENS))) as port:
        yield Served(allocator, f"http://127.0.0.1:{port}", port)


class AnswerDroppingProxy:
    """A TCP proxy in front of the portal that loses answers, as a flaky network does.

    The first ``drops`` requests starting with ``prefix`` reach the portal, which acts on them;
    then the connection is cut instead of the answer being returned.
    """

    def __init__(self, upstream_port: int, prefix: bytes, drops: int = 1) -> None:
        self.upstream_port = upstream_port
        self.prefix = prefix
        self.drops = drops
        self.dropped = 0
        self.forwarded: list[bytes] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._start(self._accept)

    def _start(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self._sockets += [client, upstream]
            cut = Event()
            self._start(self._requests, client, upstream, cut)
            self._start(self._answers, upstream, client, cut)

    def _requests(self, client: socket.socket, upstream: socket.socket, cut: Event) -> None:
        while chunk := _recv(client):
            with self._lock:
                if chunk.startswith(self.prefix):
                    self.forwarded.append(chunk)
                    if self.dropped < self.drops:
                        self.dropped += 1
                        cut.set()
            upstream.sendall(chunk)
        _close(client, upstream)

    def _answers(self, upstream: socket.socket, client: socket.socket, cut: Event) -> None:
        while chunk := _recv(upstream):
            if cut.is_set():
                break  # the portal answered, so it acted; the caller never hears of it
            client.sendall(chunk)
        _close(client, upstream)

    def close(self) -> None:
        _close(self._listener, *self._sockets)  # shutdown wakes the thread blocked in accept
        for thread in self._threads:
            thread.join(5)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _close(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()


ProxyFactory = Callable[[bytes, int], AnswerDroppingProxy]


@pytest.fixture
def dropping_proxy(portal_server: Served) -> Iterator[ProxyFactory]:
    """``dropping_proxy(prefix, drops)``: a proxy to the portal, closed after the test."""
    made: list[AnswerDroppingProxy] = []

    def make(prefix: bytes, drops: int) -> AnswerDroppingProxy:
        made.append(AnswerDroppingProxy(portal_server.port, prefix, drops))
        return made[-1]

    yield make
    for proxy in made:
        proxy.close()
