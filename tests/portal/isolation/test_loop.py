"""The isolation loop on the real apiserver: a quota change in the portal reaches the tenant's
ResourceQuota, an unchanged portal costs nothing until the resync, and drift is repaired then.

It uses its own label and namespace prefixes, so its reconciles never see (or delete) the
objects other tests in the same cluster manage.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from policies.isolation import IsolationSettings
from portal.allocator import Allocator
from portal.isolation import reconcile
from portal.isolation.config import load_isolation_settings
from portal.isolation.loop import (
    LOOP_NAME,
    IsolationLoop,
    TenantDefaults,
    register,
    register_for_service,
    tenant_specs,
)
from portal.service.loops import Loops
from portal.settings import Settings
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, hgx
from tests.support.k8s import K8sCluster

pytestmark = pytest.mark.k8s

SETTINGS = IsolationSettings(namespace_prefix="gl-", label_prefix="loop.gpuportal.io/")
NS = SETTINGS.namespace("loop-a")


@dataclass
class Seconds:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def alloc(tmp_path: Path) -> Iterator[Allocator]:
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    a = Allocator(store, clock=ManualClock())
    a.start([hgx("n1")])
    a.set_tenant("loop-a")
    a.set_quota("loop-a", "H100-80GB", guaranteed=1, limit=2)
    yield a
    store.close()


@pytest.fixture
def api(k8s_cluster: K8sCluster) -> Iterator[client.ApiClient]:
    with k8s_cluster.api_client() as api_client:
        yield api_client
        reconcile([], SETTINGS, api_client, force=True)


def gpu_limit(api: client.ApiClient) -> str:
    quota = client.CoreV1Api(api).read_namespaced_resource_quota("tenant-quota", NS)
    assert quota.spec is not None and quota.spec.hard is not None
    return str(quota.spec.hard["requests.nvidia.com/gpu"])


def test_a_quota_change_in_the_portal_updates_the_tenants_resource_quota(
    alloc: Allocator, api: client.ApiClient
) -> None:
    clock = Seconds()
    loop = IsolationLoop(alloc, SETTINGS, api, resync_s=300, clock=clock)
    loop()
    assert gpu_limit(api) == "2"
    assert loop.last is not None and any(r.kind == "Namespace" for r in loop.last.created)

    alloc.set_quota("loop-a", "H100-80GB", guaranteed=1, limit=3, expected_version=1)
    loop()
    assert gpu_limit(api) == "3"
    assert [str(r) for r in loop.last.updated] == [f"ResourceQuota {NS}/tenant-quota"]

    # Nothing changed in the portal: no reconcile (the result object is the same) ...
    before = loop.last
    client.NetworkingV1Api(api).delete_namespaced_network_policy("default-deny", NS)
    loop()
    assert loop.last is before
    # ... until the resync, which repairs the hand deletion.
    clock.now += 301
    loop()
    assert [str(r) for r in loop.last.created] == [f"NetworkPolicy {NS}/default-deny"]
    client.NetworkingV1Api(api).read_namespaced_network_policy("default-deny", NS)


def test_registered_in_the_service_loops_it_follows_quota_changes_on_its_own(
    alloc: Allocator, api: client.ApiClient
) -> None:
    loops = Loops()
    register(loops, alloc, SETTINGS, api, interval_s=0.2)
    assert loops[LOOP_NAME].interval_s == 0.2
    loops.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if gpu_limit(api) == "2":
                    break
            except ApiException:
                pass
            assert time.monotonic() < deadline, loops[LOOP_NAME].last_error
            time.sleep(0.2)
        alloc.set_quota("loop-a", "H100-80GB", guaranteed=0, limit=1, expected_version=1)
        while gpu_limit(api) != "1":
            assert time.monotonic() < deadline, loops[LOOP_NAME].last_error
            time.sleep(0.2)
    finally:
        loops.stop()
    assert loops[LOOP_NAME].errors == 0


def test_specs_carry_quota_limits_and_a_single_node_pool(alloc: Allocator) -> None:
    alloc.set_tenant("loop-b", pools=("pool-1",))
    specs = {s.name: s for s in tenant_specs(alloc, TenantDefaults(pods=7))}
    assert dict(specs["loop-a"].gpu_limits) == {"H100-80GB": 2}
    assert specs["loop-a"].node_pool is None and specs["loop-a"].pods == 7
    assert dict(specs["loop-b"].gpu_limits) == {} and specs["loop-b"].node_pool == "pool-1"


def test_the_service_registers_no_isolation_loop_without_kubernetes(alloc: Allocator) -> None:
    loops = Loops()
    assert register_for_service(loops, alloc, Settings(inventory="demo"), SETTINGS) is None
    assert [loop.name for loop in loops] == []


def test_the_service_reconciles_and_binds_with_the_settings_of_its_isolation_file(
    alloc: Allocator,
    k8s_cluster: K8sCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from portal.kube import service as kube_service

    path = tmp_path / "isolation.yaml"
    path.write_text("namespace_prefix: gf-\nlabel_prefix: file.gpuportal.io/\n")
    wanted = IsolationSettings(namespace_prefix="gf-", label_prefix="file.gpuportal.io/")
    # Outside a pod the service reads the kubeconfig (KUBECONFIG, read by the client at import).
    monkeypatch.setattr(
        "kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION",
        str(k8s_cluster.admin_kubeconfig),
    )
    settings = Settings(inventory="kubernetes", isolation_file=path)
    isolation = load_isolation_settings(settings.isolation_file)  # as ``gpuportal serve`` does
    loops = Loops()
    loop = register_for_service(loops, alloc, settings, isolation)
    assert loop is not None
    bound = kube_service.register_for_service(loops, alloc, settings, isolation)
    assert bound is not None and bound[0]._settings == wanted  # the binder agrees
    with k8s_cluster.api_client() as api:
        try:
            loop.work()
            ns = client.CoreV1Api(api).read_namespace("gf-loop-a")
            assert ns.metadata is not None and ns.metadata.labels is not None
            assert ns.metadata.labels["file.gpuportal.io/tenant"] == "loop-a"
        finally:
            reconcile([], wanted, api, force=True)
