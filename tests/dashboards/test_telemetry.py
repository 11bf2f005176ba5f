"""My work's GPU usage and alerts, and Cluster's node health, read through the portal API
(telemetry an agent posted, alerts the alert service stores).

Samples go in through ``POST /api/v1/telemetry/samples`` (the agent's token), are rolled up by
the portal's telemetry service, and come back to the store as 1-minute series with the
viewer's token. nb-alice (1 × H100) is sampled over the three minutes before ``NOW``:

| minute | utilization (6 samples) | memory MiB |
|---|---|---|
| NOW-3 min | 30 | 10,240 |
| NOW-2 min | 60 | 10,240 |
| NOW-1 min | 90 | 20,480 |

so the view shows 90% now, 60% over the hour, 20,480 MiB now and at most.
"""

from __future__ import annotations

import math

import holoviews as hv
import panel as pn
from panel.viewable import Viewable

from dashboards.cluster import ClusterView
from dashboards.my_work import MyWorkView
from dashboards.stores import ClusterStore, MyWorkStore
from policies.alerts.engine import Alert, AlertKey, AlertState
from portal.alerting.store import AlertStore
from tests.dashboards.conftest import Portal
from tests.dashboards.seed import NOW

MINUTES = ((30.0, 10240.0), (60.0, 10240.0), (90.0, 20480.0))


def _html(shown: Viewable | str) -> str:
    """The HTML of a table the view rendered: its text (``components.table_html``, shown by
    a live pane) or a pane's (``components.table``)."""
    if isinstance(shown, str):
        return shown
    assert isinstance(shown, pn.pane.HTML | pn.pane.Markdown), shown
    return str(shown.object)


def gpu_of(portal: Portal, name: str) -> tuple[str, str, str]:
    """(workload id, node, GPU UUID) of the seeded workload ``name``'s first GPU."""
    w = next(w for w in portal.source("tok-root").workloads() if w.name == name)
    device = w.allocations[0]
    return w.id, device.node, f"GPU-sim-{device.node}-{device.gpus[0]}"


def post_minutes(portal: Portal, node: str, gpu: str) -> None:
    now = NOW.timestamp()
    samples = [
        {
            "gpu_uuid": gpu,
            "at": now - 180 + 60 * m + 10 * k,
            "utilization_pct": util,
            "memory_used_mib": memory,
            "memory_total_mib": 81920.0,
        }
        for m, (util, memory) in enumerate(MINUTES)
        for k in range(6)
    ]
    portal.ingest(node, samples)
    portal.telemetry.maintain()  # the service's loop: roll the closed minutes up


def _store(portal: Portal, token: str, owner: str) -> MyWorkStore:
    store = MyWorkStore(portal.source(token), owner=owner, clock=lambda: NOW.timestamp())
    store.refresh()
    assert store.error == ""
    return store


def test_my_work_shows_utilization_and_memory_per_workload_by_the_minute(
    portal: Portal,
) -> None:
    wid, node, gpu = gpu_of(portal, "nb-alice")
    post_minutes(portal, node, gpu)
    store = _store(portal, "tok-alice", "alice")
    points = store.usage[wid]
    assert [p.at for p in points] == [NOW.timestamp() - 180 + 60 * m for m in range(3)]
    assert [p.utilization_avg for p in points] == [30.0, 60.0, 90.0]
    assert [p.memory_used_avg for p in points] == [10240.0, 10240.0, 20480.0]
    view = MyWorkView(store)
    table = _html(view.usage_table())
    assert (
        "<tr><td>nb-alice</td><td>90%</td><td>60%</td><td>20,480</td><td>20,480</td></tr>" in table
    )
    # Workloads with no samples are not listed (not shown as 0%).
    assert "train-a" not in table
    plots = view.usage_plot()
    assert isinstance(plots, hv.Layout)
    utilization, memory = plots
    assert list(utilization.get(0).dimension_values("GPU utilization %")) == [30.0, 60.0, 90.0]
    assert list(memory.get(0).dimension_values("memory MiB")) == [10240.0, 10240.0, 20480.0]


def test_my_work_leaves_an_unmeasured_minute_out_of_the_average_and_a_gap_in_the_chart(
    portal: Portal,
) -> None:
    # The middle minute carries memory only (as a MIG instance of an A100 would).
    wid, node, gpu = gpu_of(portal, "nb-alice")
    now = NOW.timestamp()
    samples = [
        {
            "gpu_uuid": gpu,
            "at": now - 180 + 60 * m + 10 * k,
            **({} if util is None else {"utilization_pct": util}),
            "memory_used_mib": 4096.0,
            "memory_total_mib": 81920.0,
        }
        for m, util in enumerate((30.0, None, 90.0))
        for k in range(6)
    ]
    portal.ingest(node, samples)
    portal.telemetry.maintain()
    store = _store(portal, "tok-alice", "alice")
    assert [p.utilization_avg for p in store.usage[wid]] == [30.0, None, 90.0]
    view = MyWorkView(store)
    # The hour's average is of the measured minutes, (30 + 90) / 2, not (30 + 0 + 90) / 3.
    assert "<tr><td>nb-alice</td><td>90%</td><td>60%</td>" in _html(view.usage_table())
    plots = view.usage_plot()
    assert isinstance(plots, hv.Layout)
    utilization, memory = plots
    drawn = list(utilization.get(0).dimension_values("GPU utilization %"))
    assert drawn[0] == 30.0 and math.isnan(drawn[1]) and drawn[2] == 90.0
    assert list(memory.get(0).dimension_values("memory MiB")) == [4096.0] * 3


def test_another_tenants_viewer_gets_none_of_that_usage(portal: Portal) -> None:
    wid, node, gpu = gpu_of(portal, "nb-alice")
    post_minutes(portal, node, gpu)
    store = _store(portal, "tok-bob", "bob")
    assert wid not in store.usage
    assert (
        _html(MyWorkView(store).usage_table()) == "<p><em>no GPU samples in the last hour</em></p>"
    )


def test_my_work_lists_the_alerts_about_the_viewers_work_only(portal: Portal) -> None:
    alice_wid, _, gpu = gpu_of(portal, "nb-alice")
    bob_wid, _, bob_gpu = gpu_of(portal, "nb-bob")
    now = NOW.timestamp()
    AlertStore(portal.allocator.store.engine).save(
        [
            Alert(
                AlertKey("idle", gpu, alice_wid),
                AlertState.FIRING,
                "team-a",
                "alice",
                (alice_wid,),
                "nb-alice: GPU idle (0% for 2 h)",
                0.0,
                now - 7200,
                now - 3600,
            ),
            Alert(
                AlertKey("noisy_neighbour", bob_gpu, bob_wid),
                AlertState.FIRING,
                "team-b",
                "bob",
                (bob_wid,),
                "nb-bob: slows its neighbours",
                95.0,
                now - 600,
                now - 300,
            ),
        ]
    )
    alice = _html(MyWorkView(_store(portal, "tok-alice", "alice")).alert_table())
    assert "<tr><td>idle</td><td>firing</td><td>nb-alice: GPU idle (0% for 2 h)</td></tr>" in alice
    assert "nb-bob" not in alice
    bob = _html(MyWorkView(_store(portal, "tok-bob", "bob")).alert_table())
    noisy = "<tr><td>noisy neighbour</td><td>firing</td><td>nb-bob: slows its neighbours</td></tr>"
    assert noisy in bob
    assert "nb-alice" not in bob


def test_cluster_node_health_lists_xid_and_throttling_alerts_by_node_and_gpu(
    portal: Portal,
) -> None:
    now = NOW.timestamp()
    idle_wid, _, idle_gpu = gpu_of(portal, "nb-alice")

    def device_alert(rule: str, device: str, summary: str, value: float) -> Alert:
        key = AlertKey(rule, device, device)
        return Alert(key, AlertState.FIRING, None, None, (), summary, value, now - 60, now)

    AlertStore(portal.allocator.store.engine).save(
        [
            device_alert("xid", "GPU-sim-hgx-2-3", "XID 79: fell off the bus", 79.0),
            device_alert("throttle", "GPU-sim-a100-1-1/gi2", "thermal slowdown", 64.0),
            Alert(
                AlertKey("idle", idle_gpu, idle_wid),
                AlertState.FIRING,
                "team-a",
                "alice",
                (idle_wid,),
                "nb-alice: GPU idle",
                0.0,
                now - 7200,
                now - 3600,
            ),
        ]
    )
    store = ClusterStore(portal.source("tok-root"))
    store.refresh()
    assert store.error == "" and store.health_note == ""
    table = _html(ClusterView(store).health())
    assert (
        "<tr><td>hgx-2</td><td>3</td><td>XID</td><td>firing</td>"
        "<td>XID 79: fell off the bus</td></tr>" in table
    )
    assert (
        "<tr><td>a100-1</td><td>1 (gi2)</td><td>throttle</td><td>firing</td>"
        "<td>thermal slowdown</td></tr>" in table
    )
    assert "idle" not in table  # about a workload's use, not a GPU's health

    # An operator holding inventory:read only: the page says why, the rest still shows.
    ops = ClusterStore(portal.source("tok-ops"))
    ops.refresh()
    assert ops.error == "" and ops.nodes
    assert ops.health == []
    assert ops.health_note.startswith("not shown: node health (your roles do not let you read ")


def test_cluster_heatmap_shows_utilization_of_whole_gpus_when_chosen(portal: Portal) -> None:
    _, node, gpu = gpu_of(portal, "nb-alice")
    post_minutes(portal, node, gpu)
    store = ClusterStore(portal.source("tok-root"), clock=lambda: NOW.timestamp())
    store.refresh()
    assert store.utilization == {}  # not read while the heatmap shows allocation
    store.metric = "utilization"  # the view's toggle: read at once
    assert store.error == ""
    assert store.utilization == {(node, int(gpu.rsplit("-", 1)[1])): 90.0}
    view = ClusterView(store)
    cells = {(n, i): v for n, i, v in view.cells()}
    assert cells[(node, int(gpu.rsplit("-", 1)[1]))] == 0.9
    measured = [v for v in cells.values() if v == v]  # NaN: not measured
    assert measured == [0.9] and len(cells) == 24
    heatmap = view.heatmap()
    assert heatmap.vdims[0].name == "utilization"
