"""A real JupyterHub with the real portal (``gpuportal serve``) as a hub-managed service and the
local gpuportal spawner; servers are ``tiny_server.py`` (fast) unless a test asks otherwise."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from portal.hubroles import HubRolesSpec, custom_scopes, load_roles
from spawner import hubconfig
from tests.support.hub import HubFactory, HubPorts, RunningHub
from tests.support.ports import free_port

GPUPORTAL = Path(sys.executable).parent / "gpuportal"
TINY_SERVER = Path(__file__).with_name("tiny_server.py")
ADMIN_TOKEN = "admin-" + "t" * 32
SPAWNER_TOKEN = "spawner-" + "s" * 32
PASSWORD = "test-password"
WAIT_S = 60.0

# One A100 node (4 GPUs, UUIDs GPU-a100-1-0...) and one shareable T4 node; team-a may hold
# one A100 at a time, team-b none.
INVENTORY = """\
version: 1
nodes:
  - name: a100-1
    preset: a100-pcie-4-nvlink-pairs
  - name: t4-1
    preset: t4-2
    shareable: true
"""
SEED = """\
tenants:
  team-a:
    quotas:
      A100-80GB: {guaranteed: 1, limit: 1}
      T4/share: {guaranteed: 0, limit: 1000}
  team-b:
    quotas:
      T4/share: {guaranteed: 0, limit: 500}
"""
GROUPS = {"team-a": ["alice", "anna"], "team-b": ["bob", "bea"]}
SHORT_WAIT_USER = "bea"
SHORT_WAIT_S = 3
SHORT_START_USER = "anna"  # her server must start within 5 s; her queue waits are longer
SHORT_START_S = 5


@dataclass
class PortalHub:
    """A running hub with the portal service, and ways to talk to both."""

    hub: RunningHub
    portal_url: str
    home: Path

    def api(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """The hub's REST API as the test's admin service."""
        headers = {"Authorization": f"token {ADMIN_TOKEN}", **kw.pop("headers", {})}
        return httpx.request(method, f"{self.hub.api_url}{path}", headers=headers, timeout=30, **kw)

    def portal(self, path: str) -> Any:
        """GET from the portal's API as the platform admin (through its own address)."""
        r = httpx.get(
            f"{self.portal_url}api/v1{path}",
            headers={"Authorization": f"token {ADMIN_TOKEN}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        return r.json()

    def server(self, user: str) -> dict[str, Any]:
        """The user's default server model ({} when none)."""
        model = self.api("GET", f"/users/{user}").json()
        got: dict[str, Any] = model.get("servers", {}).get("", {})
        return got

    def spawn(self, user: str, options: dict[str, Any]) -> httpx.Response:
        return self.api("POST", f"/users/{user}/server", json=options)

    def stop(self, user: str) -> None:
        r = self.api("DELETE", f"/users/{user}/server")
        assert r.status_code in (202, 204), r.text
        self.wait(lambda: not self.server(user), f"{user}'s server to stop")

    def wait(self, done: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            got = done()
            if got:
                return got
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}:\n{self.hub.log_tail(80)}")
            time.sleep(0.2)

    def wait_ready(self, user: str) -> None:
        self.wait(lambda: self.server(user).get("ready"), f"{user}'s server to be ready")

    def server_env(self, user: str) -> dict[str, str]:
        """The environment ``tiny_server.py`` recorded at its start."""
        path = self.home / user / "server-env.json"
        self.wait(path.exists, f"{path}")
        env: dict[str, str] = json.loads(path.read_text())
        return env

    @contextmanager
    def progress(self, user: str) -> Iterator[Iterator[dict[str, Any]]]:
        """The server's progress events, as the spawn page reads them."""
        url = f"{self.hub.api_url}/users/{user}/server/progress"
        headers = {"Authorization": f"token {ADMIN_TOKEN}"}
        with httpx.stream("GET", url, headers=headers, timeout=WAIT_S) as r:
            assert r.status_code == 200

            def events() -> Iterator[dict[str, Any]]:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        yield json.loads(line[5:])

            yield events()


def portal_hub_config(
    directory: Path,
    portal_port: int,
    *,
    server_cmd: list[str],
    extra: str = "",
) -> Callable[[HubPorts], str]:
    """Hub configuration text: dummy auth, tenants as groups, the portal's scopes and roles,
    the portal as a managed service, the spawner service, and the local gpuportal spawner."""
    (directory / "inventory.yaml").write_text(INVENTORY)
    (directory / "seed.yaml").write_text(SEED)
    (directory / "home").mkdir(parents=True, exist_ok=True)
    spec = HubRolesSpec(tenants=tuple(GROUPS))
    portal = hubconfig.portal_service(
        f"http://127.0.0.1:{portal_port}",
        [str(GPUPORTAL), "serve", "--seed", str(directory / "seed.yaml")],
        environment={
            "GPUPORTAL_DATABASE_URL": f"sqlite:///{directory / 'portal.sqlite'}",
            "GPUPORTAL_INVENTORY": f"file:{directory / 'inventory.yaml'}",
            "GPUPORTAL_STATE_DIR": str(directory / "portal-state"),
            "GPUPORTAL_TICK_INTERVAL_S": "0.5",
        },
        cwd=directory,
    )
    admin = {"name": "test-admin", "api_token": ADMIN_TOKEN}
    admin_role = {
        "name": "test-admin",
        "services": ["test-admin"],
        "scopes": ["admin:users", "admin:servers", "custom:gpuportal:admin"],
    }
    users = sorted({u for members in GROUPS.values() for u in members})

    def text(_ports: HubPorts) -> str:
        settings: dict[str, object] = {
            "JupyterHub.authenticator_class": "dummy",
            "DummyAuthenticator.password": PASSWORD,
            "Authenticator.allowed_users": set(users),
            "JupyterHub.load_groups": {g: {"users": m} for g, m in GROUPS.items()},
            "JupyterHub.custom_scopes": custom_scopes(),
            "JupyterHub.load_roles": [
                *load_roles(spec),
                hubconfig.spawner_role(),
                admin_role,
            ],
            "JupyterHub.services": [portal, hubconfig.spawner_service(SPAWNER_TOKEN), admin],
            "JupyterHub.spawner_class": "spawner.local.GPUSimpleLocalSpawner",
            "GPUSimpleLocalSpawner.home_dir_template": str(directory / "home" / "{username}"),
            "Spawner.cmd": server_cmd,
            "Spawner.start_timeout": 60,
            "Spawner.http_timeout": 60,
            "GPUPortalMixin.queue_poll_interval": 0.3,
            "JupyterHub.cleanup_servers": False,
        }
        # One user whose spawns may wait only a few seconds in the queue, one whose server
        # has only a few seconds to start (a queue wait must not count against that).
        short_wait = (
            "def _short_waits(spawner):\n"
            f"    if spawner.user.name == {SHORT_WAIT_USER!r}:\n"
            f"        spawner.max_queue_wait = {SHORT_WAIT_S}\n"
            f"    if spawner.user.name == {SHORT_START_USER!r}:\n"
            f"        spawner.start_timeout = {SHORT_START_S}\n"
            "c.Spawner.pre_spawn_hook = _short_waits\n"
        )
        return "".join(f"c.{k} = {v!r}\n" for k, v in settings.items()) + short_wait + extra

    return text


@pytest.fixture
def portal_hub(hub_factory: HubFactory, tmp_path: Path) -> PortalHub:
    """A hub with the portal service and the local spawner running tiny servers."""
    return start_portal_hub(hub_factory, tmp_path / "hub")


def start_portal_hub(
    hub_factory: HubFactory, directory: Path, *, server_cmd: list[str] | None = None
) -> PortalHub:
    portal_port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    config = portal_hub_config(
        directory, portal_port, server_cmd=server_cmd or [sys.executable, str(TINY_SERVER)]
    )
    hub = hub_factory(config, name=directory.name)
    ph = PortalHub(hub, f"http://127.0.0.1:{portal_port}/services/gpuportal/", directory / "home")

    def portal_ready() -> bool:
        try:
            return httpx.get(f"{ph.portal_url}ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    ph.wait(portal_ready, "the portal service")
    return ph
