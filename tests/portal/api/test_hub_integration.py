"""The API behind a real JupyterHub: tokens, custom scopes with group filters, groups.

Starts ``jupyterhub`` as a subprocess (its own process group, stopped at the end) with the
portal's custom scopes, a tenant-admin service holding ``quotas:write!group=team-a``, and a user
in group team-a whose token the test creates through the hub's API.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import SCOPE_HELP, CallerKind, HubAuthenticator, Scope
from portal.demo import find_proxy
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, hgx

pytestmark = [pytest.mark.hub, pytest.mark.slow]

JUPYTERHUB = Path(sys.executable).parent / "jupyterhub"
ADMIN_SVC_TOKEN = "a" * 32
PROVISIONER_TOKEN = "p" * 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def hub_config(tmp: Path, ports: tuple[int, int, int]) -> str:
    public, hub, proxy_api = ports
    config = {
        "JupyterHub.ip": "127.0.0.1",
        "JupyterHub.port": public,
        "JupyterHub.hub_ip": "127.0.0.1",
        "JupyterHub.hub_port": hub,
        "ConfigurableHTTPProxy.api_url": f"http://127.0.0.1:{proxy_api}",
        "ConfigurableHTTPProxy.command": [str(find_proxy())],
        "ConfigurableHTTPProxy.pid_file": str(tmp / "proxy.pid"),
        "JupyterHub.db_url": f"sqlite:///{tmp / 'hub.sqlite'}",
        "JupyterHub.cookie_secret_file": str(tmp / "cookie_secret"),
        "JupyterHub.pid_file": str(tmp / "hub.pid"),
        "Authenticator.allowed_users": {"alice"},
        "JupyterHub.load_groups": {"team-a": {"users": ["alice"]}, "team-b": {"users": []}},
        "JupyterHub.custom_scopes": {s.value: {"description": SCOPE_HELP[s]} for s in Scope},
        "JupyterHub.services": [
            {"name": "team-a-admin", "api_token": ADMIN_SVC_TOKEN},
            {"name": "provisioner", "api_token": PROVISIONER_TOKEN},
        ],
        "JupyterHub.load_roles": [
            {
                "name": "team-a-quota-admin",
                "services": ["team-a-admin"],
                "scopes": [
                    f"{Scope.QUOTAS_READ}!group=team-a",
                    f"{Scope.QUOTAS_WRITE}!group=team-a",
                ],
            },
            {"name": "provisioner", "services": ["provisioner"], "scopes": ["tokens"]},
            {"name": "gpu-user", "users": ["alice"], "scopes": [Scope.WORKLOADS_WRITE.value]},
        ],
    }
    return "".join(f"c.{k} = {v!r}\n" for k, v in config.items())


@pytest.fixture
def hub_api(tmp_path: Path) -> Iterator[str]:
    ports = (free_port(), free_port(), free_port())
    (tmp_path / "jupyterhub_config.py").write_text(hub_config(tmp_path, ports))
    log = (tmp_path / "hub.log").open("wb")
    proc = subprocess.Popen(
        [str(JUPYTERHUB), "-f", str(tmp_path / "jupyterhub_config.py")],
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{ports[1]}/hub/api"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (tmp_path / "hub.log").read_text()[-3000:]
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "hub.log").read_text()[-3000:]
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_hub_tokens_scopes_and_groups_decide_what_the_api_allows(
    hub_api: str, tmp_path: Path
) -> None:
    made = httpx.post(
        f"{hub_api}/users/alice/tokens",
        headers={"Authorization": f"token {PROVISIONER_TOKEN}"},
        json={"note": "test"},
    )
    assert made.status_code == 201, made.text
    alice_token = made.json()["token"]

    authenticator = HubAuthenticator(hub_api)
    svc = authenticator(ADMIN_SVC_TOKEN)
    assert svc is not None and svc.kind is CallerKind.SERVICE
    assert svc.can(Scope.QUOTAS_WRITE, "team-a") and not svc.can(Scope.QUOTAS_WRITE, "team-b")

    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    alloc = Allocator(store, clock=ManualClock())
    alloc.start([hgx("n1")])
    for t in ("team-a", "team-b"):
        alloc.set_tenant(t)
        # The platform's ceiling lets the tenants' admins raise the limit to 4.
        alloc.set_quota(t, "H100-80GB", guaranteed=1, limit=2, ceiling_limit=4)
    try:
        with TestClient(create_app(alloc, authenticator)) as client:
            admin = {"Authorization": f"token {ADMIN_SVC_TOKEN}", "If-Match": '"1"'}
            quota = {"guaranteed": 1, "limit": 4}
            ok = client.put("/api/v1/tenants/team-a/quotas/H100-80GB", json=quota, headers=admin)
            assert ok.status_code == 200, ok.text
            other = client.put("/api/v1/tenants/team-b/quotas/H100-80GB", json=quota, headers=admin)
            assert other.status_code == 403

            alice = {"Authorization": f"Bearer {alice_token}"}
            body = {"name": "nb", "devices": {"kind": "gpu", "count": 1}}
            mine = client.post(
                "/api/v1/workloads", json={**body, "tenant": "team-a"}, headers=alice
            )
            assert mine.status_code == 201 and mine.json()["owner"] == "alice"
            theirs = client.post(
                "/api/v1/workloads", json={**body, "tenant": "team-b"}, headers=alice
            )
            assert theirs.status_code == 403
            nobody = client.get("/api/v1/queue", headers={"Authorization": "token nope"})
            assert nobody.status_code == 401
    finally:
        store.close()
