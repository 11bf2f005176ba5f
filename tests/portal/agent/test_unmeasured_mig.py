"""An A100 in MIG mode (no GPU Performance Monitoring, so no utilization figure) end to end:
fake NVML → the agent → the real ingest API → the real store and alert service → the API.

Its health and memory arrive and alert like any GPU's; the instance a notebook holds is not
measured, so it is never judged idle (an idle rule with no ``for`` would fire at once on 0 %).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from policies.alerts import IdleRule, IdleSettings, XidRule
from policies.flavors import FlavorKind
from policies.requests import DeviceRequest, WorkloadRequest
from portal.agent.attribution import ProcessAttributor
from portal.agent.reporter import Reporter
from portal.agent.run import Agent, NvmlSource
from portal.alerting.service import AlertService
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import Caller, CallerKind, Scope, StaticAuthenticator
from portal.api.telemetry import use_telemetry
from portal.inventory import nvml
from portal.store.writer import Store
from portal.telemetry.service import Telemetry
from tests.portal.allocator.conftest import ManualClock
from tests.support import fake_nvml
from tests.support.fake_nvml import FakeMachine, FakeProcess

TOKENS = {
    "agent": Caller("node-agent", CallerKind.SERVICE, frozenset({Scope.TELEMETRY_WRITE})),
    "root": Caller("ops", CallerKind.USER, frozenset({Scope.ADMIN})),
}
ROOT = {"Authorization": "token root"}


class A100Portal:
    def __init__(self, tmp_path: Path, machine: FakeMachine) -> None:
        self.machine = machine
        self.store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
        self.alloc = Allocator(self.store, clock=ManualClock())
        self.alloc.start([nvml.discover("gpu-1")])
        self.alloc.set_tenant("team-a")
        self.alloc.set_quota("team-a", "A100-80GB/3g.40gb", guaranteed=1, limit=1)
        request = DeviceRequest(
            FlavorKind.MIG, mig_profile="3g.40gb", models=frozenset({"A100-80GB"})
        )
        self.workload = self.alloc.request(WorkloadRequest("team-a", "alice", "nb", request)).id
        # The notebook (pid 300) holds 20 GiB of the 3g.40gb instance it was given.
        (placed,) = self.alloc.status(self.workload).allocations
        assert placed.gpu_uuids == ("MIG-a100-0-3g",)
        gpu0 = machine.gpus[0]
        gpu0.instances[0].usage.memory_used_mib = 20_000
        gpu0.usage.processes = (FakeProcess(300, 20_000, instance=0),)
        gpu0.usage.memory_used_mib, gpu0.usage.temperature_c = 21_000, 70
        proc = tmp_path / "proc" / "300"
        proc.mkdir(parents=True)
        proc.joinpath("environ").write_bytes(f"GPUPORTAL_WORKLOAD_ID={self.workload}\0".encode())
        self.source = NvmlSource("gpu-1", ProcessAttributor(tmp_path / "proc"))
        self.telemetry = Telemetry(self.alloc, attribution_ttl_s=0)
        self.app = create_app(self.alloc, StaticAuthenticator(TOKENS))
        use_telemetry(self.app, self.telemetry)


def raw_points(client: TestClient, **which: str) -> list[tuple[object, object]]:
    """(utilization, memory) of the raw points of one device or workload, last ten minutes."""
    r = client.get(
        "/api/v1/telemetry/series",
        params={**which, "resolution": "raw", "start": time.time() - 600},
        headers=ROOT,
    )
    assert r.status_code == 200, r.text
    points = r.json()["series"][0]["points"]
    return [(p["utilization_avg"], p["memory_used_avg"]) for p in points]


@pytest.fixture
def portal(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[A100Portal]:
    machine = fake_nvml.a100_mig()
    fake_nvml.install(monkeypatch, machine)
    p = A100Portal(tmp_path, machine)
    yield p
    p.source.close()
    p.store.close()


def test_an_a100_mig_xid_alerts_through_the_api_and_its_unmeasured_instance_is_not_idle(
    portal: A100Portal,
) -> None:
    service = AlertService(
        portal.alloc, rules=(IdleRule(IdleSettings(for_s=0)), XidRule()), interval_s=60
    )
    with TestClient(portal.app) as client:
        reporter = Reporter(client, "agent")
        agent = Agent(portal.source, reporter.submit, reporter.flush)
        # GPU 0 and its 4 instances, GPU 1 (MIG mode, no instances), GPUs 2 and 3.
        assert agent.tick() == 8
        assert reporter.stats.last_result is not None
        assert (reporter.stats.last_result.accepted, reporter.stats.last_result.rejected) == (8, 0)
        assert service.evaluate(time.time() + 0.001) == ()  # no XID yet; not idle: unmeasured

        portal.machine.gpus[0].usage.xids.append(79)  # fell off the bus
        time.sleep(0.01)
        agent.tick()
        fired = service.evaluate(time.time() + 0.001)
        assert [(t.alert.key.rule, t.alert.key.scope) for t in fired] == [("xid", "GPU-a100-0")]

        alerts = client.get("/api/v1/alerts", headers=ROOT)
        assert alerts.status_code == 200, alerts.text
        assert [(a["rule"], a["subject"], a["state"]) for a in alerts.json()["items"]] == [
            ("xid", "GPU-a100-0", "firing")
        ]
        # The instance's memory reaches its device and its workload, without a utilization.
        instance = raw_points(client, device="GPU-a100-0/gi1")
        mine = raw_points(client, workload_id=portal.workload)
        portal.telemetry.store.roll_up(time.time() + 120)
        devices = client.get(
            "/api/v1/telemetry/devices", params={"start": time.time() - 600}, headers=ROOT
        )
    assert instance == mine == [(None, 20_000)] * 2
    assert devices.status_code == 200, devices.text
    latest = {d["device"]: d["utilization_avg"] for d in devices.json()["devices"]}
    assert latest["GPU-a100-0"] is None and latest["GPU-a100-0/gi1"] is None
    assert latest["GPU-a100-2"] == 0
