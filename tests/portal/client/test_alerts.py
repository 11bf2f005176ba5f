"""``Portal.alerts`` over alerts saved as the alert service saves them."""

from __future__ import annotations

import pytest

from policies.alerts import Alert, AlertKey, AlertState
from portal.alerting.store import AlertStore
from portal.client import AsyncPortal, Portal
from tests.portal.client.conftest import Served

T0 = 1_793_000_000.0  # 2026-10-26 (epoch s)


def alert(
    rule: str, subject: str, tenant: str | None, owner: str | None, since: float, **kw: object
) -> Alert:
    return Alert(
        key=AlertKey(rule, f"node:n1/{subject}", subject),
        state=kw.pop("state", AlertState.FIRING),  # type: ignore[arg-type]
        tenant=tenant,
        owner=owner,
        workloads=(subject,) if owner else (),
        summary=f"{rule} on {subject}",
        value=0.5,
        active_since=since,
        fired_at=since + 60,
    )


@pytest.fixture
def stored(portal_server: Served) -> Served:
    AlertStore(portal_server.allocator.store.engine).save(
        [
            alert("idle", "w-alice", "team-a", "alice", T0),
            alert("idle", "w-carol", "team-a", "carol", T0 + 10),
            alert("noisy_neighbour", "w-bob", "team-b", "bob", T0 + 20),
            alert("xid", "n1-0", None, None, T0 + 30, state=AlertState.PENDING),
        ]
    )
    return portal_server


def test_who_sees_which_alerts(stored: Served) -> None:
    with Portal(stored.url, "root", page_size=1) as root:
        assert sorted(a.subject for a in root.alerts()) == ["n1-0", "w-alice", "w-bob", "w-carol"]
        assert [a.subject for a in root.alerts(states=["pending"])] == ["n1-0"]
        assert [a.subject for a in root.alerts(rule="noisy_neighbour")] == ["w-bob"]
    with Portal(stored.url, "alice") as alice:
        assert [(a.subject, a.owner, a.state) for a in alice.alerts()] == [
            ("w-alice", "alice", AlertState.FIRING)
        ]
    with Portal(stored.url, "anna") as anna:  # team-a's admin
        assert sorted(a.subject for a in anna.alerts("team-a")) == ["w-alice", "w-carol"]


async def test_async_alerts(stored: Served) -> None:
    async with AsyncPortal(stored.url, "bob") as bob:
        assert [a.rule for a in await bob.alerts()] == ["noisy_neighbour"]
