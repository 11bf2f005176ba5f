"""A caller filtered to tenants reads a device's figures only for the intervals one of its
tenants held that device: a MIG instance itself (not its neighbours on the GPU), a shared GPU's
totals while holding a share, and never the time before or after, when another tenant held it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from policies.flavors import FlavorKind
from policies.inventory import GPU, Node
from policies.mig import MigInstance
from policies.requests import DeviceRequest, WorkloadRequest
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from portal.api.telemetry import use_telemetry
from portal.store.writer import Store
from portal.telemetry.service import Telemetry
from tests.portal.allocator.conftest import ManualClock, hgx, t4
from tests.portal.telemetry.conftest import T0, sample

MIG = "3g.40gb"


def reader(name: str, tenant: str) -> Caller:
    return Caller(
        name,
        CallerKind.USER,
        frozenset({f"{Scope.USAGE_READ}!group={tenant}"}),
        frozenset({tenant}),
    )


TOKENS = {
    "agent": Caller("node-agent", CallerKind.SERVICE, frozenset({Scope.TELEMETRY_WRITE})),
    "alice": reader("alice", "team-a"),
    "bob": reader("bob", "team-b"),
    "ops": Caller("ops", CallerKind.SERVICE, frozenset({Scope.USAGE_READ})),
}


def a100() -> Node:
    layout = tuple(MigInstance(MIG, s, uuid=u) for s, u in ((0, "MIG-first"), (4, "MIG-second")))
    gpu = GPU(0, "A100-80GB", 81920, uuid="GPU-m1-0", mig_enabled=True, mig_layout=layout)
    return Node("m1", (gpu,), cpu_milli=64_000, memory_mib=524_288)


@dataclass
class Setup:
    alloc: Allocator
    clock: ManualClock
    telemetry: Telemetry
    client: TestClient

    def at(self, t: float) -> None:
        self.clock.now = type(self.clock.now).fromtimestamp(t, self.clock.now.tzinfo)

    def ask(self, tenant: str, owner: str, devices: DeviceRequest) -> str:
        return self.alloc.request(WorkloadRequest(tenant, owner, f"{owner}/nb", devices)).id

    def post(self, node: str, *samples: dict[str, object]) -> None:
        r = self.client.post(
            "/api/v1/telemetry/samples",
            json={"node": node, "source": "nvml", "samples": list(samples)},
            headers={"Authorization": "token agent"},
        )
        assert r.status_code == 200 and r.json()["accepted"] == len(samples), r.text

    def get(self, token: str, route: str, **params: object) -> tuple[int, Any]:
        r = self.client.get(
            f"/api/v1/telemetry/{route}", params=params, headers={"Authorization": f"token {token}"}
        )
        return r.status_code, r.json()

    def minutes(self, token: str, device: str, start: float, end: float, **kw: object) -> Any:
        status, body = self.get(token, "series", device=device, start=start, end=end, **kw)
        if status != 200:
            return status
        return [(p["at"] - T0) / 60 for p in body["series"][0]["points"]]


@pytest.fixture
def setup(db_url: str) -> Iterator[Setup]:
    """On SQLite, then on PostgreSQL."""
    store = Store(db_url)
    clock = ManualClock()
    alloc = Allocator(store, clock=clock)
    alloc.start([a100(), t4("n2"), hgx("n1", gpus=1)])
    for t in ("team-a", "team-b"):
        alloc.set_tenant(t)
        alloc.set_quota(t, f"A100-80GB/{MIG}", guaranteed=1, limit=1)
        alloc.set_quota(t, "T4/share", guaranteed=1000, limit=1000)
        # One H100 that each tenant holds in turn (no cohort to borrow in): over-committed.
        alloc.set_quota(t, "H100-80GB", guaranteed=1, limit=1, overcommit=True)
    telemetry = Telemetry(alloc, clock=lambda: clock.now.timestamp(), attribution_ttl_s=0)
    app = create_app(alloc, StaticAuthenticator(TOKENS))
    use_telemetry(app, telemetry)
    with TestClient(app) as client:
        yield Setup(alloc, clock, telemetry, client)
    store.close()


def test_a_mig_instance_is_read_only_by_the_tenant_holding_that_instance(setup: Setup) -> None:
    mig = DeviceRequest(FlavorKind.MIG, mig_profile=MIG, models=frozenset({"A100-80GB"}))
    bob = setup.ask("team-b", "bob", mig)
    alice = setup.ask("team-a", "alice", mig)
    gi = {
        w: 1 if setup.alloc.status(w).allocations[0].gpu_uuids[0] == "MIG-first" else 2
        for w in (alice, bob)
    }
    mine, theirs = f"GPU-m1-0/gi{gi[alice]}", f"GPU-m1-0/gi{gi[bob]}"
    setup.at(T0 + 30)
    setup.post(
        "m1",
        *(
            sample("GPU-m1-0", T0 + 10, util=None, gpu_instance_id=gi[w], mig_uuid=u)
            for w, u in ((alice, "MIG-first" if gi[alice] == 1 else "MIG-second"),
                         (bob, "MIG-first" if gi[bob] == 1 else "MIG-second"))
        ),
        sample("GPU-m1-0", T0 + 10, util=None),  # the GPU itself
    )  # fmt: skip
    setup.at(T0 + 120)
    setup.telemetry.maintain()
    window = {"start": T0, "end": T0 + 120}
    _, everything = setup.get("ops", "devices", **window)
    assert {d["device"] for d in everything["devices"]} == {mine, theirs, "GPU-m1-0"}
    # alice: her instance only, neither bob's nor the GPU's own figures.
    assert [d["device"] for d in setup.get("alice", "devices", **window)[1]["devices"]] == [mine]
    assert [d["device"] for d in setup.get("bob", "devices", **window)[1]["devices"]] == [theirs]
    assert setup.minutes("alice", mine, T0, T0 + 120) == [0]
    assert setup.minutes("alice", theirs, T0, T0 + 120) == 403
    assert setup.minutes("alice", "GPU-m1-0", T0, T0 + 120) == 403
    assert setup.minutes("bob", mine, T0, T0 + 120) == 403


def test_a_share_holder_reads_the_gpus_totals_only_while_holding_a_share(setup: Setup) -> None:
    # bob holds a share of the T4 from minute 0; alice one from minute 10. Before minute 10
    # the GPU's figures are bob's alone: alice reads minutes 10 on, never 0-9.
    share = DeviceRequest(FlavorKind.SHARE, milli=500, models=frozenset({"T4"}))
    bob = setup.ask("team-b", "bob", share)
    (gpu,) = setup.alloc.status(bob).allocations[0].gpu_uuids
    setup.at(T0 + 600)
    alice = setup.ask("team-a", "alice", share)
    assert setup.alloc.status(alice).allocations[0].gpu_uuids == (gpu,)
    setup.at(T0 + 1200)
    procs = [{"workload_id": bob, "sm_util_pct": 40.0, "memory_used_mib": 4000.0}]
    setup.post("n2", *(sample(gpu, T0 + 60 * k + 5, processes=procs) for k in range(19)))
    setup.telemetry.maintain()
    assert setup.minutes("ops", gpu, T0, T0 + 1200) == list(range(19))
    assert setup.minutes("alice", gpu, T0, T0 + 1200) == list(range(10, 19))
    assert setup.minutes("bob", gpu, T0, T0 + 1200) == list(range(19))
    # Raw points likewise, by their time.
    raw = setup.minutes("alice", gpu, T0, T0 + 1200, resolution="raw")
    assert raw == [k + 5 / 60 for k in range(10, 19)]
    # Nothing of bob's own: his workload's series is refused, the device series names nobody.
    status, body = setup.get("alice", "series", workload_id=bob, start=T0, end=T0 + 1200)
    assert status == 403
    _, body = setup.get("alice", "series", device=gpu, start=T0, end=T0 + 1200)
    assert bob not in str(body) and "bob" not in str(body)


def test_a_window_reaching_back_shows_nothing_of_the_previous_holder(setup: Setup) -> None:
    # One H100: bob's from minute 0 to 10:30, then alice's. Minute 10 averages both holders'
    # samples: neither reads it; the hour (both again) neither; each reads their own minutes.
    whole = DeviceRequest(FlavorKind.GPU, count=1, models=frozenset({"H100-80GB"}))
    bob = setup.ask("team-b", "bob", whole)
    (gpu,) = setup.alloc.status(bob).allocations[0].gpu_uuids
    setup.at(T0 + 630)
    setup.alloc.release(bob)
    alice = setup.ask("team-a", "alice", whole)
    assert setup.alloc.status(alice).allocations[0].gpu_uuids == (gpu,)
    setup.at(T0 + 1200)
    setup.post("n1", *(sample(gpu, T0 + 60 * k + 5) for k in range(19)))
    setup.post("n1", *(sample(gpu, T0 + 60 * k + 45) for k in range(19)))
    setup.at(T0 + 3 * 3600)
    setup.telemetry.maintain()
    end = T0 + 1200
    assert setup.minutes("ops", gpu, T0, end) == list(range(19))
    assert setup.minutes("alice", gpu, T0, end) == list(range(11, 19))
    assert setup.minutes("bob", gpu, T0, end) == list(range(10))
    raw = setup.minutes("alice", gpu, T0, end, resolution="raw")
    assert raw[0] == 10 + 45 / 60  # her first sample: 10:45, after she got the GPU at 10:30
    assert setup.minutes("alice", gpu, T0, end, resolution="1h") == []
    assert setup.minutes("ops", gpu, T0, end, resolution="1h") == [0]
    # Before alice got it, nothing of the GPU is hers: refused.
    assert setup.minutes("alice", gpu, T0, T0 + 600) == 403
    # The latest minute (18) is alice's: bob's heatmap no longer shows the GPU.
    window = {"start": end - 120, "end": end}
    assert [d["device"] for d in setup.get("alice", "devices", **window)[1]["devices"]] == [gpu]
    assert setup.get("bob", "devices", **window)[1]["devices"] == []
