"""The Cost view's capacity forecast: shown to leadership with the portal's numbers, absent
for a tenant's admin (who never asks for it), and re-read only every few minutes.

The seed holds 7 H100s (nb-alice 1, train-a 4, nb-bob 2) every hour from its start to now:
a flat history, so the forecast is its mean, 7 GPUs every hour: 1,176 GPU-hours a week, a peak
of 7 of the 16 H100s (43.75 %), against guarantees of 4 + 4."""

from __future__ import annotations

import time

from dashboards.app import build_view
from dashboards.cost import CostView
from dashboards.stores import CapacityForecastStore
from dashboards.stores.forecast import FORECAST_REFRESH_S
from tests.dashboards.conftest import Portal
from tests.dashboards.seed import VIEWERS
from tests.dashboards.test_scoping import rendered

PATH = "/api/v1/forecast/capacity"


def asked(portal: Portal, token: str, at_least: int) -> int:
    """How often ``token`` read the forecast, once at least ``at_least`` reads are recorded
    (the recorder notes an exchange just after its answer went out)."""
    deadline = time.monotonic() + 10
    while True:
        n = len([e for e in portal.seen(token) if e.path == PATH])
        if n >= at_least or time.monotonic() > deadline:
            return n
        time.sleep(0.01)


def test_leadership_sees_forecast_demand_against_capacity_and_guarantees(portal: Portal) -> None:
    page = build_view("cost", portal.source("tok-lead"), VIEWERS["tok-lead"], {})
    (outlook,) = [s for s in page.stores if isinstance(s, CapacityForecastStore)]
    assert outlook.error == ""
    h100 = [r for r in outlook.rows() if r[0] == "H100-80GB"]
    assert [r[1] for r in h100] == ["11-03", "11-10", "11-17", "11-24"]
    _, _, hours, peak, capacity, guaranteed = h100[0]
    assert (round(hours, 6), round(peak, 6), capacity, guaranteed) == (1176.0, 7.0, 16.0, 8.0)
    # The chart: flavors with forecast demand only (no idle MIG profiles at 0 %).
    charted = {(w, f): round(p, 6) for w, f, p in outlook.peak_share()}
    assert charted[("11-03", "H100-80GB")] == 43.75
    assert {f for _, f in charted} == {"A100-80GB/1g.10gb", "H100-80GB", "T4/share"}
    assert "Capacity forecast" in rendered(page.view)
    assert isinstance(page.view, CostView) and page.view.forecast is not None
    table = page.view.forecast.table()
    assert "<td>H100-80GB</td><td>11-03</td><td>1,176.0</td><td>7.00</td><td>16.00</td>" in table


def test_a_tenant_admin_gets_no_forecast_and_never_asks(portal: Portal) -> None:
    page = build_view("cost", portal.source("tok-anna"), VIEWERS["tok-anna"], {})
    assert not any(isinstance(s, CapacityForecastStore) for s in page.stores)
    assert "Capacity forecast" not in rendered(page.view)
    assert portal.seen("tok-anna")  # the page read its cost
    assert asked(portal, "tok-anna", 0) == 0


def test_live_updates_re_read_the_forecast_only_every_few_minutes(portal: Portal) -> None:
    now = [0.0]
    store = CapacityForecastStore(portal.source("tok-lead"), weeks=1, clock=lambda: now[0])
    for _ in range(3):
        store.refresh()
    assert asked(portal, "tok-lead", 1) == 1
    now[0] = FORECAST_REFRESH_S
    store.refresh()
    assert asked(portal, "tok-lead", 2) == 2
    assert store.forecast is not None and len(store.forecast.flavors[0].weeks) == 1
