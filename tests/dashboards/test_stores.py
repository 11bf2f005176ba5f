"""Stores compute the seeded dataset's numbers (worked out in ``seed.py``) from the real API."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from dashboards.stores import ClusterStore, CostStore, MyWorkStore, TenantStore
from dashboards.stores.cost import cost
from tests.dashboards.conftest import Portal


def workload_id(portal: Portal, name: str) -> str:
    return next(w.id for w in portal.allocator.workloads() if w.name == name)


def test_cluster_counts_gpus_allocation_and_fragmentation(portal: Portal) -> None:
    store = ClusterStore(portal.source("tok-ops"))
    store.refresh()
    assert store.error == ""
    gpus, allocated = store.totals()
    # hgx-1: 7 whole H100s; t4-1 GPU 0: 250 milli; a100-1 GPU 0: 1 of its 3 MIG instances.
    assert gpus == 24
    assert allocated == pytest.approx(7 + 0.25 + 0.333)
    # Free whole GPUs: hgx-1 1, hgx-2 8, a100-1 2 (its non-MIG pair), t4-1 1, t4-2 2 = 14;
    # stranded on partly used nodes: hgx-1's and t4-1's = 2.
    assert store.fragmentation() == pytest.approx(2 / 14)
    cells = {(n, i): a for n, i, a in store.allocation()}
    assert cells[("hgx-1", 0)] == 1.0
    assert cells[("hgx-1", 3)] == 0.0
    assert cells[("t4-1", 0)] == 0.25


def test_free_capacity_by_flavor(portal: Portal) -> None:
    store = ClusterStore(portal.source("tok-ops"))
    store.refresh()
    free = {f.flavor: (f.capacity, f.free) for f in store.free_by_flavor()}
    assert free == {
        "H100-80GB": (16, 9),
        "A100-80GB": (2, 2),
        "A100-80GB/1g.10gb": (5, 4),
        "A100-80GB/2g.20gb": (1, 1),
        "A100-80GB/3g.40gb": (2, 2),
        "T4": (4, 3),
        "T4/share": (4000, 3750),
    }


def test_mig_layouts_and_link_classes_of_the_selected_node(portal: Portal) -> None:
    store = ClusterStore(portal.source("tok-ops"), selected="a100-1")
    store.refresh()
    # GPU 0 holds 3g.40gb@0, 2g.20gb@4, 1g.10gb@6: mig-bob's 1g.10gb can only be the one at 6.
    assert (0, "1g.10gb", 6, False) in store.mig_layouts()
    assert (0, "3g.40gb", 0, True) in store.mig_layouts()
    links = {(i, j): k for i, j, k in store.link_classes()}
    assert links[(2, 3)] == "nvlink"
    assert links[(0, 2)] == "cross_socket"
    assert ("A100-80GB", "3g.40gb + 2g.20gb + 1g.10gb", 1) in store.mig_layout_counts()


def test_unknown_selected_node_falls_back_to_the_first(portal: Portal) -> None:
    store = ClusterStore(portal.source("tok-ops"), selected="no-such-node")
    store.refresh()
    assert store.selected == "a100-1"


def test_topology_is_read_for_the_selected_node_only(portal: Portal) -> None:
    store = ClusterStore(portal.source("tok-ops"), selected="a100-1")
    start = len(portal.seen("tok-ops"))
    store.refresh()
    reads = [(e.path, e.query) for e in portal.seen("tok-ops")[start:]]
    assert ("/api/v1/nodes", "topology=false&limit=500&offset=0") in reads
    assert ("/api/v1/nodes/a100-1", "") in reads
    assert all(n.links is None for n in store.nodes)
    # Picking another node reads its topology at once, not at the next live update.
    store.selected = "hgx-1"
    assert store.detail is not None and store.detail.name == "hgx-1"
    assert store.node() == store.detail
    assert {k for _, _, k in store.link_classes()} == {"nvswitch"}
    assert len(store.mig_layouts()) == 0


def test_live_update_follows_the_allocator(portal: Portal) -> None:
    store = ClusterStore(portal.source("tok-ops"))
    store.refresh()
    changes: list[str] = []
    store.param.watch(lambda e: changes.append(e.name), ["nodes"])
    portal.allocator.release(workload_id(portal, "nb-alice"))
    store.refresh()
    assert changes == ["nodes"]
    assert store.totals()[1] == pytest.approx(6 + 0.25 + 0.333)
    assert {(n, i): a for n, i, a in store.allocation()}[("hgx-1", 0)] == 0.0


def test_a_live_update_reads_only_the_nodes_that_changed(portal: Portal) -> None:
    store = ClusterStore(portal.source("tok-ops"), selected="a100-1")
    store.refresh()
    before = {n.name: n for n in store.nodes}
    detail = store.detail
    start = len(portal.seen("tok-ops"))
    portal.allocator.release(workload_id(portal, "nb-alice"))  # on hgx-1
    store.refresh()
    reads = portal.seen("tok-ops")[start:]
    paths = [e.path for e in reads]
    assert "/api/v1/nodes" not in paths  # no full listing
    (follow,) = [e for e in reads if e.path == "/api/v1/inventory/changes"]
    assert [n["name"] for n in json.loads(follow.body)["nodes"]] == ["hgx-1"]
    # The selected node did not change: its topology is not read again.
    assert "/api/v1/nodes/a100-1" not in paths and store.detail is detail
    after = {n.name: n for n in store.nodes}
    assert list(after) == sorted(before)
    assert after["hgx-1"] != before["hgx-1"]
    assert all(after[k] is before[k] for k in before if k != "hgx-1")
    assert {(n, i): a for n, i, a in store.allocation()}[("hgx-1", 0)] == 0.0


def test_a_portal_restart_makes_the_store_list_every_node_again(portal: Portal) -> None:
    store = ClusterStore(portal.source("tok-ops"))
    store.refresh()
    store._inventory_version = "000000000000.0"  # what a restarted portal no longer holds
    start = len(portal.seen("tok-ops"))
    portal.allocator.release(workload_id(portal, "nb-alice"))
    store.refresh()
    assert store.error == ""
    reads = [(e.path, e.query) for e in portal.seen("tok-ops")[start:]]
    assert ("/api/v1/inventory/changes", "since=000000000000.0&topology=false") in reads
    assert ("/api/v1/nodes", "topology=false&limit=500&offset=0") in reads
    assert {(n, i): a for n, i, a in store.allocation()}[("hgx-1", 0)] == 0.0


def test_a_new_page_starts_from_another_pages_listing_with_its_own_scope_checked(
    portal: Portal,
) -> None:
    first = ClusterStore(portal.source("tok-ops"))
    first.refresh()
    portal.allocator.release(workload_id(portal, "nb-alice"))  # on hgx-1
    start = len(portal.recorder.seen)
    second = ClusterStore(portal.source("tok-root"))
    second.refresh()
    assert second.error == ""
    reads = [e for e in portal.recorder.seen[start:] if e.token == "tok-root"]
    assert "/api/v1/nodes" not in [e.path for e in reads]  # no second full listing
    (follow,) = [e for e in reads if e.path == "/api/v1/inventory/changes"]
    assert [n["name"] for n in json.loads(follow.body)["nodes"]] == ["hgx-1"]
    assert [n.name for n in second.nodes] == [n.name for n in first.nodes]
    assert {(n, i): a for n, i, a in second.allocation()}[("hgx-1", 0)] == 0.0
    # A viewer without inventory:read is refused by the portal, shared listing or not.
    member = ClusterStore(portal.source("tok-lead"))
    member.refresh()
    assert (
        member.nodes == []
        and member.error == "your roles do not let you read the cluster's nodes and GPUs"
    )


def test_tenant_bars_and_queue(portal: Portal) -> None:
    a = TenantStore(portal.source("tok-anna"), tenant="team-a")
    a.refresh()
    assert ("H100-80GB", "in use", 5) in a.bars()
    assert ("H100-80GB", "borrowed", 1) in a.bars()
    assert ("T4/share", "in use", 250) in a.bars()
    assert a.queue == []
    b = TenantStore(portal.source("tok-bob"), tenant="team-b")
    b.refresh()
    assert ("H100-80GB", "lent", 1) in b.bars()
    assert [(e.name, e.reason, e.tenant_position) for e in b.queue] == [("train-b", "quota", 1)]
    assert "2/8 gpus in use, 8 requested" in b.queue[0].message


def test_tenant_store_reports_a_refused_read(portal: Portal) -> None:
    store = TenantStore(portal.source("tok-alice"), tenant="team-b")
    store.refresh()
    # In words, not the scope's raw name.
    assert store.error == "your roles do not let you read quota and GPU usage of team-b"
    assert store.usage == []


def test_my_work_lists_own_workloads_with_devices(portal: Portal) -> None:
    alice = MyWorkStore(portal.source("tok-alice"), owner="alice")
    alice.refresh()
    devices = {w.name: [(d.node, d.gpus, d.amount) for d in w.allocations] for w in alice.workloads}
    assert devices == {
        "nb-alice": [("hgx-1", [0], 1)],
        "train-a": [("hgx-1", [4, 5, 6, 7], 4)],
        "infer-a": [("t4-1", [0], 250)],
    }
    bob = MyWorkStore(portal.source("tok-bob"), owner="bob")
    bob.refresh()
    queued = next(w for w in bob.workloads if w.name == "train-b")
    assert (queued.state, queued.position, queued.reason) == ("queued", 1, "quota")


def test_stop_and_cancel_release_in_the_portal(portal: Portal) -> None:
    alice = MyWorkStore(portal.source("tok-alice"), owner="alice")
    alice.refresh()
    infer = workload_id(portal, "infer-a")
    assert alice.stop(infer)
    assert portal.allocator.status(infer).state.value != "running"
    assert "infer-a" not in [w.name for w in alice.workloads]
    bob = MyWorkStore(portal.source("tok-bob"), owner="bob")
    bob.refresh()
    assert bob.stop(workload_id(portal, "train-b"))
    assert portal.allocator.queue() == []


def test_stopping_someone_elses_workload_is_refused(portal: Portal) -> None:
    bob = MyWorkStore(portal.source("tok-bob"), owner="bob")
    nb = workload_id(portal, "nb-alice")
    assert not bob.stop(nb)
    assert bob.message.startswith("not stopped: ")
    assert portal.allocator.status(nb).state.value == "running"


def test_cost_numbers_for_leadership(portal: Portal) -> None:
    store = CostStore(portal.source("tok-lead"))
    store.refresh()
    assert store.error == ""
    assert store.tenant_totals() == {"team-a": Decimal("482.40"), "team-b": Decimal("198.86")}
    stacked = {(day, t): cost for day, t, cost, _ in store.stacked()}
    assert stacked == {
        ("11-02", "team-a"): 301.50,
        ("11-03", "team-a"): 180.90,
        ("11-02", "team-b"): 124.29,
        ("11-03", "team-b"): 74.57,
    }
    assert {g.flavor: cost(g) for g in store.flavors} == {
        "H100-80GB": Decimal("672.00"),
        "A100-80GB/1g.10gb": Decimal("6.86"),
        "T4/share": Decimal("2.40"),
    }
    assert store.report is not None
    assert cost(store.report.total) == Decimal("681.26")
    budgets = {b.tenant: (b.budget, round(b.spent, 2), b.over) for b in store.budgets}
    assert budgets == {"team-a": (500.0, 482.40, True), "team-b": (300.0, 198.86, True)}


def test_chargeback_csv_has_a_row_per_day_owner_and_flavor(portal: Portal) -> None:
    store = CostStore(portal.source("tok-lead"))
    store.refresh()
    lines = store.chargeback().strip().splitlines()
    assert lines[0].startswith("period_start,period_end,tenant,owner,flavor")
    # Per day: alice H100-80GB, alice T4/share, bob H100-80GB, bob A100 MIG: 4 rows × 2 days.
    assert len(lines) == 1 + 8


def test_utilization_reads_ask_only_for_the_views_tenant_or_owner(portal: Portal) -> None:
    # The portal lists at most 200 live workloads' series: a view asks for its own only.
    TenantStore(portal.source("tok-anna"), tenant="team-a").refresh()
    MyWorkStore(portal.source("tok-alice"), owner="alice").refresh()
    queries = {
        e.token: e.query for e in portal.recorder.seen if e.path == "/api/v1/telemetry/series"
    }
    assert "tenant=team-a" in queries["tok-anna"].split("&")
    assert "owner=alice" in queries["tok-alice"].split("&")
