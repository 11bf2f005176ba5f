"""``/api/v1/tenants/{tenant}/offers`` and requests a service makes on a user's behalf."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from tests.portal.api.conftest import TOKENS, auth, gpu_request

SPAWNER = Caller(
    "gpuportal-spawner",
    CallerKind.SERVICE,
    frozenset({Scope.WORKLOADS_WRITE.value, Scope.QUEUE_READ.value, Scope.WORKLOADS_READ.value}),
)


def offers(client: TestClient, tenant: str, token: str) -> dict[str, dict[str, Any]]:
    r = client.get(f"/api/v1/tenants/{tenant}/offers", headers=auth(token))
    assert r.status_code == 200, r.text
    return {o["key"]: o for o in r.json()}


def test_a_member_sees_each_option_with_its_state(client: TestClient) -> None:
    got = offers(client, "team-a", "alice")
    one = got["gpu:H100-80GB:1"]
    assert (one["state"], one["label"], one["flavor"]) == (
        "available",
        "1 × H100-80GB",
        "H100-80GB",
    )
    assert one["devices"]["kind"] == "gpu" and one["devices"]["models"] == ["H100-80GB"]
    assert (one["position"], one["eta_s"], one["reason"]) == (None, None, "")
    four = got["gpu:H100-80GB:4"]
    assert (four["state"], four["reason"]) == ("not_allowed", "over-limit")
    assert got["cpu"]["state"] == "available"

    client.post("/api/v1/workloads", json=gpu_request(n=2), headers=auth("alice"))
    one = offers(client, "team-a", "alice")["gpu:H100-80GB:1"]
    assert (one["state"], one["reason"], one["position"]) == ("queued", "quota", 1)
    assert "2/2 gpus in use" in str(one["message"])


def test_offers_can_be_asked_for_named_options_only(client: TestClient) -> None:
    r = client.get(
        "/api/v1/tenants/team-a/offers",
        params=[("option", "gpu:H100-80GB:2"), ("option", "cpu"), ("option", "nope")],
        headers=auth("alice"),
    )
    assert r.status_code == 200, r.text
    assert [o["key"] for o in r.json()] == ["gpu:H100-80GB:2", "cpu"]


def test_the_offer_devices_are_a_valid_workload_request(client: TestClient) -> None:
    offer = offers(client, "team-a", "alice")["gpu:H100-80GB:2"]
    body = {"tenant": "team-a", "name": "from-offer", "devices": offer["devices"]}
    r = client.post("/api/v1/workloads", json=body, headers=auth("alice"))
    assert r.status_code == 201, r.text


def test_offers_of_another_tenant_are_forbidden_and_unknown_tenants_not_found(
    client: TestClient,
) -> None:
    r = client.get("/api/v1/tenants/team-b/offers", headers=auth("alice"))
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    r = client.get("/api/v1/tenants/team-z/offers", headers=auth("root"))
    assert r.status_code == 404 and r.json()["code"] == "not_found"


def test_a_service_requests_on_behalf_of_a_user_who_owns_the_workload(
    app: FastAPI, client: TestClient
) -> None:
    app.state.authenticator = StaticAuthenticator({**TOKENS, "spawner": SPAWNER})
    r = client.post(
        "/api/v1/workloads", params={"owner": "alice"}, json=gpu_request(), headers=auth("spawner")
    )
    assert r.status_code == 201, r.text
    assert r.json()["owner"] == "alice"
    again = client.post(
        "/api/v1/workloads",
        params={"owner": "alice"},
        json=gpu_request(),
        headers={**auth("spawner"), "Idempotency-Key": "server-1"},
    )
    retry = client.post(
        "/api/v1/workloads",
        params={"owner": "alice"},
        json=gpu_request(),
        headers={**auth("spawner"), "Idempotency-Key": "server-1"},
    )
    assert again.json()["id"] == retry.json()["id"]


def test_a_user_may_not_request_on_behalf_of_someone_else(client: TestClient) -> None:
    r = client.post(
        "/api/v1/workloads", params={"owner": "bob"}, json=gpu_request(), headers=auth("alice")
    )
    assert r.status_code == 403
    assert "only services" in r.json()["message"]
    listed = client.get("/api/v1/workloads", headers=auth("root")).json()
    assert listed["total"] == 0
