"""``AsyncPortal`` against the real API: the same answers and errors as ``Portal``."""

from __future__ import annotations

import asyncio

import pytest

from policies.errors import Forbidden, InvalidRequest, NotFound
from portal.client import ApiError, AsyncPortal, PortalUnreachable, PreconditionFailed
from portal.store.records import WorkloadState
from tests.portal.client.conftest import ProxyFactory, Served


async def test_request_read_release(portal_server: Served) -> None:
    async with AsyncPortal(portal_server.url, "alice") as alice:
        running, queued = [
            await alice.request("team-a", "H100-80GB", count=n, name=f"nb{n}") for n in (2, 1)
        ]
        assert running.state is WorkloadState.RUNNING
        assert (queued.state, queued.reason, queued.position) == (WorkloadState.QUEUED, "quota", 1)
        assert await alice.status(running.id) == running
        assert [e.workload_id for e in await alice.queue()] == [queued.id]
        assert (await alice.cancel(queued.id)).state is WorkloadState.CANCELLED
        assert (await alice.release(running.id)).state is WorkloadState.RELEASED
        assert await alice.workloads() == []


async def test_reads_follow_every_page(portal_server: Served) -> None:
    async with AsyncPortal(portal_server.url, "root", page_size=1) as root:
        made = await asyncio.gather(*(root.request("team-b", "H100-80GB") for _ in range(3)))
        assert sorted(w.id for w in await root.workloads()) == sorted(w.id for w in made)
        assert [t.name for t in await root.tenants()] == ["team-a", "team-b"]
        assert [q.tenant for q in await root.quotas()] == ["team-a", "team-b"]
        assert [u.used for u in await root.usage("team-b")] == [3]
        assert [n.name for n in await root.nodes()] == ["n1", "n2", "t1"]
        assert (await root.node("t1")).gpus[0].model == "T4"
        lean = await root.nodes(topology=False)
        assert [(n.name, n.links, n.numa) for n in lean] == [
            (m, None, None) for m in ("n1", "n2", "t1")
        ]
        assert {c.flavor for c in await root.capacity()} >= {"H100-80GB", "T4/share"}


async def test_quota_etags(portal_server: Served) -> None:
    async with AsyncPortal(portal_server.url, "anna") as anna:
        read = await anna.quota("team-a", "H100-80GB")
        await anna.set_quota("team-a", "H100-80GB", guaranteed=0, limit=1, if_match=read.etag)
        with pytest.raises(PreconditionFailed):
            await anna.set_quota("team-a", "H100-80GB", guaranteed=0, limit=2, if_match=read.etag)
        assert (await anna.tenant("team-a")).value.name == "team-a"


async def test_errors_map_like_the_sync_client(portal_server: Served) -> None:
    async with AsyncPortal(portal_server.url, "alice") as alice:
        with pytest.raises(Forbidden) as forbidden:
            await alice.request("team-b", "H100-80GB")
        assert isinstance(forbidden.value, ApiError)
        assert forbidden.value.status == 403
        with pytest.raises(NotFound):
            await alice.status("nope")
        with pytest.raises(InvalidRequest) as invalid:
            await alice.request("team-a", "H100-80GB", count=0)
        assert invalid.value.status == 422  # type: ignore[attr-defined]


async def test_a_lost_answer_is_retried_with_the_same_key(
    portal_server: Served, dropping_proxy: ProxyFactory
) -> None:
    proxy = dropping_proxy(b"POST ", 2)
    url = f"http://127.0.0.1:{proxy.port}/services/gpuportal/"
    async with AsyncPortal(url, "alice", retries=2) as alice:
        w = await alice.request("team-a", "H100-80GB")
    assert (proxy.dropped, len(proxy.forwarded)) == (2, 3)
    assert [s.id for s in portal_server.allocator.workloads()] == [w.id]


async def test_retries_run_out_into_one_clear_error(
    portal_server: Served, dropping_proxy: ProxyFactory
) -> None:
    proxy = dropping_proxy(b"GET ", 5)
    url = f"http://127.0.0.1:{proxy.port}/services/gpuportal/"
    async with AsyncPortal(url, "alice", retries=1) as alice:
        with pytest.raises(PortalUnreachable, match=f"cannot reach the portal at {url}"):
            await alice.tenants()
    assert len(proxy.forwarded) == 2


async def test_wait(portal_server: Served) -> None:
    async with AsyncPortal(portal_server.url, "alice") as alice:
        first = await alice.request("team-a", "H100-80GB", count=2)
        queued = await alice.request("team-a", "H100-80GB")
        still = await alice.wait(queued.id, timeout_s=0.2, poll_s=0.05)
        assert still.state is WorkloadState.QUEUED
        waiting = asyncio.create_task(alice.wait(queued.id, timeout_s=10, poll_s=0.05))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await alice.release(first.id)
        assert (await waiting).state is WorkloadState.RUNNING
