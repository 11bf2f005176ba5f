"""The gateway's own path (``GatewayASGI``, ahead of FastAPI) answers every request exactly as
the FastAPI routes it shadows, records the same metrics and writes the same access line: the
same app is asked the same requests with it and without it."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from portal.inference.gateway_asgi import GatewayASGI, Operation, operation
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
    # Past the checks, no replica is ready (nothing runs replicas here): 503.
    ("POST", "/gateway/team-a/llm/v1/completions", auth("alice"), {"prompt": "x"}),
    ("POST", "/gateway/team-a/llm/v1/models", auth("alice"), None),  # 405
    ("GET", "/gateway/team-a/llm/v1/completions", auth("alice"), None),  # 405
    ("PUT", "/gateway/team-a/llm/v1/chat/completions", auth("alice"), None),  # 405
    ("GET", "/gateway/team-a/llm/v2/models", auth("alice"), None),  # 404
]
STATUSES = [200, 401, 401, 401, 403, 403, 404, 422, 422, 422, 401,
            403, 401, 404, 503, 405, 405, 405, 404]  # fmt: skip


def answers(client: TestClient, caplog: pytest.LogCaptureFixture) -> list[tuple[Any, ...]]:
    """Each case's status, body, Retry-After and its one access line's fields."""
    out = []
    for method, path, headers, body in CASES:
        caplog.clear()
        r = client.request(method, path, headers=headers, json=body)
        lines = [rec for rec in caplog.records if rec.name == "portal.api.access"]
        assert len(lines) == 1, (method, path, [rec.getMessage() for rec in lines])
        fields = dict(lines[0].fields)  # type: ignore[attr-defined]
        del fields["duration_ms"]
        out.append((r.status_code, r.json(), r.headers.get("retry-after"), fields))
    return out


def request_counts(app: FastAPI) -> dict[tuple[str, ...], float]:
    """The request histogram's count per (method, route, status)."""
    counts = {}
    for metric in app.state.metrics.request_seconds.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count"):
                labels = sample.labels
                counts[(labels["method"], labels["route"], labels["status"])] = sample.value
    return counts


def test_the_gateway_path_answers_records_and_logs_as_the_fastapi_routes(
    app: FastAPI, client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="portal.api.access")
    # Holds no request: past the checks, with no replica ready, a 503 at once.
    body = {**service_body(), "hold": {"max_requests": 0}}
    r = client.post("/api/v1/services", json=body, headers=auth("alice"))
    assert r.status_code == 201, r.text
    before = request_counts(app)
    with_it = answers(client, caplog)
    counted = request_counts(app)
    assert app.user_middleware[0].cls is GatewayASGI
    app.user_middleware = [m for m in app.user_middleware if m.cls is not GatewayASGI]
    app.middleware_stack = None  # rebuilt without it on the next request
    without = answers(client, caplog)
    assert with_it == without
    assert [a[0] for a in with_it] == STATUSES
    fields = [body.get("field") for status, body, *_ in with_it if status == 422]
    assert fields == ["tenant", "service", "tenant"]
    held = with_it[STATUSES.index(503)]
    assert held[2] is not None and int(held[2]) > 0  # Retry-After
    assert held[3]["caller"] == "alice"
    assert held[3]["route"] == "/gateway/{tenant}/{service}/v1/completions"
    # Both ways recorded the same requests under the same labels.
    added = {k: v - before.get(k, 0) for k, v in counted.items() if v != before.get(k, 0)}
    again = {k: v - counted.get(k, 0) for k, v in request_counts(app).items()}
    assert added == {k: v for k, v in again.items() if v}
    assert added[("GET", "/gateway/{tenant}/{service}/v1/models", "200")] == 1


def test_the_gateway_path_takes_its_three_operations_only() -> None:
    def asked(method: str, path: str, root_path: str = "") -> Operation | None:
        scope = {"type": "http", "method": method, "path": path, "root_path": root_path}
        found = operation(scope)
        return None if found is None else found[0]

    base = "/gateway/team-a/llm/v1"
    assert asked("GET", f"{base}/models") is Operation.MODELS
    assert asked("POST", f"{base}/chat/completions") is Operation.CHAT
    assert asked("POST", f"{base}/completions") is Operation.COMPLETIONS
    # Under a mount (a hub service's prefix): the path inside the app.
    assert asked("POST", f"/svc/portal{base}/completions", "/svc/portal") is Operation.COMPLETIONS
    assert operation({"type": "http", "method": "GET", "path": f"{base}/models"}) == (
        Operation.MODELS,
        "team-a",
        "llm",
    )
    for method, path in [
        ("POST", f"{base}/models"),
        ("GET", f"{base}/completions"),
        ("POST", f"{base}/completions/x"),
        ("POST", "/gateway/team-a//v1/completions"),
        ("POST", "/gateway/team-a/v1/completions"),
        ("POST", "/api/v1/gateway/team-a/llm/v1/completions"),
        ("POST", f"/svc/portal{base}/completions"),  # not under this app's root path
    ]:
        assert asked(method, path) is None, (method, path)
