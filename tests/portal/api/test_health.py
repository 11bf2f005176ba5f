"""Health and readiness: the process answers; ready only once the allocator has started."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, hgx


def test_ready_only_after_the_allocator_started(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    try:
        alloc = Allocator(store, clock=ManualClock())
        client = TestClient(create_app(alloc, StaticAuthenticator({})))
        assert client.get("/health").json() == {"status": "ok"}
        starting = client.get("/ready")
        assert (starting.status_code, starting.json()) == (503, {"status": "starting"})
        alloc.start([hgx("n1")])
        assert client.get("/ready").status_code == 200
    finally:
        store.close()


def test_the_service_root_names_the_service_and_its_api_without_a_token(tmp_path: Path) -> None:
    # JupyterHub asks a service's URL every minute; a 404 there was logged every time.
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    try:
        client = TestClient(
            create_app(Allocator(store, clock=ManualClock()), StaticAuthenticator({}))
        )
        index = client.get("/")
        assert index.status_code == 200
        body = index.json()
        assert body["service"] == "gpuportal"
        # Relative paths: they resolve under the hub's /services/<name>/ prefix too.
        assert client.get(f"/{body['docs']}").status_code == 200
        assert client.get(f"/{body['health']}").json() == {"status": "ok"}
        assert client.get(f"/{body['api']}/tenants").status_code == 401  # the API needs a token
    finally:
        store.close()
