"""A noisy neighbour seen in the served dashboards: samples through the real ingest API, the
real alert service, then Chromium. The victim (alice) finds her alert in My work and the Tenant
view, the offender (bob) his in My work; neither page names the other side."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from dashboards.app import Settings, serve
from dashboards.auth import TokenArgIdentity
from policies.flavors import FlavorKind
from policies.requests import DeviceRequest, WorkloadKind, WorkloadRequest
from portal.alerting.service import AlertService
from tests.dashboards.conftest import Portal, running_portal
from tests.dashboards.seed import NOW, VIEWERS
from tests.dashboards.test_browser import WAIT_MS, row
from tests.support.browser import chromium
from tests.support.ports import free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@dataclass
class Crowded:
    url: str
    portal: Portal
    alice: str  # infer-a, 250 milli of a T4
    bob: str  # share-b, 500 milli of the same T4


def crowd(portal: Portal) -> tuple[str, str, str, str]:
    """bob's share next to alice's infer-a; 20 minutes of samples, crowded from minute 10,
    evaluated by the alert service each minute. Returns both ids, the node and GPU index."""
    alloc = portal.allocator
    alice = next(w for w in alloc.workloads() if w.name == "infer-a")
    alloc.set_quota("team-b", "T4/share", guaranteed=500, limit=1000)
    share = DeviceRequest(FlavorKind.SHARE, milli=500, models=frozenset({"T4"}))
    bob = alloc.request(
        WorkloadRequest("team-b", "bob", "share-b", share, kind=WorkloadKind.NOTEBOOK)
    ).id
    (placed,) = alice.allocations
    (gpu,) = placed.gpu_uuids
    assert alloc.status(bob).allocations[0].gpu_uuids == (gpu,)
    service = AlertService(alloc, interval_s=60)
    start = NOW.timestamp() - 1200
    for k in range(18):
        ua, ub, mb = (30.0, 20.0, 3000.0) if k < 10 else (5.0, 95.0, 9000.0)
        procs = [
            {"workload_id": alice.id, "sm_util_pct": ua, "memory_used_mib": 2000.0},
            {"workload_id": bob, "sm_util_pct": ub, "memory_used_mib": mb},
        ]
        sample = {
            "gpu_uuid": gpu,
            "at": start + 60 * k + 30,
            "utilization_pct": min(100.0, ua + ub),
            "memory_used_mib": 2000.0 + mb,
            "memory_total_mib": 15360.0,
            "processes": procs,
        }
        portal.ingest(placed.node, [sample])
        service.evaluate(start + 60 * (k + 1))
    firing = {(a.key.rule, a.owner) for a in service.state.firing()}
    assert {("noisy_neighbour", "bob"), ("slowed_by_neighbour", "alice")} <= firing
    return alice.id, bob, placed.node, str(placed.gpus[0])


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Crowded]:
    with running_portal(tmp_path_factory.mktemp("crowded")) as portal:
        alice, bob, _, _ = crowd(portal)
        port = free_port()
        settings = Settings(
            portal.url, TokenArgIdentity(VIEWERS), refresh_s=1.0, clock=lambda: NOW.timestamp()
        )
        server: Any = serve(settings, port=port, threaded=True)
        try:
            yield Crowded(f"http://127.0.0.1:{port}", portal, alice, bob)
        finally:
            server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    p = browser.new_page(viewport={"width": 1400, "height": 1300})
    yield p
    p.close()


def test_the_victim_sees_her_alert_in_my_work_without_the_neighbour(
    page: Page, crowded: Crowded
) -> None:
    page.goto(f"{crowded.url}/my_work?token=tok-alice", timeout=WAIT_MS)
    cells = row(page, "slowed by neighbour")
    assert cells[1] == "firing"
    assert cells[2].startswith("infer-a is slowed by another workload on t4-1: GPU 0")
    assert "another GPU" in cells[2]
    text = page.content()
    assert not any(x in text for x in ("share-b", crowded.bob, "bob", "team-b"))
    assert "noisy neighbour" not in page.locator("table.gp-table").all_inner_texts()[-1]


def test_the_offender_sees_his_alert_in_my_work_without_the_victim(
    page: Page, crowded: Crowded
) -> None:
    page.goto(f"{crowded.url}/my_work?token=tok-bob", timeout=WAIT_MS)
    cells = row(page, "noisy neighbour")
    assert cells[1] == "firing"
    assert cells[2].startswith("share-b uses 95% of t4-1: GPU 0 with 50% allocated")
    assert "slowing 1 other workload there" in cells[2]
    expect(page.get_by_text("memory over share").first).to_be_visible()
    text = page.content()
    assert not any(x in text for x in ("infer-a", crowded.alice, "alice", "team-a"))


def test_the_tenant_view_lists_the_victims_alert_for_its_admin(
    page: Page, crowded: Crowded
) -> None:
    page.goto(f"{crowded.url}/tenant?token=tok-anna", timeout=WAIT_MS)
    cells = row(page, "slowed by neighbour")
    assert cells[:3] == ["slowed by neighbour", "firing", "alice"]
    assert "team-b" not in page.content() and "share-b" not in page.content()
