"""``Portal().ray`` against the real API over real HTTP (no process started: the controller
without a backend holds and releases the slices, see ``tests/portal/ray`` for real Ray)."""

from __future__ import annotations

import pytest

from policies.errors import Conflict, Forbidden, InvalidRequest
from portal.client import Portal
from portal.client.ray import RayNotReady
from portal.ray.controller import RayController
from tests.portal.client.conftest import Served


def test_create_scale_list_and_down(portal_server: Served) -> None:
    with Portal(portal_server.url, token="alice") as portal:
        info = portal.ray.create("team-a", workers=2, flavor="H100-80GB", max_workers=4)
        assert [(s.number, s.workers, s.state.value) for s in info.slices] == [(1, 2, "running")]
        grown = portal.ray.scale(info.id, 4)
        # team-a may hold 2 GPUs: the +2 waits with its reason, the gang keeps running.
        assert [(s.workers, s.state.value) for s in grown.slices] == [(2, "running"), (2, "queued")]
        last = grown.slices[-1].workload
        assert last is not None and last.reason == "quota"
        assert [c.id for c in portal.ray.list("team-a")] == [info.id]
        down = portal.ray.down(info.id)
        assert down.state.value == "stopped"
        assert portal_server.allocator.workloads() == []


def test_bad_input_and_another_tenant_are_refused(portal_server: Served) -> None:
    with Portal(portal_server.url, token="alice") as portal:
        with pytest.raises(InvalidRequest) as e:
            portal.ray.create("team-a", workers=3, flavor="H100-80GB", max_workers=2)
        assert e.value.field == "workers.max"
        cid = portal.ray.create("team-a", workers=1, flavor="H100-80GB", max_workers=2).id
    with Portal(portal_server.url, token="bob") as other:
        for attempt in (lambda: other.ray.get(cid), lambda: other.ray.scale(cid, 2)):
            with pytest.raises(Forbidden):
                attempt()
        with pytest.raises(Forbidden):
            other.ray.down(cid)
        assert other.ray.list() == []


def test_up_says_why_when_the_gang_does_not_fit(portal_server: Served) -> None:
    with Portal(portal_server.url, token="alice") as portal:
        portal.ray.create("team-a", workers=2, flavor="H100-80GB")  # all of team-a's quota
        with pytest.raises(RayNotReady, match="queued"):
            portal.ray.up("team-a", workers=1, flavor="H100-80GB", timeout_s=0.5, poll_s=0.1)
        waiting = portal.ray.list("team-a")[-1]
        assert waiting.slices[0].workload is not None
        assert waiting.slices[0].workload.reason == "quota"

        # More than the tenant's limit can ever give is refused, not queued.
        with pytest.raises(Forbidden):
            portal.ray.create("team-a", workers=3, flavor="H100-80GB")


def test_resume_asks_for_an_idle_clusters_workers_again(portal_server: Served) -> None:
    with Portal(portal_server.url, token="alice") as portal:
        cid = portal.ray.create("team-a", workers=2, flavor="H100-80GB").id
        with pytest.raises(Conflict):
            portal.ray.resume(cid)  # it holds its workers
        # The service's loop releases it once its head reports every node idle.
        RayController(portal_server.allocator).release_idle(cid, 60.0)
        assert portal.ray.get(cid).state.value == "idle"
        assert portal_server.allocator.workloads() == []
        with Portal(portal_server.url, token="bob") as other, pytest.raises(Forbidden):
            other.ray.resume(cid)
        back = portal.ray.resume(cid)
        assert [(s.number, s.workers, s.state.value) for s in back.slices] == [
            (1, 2, "released"),
            (2, 2, "running"),
        ]
        assert len(portal_server.allocator.workloads("team-a")) == 1
