"""The Cost view's edges: opened by its address without ``cost:read``, with nothing to chart,
and groups whose utilization was not measured."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import httpx
import panel as pn
import pytest

from dashboards.app import build_view
from dashboards.cost import CostView
from dashboards.stores import CostStore
from policies.flavors import FlavorKind
from policies.requests import DeviceRequest
from policies.services import ModelRef, Replicas
from portal.inference.controller import ServiceController
from portal.inference.spec import Engine, Preset, ServiceSpec
from tests.dashboards.conftest import Portal
from tests.dashboards.seed import VIEWERS
from tests.dashboards.test_scoping import rendered
from tests.dashboards.test_telemetry import _html
from tests.dashboards.test_tenant_members import TWO_HOURS, measure_utilization, post_utilization


def download(view: CostView) -> pn.widgets.FileDownload:
    (button,) = view.__panel__().select(pn.widgets.FileDownload)
    assert isinstance(button, pn.widgets.FileDownload)
    return button


def test_a_member_opening_cost_by_its_address_is_told_why_and_reads_nothing(
    portal: Portal,
) -> None:
    page = build_view("cost", portal.source("tok-alice"), VIEWERS["tok-alice"], {})
    assert page.stores == []
    text = rendered(page.view)
    assert "Cost is not shown: your roles do not let you read cost." in text
    assert "custom:" not in text and "Chargeback" not in text
    assert portal.seen("tok-alice") == []


def test_with_no_report_the_chart_still_draws_and_chargeback_is_disabled(portal: Portal) -> None:
    # A store whose reads were refused: no groups, no report (the same as a month with none).
    refused = CostStore(portal.source("tok-alice"))
    refused.refresh()
    assert refused.error and refused.daily == [] and refused.report is None
    view = CostView(refused)
    # The empty chart renders (stacking no bars raised IndexError: a spinner for ever).
    pn.pane.HoloViews(view.bars()).get_root()
    assert download(view).disabled is True

    lead = CostView(CostStore(portal.source("tok-lead")))
    lead.store.refresh()
    button = download(lead)
    assert button.disabled is False
    # The chart stacks again once bars are there.
    assert lead.bars()[()].opts.get("plot").kwargs["stacked"] is True


def test_efficiency_of_groups_nobody_measured_is_not_measured_never_zero(portal: Portal) -> None:
    """nb-alice's H100 at 50 % for the last 2 h: used 1.00 of the 168 H100 GPU-hours, 0.6 %
    (shown as 1%); infer-a's T4 share and mig-bob's slice have no samples: the portal reports
    them as 0 % used, and the view says "not measured", as My work and Tenant do."""
    measure_utilization(portal)
    post_utilization(portal, "nb-alice", 50.0, TWO_HOURS)
    store = CostStore(portal.source("tok-lead"))
    store.refresh()
    assert store.error == ""
    share = next(g for g in store.flavors if g.flavor == "T4/share")
    assert share.efficiency == 0.0  # the portal's figure the view must not show as 0 %
    flavors = _html(CostView(store).flavors())
    assert "<tr><td>T4/share</td><td>2.40</td><td>6.00</td><td>not measured</td></tr>" in flavors
    assert "<td>A100-80GB/1g.10gb</td><td>6.86</td><td>3.43</td><td>not measured</td>" in flavors
    assert "<tr><td>H100-80GB</td><td>672.00</td><td>168.00</td><td>1%</td></tr>" in flavors


def test_services_show_their_warm_pool_hours_apart_from_serving_ones(portal: Portal) -> None:
    """A service with a warm pool (recorded by a controller without engines: its replicas hold
    their devices, which is what is charged): an hour in the pool, then two serving."""
    controller = ServiceController(portal.allocator)
    spec = ServiceSpec(
        tenant="team-a",
        owner="alice",
        name="llm",
        engine=Engine(preset=Preset.TEST),
        model=ModelRef("file:///models/tiny", "sha256:" + "0" * 64),
        devices=DeviceRequest(kind=FlavorKind.GPU, count=1, models=frozenset({"H100-80GB"})),
        replicas=Replicas(min=0, max=1, warm=1),
    )
    clock = portal.clock
    clock.now -= timedelta(hours=3)
    sid = controller.deploy(spec).service.id
    clock.now += timedelta(hours=1)
    controller.touch(sid)  # the pooled replica serves (without engines no loop refills)
    clock.now += timedelta(hours=2)
    store = CostStore(portal.source("tok-lead"))
    store.refresh()
    (hours,) = [s for s in store.services if s.service_id == sid]
    assert (hours.warm_gpu_hours, hours.serving_gpu_hours) == pytest.approx((1.0, 2.0))
    html = CostView(store).services()
    assert "<td>llm</td><td>1.00</td><td>2.00</td>" in html.replace("\n", "")

    # Each tenant sees its own services only: team-a's admin not team-b's, nor asks for them.
    controller.deploy(replace(spec, tenant="team-b", owner="bob", name="other"))
    url = f"{portal.url}/api/v1/cost/services"
    anna = {"Authorization": "token tok-anna"}
    seen = httpx.get(url, headers=anna).json()["services"]
    assert [(x["tenant"], x["name"]) for x in seen] == [("team-a", "llm")]
    refused = httpx.get(url, params={"tenant": "team-b"}, headers=anna)
    assert refused.status_code == 403, refused.text
    alice = httpx.get(url, headers={"Authorization": "token tok-alice"})
    assert alice.status_code == 403, alice.text
    lead = httpx.get(url, headers={"Authorization": "token tok-lead"}).json()["services"]
    assert sorted(x["name"] for x in lead) == ["llm", "other"]
