"""Views plot the stores' numbers in the right dimensions."""

from __future__ import annotations

import holoviews as hv

from dashboards.cost import CostView
from dashboards.my_work import MyWorkView
from dashboards.stores import CostStore, MyWorkStore
from tests.dashboards.conftest import Portal


def test_cost_charts_stack_cost_and_gpu_hours_per_tenant_and_day(portal: Portal) -> None:
    store = CostStore(portal.source("tok-lead"))
    store.refresh()
    charts = CostView(store).bars()
    assert isinstance(charts, hv.Layout)
    money, hours = (chart[()] for chart in charts)  # the dynamic charts' current frames
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
