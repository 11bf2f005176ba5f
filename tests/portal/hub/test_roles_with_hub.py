"""The roles of ``portal.hubroles`` loaded into a real JupyterHub, its tokens used on the API.

The hub gets exactly ``render_config`` for tenants team-a and team-b, plus its users and groups:
alice (member of team-a), bob (member of team-b), anna (team-a-admins), lee
(gpuportal-leadership), pat (gpuportal-admins). A provisioner service creates one token per
user through the hub's API; the portal API authenticates them with ``HubAuthenticator``, so
every allow and deny below comes from the hub's expansion of our roles.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import HubAuthenticator, Scope
from portal.hubroles import HubRolesSpec, render_config
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, hgx
from tests.support.hub import HubFactory

pytestmark = [pytest.mark.hub, pytest.mark.slow]

PROVISIONER = "p" * 32
PORTAL_SERVICE = "s" * 32
USERS = {
    "alice": "team-a",
    "bob": "team-b",
    "anna": "team-a-admins",
    "lee": "gpuportal-leadership",
    "pat": "gpuportal-admins",
}


def config() -> str:
    groups = {g: {"users": [u for u, gu in USERS.items() if gu == g]} for g in set(USERS.values())}
    extra = {
        "Authenticator.allowed_users": set(USERS),
        "JupyterHub.load_groups": groups,
        "JupyterHub.services": [
            {"name": "gpuportal", "api_token": PORTAL_SERVICE},
            {"name": "provisioner", "api_token": PROVISIONER},
        ],
    }
    text = render_config(HubRolesSpec(("team-a", "team-b")))
    text += "".join(f"c.{k} = {v!r}\n" for k, v in extra.items())
    # The test's own helper, added after the portal's roles.
    text += "c.JupyterHub.load_roles += [{'name': 'provisioner', 'services': ['provisioner'],"
    text += " 'scopes': ['tokens']}]\n"
    return text


@pytest.fixture
def hub_tokens(hub_factory: HubFactory) -> Iterator[tuple[str, dict[str, str]]]:
    hub = hub_factory(config())
    tokens = {}
    for user in USERS:
        made = httpx.post(
            f"{hub.api_url}/users/{user}/tokens",
            headers={"Authorization": f"token {PROVISIONER}"},
            json={"note": "roles test"},
        )
        assert made.status_code == 201, made.text
        tokens[user] = made.json()["token"]
    yield hub.api_url, tokens


@pytest.fixture
def api(
    hub_tokens: tuple[str, dict[str, str]], tmp_path: Path
) -> Iterator[tuple[TestClient, dict[str, dict[str, str]]]]:
    hub_api, tokens = hub_tokens
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    alloc = Allocator(store, clock=ManualClock())
    alloc.start([hgx("n1")])
    for t in ("team-a", "team-b"):
        alloc.set_tenant(t)
        # The platform lets each tenant's admins go up to 2 guaranteed and 4 limit.
        alloc.set_quota(
            t, "H100-80GB", guaranteed=1, limit=2, ceiling_guaranteed=2, ceiling_limit=4
        )
    headers = {u: {"Authorization": f"token {t}"} for u, t in tokens.items()}
    try:
        with TestClient(create_app(alloc, HubAuthenticator(hub_api))) as client:
            yield client, headers
    finally:
        store.close()


QUOTA = "/api/v1/tenants/{}/quotas/H100-80GB"
GPU = {"name": "nb", "devices": {"kind": "gpu", "count": 1}}


def test_the_roles_decide_who_may_read_change_and_charge_which_tenant(
    api: tuple[TestClient, dict[str, dict[str, str]]],
) -> None:
    client, h = api
    edit = {"guaranteed": 1, "limit": 3}

    # A tenant-A admin: A's quota yes, B's neither read nor changed.
    assert client.get(QUOTA.format("team-a"), headers=h["anna"]).status_code == 200
    assert client.get(QUOTA.format("team-b"), headers=h["anna"]).status_code == 403
    ok = client.put(QUOTA.format("team-a"), json=edit, headers={**h["anna"], "If-Match": '"1"'})
    assert ok.status_code == 200, ok.text
    no = client.put(QUOTA.format("team-b"), json=edit, headers={**h["anna"], "If-Match": '"1"'})
    assert no.status_code == 403, no.text
    assert client.get(QUOTA.format("team-b"), headers=h["bob"]).json()["limit"] == 2

    # A member charges their own tenant, not another.
    mine = client.post("/api/v1/workloads", json={**GPU, "tenant": "team-a"}, headers=h["alice"])
    assert mine.status_code == 201, mine.text
    theirs = client.post("/api/v1/workloads", json={**GPU, "tenant": "team-b"}, headers=h["alice"])
    assert theirs.status_code == 403, theirs.text
    bobs = client.post("/api/v1/workloads", json={**GPU, "tenant": "team-b"}, headers=h["bob"])
    assert bobs.status_code == 201, bobs.text
    # Members do not read cost; a tenant admin reads their tenant's only.
    assert client.get("/api/v1/cost", headers=h["alice"]).status_code == 403
    anna_cost = client.get("/api/v1/cost", headers=h["anna"])
    assert [g["tenant"] for g in anna_cost.json()["groups"]] == ["team-a"]
    assert client.get("/api/v1/cost?tenant=team-b", headers=h["anna"]).status_code == 403


def test_leadership_reads_every_tenants_cost_and_changes_nothing(
    api: tuple[TestClient, dict[str, dict[str, str]]],
) -> None:
    client, h = api
    for user, tenant in (("alice", "team-a"), ("bob", "team-b")):
        r = client.post("/api/v1/workloads", json={**GPU, "tenant": tenant}, headers=h[user])
        assert r.status_code == 201, r.text
    lee = h["lee"]
    cost = client.get("/api/v1/cost", headers=lee)
    assert cost.status_code == 200, cost.text
    assert [g["tenant"] for g in cost.json()["groups"]] == ["team-a", "team-b"]
    assert client.get("/api/v1/cost/chargeback", headers=lee).status_code == 200
    assert client.get("/api/v1/cost/budgets", headers=lee).status_code == 200
    assert client.get("/api/v1/usage", headers=lee).status_code == 200

    workloads = client.get("/api/v1/workloads", headers=h["alice"]).json()["items"]
    writes = [
        client.put(
            QUOTA.format("team-a"),
            json={"guaranteed": 1, "limit": 3},
            headers={**lee, "If-Match": '"1"'},
        ),
        client.put(
            QUOTA.format("team-c"),
            json={"guaranteed": 1, "limit": 3},
            headers={**lee, "If-None-Match": "*"},
        ),
        client.put(
            "/api/v1/tenants/team-c", json={"weight": 1.0}, headers={**lee, "If-None-Match": "*"}
        ),
        client.post("/api/v1/workloads", json={**GPU, "tenant": "team-a"}, headers=lee),
        client.delete(f"/api/v1/workloads/{workloads[0]['id']}", headers=lee),
    ]
    assert [w.status_code for w in writes] == [403] * len(writes), [w.text for w in writes]
    # Nothing changed: the quota, the tenants and alice's workload are as they were.
    assert client.get(QUOTA.format("team-a"), headers=h["alice"]).json()["limit"] == 2
    assert (
        client.get(f"/api/v1/workloads/{workloads[0]['id']}", headers=h["alice"]).json()["state"]
        == "running"
    )


def test_the_portal_service_reads_users_and_groups_but_cannot_mint_tokens(
    hub_tokens: tuple[str, dict[str, str]],
) -> None:
    hub_api, _ = hub_tokens
    svc = {"Authorization": f"token {PORTAL_SERVICE}"}
    users = httpx.get(f"{hub_api}/users", headers=svc)
    assert users.status_code == 200 and {u["name"] for u in users.json()} >= set(USERS)
    groups = httpx.get(f"{hub_api}/groups/team-a", headers=svc)
    assert groups.status_code == 200 and groups.json()["users"] == ["alice"]
    assert httpx.post(f"{hub_api}/users/alice/tokens", headers=svc, json={}).status_code == 403
    assert httpx.post(f"{hub_api}/users/mallory", headers=svc).status_code == 403
    who = HubAuthenticator(hub_api)(PORTAL_SERVICE)
    assert who is not None and not any(s.startswith(Scope.ADMIN.value) for s in who.scopes)


def test_the_platform_admin_may_create_tenants_and_change_any_quota(
    api: tuple[TestClient, dict[str, dict[str, str]]],
) -> None:
    client, h = api
    created = client.put(
        "/api/v1/tenants/team-c", json={"weight": 1.0}, headers={**h["pat"], "If-None-Match": "*"}
    )
    assert created.status_code in (200, 201), created.text
    for tenant in ("team-a", "team-b"):
        r = client.put(
            QUOTA.format(tenant),
            json={"guaranteed": 0, "limit": 1},
            headers={**h["pat"], "If-Match": '"1"'},
        )
        assert r.status_code == 200, r.text
    assert client.get("/api/v1/cost", headers=h["pat"]).status_code == 200


def test_a_tenant_admin_cannot_take_guarantees_beyond_the_platforms_ceiling(
    api: tuple[TestClient, dict[str, dict[str, str]]],
) -> None:
    client, h = api
    bobs = client.post("/api/v1/workloads", json={**GPU, "tenant": "team-b"}, headers=h["bob"])
    assert bobs.status_code == 201, bobs.text

    # anna (team-a-admins) tries to guarantee team-a the whole node: refused, naming the ceiling.
    grab = {"guaranteed": 8, "limit": 8}
    r = client.put(QUOTA.format("team-a"), json=grab, headers={**h["anna"], "If-Match": '"1"'})
    assert r.status_code == 403, r.text
    assert "team-a's ceiling for H100-80GB guaranteed is 2" in r.json()["message"]
    r = client.put(
        QUOTA.format("team-a"),
        json={"guaranteed": 1, "limit": 2, "ceiling_guaranteed": 8, "ceiling_limit": 8},
        headers={**h["anna"], "If-Match": '"1"'},
    )
    assert r.status_code == 403 and "platform admin" in r.json()["message"], r.text
    mine = client.get(QUOTA.format("team-a"), headers=h["anna"]).json()
    assert (mine["guaranteed"], mine["version"], mine["ceiling_guaranteed"]) == (1, 1, 2)
    assert (
        client.get(f"/api/v1/workloads/{bobs.json()['id']}", headers=h["bob"]).json()["state"]
        == "running"
    )

    # pat (gpuportal-admins) may raise it, but not past the capacity without saying so.
    r = client.put(QUOTA.format("team-a"), json=grab, headers={**h["pat"], "If-Match": '"1"'})
    assert r.status_code == 422, r.text
    assert "add up to 9 on a capacity of 8" in r.json()["message"]
    over = {**grab, "overcommit": True}
    r = client.put(QUOTA.format("team-a"), json=over, headers={**h["pat"], "If-Match": '"1"'})
    assert r.status_code == 200, r.text
    assert (r.json()["ceiling_guaranteed"], r.json()["ceiling_limit"]) == (8, 8)
    # Now within the new ceiling, anna may lower and raise it again herself.
    back = {"guaranteed": 6, "limit": 8}
    r = client.put(QUOTA.format("team-a"), json=back, headers={**h["anna"], "If-Match": '"2"'})
    assert r.status_code == 200, r.text
