"""``GET /api/v1/services/cache`` over a real allocator, store (SQLite and PostgreSQL) and
weight cache: each tenant sees its own entries, the platform admin all, and naming another
tenant is a 403."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from policies.services import ModelRef
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from portal.inference.backend import ServiceBackend
from portal.inference.controller import ServiceController
from portal.inference.digest import folder_digest
from portal.inference.spec import Backend
from portal.inference.weights import WeightCache
from tests.portal.api.conftest import TOKENS, auth
from tests.portal.jobs.conftest import FakeRunner


@pytest.fixture
def store_url(db_url: str) -> str:
    return db_url


@pytest.fixture
def client(allocator: Allocator, tmp_path: Path) -> Iterator[TestClient]:
    weights = WeightCache(tmp_path / "cache", node_bytes=10_000, tenant_bytes=5_000)
    for tenant in ("team-a", "team-b"):
        src = tmp_path / tenant
        src.mkdir()
        (src / "w.bin").write_bytes(tenant.encode() * 10)
        model = ModelRef(src.as_uri(), folder_digest(src))
        weights.ensure("n1", tenant, model, (), datetime(2026, 1, 1, tzinfo=UTC))
    backend = ServiceBackend(Backend.LOCAL, FakeRunner(tmp_path), tmp_path, weights=weights)
    controller = ServiceController(allocator, backend=backend)
    app = create_app(allocator, StaticAuthenticator(TOKENS), service_controller=controller)
    with TestClient(app) as c:
        yield c


def test_a_tenant_sees_its_own_cache_entries_and_the_admin_all(client: TestClient) -> None:
    r = client.get("/api/v1/services/cache", headers=auth("alice"))
    assert r.status_code == 200, r.text
    (row,) = r.json()["items"]
    assert (row["tenant"], row["node"], row["size_bytes"], row["in_use"]) == (
        "team-a", "n1", 60, False,
    )  # fmt: skip
    assert row["digest"].startswith("sha256:")
    r = client.get("/api/v1/services/cache", headers=auth("root"))
    assert sorted(i["tenant"] for i in r.json()["items"]) == ["team-a", "team-b"]
    r = client.get("/api/v1/services/cache?node=n2", headers=auth("root"))
    assert r.json()["items"] == []


def test_another_tenants_cache_listing_is_forbidden(client: TestClient) -> None:
    r = client.get("/api/v1/services/cache?tenant=team-b", headers=auth("alice"))
    assert r.status_code == 403
    assert "team-a" not in r.text
    r = client.get("/api/v1/services/cache", headers=auth("nobody"))
    assert r.status_code in (200, 403) and "team-b" not in r.text
    r = client.get("/api/v1/services/cache?tenant=Bad%20Name", headers=auth("root"))
    assert r.status_code == 422 and "tenant" in r.text
