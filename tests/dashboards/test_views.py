"""Views plot the stores' numbers in the right dimensions."""

from __future__ import annotations

import holoviews as hv

from dashboards.cost import CostView
from dashboards.my_work import MyWorkView
from dashboards.stores import CostStore, MyWorkStore, TenantStore
from dashboards.tenant import TenantView
from tests.dashboards.conftest import Portal
from tests.dashboards.seed import VIEWERS


def test_cost_charts_stack_cost_and_gpu_hours_per_tenant_and_day(portal: Portal) -> None:
    store = CostStore(portal.source("tok-lead"))
    store.refresh()
    view = CostView(store)
    chart = view.bars()
    assert isinstance(chart, hv.DynamicMap)
    money = chart[()]  # the dynamic chart's current frame
    view.measure = "GPU-hours"
    hours = chart[()]
    assert sorted(money.dimension_values("cost")) == [74.57, 124.29, 180.90, 301.50]
    # team-a: 5.25 GPUs (1 + 4 + 0.25) x 15 h on Nov 2, x 9 h on Nov 3.
    assert hours.select(day="11-02", tenant="team-a") == 78.75
    assert hours.select(day="11-03", tenant="team-a") == 47.25


def test_my_work_stop_button_releases_the_chosen_workload(portal: Portal) -> None:
    store = MyWorkStore(portal.source("tok-alice"), owner="alice")
    store.refresh()
    view = MyWorkView(store)
    assert list(view.choose.options) == [
        "nb-alice (stop)",
        "train-a (stop)",
        "infer-a (stop)",
    ]
    infer = view.choose.options["infer-a (stop)"]
    view.choose.value = infer
    view.stop_button.clicks += 1
    assert portal.allocator.status(infer).state.value != "running"
    assert list(view.choose.options) == ["nb-alice (stop)", "train-a (stop)"]


def test_tenant_quota_bars_show_each_measure_on_its_flavors_scale(portal: Portal) -> None:
    store = TenantStore(portal.source("tok-anna"), tenant="team-a")
    store.refresh()
    view = TenantView(store, VIEWERS["tok-anna"])
    bars = view.bars()
    usage = {u.flavor: u for u in store.usage}
    h100 = usage["H100-80GB"]
    top = max(h100.guaranteed, h100.limit, h100.used, h100.borrowed, h100.lent)
    block = bars.split("<strong>H100-80GB</strong>")[1].split("</div></div>")[0]
    assert f"width:{100 * h100.used / top:.1f}%" in block
    assert f'title="in use: {h100.used:,}"' in block
    assert f'title="limit: {h100.limit:,}"' in block
    # A quota change shows at the next refresh (the pane's text is replaced in place).
    q = next(q for q in portal.allocator.quotas("team-a") if q.flavor == "H100-80GB")
    portal.allocator.set_quota("team-a", "H100-80GB", guaranteed=q.guaranteed, limit=q.limit + 3)
    store.refresh()
    assert f'title="limit: {h100.limit + 3:,}"' in view.bars()
    assert "<strong>T4/share</strong>" in bars  # every flavor with quota or use has a block
