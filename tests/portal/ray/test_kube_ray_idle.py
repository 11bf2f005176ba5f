"""Idle release, resume and growth on demand of Ray clusters on Kubernetes: the real KubeRay
operator and apiserver, kwok GPU nodes, and the real controller reading a real Ray head.

kwok runs no Ray, so the one boundary faked is where a head is: the controller's head reader
(``portal.ray.kube.head_reader``) is given a resolver that maps the cluster's head Service to
a real ``ray start --head`` this module starts on loopback. The read itself (the child
interpreter asking the GCS for idle times and pending GPU demand), the decisions (the
controller's, shared with the local backend) and what the operator does with the RayCluster
are all real.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from policies.isolation import TenantSpec
from policies.ray import RayState
from policies.requests import WorkloadRequest
from portal.allocator import Allocator
from portal.inventory.kubernetes import to_node
from portal.isolation import reconcile
from portal.ray import kubeobjects as ko
from portal.ray.controller import RayController, RayView
from portal.ray.idle import probe_python
from portal.ray.kube import head_reader
from portal.ray.local import LocalRay, head_key, ray_program
from portal.ray.spec import RaySpec, installed_ray_version
from portal.store.records import WorkloadState
from portal.store.writer import Store
from tests.portal.ray.test_kube_ray import H100, RAY, SETTINGS, Rig
from tests.support import gpu_nodes
from tests.support.k8s import K8sCluster
from tests.support.k8s_tenants import delete_tenant_namespaces
from tests.support.kuberay import KubeRayOperator
from tests.support.ray_guard import nodes_end_with_tests
from tests.support.waiting import eventually

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

NODE = "ki-h100-a"
TEAM = TenantSpec(
    name="kiteama", gpu_limits={"H100-80GB": 8}, cpu_millis=32000, memory_mib=65536, pods=20
)
NAMESPACE = SETTINGS.namespace(TEAM.name)
UNREACHABLE = "127.0.0.1:9"  # discard: the read finds no GCS there

# One GPU task: the head has no GPU and kwok's workers run no Ray, so it stays Ray's unmet
# demand for as long as the driver runs.
DEMAND = textwrap.dedent(
    """
    import sys
    import ray
    ray.init(address=sys.argv[1], log_to_driver=False)

    @ray.remote(num_gpus=1)
    def needs_a_gpu():
        return 1

    ray.get(needs_a_gpu.remote(), timeout=300)
    """
)


@dataclass
class Head:
    """The real head every cluster's Service is mapped to while ``reachable``."""

    address: str
    reachable: bool = True

    def resolve(self, _service: str) -> str:
        return self.address if self.reachable else UNREACHABLE


def outcome(backend: LocalRay, key: str, start: int) -> Callable[[], str | None]:
    def check() -> str | None:
        if backend.ready(key, start):
            return "up"
        return "ended" if any(e.key == key for e in backend.poll()) else None

    return check


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    if installed_ray_version() != RAY:
        pytest.skip(f"ray {RAY} is not installed")
    state = tmp_path_factory.mktemp("ray-head")
    with nodes_end_with_tests(state):
        backend = LocalRay(state)
        key = head_key("kubeidle")
        start = 0
        try:
            # ``ray start`` gives its node 30 s to register and fails past that on a loaded host:
            # a failed start is started again (as the local backend does with a head that ended).
            for start in (1, 2, 3):
                address = backend.start_head("kubeidle", start, 1)
                if eventually(outcome(backend, key, start), "the head up or ended", 120) == "up":
                    break
            else:
                pytest.fail("the Ray head did not start in 3 tries", pytrace=False)
            yield Head(address)
        finally:
            for n in range(1, start + 1):
                backend.runner.stop(key, n, 0.0)
            backend.remove_session("kubeidle")


@pytest.fixture(scope="module")
def node(
    k8s_cluster: K8sCluster, kuberay_operator: KubeRayOperator, api: client.ApiClient
) -> Iterator[Any]:
    """The tenant reconciled and one kwok node of 8 H100s. At the end the tenant's
    namespace is deleted, its pods first, so later modules find nothing of it."""
    core = client.CoreV1Api(api)
    reconcile([TEAM], SETTINGS, api)
    k8s_cluster.add_gpu_node(gpu_nodes.h100_nvswitch_node(NODE, rack="rack-ki"))
    ready = eventually(
        lambda: n if not (n := core.read_node(NODE)).spec.taints else None,
        f"the not-ready taint leaving {NODE}",
    )
    yield to_node(api.sanitize_for_serialization(ready))
    custom = client.CustomObjectsApi(api)
    found: Any = custom.list_namespaced_custom_object(ko.GROUP, ko.VERSION, NAMESPACE, ko.PLURAL)
    for item in found["items"]:
        custom.delete_namespaced_custom_object(
            ko.GROUP, ko.VERSION, NAMESPACE, ko.PLURAL, item["metadata"]["name"]
        )
    delete_tenant_namespaces(api, SETTINGS, [NAMESPACE])


@pytest.fixture(scope="module")
def api(k8s_cluster: K8sCluster) -> Iterator[client.ApiClient]:
    with k8s_cluster.api_client() as api_client:
        yield api_client


@pytest.fixture
def rig(node: Any, head: Head, api: client.ApiClient, tmp_path: Path) -> Iterator[Rig]:
    head.reachable = True
    with Store(f"sqlite:///{tmp_path / 'portal.db'}") as store:
        alloc = Allocator(store)
        alloc.start([node])
        alloc.set_tenant(TEAM.name)
        alloc.set_quota(TEAM.name, "H100-80GB", guaranteed=0, limit=2)
        reads = head_reader(probe_python(ray_program()), head.resolve)
        ray = RayController(alloc, installed=RAY, idle_check_s=1.0, heads=reads)
        rig = Rig(alloc, api, ray, NAMESPACE)
        yield rig
        for view in rig.ray.clusters():
            rig.ray.delete(view.cluster.id)
        rig.kube.sync()


def spec(workers: int, most: int, *, idle_s: float | None = None, **more: bool) -> RaySpec:
    return RaySpec(
        tenant=TEAM.name,
        owner="alice",
        name="rl",
        devices=H100,
        min_workers=workers,
        max_workers=most,
        workers=workers,
        ray_version=RAY,
        idle_s=idle_s,
        **more,
    )


def running(rig: Rig, cid: str, joined: int) -> Callable[[], RayView | None]:
    def check() -> RayView | None:
        v = rig.ray.view(cid)
        return v if v.cluster.state is RayState.RUNNING and v.joined == joined else None

    return check


def group(rig: Rig, cid: str) -> tuple[int, int, bool]:
    """The RayCluster's worker ``replicas``, ``minReplicas`` and ``suspend``."""
    rc = rig.raycluster(cid)
    [workers] = rc["spec"]["workerGroupSpecs"]
    return workers["replicas"], workers["minReplicas"], bool(rc["spec"].get("suspend"))


def test_an_idle_cluster_gives_its_workers_back_keeps_its_head_and_resumes_through_admission(
    rig: Rig, head: Head
) -> None:
    cid = rig.ray.create(spec(2, 2, idle_s=2.0)).cluster.id
    rig.until(running(rig, cid, 2), "the cluster running", timeout_s=60)
    [head_pod] = rig.pods(cid, "head")

    # The head's GCS reports every node idle for longer than 2 s: every slice released
    # within one round, the worker group set to 0, and the operator deletes the workers.
    idle = rig.until(
        lambda: v if (v := rig.ray.view(cid)).cluster.state is RayState.IDLE else None,
        "the cluster released for idleness",
        timeout_s=60,
    )
    assert rig.alloc.workloads() == []
    assert [s.slice.reason for s in idle.slices] == ["idle"]
    assert idle.joined == 0
    assert idle.cluster.address == ko.head_address(cid, NAMESPACE)
    rig.until(lambda: True if not rig.pods(cid, "worker") else None, "the workers deleted")
    assert group(rig, cid) == (0, 0, False)
    [kept] = rig.pods(cid, "head")
    assert (kept.metadata.uid, kept.status.phase) == (head_pod.metadata.uid, "Running")

    # Resume through admission: 1 of the tenant's 2 GPUs is taken, so the gang waits with
    # the quota reason and no worker is bound; once the GPU is free it runs again.
    head.reachable = False  # no further read: the resumed cluster is not released again
    blocker = rig.alloc.request(
        WorkloadRequest(tenant=TEAM.name, owner="alice", name="notebook", devices=H100)
    )
    assert blocker.state is WorkloadState.RUNNING
    resumed = rig.ray.resume(cid)
    assert resumed.cluster.state is RayState.QUEUED
    for _ in range(3):
        rig.step()
    waiting = rig.ray.view(cid)
    assert waiting.cluster.state is RayState.QUEUED
    assert waiting.slices[-1].workload is not None
    assert waiting.slices[-1].workload.reason == "quota"
    assert group(rig, cid) == (2, 2, False)
    assert all(p.spec.node_name is None for p in rig.pods(cid, "worker"))

    rig.alloc.release(blocker.id)
    back = rig.until(running(rig, cid, 2), "the resumed cluster running", timeout_s=60)
    assert back.cluster.address == idle.cluster.address
    assert {p.spec.node_name for p in rig.pods(cid, "worker")} == {NODE}


def test_a_suspended_cluster_has_no_pod_and_resumes_at_the_same_service(
    rig: Rig, head: Head
) -> None:
    cid = rig.ray.create(spec(1, 1, idle_s=2.0, idle_suspend=True)).cluster.id
    rig.until(running(rig, cid, 1), "the cluster running", timeout_s=60)
    rig.until(
        lambda: True if rig.ray.view(cid).cluster.state is RayState.SUSPENDED else None,
        "the cluster suspended",
        timeout_s=60,
    )
    assert rig.alloc.workloads() == []
    assert rig.ray.view(cid).cluster.address is None
    assert group(rig, cid)[2] is True
    rig.until(lambda: True if not rig.pods(cid) else None, "every pod deleted")

    head.reachable = False
    rig.ray.resume(cid)
    back = rig.until(running(rig, cid, 1), "the resumed cluster running", timeout_s=60)
    assert group(rig, cid) == (1, 1, False)
    assert back.cluster.address == ko.head_address(cid, NAMESPACE)


def test_pending_gpu_demand_on_the_head_grows_the_raycluster_by_a_slice(
    rig: Rig, head: Head, tmp_path: Path
) -> None:
    cid = rig.ray.create(spec(1, 2, autoscale=True)).cluster.id
    first = rig.until(running(rig, cid, 1), "the cluster running", timeout_s=60)
    [first_pod] = rig.pods(cid, "worker")

    script = tmp_path / "demand.py"
    script.write_text(DEMAND)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    driver = subprocess.Popen(
        [sys.executable, str(script), head.address],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        grown = rig.until(running(rig, cid, 2), "a worker added for the demand", timeout_s=90)
    finally:
        driver.kill()
        driver.wait()
    assert grown.cluster.spec["workers"] == 2
    assert grown.cluster.message == "2 workers joined"
    assert [(s.slice.number, s.slice.workers) for s in grown.slices] == [(1, 1), (2, 1)]
    # The running slice is the one it was, and its pod was not touched.
    assert grown.slices[0].slice.workload_id == first.slices[0].slice.workload_id
    assert first_pod.metadata.uid in {p.metadata.uid for p in rig.pods(cid, "worker")}
    assert group(rig, cid) == (2, 1, False)
    events = [e.message for e in rig.alloc.store.events() if "autoscaler:" in e.message]
    assert events, "the increase says it was the autoscaler's"
