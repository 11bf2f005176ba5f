"""The Cluster view's live update (new values go into the heatmap already on the page), its
topology matrix, and what its node health says when it lacks data or rights."""

from __future__ import annotations

import panel as pn
from bokeh.model import Model
from bokeh.models import ColumnDataSource

from dashboards import components as c
from dashboards.app import build_view
from dashboards.cluster import ClusterView
from dashboards.stores import ClusterStore
from tests.dashboards.conftest import Portal
from tests.dashboards.seed import VIEWERS
from tests.dashboards.test_telemetry import _html
from tests.dashboards.test_tenant_members import save_alerts


def heatmap_source(root: Model) -> ColumnDataSource:
    found = [s for s in root.select({"type": ColumnDataSource}) if isinstance(s, ColumnDataSource)]
    (source,) = [s for s in found if "allocated" in s.data]
    return source


def allocated(source: ColumnDataSource, node: str, gpu: int) -> float:
    cells = zip(source.data["node"], source.data["GPU"], source.data["allocated"], strict=True)
    return next(float(a) for n, i, a in cells if (n, int(i)) == (node, gpu))


def test_a_live_update_changes_the_heatmap_in_place(portal: Portal) -> None:
    store = ClusterStore(portal.source("tok-ops"))
    store.refresh()
    root = pn.panel(ClusterView(store)).get_root()  # type: ignore[attr-defined]
    before = heatmap_source(root)
    assert allocated(before, "hgx-1", 0) == 1.0  # nb-alice's GPU
    nb_alice = next(w.id for w in portal.allocator.workloads() if w.name == "nb-alice")
    portal.allocator.release(nb_alice)
    store.refresh()
    after = heatmap_source(root)
    assert after is before  # the same plot, its data replaced
    assert allocated(after, "hgx-1", 0) == 0.0


def test_the_selected_nodes_link_classes_are_a_matrix_of_nvidia_smi_codes(
    portal: Portal,
) -> None:
    store = ClusterStore(portal.source("tok-ops"), selected="hgx-1")
    store.refresh()
    view = ClusterView(store)
    nvswitch = view.topology()
    assert "Link classes of hgx-1" in nvswitch
    assert nvswitch.count(">NVS</td>") == 8 * 7 and nvswitch.count("<td>X</td>") == 8
    store.selected = "a100-1"  # PCIe GPUs, NVLink bridges in pairs
    pcie = view.topology()
    assert "Link classes of a100-1" in pcie and ">NVS</td>" not in pcie
    pairs = {(i, j) for i, j, k in store.link_classes() if k == "nvlink"}
    assert pcie.count(">NV</td>") == len(pairs) > 0
    assert 'title="GPU 0 – GPU 1: NVLink"' in pcie


def test_node_health_is_healthy_only_when_every_health_alert_was_read(portal: Portal) -> None:
    """An XID error fires on a GPU (a platform alert: no tenant). The portal admin sees it;
    mia (a member of team-a, who may read the inventory but not the platform's alerts) and
    an operator without workloads:read see "not shown", never "no health alerts"."""
    save_alerts(portal)  # the XID alert on GPU-sim-hgx-2-3, and tenant alerts
    pages = {
        token: build_view("cluster", portal.source(token), VIEWERS[token], {})
        for token in ("tok-root", "tok-mia", "tok-ops")
    }
    root = pages["tok-root"].view
    assert isinstance(root, ClusterView)
    assert (
        "<tr><td>hgx-2</td><td>3</td><td>XID</td><td>firing</td>"
        "<td>XID 79: fell off the bus</td></tr>" in _html(root.health())
    )
    for token in ("tok-mia", "tok-ops"):  # not theirs to see: said so, in words, not red
        view = pages[token].view
        assert isinstance(view, ClusterView) and view.store.error == "", token
        assert view.health() == "<p><em>not shown</em></p>", token
        note = view.store.health_note
        assert note.startswith("not shown: node health: ") and "custom:" not in note
        assert c.message(view.store, "health_note").alert_type == "info"
    assert "/api/v1/alerts" not in [e.path for e in portal.seen("tok-mia")]


def test_node_health_that_could_not_be_read_is_unknown(portal: Portal) -> None:
    save_alerts(portal)
    # alice may not read the inventory: the page read nothing, node health included.
    alice = build_view("cluster", portal.source("tok-alice"), VIEWERS["tok-alice"], {}).view
    assert isinstance(alice, ClusterView) and alice.store.error
    assert alice.health() == "<p><em>unknown</em></p>"
    # The nodes read, the alerts not (their table gone: the portal answers 500).
    store = ClusterStore(portal.source("tok-root"))
    store.refresh()
    assert store.health
    portal.allocator.store.engine.dispose()
    with portal.allocator.store.engine.begin() as db:
        db.exec_driver_sql("DROP TABLE alerts")
    store.refresh()
    assert store.error == "" and store.health == []
    assert store.health_note.startswith("unknown: node health could not be read")
    assert ClusterView(store).health() == "<p><em>unknown</em></p>"
