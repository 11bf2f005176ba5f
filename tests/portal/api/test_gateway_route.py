"""The gateway's routes served ahead of FastAPI's router (``GatewayRoute``) answer every
request exactly as the FastAPI routes they shadow: the same app is asked the same requests
with the fast route and without it."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.routing import Match

from portal.inference.gateway_route import GatewayRoute
from tests.portal.api.conftest import auth, service_body

LONG = "s" * 64
CASES: list[tuple[str, str, dict[str, str], Any]] = [
    ("GET", "/gateway/team-a/llm/v1/models", auth("alice"), None),
    ("GET", "/gateway/team-a/llm/v1/models", {}, None),  # no token: 401
    ("GET", "/gateway/team-a/llm/v1/models", auth("expired"), None),  # 401
    ("GET", "/gateway/team-a/llm/v1/models", {"Authorization": "Basic x"}, None),  # 401
    ("GET", "/gateway/team-a/llm/v1/models", auth("nobody"), None),  # no scope: 403
    ("GET", "/gateway/team-a/llm/v1/models", auth("bob"), None),  # another tenant's: 403
    ("GET", "/gateway/team-a/nope/v1/models", auth("alice"), None),  # 404
    ("GET", "/gateway/Team_A!/llm/v1/models", auth("root"), None),  # 422 tenant
    ("GET", f"/gateway/team-a/{LONG}/v1/models", auth("root"), None),  # 422 service
    ("GET", f"/gateway/Team_A!/{LONG}/v1/models", auth("root"), None),  # 422 both
    ("GET", "/gateway/Team_A!/llm/v1/models", {}, None),  # 401 before 422
    ("POST", "/gateway/team-a/llm/v1/completions", auth("bob"), {"prompt": "x"}),  # 403
    ("POST", "/gateway/team-a/llm/v1/chat/completions", {}, {"messages": []}),  # 401
    ("POST", "/gateway/team-b/llm/v1/completions", auth("bob"), {"prompt": "x"}),  # 404
    ("POST", "/gateway/team-a/llm/v1/models", auth("alice"), None),  # 405
    ("GET", "/gateway/team-a/llm/v1/completions", auth("alice"), None),  # 405
    ("PUT", "/gateway/team-a/llm/v1/chat/completions", auth("alice"), None),  # 405
    ("GET", "/gateway/team-a/llm/v2/models", auth("alice"), None),  # 404
]


def answers(client: TestClient) -> list[tuple[int, Any]]:
    out = []
    for method, path, headers, body in CASES:
        r = client.request(method, path, headers=headers, json=body)
        out.append((r.status_code, r.json()))
    return out


def test_the_fast_route_answers_as_the_fastapi_routes(app: FastAPI, client: TestClient) -> None:
    r = client.post("/api/v1/services", json=service_body(), headers=auth("alice"))
    assert r.status_code == 201, r.text
    fast = app.router.routes[0]
    assert isinstance(fast, GatewayRoute)
    with_fast = answers(client)
    app.router.routes.remove(fast)
    without = answers(client)
    assert with_fast == without
    statuses = [status for status, _body in with_fast]
    assert statuses == [200, 401, 401, 401, 403, 403, 404, 422, 422, 422, 401,
                        403, 401, 404, 405, 405, 405, 404]  # fmt: skip
    fields = [body.get("field") for status, body in with_fast if status == 422]
    assert fields == ["tenant", "service", "tenant"]


def test_the_fast_route_takes_the_three_operations_only() -> None:
    route = GatewayRoute()

    def match(method: str, path: str, root_path: str = "") -> Match:
        scope = {"type": "http", "method": method, "path": path, "root_path": root_path}
        return route.matches(scope)[0]

    base = "/gateway/team-a/llm/v1"
    assert match("GET", f"{base}/models") is Match.FULL
    assert match("POST", f"{base}/chat/completions") is Match.FULL
    assert match("POST", f"{base}/completions") is Match.FULL
    # Under a mount (a hub service's prefix): the path inside the app.
    assert match("POST", f"/services/portal{base}/completions", "/services/portal") is Match.FULL
    for method, path in [
        ("POST", f"{base}/models"),
        ("GET", f"{base}/completions"),
        ("POST", f"{base}/completions/x"),
        ("POST", "/gateway/team-a//v1/completions"),
        ("POST", "/gateway/team-a/v1/completions"),
        ("POST", "/api/v1/gateway/team-a/llm/v1/completions"),
    ]:
        assert match(method, path) is Match.NONE, (method, path)
