"""The weight cache's size accounting and eviction on Kubernetes, against the real apiserver
and a kwok GPU node: entries counted against the tenant's cache size on a node at the size
their source declared, the least recently used one no running replica uses removed by an
evict Job on that node before a fetch that would not fit, and a model that cannot fit refused
with the sizes in the way.

kwok completes the cache's Jobs (the fetch and evict pods run no container): the files on
the node are the fetch module's business, tested as a real process in ``test_fetch.py``.
The models' sizes come from a real HTTP server on loopback (what the portal asks before a
fetch)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from policies.errors import Conflict, Unavailable
from policies.isolation import IsolationSettings, TenantSpec
from policies.services import ModelRef
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from portal.inference import kubeweights as kw
from portal.inference.controller import ServiceController
from portal.inference.kube import kube_backend
from portal.inference.kubecache import KubeWeights
from portal.inference.weights import Fetched, InUse
from portal.isolation import reconcile
from portal.store.writer import Store
from tests.portal.api.conftest import auth, member_of, user
from tests.portal.inference.test_weights import Served, http_model
from tests.support import gpu_nodes
from tests.support.k8s import K8sCluster
from tests.support.k8s_tenants import delete_tenant_namespaces
from tests.support.kwok_stages import EXIT_CODE
from tests.support.waiting import eventually

pytestmark = pytest.mark.k8s

SETTINGS = IsolationSettings()
NODE = "ke-h100-a"
TEAM_A = TenantSpec(name="keteama", gpu_limits={"H100-80GB": 8}, cpu_millis=8000,
                    memory_mib=16384, pods=20)  # fmt: skip
TEAM_B = TenantSpec(name="keteamb", gpu_limits={"H100-80GB": 8}, cpu_millis=8000,
                    memory_mib=16384, pods=20)  # fmt: skip
NS_A = SETTINGS.namespace(TEAM_A.name)
TOKENS = {
    "alice": user("alice", {TEAM_A.name}, *member_of(TEAM_A.name)),
    "bob": user("bob", {TEAM_B.name}, *member_of(TEAM_B.name)),
}
CACHE = kw.CacheConfig("/var/lib/gpuportal/weights", "registry.invalid/gpuportal:0", 2_500)
"""Room for two 1000-byte models per tenant on a node, not three."""
T0 = datetime.now(UTC) + timedelta(hours=1)
"""The replicas' starts: after the Jobs' real completion times, which also count as uses."""


@pytest.fixture(scope="module")
def api(k8s_cluster: K8sCluster) -> Iterator[client.ApiClient]:
    with k8s_cluster.api_client() as api_client:
        reconcile([TEAM_A, TEAM_B], SETTINGS, api_client)
        k8s_cluster.add_gpu_node(gpu_nodes.h100_nvswitch_node(NODE, rack="rack-ke"))
        yield api_client
        core = client.CoreV1Api(api_client)
        client.BatchV1Api(api_client).delete_collection_namespaced_job(
            NS_A, propagation_policy="Background"
        )
        delete_tenant_namespaces(api_client, SETTINGS, [NS_A, SETTINGS.namespace(TEAM_B.name)])
        with contextlib.suppress(ApiException):
            core.delete_node(NODE)
        for namespace in (NS_A, SETTINGS.namespace(TEAM_B.name)):
            with contextlib.suppress(ApiException):
                core.delete_persistent_volume(kw.volume_name(NODE, namespace))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    (tmp_path / "www").mkdir()
    s = Served(tmp_path / "www")
    yield s
    s.server.shutdown()
    s.server.server_close()


def cache_jobs(
    batch: client.BatchV1Api, component: str, deleting: bool = False
) -> list[client.V1Job]:
    """The tenant's Jobs of ``component`` (with those being deleted when ``deleting``)."""
    selector = f"{SETTINGS.label('component')}={component}"
    found = batch.list_namespaced_job(NS_A, label_selector=selector).items
    return [j for j in found if deleting or j.metadata.deletion_timestamp is None]


def ready(cache: KubeWeights, model: ModelRef, in_use: InUse, minute: int) -> Fetched:
    """Ask as the controller does each round until the weights are there."""
    at = T0 + timedelta(minutes=minute)
    return eventually(
        lambda: got if (got := cache.ensure(NODE, TEAM_A.name, model, in_use, at)).ready else None,
        f"{model.uri} ready on {NODE}",
    )


def test_a_fetch_that_would_not_fit_evicts_the_least_recently_used_unused_entry_first(
    api: client.ApiClient, served: Served, tmp_path: Path
) -> None:
    batch = client.BatchV1Api(api)
    cache = KubeWeights(api, SETTINGS, CACHE)
    m1, m2, m3 = (http_model(served, f"m{i}.bin", 1000) for i in (1, 2, 3))
    ready(cache, m1, (), 1)
    ready(cache, m2, (), 2)
    ready(cache, m1, (), 3)  # a replica starts on m1 again: m2 is now the least recently used
    # Sizes without a kubelet (kwok reports none): what the source declared, on the Job.
    rows = cache.entries(())
    assert [(e.tenant, e.digest, e.size) for e in rows] == sorted(
        [(TEAM_A.name, m1.digest, 1000), (TEAM_A.name, m2.digest, 1000)],
        key=lambda r: r[1],
    )
    last = {e.digest: e.last_used for e in rows}
    assert last[m1.digest] == T0 + timedelta(minutes=3) > last[m2.digest]

    # m3 would make 3000 > 2500: m1 is in use by a running replica, so m2 goes, by a Job on
    # the node that removes its folder, and no fetch is made before the eviction is done.
    in_use = [(NODE, m1.digest)]
    first = cache.ensure(NODE, TEAM_A.name, m3, in_use, T0 + timedelta(minutes=4))
    assert not first.ready
    (evict,) = cache_jobs(batch, kw.EVICT_COMPONENT)
    assert evict.metadata.name == kw.evict_job_name(NODE, m2.digest)
    pod = evict.spec.template.spec
    assert pod.node_name == NODE
    assert pod.containers[0].command[-3:] == ["--evict", m2.digest, kw.CACHE]
    assert pod.volumes[0].persistent_volume_claim.claim_name == kw.claim_name(NODE)
    assert pod.security_context.run_as_non_root is True  # the namespace enforces restricted
    assert kw.fetch_job_name(NODE, m3.digest) not in {
        j.metadata.name for j in cache_jobs(batch, kw.FETCH_COMPONENT)
    }
    ready(cache, m3, in_use, 5)
    assert sorted(e.digest for e in cache.entries(())) == sorted([m1.digest, m3.digest])
    names = {j.metadata.name for j in cache_jobs(batch, kw.FETCH_COMPONENT)}
    assert kw.fetch_job_name(NODE, m2.digest) not in names
    eventually(lambda: True if not cache_jobs(batch, kw.EVICT_COMPONENT, True) else None,
               "the evict Job deleted once done")  # fmt: skip

    # Both entries in use: m2 cannot fit, so nothing is evicted or fetched and the replica
    # is told why, with the sizes.
    both = [(NODE, m1.digest), (NODE, m3.digest)]
    with pytest.raises(Conflict, match=f"tenant {TEAM_A.name} on node {NODE}: 1000 bytes do not"):
        cache.ensure(NODE, TEAM_A.name, m2, both, T0 + timedelta(minutes=6))
    assert cache_jobs(batch, kw.EVICT_COMPONENT) == []
    assert len(cache_jobs(batch, kw.FETCH_COMPONENT)) == 2

    # An eviction that fails (kwok's stand-in for its pod's exit code): the entry stays, and
    # the replica waiting for the room ends with why; the next one decides again.
    failing: Any = kw.evict_job(NODE, TEAM_A.name, m1.digest, CACHE, SETTINGS)
    failing["spec"]["backoffLimit"] = 0
    failing["spec"]["template"]["metadata"]["annotations"][EXIT_CODE] = "1"
    batch.create_namespaced_job(NS_A, failing)

    def refused() -> str | None:
        try:
            cache.ensure(NODE, TEAM_A.name, m2, (), T0 + timedelta(minutes=7))
        except Unavailable as exc:
            return exc.message
        return None

    assert "the eviction of " + m1.digest + " failed" in eventually(refused, "eviction failed")
    assert m1.digest in {e.digest for e in cache.entries(())}
    eventually(lambda: True if not cache_jobs(batch, kw.EVICT_COMPONENT, True) else None,
               "the failed evict Job deleted")  # fmt: skip

    # Through the API: sizes and last use per node and tenant; another tenant sees nothing.
    with Store(f"sqlite:///{tmp_path / 'portal.db'}") as store:
        alloc = Allocator(store)
        alloc.start([])
        for tenant in (TEAM_A, TEAM_B):
            alloc.set_tenant(tenant.name)
        backend = kube_backend(api, SETTINGS, tmp_path, CACHE)
        controller = ServiceController(alloc, backend=backend)
        app = create_app(alloc, StaticAuthenticator(TOKENS), service_controller=controller)
        with TestClient(app) as http:
            mine = http.get("/api/v1/services/cache", headers=auth("alice"))
            assert mine.status_code == 200, mine.text
            rows = {r["digest"]: r for r in mine.json()["items"]}
            assert sorted(rows) == sorted([m1.digest, m3.digest])
            assert {(r["node"], r["tenant"], r["size_bytes"]) for r in rows.values()} == {
                (NODE, TEAM_A.name, 1000)
            }
            used = datetime.fromisoformat(rows[m1.digest]["last_used"].replace("Z", "+00:00"))
            assert used == T0 + timedelta(minutes=3)
            theirs = http.get("/api/v1/services/cache", headers=auth("bob"))
            assert theirs.status_code == 200 and theirs.json()["items"] == []
            other = http.get(f"/api/v1/services/cache?tenant={TEAM_A.name}", headers=auth("bob"))
            assert other.status_code == 403 and m1.digest not in other.text
