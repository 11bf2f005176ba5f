"""Who is told what: a noisy neighbour's victim and the offender each see their own alert through
the API, neither the other's identity; summaries and webhook payloads name workloads and GPUs
as people know them, and an XID alert its code and meaning."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from policies.alerts import AlertState
from portal.alerting.webhook import payload
from portal.api import create_app
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from tests.portal.alerting.conftest import Scenario, gpu, t4

FIRING = AlertState.FIRING


def member(name: str, tenant: str) -> Caller:
    return Caller(
        name,
        CallerKind.USER,
        frozenset({f"{Scope.WORKLOADS_READ}!group={tenant}"}),
        frozenset({tenant}),
    )


def listed(scenario: Scenario, who: str, tenant: str) -> list[dict[str, object]]:
    app = create_app(scenario.portal.alloc, StaticAuthenticator({who: member(who, tenant)}))
    with TestClient(app) as c:
        r = c.get("/api/v1/alerts", headers={"Authorization": f"token {who}"})
    assert r.status_code == 200, r.text
    items: list[dict[str, object]] = r.json()["items"]
    return items


def test_the_victim_of_a_noisy_neighbour_is_told_and_neither_side_sees_the_other(
    scenario: Scenario,
) -> None:
    # A T4 shared half and half: alice (team-a) at 30 % for ten minutes, then 5 % while bob
    # (team-b) takes 95 % of the GPU's SM time and 9,000 MiB from minute 10.
    p = scenario.portal
    alice = p.share("team-a", 500, owner="alice", name="alice/infer")
    bob = p.share("team-b", 500, owner="bob", name="bob/train")
    (g,) = p.devices_of(alice)
    assert p.devices_of(bob) == [g]
    scenario.start()

    def minute(k: int) -> list[tuple[str, dict[str, object]]]:
        ua, ub, mb = (30.0, 20.0, 3000.0) if k < 10 else (5.0, 95.0, 9000.0)
        procs = [
            {"workload_id": alice, "sm_util_pct": ua, "memory_used_mib": 2000.0},
            {"workload_id": bob, "sm_util_pct": ub, "memory_used_mib": mb},
        ]
        return [("n2", t4(g, min(100.0, ua + ub), procs, memory_used_mib=2000.0 + mb))]

    scenario.run(range(17), minute)
    # Crowded from minute 10's samples: both pending at 11, firing 5 minutes later at 16.
    assert scenario.times("noisy_neighbour", FIRING) == [16]
    assert scenario.times("slowed_by_neighbour", FIRING) == [16]

    hers = listed(scenario, "alice", "team-a")
    assert [(a["rule"], a["state"], a["workloads"]) for a in hers] == [
        ("slowed_by_neighbour", "firing", [alice])
    ]
    summary = str(hers[0]["summary"])
    assert summary.startswith("alice/infer is slowed by another workload on n2: GPU ")
    assert "fell from 30 % to 5 %" in summary and "another GPU" in summary
    his = listed(scenario, "bob", "team-b")
    assert sorted((a["rule"], tuple(a["workloads"])) for a in his) == [  # type: ignore[arg-type]
        ("memory_over_share", (bob,)),
        ("noisy_neighbour", (bob,)),
    ]
    noisy = next(a for a in his if a["rule"] == "noisy_neighbour")
    assert str(noisy["summary"]).startswith("bob/train uses 95% of n2: GPU ")
    assert "slowing 1 other workload there" in str(noisy["summary"])
    # Neither answer names the other side: workload id, name, owner or tenant.
    assert not any(x in json.dumps(hers) for x in (bob, "bob", "team-b"))
    assert not any(x in json.dumps(his) for x in (alice, "alice", "team-a"))


def test_summaries_and_payloads_name_workloads_and_gpus_and_the_xid_code(
    scenario: Scenario,
) -> None:
    p = scenario.portal
    w = p.gpus("team-a", 1, owner="alice", name="alice/default")
    (g,) = p.devices_of(w)
    index = g.rsplit("-", 1)[1]
    scenario.start()
    scenario.run(
        range(7), lambda k: [("n1", gpu(g, 90.0, xid_count=0 if k < 5 else 1, last_xid=79))]
    )
    (fired,) = [t for t in scenario.log if t.alert.key.rule == "xid"]
    body = payload(fired)
    assert body["summary"] == (
        f"new XID 79 (GPU has fallen off the bus) on n1: GPU {index}; workload alice/default"
    )
    assert body["value"] == 79.0 and body["workloads"] == [w]
    assert w not in str(body["summary"]) and g not in str(body["summary"])
