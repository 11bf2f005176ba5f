"""Views plot the stores' numbers in the right dimensions."""

from __future__ import annotations

import holoviews as hv

from dashboards.cost import CostView
from dashboards.stores import CostStore
from tests.dashboards.conftest import Portal


def test_cost_charts_stack_cost_and_gpu_hours_per_tenant_and_day(portal: Portal) -> None:
    store = CostStore(portal.source("tok-lead"))
    store.refresh()
    charts = CostView(store).bars()
    assert isinstance(charts, hv.Layout)
    money, hours = charts
    assert sorted(money.dimension_values("cost")) == [74.57, 124.29, 180.90, 301.50]
    # team-a: 5.25 GPUs (1 + 4 + 0.25) x 15 h on Nov 2, x 9 h on Nov 3.
    assert hours.select(day="11-02", tenant="team-a") == 78.75
    assert hours.select(day="11-03", tenant="team-a") == 47.25
