"""The Services section of My work and Tenant against a real portal API with a service
controller over a real allocator. STAND-IN runner, health probe and sleep calls at the process
boundary (as ``tests/portal/inference/test_warm_pool.py``): replicas become ready or asleep
when the test steps the controller, without engine processes or GPUs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from dashboards.app import build_view
from dashboards.services_view import ServicesView, replica_row, service_row
from dashboards.stores import ServicesStore
from policies.errors import Forbidden
from portal.allocator import Allocator
from portal.api.services import ServiceOut
from portal.client import Portal as Client
from portal.inference.backend import ServiceBackend
from portal.inference.controller import ServiceController
from portal.inference.spec import Backend
from tests.dashboards.conftest import Portal, running_portal
from tests.dashboards.seed import NOW, VIEWERS
from tests.dashboards.test_scoping import rendered
from tests.portal.jobs.conftest import FakeRunner

DIGEST = "sha256:" + "0" * 64
H100 = "H100-80GB"


@pytest.fixture
def portal(tmp_path: Path) -> Iterator[Portal]:
    runner = FakeRunner(tmp_path)  # STAND-IN runner: no processes, no GPUs here

    def controller(alloc: Allocator) -> ServiceController:
        backend = ServiceBackend(
            Backend.LOCAL, runner, tmp_path, probe=lambda _url: True, post=lambda _url: True
        )  # STAND-IN probe and sleep calls: every engine answers
        return ServiceController(alloc, backend=backend)

    with running_portal(tmp_path, services=controller) as p:
        yield p


def deploy(token: str, portal: Portal, tenant: str, name: str, **kw: int) -> ServiceOut:
    with Client(portal.url, token) as c:
        return c.services.deploy(
            tenant, name, model_uri="file:///models/tiny", digest=DIGEST, flavor=H100,
            preset="test", **kw,
        ).info  # fmt: skip


def settle(portal: Portal, token: str, done: object) -> list[ServiceOut]:
    """Step the allocator and the controller until ``done(services)`` holds (10 s)."""
    assert portal.services is not None
    deadline = time.monotonic() + 10
    while True:
        portal.allocator.tick()
        portal.services.step()
        with Client(portal.url, token) as c:
            found = [s.info for s in c.services.list()]
        if done(found):  # type: ignore[operator]
            return found
        assert time.monotonic() < deadline, found
        time.sleep(0.02)


def store(portal: Portal, token: str, **kw: object) -> ServicesStore:
    s = ServicesStore(portal.source(token), clock=lambda: portal.clock.now.timestamp(), **kw)
    s.refresh()
    assert s.error == "", s.error
    return s


def rows(s: ServicesStore) -> dict[str, tuple[str, ...]]:
    hours = s.hours
    return {x.name: service_row(x, (hours or {}).get(x.id), hours is not None) for x in s.services}


def by_name(found: list[ServiceOut], name: str) -> ServiceOut:
    return next(s for s in found if s.name == name)


def ready(found: list[ServiceOut]) -> bool:
    llm = by_name(found, "llm")
    return llm.ready == 1 and llm.asleep == 1


def test_my_work_shows_the_viewers_services_replicas_queue_and_hours(portal: Portal) -> None:
    # team-a holds 5 of its limit 8 H100s: llm's replica and warm one fit, big's 4 wait.
    llm = deploy("tok-alice", portal, "team-a", "llm", max_replicas=2, warm=1)
    big = deploy("tok-alice", portal, "team-a", "big", count=4)
    theirs = deploy("tok-bob", portal, "team-b", "bobs")
    teammates = deploy("tok-anna", portal, "team-a", "annas")
    settle(portal, "tok-root", ready)
    alice = store(portal, "tok-alice", owner="alice")
    # Neither bob's (another tenant) nor anna's (a teammate's: Tenant shows those).
    assert [s.id for s in alice.services] == [llm.id, big.id]
    assert teammates.id in {s.id for s in store(portal, "tok-alice", tenant="team-a").services}
    r = rows(alice)
    # state, serving, starting, queued, warm asleep, min–max (warm), waiting, in flight, p50/p99
    assert r["llm"][3:12] == ("active", "1", "0", "0", "1", "1–2 (1)", "0", "0", "— / —")
    assert r["big"][3:9] == ("active", "0", "0", "1", "0", "1–1 (0)")
    assert r["big"][13].startswith("#1: #") and "quota: " in r["big"][13]
    # A member reads no cost: the hours say so instead of showing zeros.
    assert r["llm"][12] == "not shown" and "GPU-hours serving and warm" in alice.note
    # The picked service's replicas: the serving one and the warm one asleep, with devices.
    assert alice.selected == llm.id
    picked = sorted(replica_row(x) for x in by_name(alice.services, "llm").replicas)
    assert [p[1:3] for p in picked] == [("ready", "no"), ("asleep", "yes")]
    assert all(p[3].startswith("hgx-") and p[4] != "—" for p in picked)
    alice.select(big.id)
    html = ServicesView(alice, empty="none").replicas()
    assert "queued" in html and "quota: " in html
    # Bob's My work: his service only.
    assert [s.id for s in store(portal, "tok-bob", owner="bob").services] == [theirs.id]


def test_tenant_shows_its_services_with_hours_and_refuses_other_tenants(portal: Portal) -> None:
    llm = deploy("tok-alice", portal, "team-a", "llm", max_replicas=2, warm=1)
    deploy("tok-bob", portal, "team-b", "bobs")
    settle(portal, "tok-root", ready)
    portal.clock.now = NOW + timedelta(hours=2)  # two hours serving, and two warm
    anna = store(portal, "tok-anna", tenant="team-a")  # team-a's admin
    assert [s.id for s in anna.services] == [llm.id]
    assert anna.hours is not None and anna.note == ""
    assert rows(anna)["llm"][12] == "2.00 / 2.00"
    assert "llm" in rendered(ServicesView(anna, empty="none"))
    # A member of team-b reads none of team-a's services: the portal refuses, nothing shows.
    bob = ServicesStore(portal.source("tok-bob"), tenant="team-a")
    bob.refresh()
    assert bob.services == [] and "team-a" in bob.error
    with Client(portal.url, "tok-bob") as c, pytest.raises(Forbidden):
        c.services.list("team-a")
    assert [s.tenant for s in store(portal, "tok-bob", tenant="team-b").services] == ["team-b"]


def test_the_pages_carry_the_section(portal: Portal) -> None:
    deploy("tok-alice", portal, "team-a", "llm")
    page = build_view("my_work", portal.source("tok-alice"), VIEWERS["tok-alice"], {}, time.time)
    text = rendered(page.view)
    assert "Services" in text and "llm" in text
    page = build_view("tenant", portal.source("tok-bob"), VIEWERS["tok-bob"], {}, time.time)
    text = rendered(page.view)
    assert "Services" in text and "team-b runs no inference services." in text
    assert "llm" not in text


def test_waiting_requests_and_latency_read_as_the_gateway_counts_them(portal: Portal) -> None:
    deploy("tok-alice", portal, "team-a", "llm")
    (llm,) = settle(portal, "tok-alice", lambda found: found[0].ready == 1)
    assert service_row(llm, None, True)[9:13] == ("0", "0", "— / —", "0.00 / 0.00")
    # The counts as the gateway reports them under load (no engine answers here).
    busy = llm.model_copy(
        update={
            "traffic": {
                "held": 3,
                "in_flight": 2,
                "first_byte_p50_s": 0.0123,
                "first_byte_p99_s": 1.5,
            }
        }
    )
    assert service_row(busy, None, True)[9:12] == ("3", "2", "0.01 s / 1.50 s")
