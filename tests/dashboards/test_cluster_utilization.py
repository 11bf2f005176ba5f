"""The Cluster heatmap's utilization: each GPU's own latest minute, read per device through
``GET /api/v1/telemetry/devices`` after samples went in through the real ingest route.

Samples (six per minute, same value within a minute), the minute before ``NOW`` unless said:

| GPU | device | minute NOW-2 | minute NOW-1 | cell |
|---|---|---|---|---|
| hgx-1 GPU 0 (nb-alice's) | the GPU | 10 | 90 | 90: the latest minute |
| hgx-2 GPU 5 (nobody's) | the GPU | — | 35 | 35: unallocated GPUs are measured too |
| t4-1 GPU 0 (infer-a's 250 milli share) | the GPU | — | 45 | 45: the whole GPU's figure |
| a100-1 GPU 0 (MIG) | gi 1 / gi 2 | — | 30 / 70 | 70: the busiest instance |

Every other GPU has no sample: NaN (blank).
"""

from __future__ import annotations

import math

from dashboards.cluster import ClusterView
from dashboards.stores import ClusterStore
from tests.dashboards.conftest import Portal
from tests.dashboards.seed import NOW


def post(
    portal: Portal, node: str, gpu: int, minutes: dict[int, float | None], gi: int | None = None
) -> None:
    """Six samples a minute of GPU ``gpu`` of ``node`` (or its MIG instance ``gi``), for each
    ``minutes`` entry: minutes before ``NOW`` -> utilization %."""
    now = NOW.timestamp()
    samples: list[dict[str, object]] = [
        {
            "gpu_uuid": f"GPU-sim-{node}-{gpu}",
            **({} if gi is None else {"gpu_instance_id": gi}),
            "at": now - 60 * ago + 10 * k,
            "utilization_pct": util,
            "memory_used_mib": 1024.0,
            "memory_total_mib": 81920.0,
        }
        for ago, util in minutes.items()
        for k in range(6)
    ]
    portal.ingest(node, samples)


def test_heatmap_cells_are_each_gpus_latest_minute(portal: Portal) -> None:
    post(portal, "hgx-1", 0, {2: 10.0, 1: 90.0})
    post(portal, "hgx-2", 5, {1: 35.0})
    post(portal, "t4-1", 0, {1: 45.0})
    post(portal, "a100-1", 0, {1: 30.0}, gi=1)
    post(portal, "a100-1", 0, {1: 70.0}, gi=2)
    portal.telemetry.maintain()  # the service's loop: roll the closed minutes up
    store = ClusterStore(portal.source("tok-root"), clock=lambda: NOW.timestamp())
    store.metric = "utilization"  # the view's toggle: read at once
    assert store.error == "" and store.utilization_note == ""
    assert store.utilization == {
        ("hgx-1", 0): 90.0,
        ("hgx-2", 5): 35.0,
        ("t4-1", 0): 45.0,
        ("a100-1", 0): 70.0,
    }
    cells = {(n, i): v for n, i, v in ClusterView(store).cells()}
    assert len(cells) == 24
    measured = {k: v for k, v in cells.items() if not math.isnan(v)}
    assert measured == {
        ("hgx-1", 0): 0.9,
        ("hgx-2", 5): 0.35,
        ("t4-1", 0): 0.45,
        ("a100-1", 0): 0.7,
    }
    # One read for the whole platform, and none while the heatmap shows allocation (checked
    # after that refresh's requests: the recorder logs an exchange once it has answered).
    store.metric = "allocation"
    assert store.utilization == {}
    reads = [e.path for e in portal.seen("tok-root")]
    assert reads.count("/api/v1/telemetry/devices") == 1
    assert "/api/v1/telemetry/series" not in reads


def test_a_viewer_without_usage_read_is_told_why(portal: Portal) -> None:
    post(portal, "hgx-1", 0, {1: 90.0})
    portal.telemetry.maintain()
    store = ClusterStore(portal.source("tok-ops"), clock=lambda: NOW.timestamp())
    store.metric = "utilization"
    assert store.error == "" and store.nodes  # the rest of the page still shows
    assert store.utilization == {}
    assert store.utilization_note == (
        "not shown: utilization (your roles do not let you read quota and GPU usage)"
    )


def test_unmeasured_instances_leave_their_gpu_blank_never_at_zero(portal: Portal) -> None:
    # An A100 without GPU Performance Monitoring: its instances' samples carry memory only.
    # GPU 0: both instances unmeasured -> blank; GPU 1: one unmeasured, one at 40 -> 40.
    post(portal, "a100-1", 0, {1: None}, gi=1)
    post(portal, "a100-1", 0, {1: None}, gi=2)
    post(portal, "a100-1", 1, {1: None}, gi=1)
    post(portal, "a100-1", 1, {1: 40.0}, gi=2)
    portal.telemetry.maintain()
    store = ClusterStore(portal.source("tok-root"), clock=lambda: NOW.timestamp())
    store.metric = "utilization"
    assert store.error == "" and store.utilization_note == ""
    assert store.utilization == {("a100-1", 1): 40.0}
    cells = {(n, i): v for n, i, v in ClusterView(store).cells()}
    assert math.isnan(cells[("a100-1", 0)])
    assert cells[("a100-1", 1)] == 0.4
