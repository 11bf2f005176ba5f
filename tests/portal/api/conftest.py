"""An API over a real allocator on a real SQLite store, with tokens from a dict."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, hgx

S = Scope


def user(name: str, groups: set[str], *scopes: str) -> Caller:
    return Caller(name, CallerKind.USER, frozenset(scopes), frozenset(groups))


def member_of(tenant: str) -> tuple[str, ...]:
    """The scopes a tenant member's role grants: spend, and read their tenant."""
    return (
        S.WORKLOADS_WRITE,
        f"{S.WORKLOADS_READ}!group={tenant}",
        f"{S.QUEUE_READ}!group={tenant}",
        f"{S.QUOTAS_READ}!group={tenant}",
        f"{S.USAGE_READ}!group={tenant}",
        f"{S.SERVICES_CALL}!group={tenant}",
    )


def admin_of(tenant: str) -> tuple[str, ...]:
    return (*member_of(tenant), f"{S.QUOTAS_WRITE}!group={tenant}")


TOKENS: dict[str, Caller] = {
    "root": Caller("portal-admin", CallerKind.SERVICE, frozenset({S.ADMIN})),
    "alice": user("alice", {"team-a"}, *member_of("team-a")),
    "bob": user("bob", {"team-b"}, *member_of("team-b")),
    "anna": user("anna", {"team-a"}, *admin_of("team-a")),
    "nobody": user("nobody", set()),
}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"token {token}"}


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """The allocator's database: SQLite here; a module overrides it with ``db_url`` to run on
    SQLite and PostgreSQL."""
    return f"sqlite:///{tmp_path / 'portal.db'}"


@pytest.fixture
def allocator(store_url: str) -> Iterator[Allocator]:
    store = Store(store_url)
    alloc = Allocator(store, clock=ManualClock())
    alloc.start([hgx("n1")])
    alloc.set_tenant("team-a")
    alloc.set_tenant("team-b")
    # team-a's admins may raise it to 4 guaranteed, 6 limit; team-b's stays as given.
    alloc.set_quota(
        "team-a", "H100-80GB", guaranteed=2, limit=2, ceiling_guaranteed=4, ceiling_limit=6
    )
    alloc.set_quota("team-b", "H100-80GB", guaranteed=2, limit=4)
    yield alloc
    store.close()


@pytest.fixture
def app(allocator: Allocator) -> FastAPI:
    return create_app(allocator, StaticAuthenticator(TOKENS))


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


def gpu_request(tenant: str = "team-a", n: int = 1, name: str = "nb") -> dict[str, object]:
    return {"tenant": tenant, "name": name, "devices": {"kind": "gpu", "count": n}}


def job_body(tenant: str = "team-a", members: int = 1, n: int = 1) -> dict[str, object]:
    return {
        "tenant": tenant,
        "name": "train",
        "members": members,
        "devices": {"kind": "gpu", "count": n},
        "command": ["python", "train.py"],
    }


def service_body(
    tenant: str = "team-a", name: str = "llm", min_: int = 1, max_: int = 2
) -> dict[str, object]:
    return {
        "tenant": tenant,
        "name": name,
        "engine": {"preset": "test"},
        "model": {"uri": "file:///models/tiny", "digest": "sha256:" + "ab" * 32},
        "devices": {"kind": "gpu", "count": 1},
        "replicas": {"min": min_, "max": max_},
    }
