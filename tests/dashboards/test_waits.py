"""My work and the Tenant view tell a wait in the portal's words (``portal.waits``), the same
the CLI prints: a queued workload without an estimate "waits for a release; no estimate",
never a time nobody estimated nor an 'unknown' of the dashboards' own."""

from __future__ import annotations

from dashboards.my_work import MyWorkView
from dashboards.stores import MyWorkStore, TenantStore
from dashboards.tenant import TenantView
from portal.commands.workloads import describe
from portal.waits import NO_ESTIMATE
from tests.dashboards.conftest import Portal
from tests.dashboards.seed import VIEWERS


def test_my_work_says_a_wait_without_estimate_as_the_cli_does(portal: Portal) -> None:
    # bob's train-b (8 H100s) waits for team-b's quota; the work it waits for has no
    # expected end, so the portal gives no ETA.
    store = MyWorkStore(portal.source("tok-bob"), owner="bob")
    store.refresh()
    queued = next(w for w in store.workloads if w.name == "train-b")
    assert (queued.state, queued.eta_s) == ("queued", None)
    row = MyWorkView(store).rows()
    line = f"#1 · quota: {queued.message}; {NO_ESTIMATE}"
    assert line in row
    assert "unknown" not in row and "ETA" not in row
    # The CLI's ``workloads show`` of the same record says the same.
    shown = dict(x.split(None, 1) for x in describe(queued).splitlines())
    assert shown["eta"] == NO_ESTIMATE


def test_the_tenant_queue_says_it_in_the_same_words(portal: Portal) -> None:
    store = TenantStore(portal.source("tok-root"), tenant="team-b")
    store.refresh()
    table = TenantView(store, VIEWERS["tok-root"]).queue()
    assert "train-b" in table
    assert f"<td>{NO_ESTIMATE}</td>" in table
    assert "unknown" not in table
