"""``Portal`` against the real API over real HTTP: every method, errors, pages, retries."""

from __future__ import annotations

import socket
import threading

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from policies.errors import Conflict, Forbidden, InvalidRequest, NotFound
from policies.flavors import FlavorKind
from policies.requests import TopologyRequirement, WorkloadKind
from portal.api.schemas import DevicesIn
from portal.client import (
    ApiError,
    ApiNotFound,
    Expired,
    Portal,
    PortalUnreachable,
    PreconditionFailed,
    PreconditionRequired,
    Unauthorized,
)
from portal.store.records import WorkloadState
from tests.portal.client.conftest import ProxyFactory, Served, serving


def portal(served: Served, token: str = "root", **kw: object) -> Portal:
    return Portal(served.url, token, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------ tenants and quotas


def test_tenants_and_quotas_list_what_the_token_may_see(portal_server: Served) -> None:
    with portal(portal_server) as root, portal(portal_server, "alice") as alice:
        assert [t.name for t in root.tenants()] == ["team-a", "team-b"]
        assert [t.name for t in alice.tenants()] == ["team-a"]
        assert [(q.tenant, q.flavor, q.guaranteed, q.limit) for q in root.quotas()] == [
            ("team-a", "H100-80GB", 2, 2),
            ("team-b", "H100-80GB", 2, 4),
        ]
        assert [q.tenant for q in root.quotas("team-b")] == ["team-b"]
        read = root.tenant("team-a")
        assert read.value.name == "team-a"
        assert read.etag == f'"{read.value.version}"'


def test_a_quota_is_changed_with_the_etag_it_was_read_with(portal_server: Served) -> None:
    with portal(portal_server, "anna") as anna:
        read = anna.quota("team-a", "H100-80GB")
        assert read.etag == f'"{read.value.version}"'
        changed = anna.set_quota("team-a", "H100-80GB", guaranteed=1, limit=3, if_match=read.etag)
        assert (changed.value.guaranteed, changed.value.limit) == (1, 3)
        assert changed.etag != read.etag
        assert portal_server.allocator.quotas("team-a")[0].limit == 3


def test_a_stale_etag_is_a_conflict_and_changes_nothing(portal_server: Served) -> None:
    with portal(portal_server, "anna") as first, portal(portal_server, "anna") as second:
        etag = first.quota("team-a", "H100-80GB").etag
        first.set_quota("team-a", "H100-80GB", guaranteed=1, limit=2, if_match=etag)
        with pytest.raises(PreconditionFailed) as caught:
            second.set_quota("team-a", "H100-80GB", guaranteed=2, limit=9, if_match=etag)
    assert isinstance(caught.value, Conflict)
    assert (caught.value.status, caught.value.code) == (412, "precondition_failed")
    quota = portal_server.allocator.quotas("team-a")[0]
    assert (quota.guaranteed, quota.limit) == (1, 2)


def test_an_edit_without_etag_is_refused_and_create_makes_a_new_quota(
    portal_server: Served,
) -> None:
    with portal(portal_server, "anna") as anna:
        with pytest.raises(PreconditionRequired) as caught:
            anna.set_quota("team-a", "H100-80GB", guaranteed=0, limit=1)
        assert caught.value.status == 428
        assert "If-Match" in caught.value.message
    # A new flavor's quota is the platform's to give (its ceilings start at 0).
    with portal(portal_server, "root") as root:
        made = root.set_quota("team-a", "T4", guaranteed=1, limit=2, create=True)
        assert made.value.flavor == "T4"
        assert root.quota("team-a", "T4").etag == made.etag
        with pytest.raises(PreconditionFailed):
            root.set_quota("team-a", "T4", guaranteed=1, limit=2, create=True)
    with portal(portal_server, "anna") as anna, pytest.raises(InvalidRequest, match="if_match"):
        anna.set_quota("team-a", "H100-80GB", guaranteed=1, limit=2, if_match='"1"', create=True)


# ------------------------------------------------------------------ workloads


def test_a_reused_idempotency_key_for_another_request_raises_invalid_request(
    portal_server: Served,
) -> None:
    with portal(portal_server, "alice") as alice:
        first = alice.request("team-a", "H100-80GB", name="a", idempotency_key="spawn-1")
        with pytest.raises(InvalidRequest) as caught:
            alice.request("team-a", "H100-80GB", name="b", idempotency_key="spawn-1")
        assert caught.value.code == "idempotency_mismatch"
        assert caught.value.field == "Idempotency-Key" and first.id in caught.value.message


def test_a_request_that_fits_runs_with_its_devices(portal_server: Served) -> None:
    with portal(portal_server, "alice") as alice:
        w = alice.request("team-a", "H100-80GB", count=2, name="train", kind=WorkloadKind.JOB)
        assert w.state is WorkloadState.RUNNING
        assert (w.tenant, w.owner, w.name, w.kind) == ("team-a", "alice", "train", "job")
        assert sum(len(a.gpus) for a in w.allocations) == 2
        assert w.flavor == "H100-80GB"
        assert alice.status(w.id) == w
        released = alice.release(w.id)
        assert released.state is WorkloadState.RELEASED
        assert alice.release(w.id).state is WorkloadState.RELEASED  # idempotent
        assert alice.workloads() == []


def test_a_request_over_quota_is_queued_with_reason_position_and_can_be_cancelled(
    portal_server: Served,
) -> None:
    with portal(portal_server, "alice") as alice:
        alice.request("team-a", "H100-80GB", count=2)
        queued = alice.request("team-a", "H100-80GB", count=1, name="waiting")
        assert queued.state is WorkloadState.QUEUED
        assert queued.reason == "quota"
        assert queued.message
        assert (queued.position, queued.tenant_position) == (1, 1)
        assert queued.allocations == []
        [entry] = alice.queue()
        assert (entry.workload_id, entry.reason, entry.position) == (queued.id, "quota", 1)
        assert [w.state for w in alice.workloads(state="queued")] == [WorkloadState.QUEUED]
        assert alice.cancel(queued.id).state is WorkloadState.CANCELLED
        assert alice.queue() == []


def test_request_shapes_from_flavor_names_and_devices(portal_server: Served) -> None:
    with portal(portal_server) as root:
        root.set_quota("team-b", "T4/share", guaranteed=500, limit=500, create=True)
        shared = root.request("team-b", "T4/share", milli=250, gpu_memory_mib=4096)
        assert shared.state is WorkloadState.RUNNING, shared.message
        assert [(a.node, a.milli, a.gpu_memory_mib) for a in shared.allocations] == [
            ("t1", 250, 4096)
        ]
        with pytest.raises(InvalidRequest, match="mig"):
            root.request("team-b", "H100-80GB/1g.10gb")  # no MIG GPUs: the server says so
        pair = root.request(
            "team-b",
            devices=DevicesIn(kind=FlavorKind.GPU, count=2, topology=TopologyRequirement.NVLINK),
        )
        assert pair.state is WorkloadState.RUNNING, pair.message
        assert [len(a.gpus) for a in pair.allocations] == [2]
        with pytest.raises(InvalidRequest, match="flavor"):
            root.request("team-b", "H100-80GB", devices=DevicesIn())
        with pytest.raises(InvalidRequest, match=r"MIG profile '9g\.999gb'"):
            root.request("team-b", "H100-80GB/9g.999gb")  # the flavor parser's own error


def test_the_same_idempotency_key_allocates_once(portal_server: Served) -> None:
    with portal(portal_server, "alice") as alice:
        first = alice.request("team-a", "H100-80GB", idempotency_key="nb-alice-1")
        again = alice.request("team-a", "H100-80GB", idempotency_key="nb-alice-1")
        other = alice.request("team-a", "H100-80GB")
    assert again.id == first.id
    assert other.id != first.id
    assert len(portal_server.allocator.workloads()) == 2


def test_a_lost_answer_to_an_allocation_is_retried_with_the_same_key(
    portal_server: Served, dropping_proxy: ProxyFactory
) -> None:
    proxy = dropping_proxy(b"POST ", 1)
    url = f"http://127.0.0.1:{proxy.port}/services/gpuportal/"
    with Portal(url, "alice") as alice:
        w = alice.request("team-a", "H100-80GB")
    assert proxy.dropped == 1
    assert len(proxy.forwarded) == 2  # the portal got the request twice ...
    keys = {line for req in proxy.forwarded for line in req.split(b"\r\n") if b"dempotency" in line}
    assert len(keys) == 1  # ... with one key ...
    assert [s.id for s in portal_server.allocator.workloads()] == [w.id]  # ... and allocated once
    assert w.state is WorkloadState.RUNNING


def test_a_lost_answer_to_a_quota_edit_is_not_sent_again(
    portal_server: Served, dropping_proxy: ProxyFactory
) -> None:
    proxy = dropping_proxy(b"PUT ", 1)
    url = f"http://127.0.0.1:{proxy.port}/services/gpuportal/"
    with Portal(url, "anna") as anna:
        etag = anna.quota("team-a", "H100-80GB").etag
        with pytest.raises(PortalUnreachable, match=f"cannot reach the portal at {url}"):
            anna.set_quota("team-a", "H100-80GB", guaranteed=1, limit=2, if_match=etag)
    assert len(proxy.forwarded) == 1


# ------------------------------------------------------------------ reads and pages


def test_lists_follow_every_page(portal_server: Served) -> None:
    with portal(portal_server, page_size=2) as root:
        made = [root.request("team-b", "H100-80GB", name=f"w{i}") for i in range(5)]
        assert [w.id for w in root.workloads()] == [w.id for w in made]
        assert [w.id for w in root.workloads(tenant="team-b", state="queued")] == [
            w.id for w in made[4:]
        ]
        assert len(root.queue()) == 1
    with portal(portal_server, page_size=1) as root:
        assert [t.name for t in root.tenants()] == ["team-a", "team-b"]
    with pytest.raises(InvalidRequest, match="page_size"):
        portal(portal_server, page_size=0)


def test_usage_and_inventory(portal_server: Served) -> None:
    with portal(portal_server) as root:
        root.request("team-b", "H100-80GB", count=3)
        [a, b] = root.usage()
        assert (a.tenant, a.used) == ("team-a", 0)
        assert (b.tenant, b.used, b.borrowed, b.lent) == ("team-b", 3, 1, 0)
        assert [u.tenant for u in root.usage("team-b")] == ["team-b"]
        nodes = root.nodes()
        assert [n.name for n in nodes] == ["n1", "n2", "t1"]
        assert sum(g.free_milli == 0 for n in nodes for g in n.gpus) == 3
        assert root.node("n2").name == "n2"
        assert [(c.flavor, c.capacity) for c in root.capacity() if c.flavor == "H100-80GB"] == [
            ("H100-80GB", 16)
        ]


def test_nodes_without_topology_follow_every_page(portal_server: Served) -> None:
    with portal(portal_server, page_size=2) as root:
        full = root.nodes()
        lean = root.nodes(topology=False)
        assert [n.links for n in full if n.name == "n1"] != [None]
        assert [n.model_copy(update={"links": None, "numa": None}) for n in full] == lean


def test_nodes_are_listed_once_and_then_followed_by_their_changes(portal_server: Served) -> None:
    with portal(portal_server, page_size=2) as root, portal(portal_server, "alice") as alice:
        listed = root.versioned_nodes(topology=False)
        assert [n.name for n in listed.value] == ["n1", "n2", "t1"]
        assert root.node_changes(listed.version).nodes == []
        made = alice.request("team-a", "H100-80GB", count=2)
        (held,) = {a.node for a in made.allocations}
        changed = root.node_changes(listed.version, topology=False)
        assert [n.name for n in changed.nodes] == [held]
        assert changed.nodes[0].links is None
        assert sum(g.free_milli for g in changed.nodes[0].gpus) == 6000
        assert root.node_changes(changed.version).nodes == []
        with pytest.raises(Expired) as caught:
            root.node_changes("0123456789ab.0")
        assert caught.value.status == 410


# ------------------------------------------------------------------ errors


def test_another_tenants_workloads_are_forbidden_with_the_servers_message(
    portal_server: Served,
) -> None:
    with portal(portal_server, "alice") as alice, pytest.raises(Forbidden) as caught:
        alice.request("team-b", "H100-80GB")
    err = caught.value
    assert isinstance(err, ApiError)
    assert (err.status, err.code) == (403, "forbidden")
    assert "team-b" in err.message
    assert err.url.endswith("/services/gpuportal/api/v1/workloads")
    with portal(portal_server, "alice") as alice, pytest.raises(Forbidden):
        alice.usage("team-b")


def test_unknown_things_are_not_found(portal_server: Served) -> None:
    with portal(portal_server) as root:
        with pytest.raises(ApiNotFound, match="unknown workload 'nope'") as caught:
            root.status("nope")
        assert isinstance(caught.value, NotFound)
        assert caught.value.status == 404
        with pytest.raises(NotFound, match="quota"):
            root.quota("team-a", "A100-80GB")
        with pytest.raises(NotFound, match="node"):
            root.node("n9")


def test_invalid_input_names_the_field_and_what_is_valid(portal_server: Served) -> None:
    with portal(portal_server) as root, pytest.raises(InvalidRequest) as caught:
        root.request("team-a", "H100-80GB", count=99)
    err = caught.value
    assert isinstance(err, ApiError)
    assert (err.status, err.code, err.field) == (422, "invalid", "devices.count")
    assert "devices.count" in err.message
    assert err.valid


def test_an_unknown_token_is_unauthorized(portal_server: Served) -> None:
    with portal(portal_server, "stolen") as p, pytest.raises(Unauthorized) as caught:
        p.tenants()
    assert caught.value.status == 401


def test_a_wrong_url_says_the_answer_was_not_the_portals(portal_server: Served) -> None:
    wrong = Portal(f"{portal_server.origin}/services/other/", "root")
    with wrong, pytest.raises(NotFound, match="without the portal's error body") as caught:
        wrong.tenants()
    assert "/services/other/api/v1/tenants" in caught.value.message


def test_no_server_is_one_clear_error_naming_the_url() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/services/gpuportal/"
    with Portal(url, "root", retries=1) as p, pytest.raises(PortalUnreachable) as caught:
        p.tenants()
    assert url in caught.value.message


def test_wait_returns_once_the_workload_runs_or_time_is_up(portal_server: Served) -> None:
    with portal(portal_server, "alice") as alice:
        first = alice.request("team-a", "H100-80GB", count=2)
        queued = alice.request("team-a", "H100-80GB")
        still = alice.wait(queued.id, timeout_s=0.3, poll_s=0.1)
        assert (still.state, still.reason) == (WorkloadState.QUEUED, "quota")
        releaser = threading.Timer(0.3, lambda: portal_server.allocator.release(first.id))
        releaser.start()
        try:
            started = alice.wait(queued.id, timeout_s=10, poll_s=0.05)
        finally:
            releaser.join()
        assert started.state is WorkloadState.RUNNING
        assert alice.wait(first.id).state is WorkloadState.RELEASED  # ended: no waiting


def test_an_answer_the_client_cannot_read_is_an_api_error_naming_the_field() -> None:
    # A portal of another version: its tenants carry a field this client does not know.
    newer: dict[str, object] = {
        "name": "team-a",
        "cohort": None,
        "weight": 1.0,
        "pools": [],
        "version": 1,
    }
    page = {"items": [{**newer, "color": "red"}], "total": 1, "limit": 500, "offset": 0}

    async def tenants(_request: Request) -> JSONResponse:
        return JSONResponse({**page, "next_offset": None})

    app = Starlette(routes=[Route("/api/v1/tenants", tenants)])
    unreadable = r"cannot read \(color: .*same version"
    with (
        serving(app) as port,
        Portal(f"http://127.0.0.1:{port}/", "t") as p,
        pytest.raises(ApiError, match=unreadable) as caught,
    ):
        p.tenants()
    assert caught.value.status == 200


def test_one_object_answers_that_do_not_fit_or_are_not_json_are_api_errors() -> None:
    async def node(request: Request) -> JSONResponse | PlainTextResponse:
        if request.path_params["name"] == "odd":
            return JSONResponse({"name": "odd"})  # a node without its other fields
        return PlainTextResponse("<html>a login page</html>")

    app = Starlette(routes=[Route("/api/v1/nodes/{name}", node)])
    with serving(app) as port, Portal(f"http://127.0.0.1:{port}/", "t") as p:
        with pytest.raises(ApiError, match=r"answered a NodeOut this client cannot read \(sched"):
            p.node("odd")
        with pytest.raises(ApiError, match="without JSON"):
            p.node("html")


def test_platform_admins_create_and_change_tenants_with_etags(portal_server: Served) -> None:
    with portal(portal_server) as root:
        made = root.set_tenant("team-c", cohort="research", pools=["big"], create=True)
        assert (made.value.cohort, made.value.pools, made.value.version) == ("research", ["big"], 1)
        changed = root.set_tenant("team-c", cohort="research", weight=2, if_match=made.etag)
        assert (changed.value.weight, changed.value.pools) == (2.0, [])
        with pytest.raises(PreconditionFailed):
            root.set_tenant("team-c", weight=3, if_match=made.etag)
    assert [t.name for t in portal_server.allocator.tenants()] == ["team-a", "team-b", "team-c"]
    with portal(portal_server, "anna") as anna, pytest.raises(Forbidden, match="admin"):
        anna.set_tenant("team-a", if_match='"1"')
