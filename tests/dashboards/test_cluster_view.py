"""The Cluster view's live update: new values go into the heatmap already on the page."""

from __future__ import annotations

import panel as pn
from bokeh.model import Model
from bokeh.models import ColumnDataSource

from dashboards.cluster import ClusterView
from dashboards.stores import ClusterStore
from tests.dashboards.conftest import Portal


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
