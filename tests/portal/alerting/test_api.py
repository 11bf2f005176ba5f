"""``GET /api/v1/alerts`` shows each caller the alerts they may see."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from policies.alerts import Alert, AlertKey, AlertState
from portal.alerting.store import AlertStore, alert_id
from portal.api import create_app
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from tests.portal.telemetry.conftest import T0, make_portal

S = Scope


def member(name: str, tenant: str, *more: str) -> Caller:
    scopes = frozenset({f"{S.WORKLOADS_READ}!group={tenant}", *more})
    return Caller(name, CallerKind.USER, scopes, frozenset({tenant}))


TOKENS = {
    "alice": member("alice", "team-a"),
    "anna": member("anna", "team-a", f"{S.QUOTAS_WRITE}!group=team-a"),
    "bob": member("bob", "team-b"),
    "root": Caller("ops", CallerKind.USER, frozenset({S.ADMIN})),
}


def alert(rule: str, subject: str, tenant: str | None, owner: str | None, **kw: object) -> Alert:
    return Alert(
        key=AlertKey(rule, f"GPU-{subject}", subject),
        state=AlertState.FIRING,
        tenant=tenant,
        owner=owner,
        workloads=(subject,) if owner else (),
        summary=f"{rule} on {subject}",
        value=1.0,
        active_since=T0,
        fired_at=T0 + 60,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    p = make_portal(f"sqlite:///{tmp_path / 'portal.db'}")
    AlertStore(p.store.engine).save(
        [
            alert("idle", "w-alice", "team-a", "alice"),
            alert("idle", "w-carol", "team-a", "carol"),
            alert("idle", "w-bob", "team-b", "bob"),
            alert("xid", "n1-0", None, None),
            replace_state(alert("idle", "w-old", "team-a", "alice")),
        ]
    )
    with TestClient(create_app(p.alloc, StaticAuthenticator(TOKENS))) as c:
        yield c
    p.store.close()


def replace_state(a: Alert) -> Alert:
    return replace(a, state=AlertState.INACTIVE)


def subjects(client: TestClient, token: str, **params: object) -> list[str]:
    r = client.get("/api/v1/alerts", params=params, headers={"Authorization": f"token {token}"})
    assert r.status_code == 200, r.text
    return sorted(a["subject"] for a in r.json()["items"])


def test_members_see_their_own_admins_their_tenant_and_operators_everything(
    client: TestClient,
) -> None:
    assert subjects(client, "alice") == ["w-alice"]
    assert subjects(client, "anna") == ["w-alice", "w-carol"]
    assert subjects(client, "bob") == ["w-bob"]
    assert subjects(client, "root") == ["n1-0", "w-alice", "w-bob", "w-carol"]
    assert subjects(client, "root", tenant="team-b") == ["w-bob"]
    assert subjects(client, "root", state="inactive") == ["w-old"]
    assert subjects(client, "root", rule="xid") == ["n1-0"]
    assert subjects(client, "root", state="resolved") == []


def test_a_stored_alert_reads_back_whole_and_other_tenants_are_refused(
    client: TestClient,
) -> None:
    r = client.get("/api/v1/alerts", headers={"Authorization": "token alice"})
    (item,) = r.json()["items"]
    key = AlertKey("idle", "GPU-w-alice", "w-alice")
    assert item == {
        "id": alert_id(key, T0),
        "rule": "idle",
        "scope": "GPU-w-alice",
        "subject": "w-alice",
        "state": "firing",
        "tenant": "team-a",
        "owner": "alice",
        "workloads": ["w-alice"],
        "summary": "idle on w-alice",
        "value": 1.0,
        "active_since": "2026-11-02T09:00:00Z",
        "fired_at": "2026-11-02T09:01:00Z",
        "resolved_at": None,
    }
    r = client.get(
        "/api/v1/alerts", params={"tenant": "team-b"}, headers={"Authorization": "token alice"}
    )
    assert r.status_code == 403
    r = client.get(
        "/api/v1/alerts", params={"state": "sleeping"}, headers={"Authorization": "token root"}
    )
    assert r.status_code == 422 and r.json()["field"] == "state.0"
