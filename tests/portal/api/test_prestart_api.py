"""``GET /api/v1/prestart`` and a spawn's adoption through ``POST /workloads``, over the real
API, allocator and store."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from portal.allocator import Allocator
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from portal.prestart.service import PrestartService, PrestartSettings
from tests.portal.api.conftest import TOKENS, auth, gpu_request

ONE, TWO = "gpu:H100-80GB:1", "gpu:H100-80GB:2"
TENANT_ADMIN = Caller(
    "tara", CallerKind.USER, frozenset({f"{Scope.ADMIN}!group=team-a"}), frozenset({"team-a"})
)


def started(app: FastAPI, alloc: Allocator) -> PrestartService:
    pre = PrestartService(
        alloc, PrestartSettings(budget_gpus=4, horizon_s=600, tenant="platform", interval_s=5)
    )
    pre.setup()
    pre.refresh()
    pre.rates = {ONE: 6.0, TWO: 3.0}
    pre.round()
    app.state.prestart = pre  # as serve sets it
    return pre


def test_platform_admins_only_and_off_says_so(app: FastAPI, client: TestClient) -> None:
    app.state.authenticator = StaticAuthenticator({**TOKENS, "tara": TENANT_ADMIN})
    for token in ("alice", "anna", "tara"):
        r = client.get("/api/v1/prestart", headers=auth(token))
        assert r.status_code == 403, (token, r.text)
    assert "platform admins" in client.get("/api/v1/prestart", headers=auth("tara")).text
    off = client.get("/api/v1/prestart", headers=auth("root")).json()
    assert off["enabled"] is False and off["options"] == [] and off["placeholders"] == []


def test_plan_and_placeholders_shown(
    app: FastAPI, client: TestClient, allocator: Allocator
) -> None:
    pre = started(app, allocator)
    body = client.get("/api/v1/prestart", headers=auth("root")).json()
    assert body["enabled"] and body["tenant"] == "platform" and body["budget_gpus"] == 4
    shown = {o["key"]: (o["count"], o["reason"], o["held"]) for o in body["options"]}
    assert shown == {ONE: (2, "forecast", 2), TWO: (1, "forecast", 1)}
    held = pre.pool.held()
    assert {(p["id"], p["option"]) for p in body["placeholders"]} == {
        (wid, key) for key, ids in held.items() for wid in ids
    }
    assert all(p["nodes"] == ["n1"] for p in body["placeholders"])


def test_a_spawn_of_the_option_takes_its_placeholder_through_the_api(
    app: FastAPI, client: TestClient, allocator: Allocator
) -> None:
    pre = started(app, allocator)  # 4 GPUs held: ONE 2 x 1, TWO 1 x 2
    for tenant, token in (("team-a", "alice"), ("team-b", "bob")):  # their guarantees: full
        fill = client.post("/api/v1/workloads", json=gpu_request(tenant, 2), headers=auth(token))
        assert fill.status_code == 201, fill.text
    held = pre.pool.held()
    # Without the option (or with another one's key) nothing is adopted: the spawn queues.
    plain = client.post("/api/v1/workloads", json=gpu_request("team-b"), headers=auth("bob"))
    assert plain.status_code == 202
    other = {**gpu_request("team-b", name="x"), "option": ONE}  # any model: not ONE's devices
    mismatch = client.post("/api/v1/workloads", json=other, headers=auth("bob"))
    assert mismatch.status_code == 202
    assert pre.pool.held() == held
    for wid in (plain.json()["id"], mismatch.json()["id"]):
        client.delete(f"/api/v1/workloads/{wid}", headers=auth("bob"))
    # With ONE's key: running at once, on the devices ONE's oldest placeholder held.
    taken = held[ONE][0]
    devices = allocator.read(lambda st: {(a.node, a.gpus) for a in st.live[taken].allocations})
    # The offer's devices, as the spawner sends them (a request for any model is not ONE).
    h100 = {"kind": "gpu", "count": 1, "models": ["H100-80GB"]}
    spawn = {**gpu_request("team-b", name="bob/default"), "devices": h100, "option": ONE}
    r = client.post("/api/v1/workloads", json=spawn, headers=auth("bob"))
    assert r.status_code == 201, r.text
    ended = allocator.status(taken)
    assert ended.state.value == "released" and "adopted by bob/default" in ended.reason
    assert {(a["node"], tuple(a["gpus"])) for a in r.json()["allocations"]} == devices
    assert pre.pool.held() == {ONE: held[ONE][1:], TWO: held[TWO]}


def test_an_unknown_option_key_is_refused_naming_the_field(client: TestClient) -> None:
    bad = {**gpu_request(), "option": "gpu h100"}
    r = client.post("/api/v1/workloads", json=bad, headers=auth("alice"))
    assert r.status_code == 422 and "option" in r.text
