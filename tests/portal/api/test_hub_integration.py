"""The API behind a real JupyterHub: tokens, custom scopes with group filters, groups.

Starts ``jupyterhub`` through ``tests.support.hub`` (stopped at the end) with the
portal's custom scopes, a tenant-admin service holding ``quotas:write!group=team-a``, and a user
in group team-a whose token the test creates through the hub's API.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import SCOPE_HELP, CallerKind, HubAuthenticator, Scope
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, hgx
from tests.support.hub import HubFactory

pytestmark = [pytest.mark.hub, pytest.mark.slow]

ADMIN_SVC_TOKEN = "a" * 32
PROVISIONER_TOKEN = "p" * 32


def hub_config() -> str:
    """The portal's scopes, a tenant-admin service limited to team-a, a token provisioner."""
    config = {
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
def hub_api(hub_factory: HubFactory) -> str:
    return hub_factory(hub_config()).api_url


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
