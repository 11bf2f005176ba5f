"""The Cost store's live update sets only what changed, so an unchanged month redraws nothing."""

from __future__ import annotations

from datetime import timedelta

from dashboards.stores import CostStore
from dashboards.stores.cost import cost
from tests.dashboards.conftest import Portal


def test_a_live_update_changes_only_what_changed(portal: Portal) -> None:
    store = CostStore(portal.source("tok-lead"))
    store.refresh()
    changed: list[str] = []
    data = ["daily", "flavors", "owners", "budgets", "report"]
    store.param.watch(lambda *events: changed.extend(e.name for e in events), data)
    store.refresh()
    assert store.error == ""
    assert changed == []  # the same month: no chart or table is redrawn
    before = store.report
    # An hour later the workloads still running have cost more: today's bars, the flavors'
    # totals, the budgets' burn and the headline change; owners are not read (no utilization).
    portal.clock.now += timedelta(hours=1)
    store.refresh()
    assert sorted(changed) == ["budgets", "daily", "flavors", "report"]
    assert store.report is not None and before is not None
    assert cost(store.report.total) > cost(before.total)
