"""The real-hub fixture itself: starts, restarts on the same database, leaves nothing behind."""

from __future__ import annotations

import httpx
import pytest

from tests.support.hub import HubFactory, HubPorts, _running

pytestmark = [pytest.mark.hub, pytest.mark.slow]

TOKEN = "s" * 32


def test_hub_starts_restarts_with_its_database_and_stops_its_proxy(
    hub_factory: HubFactory,
) -> None:
    def config(ports: HubPorts) -> str:
        return (
            "c.Authenticator.allowed_users = {'alice'}\n"
            f"c.JupyterHub.services = [{{'name': 'svc', 'api_token': {TOKEN!r}}}]\n"
            "c.JupyterHub.load_roles = [{'name': 'svc', 'services': ['svc'], "
            "'scopes': ['admin:groups']}]\n"
            f"# public port {ports.public}\n"
        )

    hub = hub_factory(config)
    headers = {"Authorization": f"token {TOKEN}"}
    made = httpx.post(f"{hub.api_url}/groups/team-x", headers=headers)
    assert made.status_code == 201, made.text
    assert httpx.get(f"{hub.url}/hub/api/", timeout=5).status_code == 200  # through the proxy
    hub.remember_descendants()
    proxy = [pid for pid, _ in hub.seen]
    assert proxy, "the hub started no proxy"

    hub.restart()
    again = httpx.get(f"{hub.api_url}/groups/team-x", headers=headers)
    assert again.status_code == 200 and again.json()["name"] == "team-x"

    hub.kill_everything()
    assert hub.process is None
    assert [pid for pid, started in hub.seen if _running(pid, started)] == []
