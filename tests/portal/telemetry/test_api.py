"""The telemetry routes over a real allocator and SQLite store: ingest, 422s, scoped reads."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from portal.api import create_app
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from portal.api.telemetry import use_telemetry
from portal.telemetry.service import Telemetry
from tests.portal.telemetry.conftest import T0, Portal, make_portal, sample

S = Scope
TOKENS = {
    "agent": Caller("node-agent", CallerKind.SERVICE, frozenset({S.TELEMETRY_WRITE})),
    "agent-a": Caller(
        "half-agent", CallerKind.SERVICE, frozenset({f"{S.TELEMETRY_WRITE}!group=team-a"})
    ),
    "alice": Caller(
        "alice", CallerKind.USER, frozenset({f"{S.USAGE_READ}!group=team-a"}), frozenset({"team-a"})
    ),
    "bob": Caller(
        "bob", CallerKind.USER, frozenset({f"{S.USAGE_READ}!group=team-b"}), frozenset({"team-b"})
    ),
    "ops": Caller("ops", CallerKind.SERVICE, frozenset({S.USAGE_READ})),
}


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Portal, TestClient, Clock]]:
    p = make_portal(f"sqlite:///{tmp_path / 'portal.db'}")
    clock = Clock(T0 + 30)
    app = create_app(p.alloc, StaticAuthenticator(TOKENS))
    use_telemetry(app, Telemetry(p.alloc, clock=clock, attribution_ttl_s=0))
    with TestClient(app) as client:
        yield p, client, clock
    p.store.close()


def h(token: str) -> dict[str, str]:
    return {"Authorization": f"token {token}"}


def post(client: TestClient, token: str, *samples: dict[str, object]) -> dict[str, object]:
    r = client.post(
        "/api/v1/telemetry/samples",
        json={"node": "n1", "source": "nvml", "samples": list(samples)},
        headers=h(token),
    )
    assert r.status_code == 200, r.text
    body: dict[str, object] = r.json()
    return body


def test_an_agent_posts_samples_and_gets_counts_and_reasons(
    setup: tuple[Portal, TestClient, Clock],
) -> None:
    _, client, _ = setup
    body = post(
        client,
        "agent",
        sample("GPU-n1-0", T0 + 10),
        sample("GPU-n1-0", T0 + 10),
        sample("GPU-unknown", T0 + 10),
    )
    assert body["accepted"] == 1 and body["duplicates"] == 1 and body["rejected"] == 1
    assert body["rejections"] == [
        {
            "index": 2,
            "device": "GPU-unknown",
            "reason": "unknown GPU GPU-unknown: not in the portal's inventory",
        }
    ]


def test_a_malformed_batch_is_refused_whole_with_the_field_named(
    setup: tuple[Portal, TestClient, Clock],
) -> None:
    p, client, clock = setup
    r = client.post(
        "/api/v1/telemetry/samples",
        json={
            "node": "n1",
            "source": "nvml",
            "samples": [sample("GPU-n1-0", T0 + 1), sample("GPU-n1-1", T0 + 1, util=101)],
        },
        headers=h("agent"),
    )
    assert r.status_code == 422
    err = r.json()
    assert err["code"] == "invalid" and err["field"] == "samples.1.utilization_pct"
    assert "less than or equal to 100" in err["message"]
    # Nothing of the batch was stored, not even its good first sample.
    clock.now = T0 + 3600
    p.telemetry.roll_up(clock.now)
    r = client.get(
        "/api/v1/telemetry/series",
        params={"device": "GPU-n1-0", "start": T0, "end": T0 + 3600, "resolution": "raw"},
        headers=h("ops"),
    )
    assert r.json()["series"][0]["points"] == []


def test_an_agent_token_filtered_to_one_tenant_may_not_post(
    setup: tuple[Portal, TestClient, Clock],
) -> None:
    _, client, _ = setup
    r = client.post(
        "/api/v1/telemetry/samples",
        json={"node": "n1", "source": "nvml", "samples": []},
        headers=h("agent-a"),
    )
    assert r.status_code == 403 and "needs it unfiltered" in r.json()["message"]


def read_series(client: TestClient, token: str, **params: object) -> tuple[int, dict[str, Any]]:
    r = client.get("/api/v1/telemetry/series", params=params, headers=h(token))
    return r.status_code, r.json()


def test_series_are_scoped_to_the_callers_tenants(
    setup: tuple[Portal, TestClient, Clock],
) -> None:
    p, client, clock = setup
    wa = p.gpus("team-a", 1, owner="alice")
    wb = p.gpus("team-b", 1, owner="bob")
    (ga,), (gb,) = p.devices_of(wa), p.devices_of(wb)
    post(client, "agent", sample(ga, T0 + 10, util=80.0), sample(gb, T0 + 10, util=20.0))
    clock.now = T0 + 60
    p.telemetry.roll_up(clock.now)

    def get(token: str, **params: object) -> tuple[int, dict[str, Any]]:
        return read_series(client, token, **{"start": T0, "end": T0 + 60, **params})

    status, body = get("alice", workload_id=wa)
    assert status == 200
    assert body["series"] == [
        {
            "device": None,
            "workload_id": wa,
            "points": [
                {
                    "at": T0,
                    "samples": 1,
                    "utilization_avg": 80.0,
                    "utilization_min": 80.0,
                    "utilization_max": 80.0,
                    "memory_used_avg": 1000.0,
                    "memory_used_max": 1000.0,
                    "activity_avg": None,
                    "power_avg": None,
                    "power_max": None,
                    "temperature_max": None,
                }
            ],
        }
    ]
    assert get("alice", device=ga)[0] == 200
    assert get("alice", workload_id=wb)[0] == 403
    status, body = get("alice", device=gb)
    assert status == 403 and "not held by a workload of your tenants" in str(body["message"])
    # Without a selector: every live workload the caller may see.
    assert [s["workload_id"] for s in get("alice")[1]["series"]] == [wa]
    assert {s["workload_id"] for s in get("ops")[1]["series"]} == {wa, wb}
    status, body = get("ops", device=ga, workload_id=wa)
    assert status == 422
    status, body = get("ops", start=T0 + 60, end=T0)
    assert status == 422 and body["field"] == "time range"


def test_latest_device_minutes_are_scoped_like_device_series(
    setup: tuple[Portal, TestClient, Clock],
) -> None:
    p, client, clock = setup
    wa = p.gpus("team-a", 1, owner="alice")
    wb = p.gpus("team-b", 1, owner="bob")
    (ga,), (gb,) = p.devices_of(wa), p.devices_of(wb)
    idle = next(f"GPU-n1-{i}" for i in range(8) if f"GPU-n1-{i}" not in (ga, gb))
    # ga: 80 % then 40 % (two minutes: the latest counts); gb: 20 % in the first minute only;
    # a GPU nobody holds: 5 %. Each minute averages its samples (40 and 60 -> 50 for idle).
    post(
        client,
        "agent",
        sample(ga, T0 + 10, util=80.0),
        sample(gb, T0 + 10, util=20.0, memory_used_mib=3000.0),
        sample(ga, T0 + 70, util=40.0),
        sample(idle, T0 + 70, util=40.0),
        sample(idle, T0 + 80, util=60.0),
    )
    clock.now = T0 + 120
    p.telemetry.roll_up(clock.now)

    def get(token: str, **params: object) -> tuple[int, dict[str, Any]]:
        q = {"start": T0, "end": T0 + 120, **params}
        r = client.get("/api/v1/telemetry/devices", params=q, headers=h(token))
        return r.status_code, r.json()

    status, body = get("ops")
    assert status == 200
    got = {
        d["device"]: (d["node"], d["at"], d["samples"], d["utilization_avg"])
        for d in body["devices"]
    }
    assert got == {
        ga: ("n1", T0 + 60, 1, 40.0),
        gb: ("n1", T0, 1, 20.0),
        idle: ("n1", T0 + 60, 2, 50.0),
    }
    assert next(d for d in body["devices"] if d["device"] == gb)["memory_used_avg"] == 3000.0
    assert all(d["gpu_uuid"] == d["device"] for d in body["devices"])
    # Filtered callers: only the GPUs their tenants' workloads hold.
    assert [d["device"] for d in get("alice")[1]["devices"]] == [ga]
    assert [d["device"] for d in get("bob")[1]["devices"]] == [gb]
    # The window: only minutes starting in [start, end).
    assert {d["device"] for d in get("ops", start=T0 + 60)[1]["devices"]} == {ga, idle}
    assert get("ops", start=T0 + 120, end=T0 + 180)[1]["devices"] == []
    status, body = get("ops", start=T0, end=T0 + 7200)
    assert status == 422 and body["field"] == "time range" and "3600" in body["message"]
    assert get("agent")[0] == 403


@pytest.mark.parametrize("route", ["series", "devices"])
@pytest.mark.parametrize("bound", ["start", "end"])
def test_a_time_past_the_year_2286_is_a_422_not_a_500(
    setup: tuple[Portal, TestClient, Clock], route: str, bound: str
) -> None:
    # Found by the API fuzz test: milliseconds of such a time overflow SQLite's integers.
    _, client, _ = setup
    params = {bound: 9223372036854776.0}
    r = client.get(f"/api/v1/telemetry/{route}", params=params, headers=h("ops"))
    assert r.status_code == 422
    assert bound in r.text


def test_the_list_of_series_narrows_to_a_tenant_and_an_owner_within_the_scope(
    setup: tuple[Portal, TestClient, Clock],
) -> None:
    p, client, clock = setup
    wa = p.gpus("team-a", 1, owner="alice")
    wa2 = p.gpus("team-a", 1, owner="carol")
    wb = p.gpus("team-b", 1, owner="bob")
    clock.now = T0 + 60

    def get(token: str, **params: object) -> tuple[int, dict[str, Any]]:
        return read_series(client, token, **{"start": T0, "end": T0 + 60, **params})

    def listed(token: str, **params: object) -> set[str]:
        status, body = get(token, **params)
        assert status == 200, body
        return {s["workload_id"] for s in body["series"]}

    assert listed("ops") == {wa, wa2, wb}
    assert listed("ops", tenant="team-b") == {wb}
    assert listed("ops", tenant="team-a", owner="carol") == {wa2}
    assert listed("alice", owner="alice") == {wa}
    assert listed("alice", owner="bob") == set()  # bob's are team-b's: not alice's to see
    # Another tenant's name is refused, an unknown one is not found (after the scope check).
    assert get("alice", tenant="team-b")[0] == 403
    assert get("ops", tenant="team-z")[0] == 404
    status, body = get("ops", tenant="team-a", workload_id=wa)
    assert status == 422 and "tenant and owner only with neither" in body["message"]
