"""/metrics: scope-protected, Bearer or token, and its values follow what happens."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from portal.api.metrics import ServiceMetrics
from portal.service.decisions import ReportingStore
from tests.portal.allocator.conftest import ManualClock, hgx

ADMIN = Caller("ops", CallerKind.SERVICE, frozenset({Scope.ADMIN.value}))
SCRAPER = Caller("prom", CallerKind.SERVICE, frozenset({Scope.METRICS_READ.value}))
READER = Caller("r", CallerKind.SERVICE, frozenset({Scope.QUEUE_READ.value}))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    store = ReportingStore(f"sqlite:///{tmp_path / 'portal.db'}")
    alloc = Allocator(store, clock=ManualClock())
    alloc.start([hgx("n1")])
    alloc.set_tenant("team-a")
    alloc.set_quota("team-a", "H100-80GB", guaranteed=2, limit=8)
    metrics = ServiceMetrics(alloc)
    store.listeners.append(lambda outcome, _event: metrics.decided(outcome))
    app = create_app(
        alloc,
        StaticAuthenticator({"root": ADMIN, "prom": SCRAPER, "reader": READER}),
        metrics=metrics,
    )
    with TestClient(app) as c:
        yield c
    store.close()


def scrape(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = client.get("/metrics", headers={"Authorization": "Bearer prom"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def ask(client: TestClient, n: int) -> str:
    body = {"tenant": "team-a", "name": "nb", "devices": {"kind": "gpu", "count": n}}
    r = client.post("/api/v1/workloads", json=body, headers={"Authorization": "token root"})
    assert r.status_code in (201, 202), r.text
    wid: str = r.json()["id"]
    return wid


def decisions(values: dict[tuple[str, tuple[tuple[str, str], ...]], float], outcome: str) -> float:
    return values[("gpuportal_allocator_decisions_total", (("outcome", outcome),))]


def test_metrics_need_their_scope_with_token_or_bearer(client: TestClient) -> None:
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": "token reader"}).status_code == 403
    assert client.get("/metrics", headers={"Authorization": "token prom"}).status_code == 200
    assert client.get("/metrics", headers={"Authorization": "Bearer root"}).status_code == 200


def test_values_follow_requests_decisions_and_the_queue(client: TestClient) -> None:
    before = scrape(client)
    assert decisions(before, "allocated") == 0
    running = ask(client, 6)
    queued = ask(client, 4)  # 6 + 4 > 8 GPUs on the node
    refused = client.post(
        "/api/v1/workloads",
        json={"tenant": "team-a", "name": "x", "devices": {"kind": "gpu", "count": 99}},
        headers={"Authorization": "token root"},
    )
    assert refused.status_code == 422
    after = scrape(client)
    assert decisions(after, "allocated") == 1
    assert decisions(after, "queued") == 1
    assert decisions(after, "refused") == 1
    assert (
        after[("gpuportal_allocated_units", (("flavor", "H100-80GB"), ("tenant", "team-a")))] == 6
    )
    assert after[("gpuportal_borrowed_units", (("flavor", "H100-80GB"), ("tenant", "team-a")))] == 4
    queue_keys = [k for k in after if k[0] == "gpuportal_queue_length"]
    assert [after[k] for k in queue_keys] == [1]
    posts = (
        "gpuportal_http_request_duration_seconds_count",
        (("method", "POST"), ("route", "/api/v1/workloads"), ("status", "201")),
    )
    assert after[posts] == 1

    r = client.delete(f"/api/v1/workloads/{running}", headers={"Authorization": "token root"})
    assert r.status_code == 200
    later = scrape(client)
    assert decisions(later, "released") == 1
    assert decisions(later, "allocated") == 2  # the queued one started on the freed GPUs
    assert [later[k] for k in later if k[0] == "gpuportal_queue_length"] == []
    assert (
        later[("gpuportal_allocated_units", (("flavor", "H100-80GB"), ("tenant", "team-a")))] == 4
    )
    wid_route = (
        "gpuportal_http_request_duration_seconds_count",
        (("method", "DELETE"), ("route", "/api/v1/workloads/{workload_id}"), ("status", "200")),
    )
    assert later[wid_route] == 1
    assert queued


def test_every_route_template_is_a_label_and_unknown_paths_share_one(client: TestClient) -> None:
    client.get(
        "/api/v1/tenants/team-a/quotas/H100-80GB/3g.40gb", headers={"Authorization": "token root"}
    )
    client.get("/no/such/path")
    client.get("/another/unknown")
    text = client.get("/metrics", headers={"Authorization": "Bearer prom"}).text
    assert 'route="/api/v1/tenants/{tenant}/quotas/{flavor}"' in text
    assert len(re.findall(r'_count\{method="GET",route="unmatched",status="404"\} 2\.0', text)) == 1
