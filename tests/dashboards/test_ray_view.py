"""Ray clusters in My work, Tenant and Cost against the real seeded portal API: clusters made
through ``/ray`` as their owners would (the API's controller holds their slices in the real
allocator; no Ray process is needed to show them), read back as each viewer."""

from __future__ import annotations

import time
from datetime import timedelta

from dashboards.app import build_view
from dashboards.ray_view import RayClustersView, cluster_row
from dashboards.stores import RayStore
from portal.api.ray import RayOut
from portal.client import Portal as Client
from tests.dashboards.conftest import Portal
from tests.dashboards.seed import VIEWERS
from tests.dashboards.test_scoping import rendered

H100 = "H100-80GB"


def up(portal: Portal, token: str, tenant: str, workers: int, grow_to: int) -> RayOut:
    with Client(portal.url, token) as c:
        made = c.ray.create(tenant, workers=workers, max_workers=grow_to, flavor=H100)
        return c.ray.scale(made.id, grow_to) if grow_to > workers else made


def store(portal: Portal, token: str, **kw: object) -> RayStore:
    s = RayStore(portal.source(token), clock=lambda: portal.clock.now.timestamp(), **kw)
    s.refresh()
    assert s.error == "", s.error
    return s


def rows(s: RayStore) -> dict[str, tuple[str, ...]]:
    return {r.id: cluster_row(r, s.cost_of(r.id), s.costs is not None) for r in s.clusters}


def test_each_viewer_sees_its_clusters_one_line_each_with_slices_and_gpu_hours(
    portal: Portal,
) -> None:
    # alice: 2 workers admitted, +2 asked for: team-a holds 5 of its 8 H100s already, so
    # the increase waits on quota. bob: one worker in team-b.
    mine = up(portal, "tok-alice", "team-a", 2, 4)
    assert [s.state.value for s in mine.slices] == ["running", "queued"]
    theirs = up(portal, "tok-bob", "team-b", 1, 1)
    portal.clock.now += timedelta(hours=1)

    alice = store(portal, "tok-alice", owner="alice")
    assert [r.id for r in alice.clusters] == [mine.id]  # never bob's
    row = rows(alice)[mine.id]
    assert row[3:6] == ("queued", "0 / 4 (2–4)", "2")
    assert row[6].startswith("#1 2 workers running, 2 devices; #2 2 workers queued (")
    assert "quota" in row[6]
    assert row[7] == "2.00"  # 2 GPUs for an hour: slice 1 only, the queued slice costs nothing
    cost = alice.cost_of(mine.id)
    assert cost is not None and [s.gpu_hours for s in cost.slices] == [2.0, 0.0]

    # Tenant: team-a's admin sees alice's cluster, not team-b's.
    anna = store(portal, "tok-anna", tenant="team-a")
    assert [r.id for r in anna.clusters] == [mine.id]
    assert rows(anna)[mine.id] == row

    # Cost (every tenant for leadership): both, each priced; bob sees only his in My work.
    before = len(portal.seen("tok-lead"))
    lead = store(portal, "tok-lead", stopped=True)
    assert {r.id for r in lead.clusters} == {mine.id, theirs.id}
    assert rows(lead)[theirs.id][7] == "1.00"
    # One cost read per refresh, whatever the number of clusters; it answers per cluster
    # what the cluster's own cost route does.
    cost_reads = [e.path for e in portal.seen("tok-lead")[before:] if "cost" in e.path]
    assert cost_reads == ["/api/v1/ray/costs"]
    with Client(portal.url, "tok-lead") as c:
        for cluster in (mine, theirs):
            assert lead.cost_of(cluster.id) == c.ray.cost(cluster.id)
    assert [r.id for r in store(portal, "tok-bob", owner="bob").clusters] == [theirs.id]

    # A stopped cluster leaves My work and Tenant but stays in this month's Cost.
    with Client(portal.url, "tok-alice") as c:
        c.ray.down(mine.id)
    assert store(portal, "tok-alice", owner="alice").clusters == []
    lead = store(portal, "tok-lead", stopped=True)
    assert rows(lead)[mine.id][3] == "stopped" and rows(lead)[mine.id][7] == "2.00"


def test_the_pages_show_the_section_and_another_tenants_cluster_never_appears(
    portal: Portal,
) -> None:
    up(portal, "tok-alice", "team-a", 1, 1)
    bobs = up(portal, "tok-bob", "team-b", 1, 1)
    page = build_view("my_work", portal.source("tok-alice"), VIEWERS["tok-alice"], {}, time.time)
    text = rendered(page.view)
    assert "Ray clusters" in text and "#1 1 worker running" in text
    assert bobs.id not in text and "nb-bob" not in text
    for token, view in (("tok-anna", "tenant"), ("tok-anna", "cost")):
        text = rendered(build_view(view, portal.source(token), VIEWERS[token], {}, time.time).view)
        assert "Ray clusters" in text and "#1 1 worker running" in text, view
        assert bobs.id not in text
    empty = RayClustersView(store(portal, "tok-mia", owner="mia"), empty="You have none.")
    assert "You have none." in rendered(empty)
