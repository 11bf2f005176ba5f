"""The Cluster view marks a flavor whose guarantees add up to more than its capacity."""

from __future__ import annotations

from dashboards.cluster import ClusterView
from dashboards.stores import ClusterStore
from tests.dashboards.conftest import Portal


def test_an_overcommitted_flavor_is_shown_as_such(portal: Portal) -> None:
    # The seed: team-a and team-b each guarantee 4 of the 16 H100s; the platform over-commits.
    portal.allocator.set_quota("team-a", "H100-80GB", guaranteed=16, limit=16, overcommit=True)
    store = ClusterStore(portal.source("tok-root"))
    store.refresh()
    assert store.error == ""
    rows = {f.flavor: f for f in store.free_by_flavor()}
    assert (rows["H100-80GB"].guaranteed, rows["H100-80GB"].capacity) == (20, 16)
    assert rows["H100-80GB"].overcommitted
    assert not rows["T4/share"].overcommitted
    html = ClusterView(store).free()
    assert "over-committed: guarantees 20 of 16" in html
    assert html.count("over-committed") == 1
