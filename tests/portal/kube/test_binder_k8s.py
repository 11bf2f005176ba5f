"""The binder and the sweep against the real apiserver and kwok nodes.

Tenant namespaces come from the isolation reconciler (restricted Pod Security, ResourceQuota,
LimitRange, the token-less ServiceAccount); pods from ``spawner.pod``; allocations from a real
allocator on SQLite. There is no kube-scheduler in the test cluster: a pod runs only if the
binder binds it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from policies.flavors import FlavorKind
from policies.isolation import IsolationSettings, TenantSpec, portal_manifests
from policies.requests import DeviceRequest, WorkloadRequest
from portal.allocator import Allocator, WorkloadStatus
from portal.inventory.kubernetes import to_node
from portal.isolation import reconcile
from portal.kube.binder import Bind, Binder, BindReport, HoldReason, decide, in_use
from portal.kube.keys import PodKeys
from portal.kube.sweep import RELEASE_REASON, Sweeper
from portal.kube.views import pod_view
from portal.store.records import WorkloadState
from portal.store.writer import Store
from spawner.pod import PodPlacement, PodSettings, place_pod
from tests.support import gpu_nodes
from tests.support.k8s import POD_CIDR, K8sCluster
from tests.support.k8s_tenants import delete_tenant_namespaces
from tests.support.waiting import eventually

pytestmark = pytest.mark.k8s

IMAGE = "registry.invalid/gpuportal/never-pulled:0"  # kwok runs no containers
SETTINGS = IsolationSettings()
POD_SETTINGS = PodSettings(isolation=SETTINGS)
KEYS = PodKeys.of(SETTINGS)
NODES = ("bind-h100-a", "bind-h100-b")
MIG_NODE = "bind-a100-mig"
VISION = TenantSpec(
    name="bindvision",
    gpu_limits={"H100-80GB": 4, "A100-80GB/3g.40gb": 1},
    cpu_millis=8000,
    memory_mib=16384,
    pods=10,
)
AUDIT = TenantSpec(
    name="bindaudit", gpu_limits={"H100-80GB": 1}, cpu_millis=2000, memory_mib=4096, pods=5
)


@pytest.fixture(scope="module")
def api(k8s_cluster: K8sCluster) -> Iterator[client.ApiClient]:
    with k8s_cluster.api_client() as api_client:
        yield api_client


@pytest.fixture(scope="module")
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture(scope="module")
def cluster(
    k8s_cluster: K8sCluster, api: client.ApiClient, core: client.CoreV1Api
) -> Iterator[list[Any]]:
    """Two tenants reconciled, two kwok H100 nodes and an A100 node split into MIG instances
    (mixed strategy); the inventory as the allocator sees it. At the end the tenants' pods
    and namespaces are deleted (later modules reconcile their own tenants)."""
    reconcile([VISION, AUDIT], SETTINGS, api)
    for tenant in (VISION, AUDIT):
        namespace = SETTINGS.namespace(tenant.name)
        # Quota admission refuses every pod until the controller has published the status.
        eventually(
            lambda ns=namespace: (
                True if (q := core.read_namespaced_resource_quota("tenant-quota", ns)).status
                and q.status.hard else None
            ),
            f"ResourceQuota status in {namespace}",
        )  # fmt: skip
    for name in NODES:
        k8s_cluster.add_gpu_node(gpu_nodes.h100_nvswitch_node(name, rack=f"rack-{name}"))
    k8s_cluster.add_gpu_node(gpu_nodes.a100_mig_mixed_node(MIG_NODE))
    # The node lifecycle controller taints a new node not-ready until it has seen it Ready.
    ready = [
        eventually(
            lambda name=name: n if not (n := core.read_node(name)).spec.taints else None,
            f"the not-ready taint leaving {name}",
        )
        for name in (*NODES, MIG_NODE)
    ]
    yield [to_node(api.sanitize_for_serialization(n)) for n in ready]
    delete_tenant_namespaces(api, SETTINGS, [SETTINGS.namespace(t.name) for t in (VISION, AUDIT)])


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(f"sqlite:///{tmp_path / 'portal.db'}") as opened:
        yield opened


@pytest.fixture
def allocator(cluster: list[Any], store: Store) -> Allocator:
    alloc = Allocator(store)
    alloc.start(cluster)
    for tenant in (VISION, AUDIT):
        alloc.set_tenant(tenant.name)
    alloc.set_quota("bindvision", "H100-80GB", guaranteed=4, limit=4)
    alloc.set_quota("bindvision", "A100-80GB/3g.40gb", guaranteed=1, limit=1)
    return alloc


@pytest.fixture
def binder(api: client.ApiClient, allocator: Allocator) -> Binder:
    return Binder(api, allocator, SETTINGS)


def request_gpus(allocator: Allocator, count: int, name: str) -> WorkloadStatus:
    devices = DeviceRequest(kind=FlavorKind.GPU, count=count, models=frozenset({"H100-80GB"}))
    status = allocator.request(WorkloadRequest("bindvision", "alice", name, devices))
    assert status.state is WorkloadState.RUNNING, (status.reason, status.message)
    return status


def notebook_pod(name: str) -> dict[str, Any]:
    """The parts of KubeSpawner's pod that matter here."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"component": "singleuser-server"}},
        "spec": {
            "containers": [
                {
                    "name": "notebook",
                    "image": IMAGE,
                    "ports": [{"containerPort": 8888, "name": "notebook-port"}],
                }
            ]
        },
    }


def create_gpu_pod(core: client.CoreV1Api, status: WorkloadStatus, name: str) -> dict[str, Any]:
    placement = PodPlacement.of(status.tenant, status.id, status.allocations[0])
    pod = place_pod(notebook_pod(name), placement, POD_SETTINGS)
    core.create_namespaced_pod(pod["metadata"]["namespace"], pod)
    return pod


def read(core: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod:
    return core.read_namespaced_pod(name, namespace)


def events_of(core: client.CoreV1Api, namespace: str, name: str) -> list[client.CoreV1Event]:
    selector = f"involvedObject.name={name},involvedObject.kind=Pod"
    return list(core.list_namespaced_event(namespace, field_selector=selector).items)


def delete_and_wait(core: client.CoreV1Api, namespace: str, name: str) -> None:
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    def gone() -> bool | None:
        try:
            read(core, namespace, name)
        except ApiException as e:
            if e.status == 404:
                return True
            raise
        return None

    eventually(gone, f"pod {namespace}/{name} disappearing")


def test_binder_binds_a_gpu_pod_to_the_allocators_node_and_it_runs(
    binder: Binder, allocator: Allocator, core: client.CoreV1Api
) -> None:
    status = request_gpus(allocator, 2, "two-gpus")
    chosen = status.allocations[0].node
    pod = create_gpu_pod(core, status, "jupyter-alice")
    namespace = pod["metadata"]["namespace"]
    assert namespace == "gp-bindvision"
    # Nothing else schedules it: without the binder it stays unbound.
    assert read(core, namespace, "jupyter-alice").spec.node_name is None

    report = binder.bind_pending()

    assert report.bound == ((f"{namespace}/jupyter-alice", chosen),)
    assert report.held == () and report.failed == ()

    def running() -> client.V1Pod | None:
        p = read(core, namespace, "jupyter-alice")
        return p if p.status.phase == "Running" and p.status.pod_ip else None

    live = eventually(running, "the bound pod reaching Running")
    assert live.spec.node_name == chosen
    assert chosen in NODES
    assert live.status.pod_ip.startswith(POD_CIDR.split("0.0/")[0])
    container = live.spec.containers[0]
    assert container.resources.limits["nvidia.com/gpu"] == "2"
    assert container.resources.requests["nvidia.com/gpu"] == "2"
    # Defaults from the tenant's LimitRange were applied by admission.
    assert container.resources.requests["cpu"] == "100m"
    assert container.security_context.allow_privilege_escalation is False
    assert container.security_context.capabilities.drop == ["ALL"]
    assert live.spec.security_context.run_as_non_root is True
    assert live.spec.security_context.seccomp_profile.type == "RuntimeDefault"
    assert live.spec.automount_service_account_token is False
    assert live.spec.service_account_name == "tenant-jobs"
    assert live.metadata.labels[KEYS.allocation] == status.allocations[0].id
    assert live.metadata.labels[KEYS.tenant] == "bindvision"

    # A second pass finds nothing to do: bound pods are not pending any more.
    assert binder.bind_pending().bound == ()
    # Told like the kube-scheduler tells it (KubeSpawner shows pod Events while starting).
    events = events_of(core, namespace, "jupyter-alice")
    scheduled = [e for e in events if e.reason == "Scheduled"]
    assert [(e.type, e.source.component, e.message) for e in scheduled] == [
        (
            "Normal",
            "gpuportal-binder",
            f"Successfully assigned {namespace}/jupyter-alice to {chosen} "
            f"(gpuportal workload {status.id})",
        )
    ]
    delete_and_wait(core, namespace, "jupyter-alice")


def test_a_mig_pod_is_bound_to_the_mig_node_asking_for_its_profile(
    binder: Binder, allocator: Allocator, core: client.CoreV1Api
) -> None:
    devices = DeviceRequest(
        kind=FlavorKind.MIG, mig_profile="3g.40gb", models=frozenset({"A100-80GB"})
    )
    status = allocator.request(WorkloadRequest("bindvision", "alice", "mig", devices))
    assert status.state is WorkloadState.RUNNING, (status.reason, status.message)
    create_gpu_pod(core, status, "jupyter-mig")
    # The tenant's quota admits one such instance: the apiserver counted this pod against it.
    quota = core.read_namespaced_resource_quota("tenant-quota", "gp-bindvision")
    assert quota.spec.hard["requests.nvidia.com/mig-3g.40gb"] == "1"

    assert binder.bind_pending().bound == (("gp-bindvision/jupyter-mig", MIG_NODE),)

    def running() -> client.V1Pod | None:
        p = read(core, "gp-bindvision", "jupyter-mig")
        return p if p.status.phase == "Running" else None

    live = eventually(running, "the MIG pod reaching Running")
    assert live.spec.node_name == MIG_NODE
    assert live.spec.containers[0].resources.limits == {
        "nvidia.com/mig-3g.40gb": "1",
        # The rest comes from the tenant's LimitRange defaults.
        "cpu": "1",
        "memory": "1Gi",
    }
    assert live.metadata.annotations[KEYS.flavor] == "A100-80GB/3g.40gb"
    delete_and_wait(core, "gp-bindvision", "jupyter-mig")


def test_a_pod_naming_an_unknown_allocation_stays_pending_with_an_event(
    binder: Binder, allocator: Allocator, core: client.CoreV1Api
) -> None:
    status = request_gpus(allocator, 1, "real")
    placement = PodPlacement(
        tenant="bindvision",
        workload_id="0123456789abcdef0123456789abcdef",
        allocation_id="fedcba9876543210fedcba9876543210",
        node=NODES[0],
        flavor="H100-80GB",
        gpus=(0,),
    )
    pod = place_pod(notebook_pod("forged"), placement, POD_SETTINGS)
    core.create_namespaced_pod("gp-bindvision", pod)

    first = binder.bind_pending()
    second = binder.bind_pending()

    held = ("gp-bindvision/forged", HoldReason.UNKNOWN_ALLOCATION)
    assert first.held == (held,) and second.held == (held,)
    assert first.bound == () and second.bound == ()
    time.sleep(1)  # long enough for kwok to have acted on a pod it had been given
    stuck = read(core, "gp-bindvision", "forged")
    assert stuck.spec.node_name is None and stuck.status.phase == "Pending"
    events = events_of(core, "gp-bindvision", "forged")
    # Posted once although two passes held the pod.
    assert [(e.reason, e.type, e.source.component) for e in events] == [
        ("UnknownGPUAllocation", "Warning", "gpuportal-binder")
    ]
    assert events[0].message == (
        "the portal has no workload 0123456789abcdef0123456789abcdef "
        "(pod gp-bindvision/forged); it will not be bound"
    )
    # The real allocation is untouched by the forged pod.
    assert allocator.status(status.id).state is WorkloadState.RUNNING
    delete_and_wait(core, "gp-bindvision", "forged")


def test_released_and_foreign_allocations_are_not_bound(
    binder: Binder, allocator: Allocator, core: client.CoreV1Api
) -> None:
    ended = request_gpus(allocator, 1, "ended")
    create_gpu_pod(core, ended, "late")
    allocator.release(ended.id)

    mine = request_gpus(allocator, 1, "mine")
    # The same allocation cited from another tenant's namespace.
    placement = PodPlacement.of("bindaudit", mine.id, mine.allocations[0])
    stolen = place_pod(notebook_pod("stolen"), placement, POD_SETTINGS)
    core.create_namespaced_pod("gp-bindaudit", stolen)

    report = binder.bind_pending()

    assert report.bound == ()
    assert sorted(report.held) == [
        ("gp-bindaudit/stolen", HoldReason.WRONG_NAMESPACE),
        ("gp-bindvision/late", HoldReason.ALLOCATION_ENDED),
    ]
    (late,) = events_of(core, "gp-bindvision", "late")
    assert late.message == (
        f"workload {ended.id} is released: released; its devices are no longer held, so pod "
        "gp-bindvision/late will not be bound: delete it"
    )
    (foreign,) = events_of(core, "gp-bindaudit", "stolen")
    assert foreign.message == (
        f"allocation {mine.allocations[0].id} belongs to tenant bindvision, whose pods run in "
        "namespace gp-bindvision; pod gp-bindaudit/stolen will not be bound"
    )
    delete_and_wait(core, "gp-bindvision", "late")
    delete_and_wait(core, "gp-bindaudit", "stolen")


def test_two_pods_for_one_allocation_bind_once_and_a_stale_bind_is_harmless(
    binder: Binder, allocator: Allocator, core: client.CoreV1Api, api: client.ApiClient
) -> None:
    status = request_gpus(allocator, 1, "twice")
    create_gpu_pod(core, status, "first")
    create_gpu_pod(core, status, "second")
    stale = pod_view(read(core, "gp-bindvision", "first"))

    report = binder.bind_pending()

    assert report.bound == (("gp-bindvision/first", status.allocations[0].node),)
    assert report.held == (("gp-bindvision/second", HoldReason.ALLOCATION_IN_USE),)
    # A restarted binder acting on a decision made before the bind: the apiserver refuses the
    # second Binding (409) and the binder takes that as done.
    decision = decide(stale, allocator, SETTINGS, in_use([], KEYS))
    assert isinstance(decision, Bind)
    Binder(api, allocator, SETTINGS).act(decision)
    assert read(core, "gp-bindvision", "first").spec.node_name == status.allocations[0].node
    delete_and_wait(core, "gp-bindvision", "first")
    delete_and_wait(core, "gp-bindvision", "second")


class CountingSource:
    """The allocator, counting the status reads a binder makes (per workload id)."""

    def __init__(self, allocator: Allocator) -> None:
        self.allocator = allocator
        self.reads: dict[str, int] = {}
        self._lock = threading.Lock()

    def status(self, workload_id: str, *, estimate: bool = True) -> WorkloadStatus:
        with self._lock:
            self.reads[workload_id] = self.reads.get(workload_id, 0) + 1
        return self.allocator.status(workload_id, estimate=estimate)

    def workloads(self, tenant: str | None = None) -> list[WorkloadStatus]:
        return self.allocator.workloads(tenant)

    def release(self, workload_id: str, *, reason: str = "released") -> WorkloadStatus:
        return self.allocator.release(workload_id, reason=reason)


def test_two_binders_racing_over_many_pods_bind_each_allocation_to_one_pod_on_its_node(
    allocator: Allocator, core: client.CoreV1Api, api: client.ApiClient
) -> None:
    """Two portals' passes at once (a restart overlapping the old process), each acting on
    its decisions concurrently: every allocation ends with exactly one pod, on its node."""
    # Two GPUs twice over: the tenant's ResourceQuota counts Pending pods, up to 4 GPUs.
    statuses = [request_gpus(allocator, 1, f"race-{i}") for i in range(2)]
    names = {}
    for i, status in enumerate(statuses):
        for twin in ("a", "b"):  # two pods citing one allocation: one may run
            create_gpu_pod(core, status, f"race-{i}-{twin}")
            names[f"race-{i}-{twin}"] = status
    sources = [CountingSource(allocator), CountingSource(allocator)]
    binders = [Binder(api, source, SETTINGS, act_workers=8) for source in sources]
    start = threading.Barrier(len(binders))
    reports: list[BindReport] = []

    def race(binder: Binder) -> None:
        start.wait()
        reports.append(binder.bind_pending())

    threads = [threading.Thread(target=race, args=(b,)) for b in binders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert [r.failed for r in reports] == [(), ()]
    pods = {name: read(core, "gp-bindvision", name) for name in names}
    for i, status in enumerate(statuses):
        twins = [pods[f"race-{i}-{twin}"] for twin in ("a", "b")]
        bound = [p for p in twins if p.spec.node_name]
        # The first by name wins in either pass; the other stays Pending.
        assert [p.metadata.name for p in bound] == [f"race-{i}-a"]
        assert bound[0].spec.node_name == status.allocations[0].node
        scheduled = [
            e for e in events_of(core, "gp-bindvision", f"race-{i}-a") if e.reason == "Scheduled"
        ]
        assert len(scheduled) == 1
    # A pass reads each workload's status once, however many of its pods are pending.
    assert all(set(s.reads.values()) <= {1} for s in sources)
    assert set().union(*(s.reads for s in sources)) <= {s.id for s in statuses}
    for name in names:
        delete_and_wait(core, "gp-bindvision", name)


def test_a_pod_deleted_behind_the_hubs_back_is_released_exactly_once(
    binder: Binder,
    allocator: Allocator,
    store: Store,
    core: client.CoreV1Api,
    api: client.ApiClient,
) -> None:
    kept = request_gpus(allocator, 1, "kept")
    doomed = request_gpus(allocator, 1, "doomed")
    not_yet = request_gpus(allocator, 1, "pod-not-created-yet")
    create_gpu_pod(core, kept, "kept")
    create_gpu_pod(core, doomed, "doomed")
    binder.bind_pending()
    sweeper = Sweeper(api, allocator, SETTINGS, grace_s=300.0)
    # Everything has its pod, or is within its grace period.
    assert sweeper.sweep() == []

    delete_and_wait(core, "gp-bindvision", "doomed")
    released = sweeper.sweep()

    assert released == [doomed.id]
    after = allocator.status(doomed.id)
    assert after.state is WorkloadState.RELEASED and after.reason == RELEASE_REASON
    assert sweeper.sweep() == []
    # The hub's own stop arriving later releases nothing more.
    assert allocator.release(doomed.id).reason == RELEASE_REASON
    kinds = [e.kind for e in store.events() if e.workload_id == doomed.id]
    assert kinds.count("workload.released") == 1
    assert allocator.status(kept.id).state is WorkloadState.RUNNING
    assert allocator.status(not_yet.id).state is WorkloadState.RUNNING

    # A fresh sweeper (a portal restart) never saw a pod of the third workload: it waits out
    # the grace period, then releases it.
    restarted = Sweeper(api, allocator, SETTINGS, grace_s=0.0)
    assert restarted.sweep() == [not_yet.id]
    assert allocator.status(kept.id).state is WorkloadState.RUNNING
    delete_and_wait(core, "gp-bindvision", "kept")


def test_the_portals_own_cluster_role_is_enough_to_bind_and_sweep(
    k8s_cluster: K8sCluster, api: client.ApiClient, core: client.CoreV1Api, allocator: Allocator
) -> None:
    """Least privilege: run as the portal's ServiceAccount with the chart's ClusterRole."""
    with portal_identity(k8s_cluster, api, core):
        run_as_the_portal(k8s_cluster, core, allocator)


@contextmanager
def portal_identity(
    k8s_cluster: K8sCluster, api: client.ApiClient, core: client.CoreV1Api
) -> Iterator[None]:
    """The hub namespace, the portal's ServiceAccount, ClusterRole and binding for the block;
    removed after it (the Helm tests install the same names)."""
    rbac = client.RbacAuthorizationV1Api(api)
    k8s_cluster.create_namespace(SETTINGS.hub_namespace)
    manifests = portal_manifests(SETTINGS)
    try:
        for manifest in manifests:
            kind = manifest["kind"]
            if kind == "ServiceAccount":
                core.create_namespaced_service_account(SETTINGS.hub_namespace, manifest)
            elif kind == "ClusterRole":
                rbac.create_cluster_role(manifest)
            else:
                rbac.create_cluster_role_binding(manifest)
        yield
    finally:
        for manifest in manifests:
            name = manifest["metadata"]["name"]
            with contextlib.suppress(ApiException):  # never created, or gone
                if manifest["kind"] == "ClusterRole":
                    rbac.delete_cluster_role(name)
                elif manifest["kind"] == "ClusterRoleBinding":
                    rbac.delete_cluster_role_binding(name)
        core.delete_namespace(SETTINGS.hub_namespace)
        eventually(
            lambda: (
                None
                if SETTINGS.hub_namespace in {n.metadata.name for n in core.list_namespace().items}
                else True
            ),
            "the hub namespace deleted",
            timeout_s=90,
        )


def run_as_the_portal(
    k8s_cluster: K8sCluster, core: client.CoreV1Api, allocator: Allocator
) -> None:
    token = core.create_namespaced_service_account_token(
        SETTINGS.portal_service_account,
        SETTINGS.hub_namespace,
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    ).status.token
    config = k8s_cluster.configure(client.Configuration())
    config.api_key = {"BearerToken": token, "authorization": token}

    status = request_gpus(allocator, 1, "least")
    create_gpu_pod(core, status, "least")
    forged = place_pod(
        notebook_pod("least-forged"),
        PodPlacement("bindvision", "nope", "nope", NODES[0], "H100-80GB", (0,)),
        POD_SETTINGS,
    )
    core.create_namespaced_pod("gp-bindvision", forged)
    with client.ApiClient(config) as portal_api:

        def bound() -> BindReport | None:
            try:
                report = Binder(portal_api, allocator, SETTINGS).bind_pending()
            except ApiException as e:
                if e.status != 403:
                    raise
                return None  # RBAC grants take effect asynchronously
            return report if report.bound else None

        report = eventually(bound, "the portal's identity binding the pod")
        assert report.failed == ()
        assert report.bound == (("gp-bindvision/least", status.allocations[0].node),)
        assert report.held == (("gp-bindvision/least-forged", HoldReason.UNKNOWN_ALLOCATION),)
        delete_and_wait(core, "gp-bindvision", "least")
        assert Sweeper(portal_api, allocator, SETTINGS, grace_s=0.0).sweep() == [status.id]
    delete_and_wait(core, "gp-bindvision", "least-forged")
