"""``Portal()`` as in a notebook, against a real JupyterHub: the hub's token, its proxy, and the
portal as the hub service ``gpuportal``.

The hub loads the portal's roles (``portal.hubroles``) for team-a and team-b and routes
``/services/gpuportal/`` to the API served by uvicorn, which checks tokens with the hub. A
provisioner service mints alice's token, as the hub does for her server; the client gets only
environment variables, as in her notebook.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from policies.errors import Forbidden
from portal.allocator import Allocator
from portal.api.auth import Caller, HubAuthenticator
from portal.client import ApiError, Portal
from portal.hubroles import HubRolesSpec, render_config
from portal.store.records import WorkloadState
from tests.portal.client.conftest import mounted, serving
from tests.support.hub import HubFactory, HubPorts, RunningHub

pytestmark = [pytest.mark.hub, pytest.mark.slow]

PROVISIONER = "p" * 32
PORTAL_SERVICE = "s" * 32


class LaterHubAuthenticator:
    """``HubAuthenticator`` for a hub whose API address is known only once its ports are."""

    def __init__(self) -> None:
        self.hub: HubAuthenticator | None = None

    def __call__(self, token: str) -> Caller | None:
        assert self.hub is not None, "the hub's ports are not chosen yet"
        return self.hub(token)


@dataclass(frozen=True)
class Notebook:
    hub: RunningHub
    token: str
    allocator: Allocator


@pytest.fixture
def notebook(hub_factory: HubFactory, allocator: Allocator) -> Iterator[Notebook]:
    auth = LaterHubAuthenticator()
    with serving(mounted(allocator, auth)) as portal_port:

        def config(ports: HubPorts) -> str:
            auth.hub = HubAuthenticator(f"http://127.0.0.1:{ports.hub}/hub/api")
            settings = {
                "Authenticator.allowed_users": {"alice", "bob"},
                "JupyterHub.load_groups": {
                    "team-a": {"users": ["alice"]},
                    "team-b": {"users": ["bob"]},
                },
                "JupyterHub.services": [
                    {
                        "name": "gpuportal",
                        "url": f"http://127.0.0.1:{portal_port}",
                        "api_token": PORTAL_SERVICE,
                    },
                    {"name": "provisioner", "api_token": PROVISIONER},
                ],
            }
            text = render_config(HubRolesSpec(("team-a", "team-b")))
            text += "".join(f"c.{k} = {v!r}\n" for k, v in settings.items())
            text += "c.JupyterHub.load_roles += [{'name': 'provisioner', "
            text += "'services': ['provisioner'], 'scopes': ['tokens']}]\n"
            return text

        hub = hub_factory(config)
        made = httpx.post(
            f"{hub.api_url}/users/alice/tokens",
            headers={"Authorization": f"token {PROVISIONER}"},
            json={"note": "alice's notebook"},
        )
        assert made.status_code == 201, made.text
        yield Notebook(hub, made.json()["token"], allocator)


def in_notebook(monkeypatch: pytest.MonkeyPatch, token: str, hub_api_url: str) -> None:
    """The variables JupyterHub sets in a single-user server, and nothing else of ours."""
    monkeypatch.delenv("GPUPORTAL_URL", raising=False)
    monkeypatch.delenv("JPY_API_TOKEN", raising=False)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", token)
    monkeypatch.setenv("JUPYTERHUB_API_URL", hub_api_url)


def test_portal_with_no_arguments_works_through_the_hubs_proxy(
    notebook: Notebook, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hub reached through its proxy (as with c.JupyterHub.hub_connect_url set to it).
    in_notebook(monkeypatch, notebook.token, f"{notebook.hub.url}/hub/api")
    with Portal() as portal:
        assert portal.url == f"{notebook.hub.url}/services/gpuportal/"
        assert [t.name for t in portal.tenants()] == ["team-a"]
        w = portal.request("team-a", "H100-80GB", name="nb")
        assert (w.state, w.owner) == (WorkloadState.RUNNING, "alice")
        with pytest.raises(Forbidden, match="team-b"):
            portal.request("team-b", "H100-80GB")
        assert portal.release(w.id).state is WorkloadState.RELEASED
    assert notebook.allocator.workloads() == []


def test_the_hubs_own_api_port_does_not_route_services(
    notebook: Notebook, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Why docs/cli.md asks for GPUPORTAL_URL where the hub's API listens apart from its proxy.
    in_notebook(monkeypatch, notebook.token, notebook.hub.api_url)
    with Portal() as portal, pytest.raises(ApiError, match="is the portal URL right"):
        portal.tenants()
    monkeypatch.setenv("GPUPORTAL_URL", f"{notebook.hub.url}/services/gpuportal/")
    with Portal() as portal:
        assert [t.name for t in portal.tenants()] == ["team-a"]
