"""Training jobs on the Kubernetes backend, against the real apiserver, the real Job controller
of kube-controller-manager and kwok GPU nodes.

The job controller runs over a real allocator (SQLite) with the ``KubeRunner``; the binder is
the portal's; nothing else schedules pods. A test stands in for the containers with kwok
annotations on the pods before they are bound (``tests.support.kwok_stages``): by default a
Job's pod succeeds as soon as it runs, ``RUN_FOR`` keeps it running, ``EXIT_CODE`` fails it.
The test drives the loops itself (allocator tick, job controller step, binder pass), so every
step happens in the order it reads.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kubernetes_asyncio
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from policies.flavors import FlavorKind
from policies.isolation import IsolationSettings, TenantSpec
from policies.jobs import NODE_LOST, JobState, RestartPolicy, rank_layout
from policies.requests import DeviceRequest, WorkloadRequest
from portal.allocator import Allocator
from portal.allocator.inventory_sync import apply_event
from portal.inventory.kubernetes import KubernetesInventory, to_node
from portal.isolation import reconcile
from portal.jobs.checkpoints import mark_complete, step_path
from portal.jobs.controller import JobController
from portal.jobs.kube import manifests
from portal.jobs.kube.admission import Admission, job_id_of
from portal.jobs.kube.runner import KubeRunner
from portal.jobs.kube.service import kube_backend
from portal.jobs.runner import MemberLaunch
from portal.jobs.spec import JobSpec
from portal.kube.binder import Binder
from portal.kube.keys import PodKeys
from portal.store.records import WorkloadState
from portal.store.writer import Store
from tests.support import gpu_nodes
from tests.support.k8s import K8sCluster
from tests.support.k8s_tenants import delete_tenant_namespaces
from tests.support.kwok_stages import RUN_FOR
from tests.support.waiting import eventually

pytestmark = pytest.mark.k8s

T = TypeVar("T")
IMAGE = "registry.invalid/gpuportal/train:0"  # kwok runs no containers
SETTINGS = IsolationSettings()
KEYS = PodKeys.of(SETTINGS)
JOB_KEYS = manifests.JobKeys.of(SETTINGS)
NODES = ("kj-h100-a", "kj-h100-b")
TEAM_A = TenantSpec(
    name="kjteama", gpu_limits={"H100-80GB": 32}, cpu_millis=64000, memory_mib=65536, pods=40
)
TEAM_B = TenantSpec(
    name="kjteamb", gpu_limits={"H100-80GB": 8}, cpu_millis=8000, memory_mib=8192, pods=10
)
NS_A = SETTINGS.namespace(TEAM_A.name)


@pytest.fixture(scope="module")
def api(k8s_cluster: K8sCluster) -> Iterator[client.ApiClient]:
    with k8s_cluster.api_client() as api_client:
        yield api_client


@pytest.fixture(scope="module")
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture(scope="module")
def batch(api: client.ApiClient) -> client.BatchV1Api:
    return client.BatchV1Api(api)


def add_ready_node(k8s_cluster: K8sCluster, core: client.CoreV1Api, name: str) -> Any:
    k8s_cluster.add_gpu_node(gpu_nodes.h100_nvswitch_node(name, rack=f"rack-{name}"))
    # The node lifecycle controller taints a new node not-ready until it has seen it Ready.
    return eventually(
        lambda: n if not (n := core.read_node(name)).spec.taints else None,
        f"the not-ready taint leaving {name}",
    )


@pytest.fixture(scope="module")
def cluster(k8s_cluster: K8sCluster, api: client.ApiClient, core: client.CoreV1Api) -> list[Any]:
    """Two tenants reconciled and two kwok nodes of 8 H100s; the inventory as the allocator
    sees it."""
    reconcile([TEAM_A, TEAM_B], SETTINGS, api)
    for tenant in (TEAM_A, TEAM_B):
        namespace = SETTINGS.namespace(tenant.name)
        eventually(
            lambda ns=namespace: (
                True if (q := core.read_namespaced_resource_quota("tenant-quota", ns)).status
                and q.status.hard else None
            ),
            f"ResourceQuota status in {namespace}",
        )  # fmt: skip
    ready = [add_ready_node(k8s_cluster, core, name) for name in NODES]
    return [to_node(api.sanitize_for_serialization(n)) for n in ready]


@pytest.fixture(scope="module", autouse=True)
def no_tenants_left(
    cluster: list[Any], api: client.ApiClient, batch: client.BatchV1Api
) -> Iterator[None]:
    """Leave neither pods (pods of a deleted node would wait for the pod GC) nor the
    tenants' namespaces: later modules reconcile their own tenants."""
    yield
    namespaces = [SETTINGS.namespace(t.name) for t in (TEAM_A, TEAM_B)]
    for namespace in namespaces:  # Jobs first, or their controller recreates the pods
        for job in batch.list_namespaced_job(namespace).items:
            batch.delete_namespaced_job(
                job.metadata.name, namespace, propagation_policy="Background"
            )
    delete_tenant_namespaces(api, SETTINGS, namespaces)


@pytest.fixture
def allocator(cluster: list[Any], tmp_path: Path) -> Iterator[Allocator]:
    with Store(f"sqlite:///{tmp_path / 'portal.db'}") as store:
        alloc = Allocator(store)
        alloc.start(cluster)
        for tenant, guaranteed, limit in ((TEAM_A, 16, 24), (TEAM_B, 0, 8)):
            alloc.set_tenant(tenant.name)
            alloc.set_quota(tenant.name, "H100-80GB", guaranteed=guaranteed, limit=limit)
        yield alloc


class Loops:
    """The service's loops, stepped by the test: tick, jobs, binder (and admission)."""

    def __init__(self, alloc: Allocator, api: client.ApiClient) -> None:
        self.alloc = alloc
        self.backend = kube_backend(SETTINGS, api)
        self.jobs = JobController(alloc, backend=self.backend, stop_grace_s=0)
        self.jobs.start()
        self.binder = Binder(api, alloc, SETTINGS)
        self.admission = Admission(api, self.jobs, SETTINGS)

    @property
    def runner(self) -> KubeRunner:
        assert isinstance(self.backend.runner, KubeRunner)
        return self.backend.runner

    def step(self) -> None:
        self.alloc.tick()
        self.jobs.step()
        self.binder.bind_pending()

    def until(self, probe: Callable[[], T | None], what: str, timeout_s: float = 30.0) -> T:
        def stepped() -> T | None:
            self.step()
            return probe()

        return eventually(stepped, what, timeout_s)


@pytest.fixture
def loops(allocator: Allocator, api: client.ApiClient, batch: client.BatchV1Api) -> Iterator[Loops]:
    loops = Loops(allocator, api)
    yield loops
    loops.runner.close()  # its watches
    # Leave no Job behind for the next test (their pods would wait for a binder).
    for job in batch.list_job_for_all_namespaces(label_selector=JOB_KEYS.job).items:
        batch.delete_namespaced_job(
            job.metadata.name, job.metadata.namespace, propagation_policy="Background"
        )


def used(alloc: Allocator, tenant: str) -> int:
    """H100s the tenant's quota is charged for now."""
    return sum(u.used for u in alloc.usage(tenant) if u.flavor == "H100-80GB")


def job_spec(members: int, gpus: int, **kw: Any) -> JobSpec:
    devices = DeviceRequest(kind=FlavorKind.GPU, count=gpus, models=frozenset({"H100-80GB"}))
    return JobSpec(
        tenant=TEAM_A.name,
        owner="alice",
        name="train",
        members=members,
        devices=devices,
        image=IMAGE,
        env=(("WANDB_MODE", "offline"),),
        **kw,
    )


def pods_of(core: client.CoreV1Api, job_id: str, attempt: int) -> list[client.V1Pod]:
    selector = f"{JOB_KEYS.job}={job_id},{JOB_KEYS.attempt}={attempt}"
    return list(core.list_namespaced_pod(NS_A, label_selector=selector).items)


def hold_running(core: client.CoreV1Api, job_id: str, attempt: int, members: int) -> None:
    """Keep the attempt's pods running (what a long training run does under kwok): annotate
    them once the Job controller made them, before the binder binds them."""
    pods = eventually(
        lambda: p if len(p := pods_of(core, job_id, attempt)) == members else None,
        f"the Job controller creating {members} pods",
    )
    for pod in pods:
        assert pod.spec.node_name is None  # not bound yet: the test steps the binder
        core.patch_namespaced_pod(
            pod.metadata.name, NS_A, {"metadata": {"annotations": {RUN_FOR: "1h"}}}
        )


def all_running(core: client.CoreV1Api, job_id: str, attempt: int) -> list[client.V1Pod] | None:
    pods = pods_of(core, job_id, attempt)
    return pods if pods and all(p.status.phase == "Running" for p in pods) else None


def env_of(job: client.V1Job) -> dict[str, Any]:
    container = job.spec.template.spec.containers[0]
    return {e.name: e.value if e.value_from is None else e.value_from for e in container.env}


def test_a_four_member_job_runs_ranks_contiguous_per_node_and_succeeds(
    loops: Loops, core: client.CoreV1Api, batch: client.BatchV1Api, api: client.ApiClient
) -> None:
    view = loops.jobs.submit(job_spec(4, 4))
    job_id = view.job.id
    workload = loops.alloc.status(view.job.workload_id or "")
    assert workload.state is WorkloadState.RUNNING, (workload.reason, workload.message)
    name = manifests.job_name(job_id, 1)

    # The attempt is an indexed Job with a headless Service in the tenant's namespace.
    job = batch.read_namespaced_job(name, NS_A)
    assert (job.spec.completion_mode, job.spec.completions, job.spec.parallelism) == (
        "Indexed",
        4,
        4,
    )
    assert job.spec.backoff_limit == 0
    pod_spec = job.spec.template.spec
    assert pod_spec.scheduler_name == "gpuportal" and pod_spec.subdomain == name
    assert pod_spec.security_context.run_as_non_root is True
    assert pod_spec.automount_service_account_token is False
    assert pod_spec.containers[0].resources.limits == {"nvidia.com/gpu": "4"}
    env = env_of(job)
    assert env["MASTER_ADDR"] == f"{name}-0.{name}"
    assert (env["MASTER_PORT"], env["WORLD_SIZE"], env["NNODES"]) == ("29500", "4", "2")
    assert env["TORCHELASTIC_RUN_ID"] == job_id and env["WANDB_MODE"] == "offline"
    assert env["RANK"].field_ref.field_path == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    service = core.read_namespaced_service(name, NS_A)
    assert service.spec.cluster_ip == "None" and service.spec.publish_not_ready_addresses
    assert service.metadata.owner_references[0].uid == job.metadata.uid
    # The test apiserver serves scheduling.k8s.io/v1alpha1: the gang is visible there too.
    assert loops.runner.workloads_served()
    gang = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha1", NS_A, "workloads", name
    )
    assert gang["spec"]["podGroups"][0]["policy"]["gang"]["minCount"] == 4
    assert gang["spec"]["controllerRef"] == {"apiGroup": "batch", "kind": "Job", "name": name}

    hold_running(core, job_id, 1, 4)
    running = loops.until(lambda: all_running(core, job_id, 1), "every member running")
    assert loops.jobs.get(job_id).state is JobState.RUNNING

    # Each rank on its allocation's node; the ranks of one node are one block.
    by_member = {a.member: a for a in workload.allocations}
    layout = [(a.member, a.node) for a in workload.allocations]
    slots = {s.rank: s for s in rank_layout(layout)}
    seen: dict[int, str] = {}
    for pod in running:
        ann = pod.metadata.annotations
        rank = int(ann["batch.kubernetes.io/job-completion-index"])
        slot = slots[rank]
        assert pod.spec.node_name == slot.node == by_member[slot.member].node
        assert ann[KEYS.allocation] == by_member[slot.member].id
        assert int(ann[JOB_KEYS.rank["LOCAL_RANK"]]) == slot.local_rank
        assert int(ann[JOB_KEYS.rank["NODE_RANK"]]) == slot.node_rank
        assert ann[JOB_KEYS.rank["LOCAL_WORLD_SIZE"]] == "2"
        seen[rank] = pod.spec.node_name
    assert sorted(seen) == [0, 1, 2, 3]
    assert seen[0] == seen[1] != seen[2] == seen[3]
    assert set(seen.values()) == set(NODES)

    # kwok pods have no log: the answer says so instead of an empty success.
    chunk = loops.jobs.read_log(job_id, 1, 0, 0, 1024)
    assert chunk.data == b"" and "cannot be read" in chunk.unavailable

    # The members finish (kwok completes them): the job succeeded, the gang is released.
    for pod in running:
        core.patch_namespaced_pod(
            pod.metadata.name, NS_A, {"metadata": {"annotations": {RUN_FOR: "0s"}}}
        )
    done = loops.until(
        lambda: j if (j := loops.jobs.get(job_id)).state.terminal else None, "the job ending"
    )
    assert done.state is JobState.SUCCEEDED, done.message
    (attempt,) = loops.jobs.attempts(job_id)
    assert attempt.exit_reason == "completed" and attempt.nodes == (seen[0], seen[2])
    assert loops.alloc.status(workload.id).state is WorkloadState.RELEASED


def test_a_job_that_does_not_fit_creates_no_job_object_and_holds_no_quota(
    loops: Loops, batch: client.BatchV1Api
) -> None:
    devices = DeviceRequest(kind=FlavorKind.GPU, count=8, models=frozenset({"H100-80GB"}))
    blocker = loops.alloc.request(WorkloadRequest(TEAM_A.name, "bob", "notebook", devices))
    assert blocker.state is WorkloadState.RUNNING

    view = loops.jobs.submit(job_spec(2, 8))
    for _ in range(10):
        loops.step()
    waiting = loops.alloc.status(view.job.workload_id or "")
    assert waiting.state is WorkloadState.QUEUED and waiting.allocations == ()
    assert batch.list_namespaced_job(NS_A, label_selector=JOB_KEYS.job).items == []
    assert used(loops.alloc, TEAM_A.name) == 8  # the notebook's only

    loops.alloc.release(blocker.id)
    name = manifests.job_name(view.job.id, 1)

    def created() -> client.V1Job | None:
        try:
            return batch.read_namespaced_job(name, NS_A)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    loops.until(created, "the Job once the gang fits")


def test_deleting_the_node_of_a_running_attempt_restarts_the_gang_from_its_checkpoint(
    loops: Loops,
    k8s_cluster: K8sCluster,
    core: client.CoreV1Api,
    batch: client.BatchV1Api,
    tmp_path: Path,
) -> None:
    lost_node = "kj-h100-lost"
    node = add_ready_node(k8s_cluster, core, lost_node)
    loops.alloc.node_updated(to_node(client.ApiClient().sanitize_for_serialization(node)))
    devices = DeviceRequest(kind=FlavorKind.GPU, count=8, models=frozenset({"H100-80GB"}))
    blockers = [
        loops.alloc.request(WorkloadRequest(TEAM_A.name, "bob", f"hold-{n}", devices))
        for n in NODES
    ]
    assert {b.allocations[0].node for b in blockers} == set(NODES)
    checkpoints = tmp_path / "ckpt"
    restart = RestartPolicy(max_restarts=2, backoff_s=0.5, backoff_cap_s=0.5)
    view = loops.jobs.submit(job_spec(2, 4, checkpoint_dir=str(checkpoints), restart=restart))
    job_id = view.job.id
    hold_running(core, job_id, 1, 2)
    loops.until(
        lambda: True if loops.jobs.get(job_id).state is JobState.RUNNING else None, "running"
    )
    loops.until(lambda: all_running(core, job_id, 1), "both members running")
    assert {p.spec.node_name for p in pods_of(core, job_id, 1)} == {lost_node}
    # The training script writes a checkpoint (on the volume the portal reads it from).
    step = step_path(checkpoints, 7)
    step.mkdir(parents=True)
    mark_complete(step)

    # The inventory as the service's follower keeps it, listed before the node goes.
    loop = asyncio.new_event_loop()
    async_client = loop.run_until_complete(async_api(k8s_cluster))
    inventory = KubernetesInventory(kubernetes_asyncio.client.CoreV1Api(async_client), core_v1=core)
    assert lost_node in {n.name for n in inventory.snapshot()}
    core.delete_node(lost_node)
    # The runner sees the node gone before the inventory tells the allocator.
    loops.until(
        lambda: True if loops.jobs.get(job_id).state is not JobState.RUNNING else None,
        "the attempt ending",
    )
    first = loops.jobs.attempts(job_id)[0]
    assert first.exit_reason == NODE_LOST and first.counted
    # The inventory follower applies the deletion too (here: one list, its changes applied).
    for event in loop.run_until_complete(refresh(inventory, async_client)):
        apply_event(loops.alloc, event)
    loop.close()
    assert lost_node not in loops.alloc.inspect(lambda c: set(c.nodes))
    # The gang was released: nothing of attempt 1 holds devices.
    assert loops.alloc.status(first.workload_id).state is WorkloadState.RELEASED

    loops.alloc.release(blockers[0].id)
    second = loops.until(
        lambda: a[1] if len(a := loops.jobs.attempts(job_id)) == 2 and a[1].started_at else None,
        "the second attempt starting",
    )
    assert second.resume_step == 7 and second.resume_from == str(step)
    job = batch.read_namespaced_job(manifests.job_name(job_id, 2), NS_A)
    env = env_of(job)
    assert env["GPUPORTAL_RESUME_FROM"] == str(step)
    assert env["GPUPORTAL_CHECKPOINT_DIR"] == str(checkpoints)
    assert env["GPUPORTAL_ATTEMPT"] == "2"
    assert loops.jobs.get(job_id).restarts == 1
    for b in blockers:
        loops.alloc.release(b.id)


async def async_api(k8s_cluster: K8sCluster) -> kubernetes_asyncio.client.ApiClient:
    config = k8s_cluster.configure(kubernetes_asyncio.client.Configuration())
    return kubernetes_asyncio.client.ApiClient(config)


async def refresh(
    inventory: KubernetesInventory, api: kubernetes_asyncio.client.ApiClient
) -> list[Any]:
    try:
        return await inventory.refresh()
    finally:
        await api.close()


def kubectl_job(name: str, namespace: str, gpus: int, members: int) -> dict[str, Any]:
    """A Job as a user writes it for the portal, with a forged tenant label of team b."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {SETTINGS.label("tenant"): TEAM_B.name},
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": members,
            "parallelism": members,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {SETTINGS.label("tenant"): TEAM_B.name}},
                "spec": {
                    "schedulerName": "gpuportal",
                    "restartPolicy": "Never",
                    "serviceAccountName": SETTINGS.jobs_service_account,
                    "automountServiceAccountToken": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 1000,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "train",
                            "image": IMAGE,
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                },
            },
        },
    }


def test_a_kubectl_job_is_admitted_and_charged_to_its_namespaces_tenant(
    loops: Loops, core: client.CoreV1Api, batch: client.BatchV1Api
) -> None:
    created = batch.create_namespaced_job(NS_A, kubectl_job("by-kubectl", NS_A, 2, 2))
    job_id = job_id_of(created.metadata.uid)

    report = loops.admission.admit()

    assert report.admitted == ((f"{NS_A}/by-kubectl", job_id),)
    record = loops.jobs.get(job_id)
    # The namespace decides, not the label the user wrote.
    assert record.tenant == TEAM_A.name and record.owner == "kubectl"
    assert record.spec["members"] == 2 and record.spec["devices"]["count"] == 2
    workload = loops.alloc.status(record.workload_id or "")
    assert workload.tenant == TEAM_A.name
    assert used(loops.alloc, TEAM_B.name) == 0
    assert used(loops.alloc, TEAM_A.name) == 4
    # Admitted once: a second pass finds nothing new.
    assert loops.admission.admit().admitted == ()

    done = loops.until(
        lambda: j if (j := loops.jobs.get(job_id)).state.terminal else None, "the Job ending"
    )
    assert done.state is JobState.SUCCEEDED, done.message
    pods = core.list_namespaced_pod(NS_A, label_selector="batch.kubernetes.io/job-name=by-kubectl")
    bound = {p.metadata.annotations[KEYS.allocation]: p.spec.node_name for p in pods.items}
    assert bound == {a.id: a.node for a in workload.allocations}
    batch.delete_namespaced_job("by-kubectl", NS_A, propagation_policy="Background")


def test_two_admission_passes_racing_over_the_same_jobs_admit_and_launch_each_once(
    loops: Loops, batch: client.BatchV1Api
) -> None:
    names = [f"race-{i}" for i in range(6)]
    uids = {
        n: batch.create_namespaced_job(NS_A, kubectl_job(n, NS_A, 1, 1)).metadata.uid for n in names
    }
    # Two nodes' worth: queued behind the six (16 GPUs on the cluster, 6 in use).
    wide = batch.create_namespaced_job(NS_A, kubectl_job("race-wide", NS_A, 8, 2)).metadata.uid
    eventually(
        lambda: True if len(loops.runner.jobs_informer().items()) >= 7 else None,
        "the copy of the Jobs holding all seven",
    )
    passes = [loops.admission, Admission(loops.runner.api_client, loops.jobs, SETTINGS)]
    start = threading.Barrier(len(passes))
    reports: list[Any] = [None] * len(passes)

    def run(i: int) -> None:
        start.wait()
        reports[i] = passes[i].admit()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(passes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    admitted = [pair for r in reports for pair in r.admitted]
    expected = {(f"{NS_A}/{n}", job_id_of(u)) for n, u in [*uids.items(), ("race-wide", wide)]}
    assert sorted(admitted) == sorted(expected)  # each once, by one pass or the other
    assert [r.refused for r in reports] == [(), ()]
    assert len(loops.jobs.jobs()) == 7
    assert used(loops.alloc, TEAM_A.name) == 6  # the wide one waits: not charged
    for n, uid in uids.items():
        job_id = job_id_of(uid)
        assert len(loops.jobs.attempts(job_id)) == 1
        assert loops.jobs.get(job_id).state is JobState.RUNNING
        # The launch's one patch labels the Job (the tenant from its namespace, not the
        # label the user wrote).
        labels = batch.read_namespaced_job(n, NS_A).metadata.labels
        assert labels[JOB_KEYS.job] == job_id and labels[JOB_KEYS.tenant] == TEAM_A.name
    # Queued, not launched: not labelled yet, and not offered again.
    assert JOB_KEYS.job not in (batch.read_namespaced_job("race-wide", NS_A).metadata.labels or {})
    assert loops.jobs.get(job_id_of(wide)).state is JobState.QUEUED
    assert [p.admit().admitted for p in passes] == [(), ()]
    for n in [*names, "race-wide"]:
        batch.delete_namespaced_job(n, NS_A, propagation_policy="Background")


def test_a_kubectl_job_that_completed_while_its_attempt_stopped_succeeds_when_resumed(
    loops: Loops, batch: client.BatchV1Api, core: client.CoreV1Api
) -> None:
    created = batch.create_namespaced_job(NS_A, kubectl_job("done-meanwhile", NS_A, 1, 1))
    job_id = job_id_of(created.metadata.uid)
    loops.admission.admit()
    (allocation,) = loops.alloc.status(loops.jobs.get(job_id).workload_id or "").allocations

    def complete() -> bool | None:
        # The binder binds and kwok completes the pod; the jobs loop does not collect it.
        loops.alloc.tick()
        loops.binder.bind_pending()
        job = batch.read_namespaced_job("done-meanwhile", NS_A)
        conditions = job.status.conditions or []
        return (
            True if any(c.type == "Complete" and c.status == "True" for c in conditions) else None
        )

    eventually(complete, "the Job complete")
    (pod,) = core.list_namespaced_pod(
        NS_A, label_selector="batch.kubernetes.io/job-name=done-meanwhile"
    ).items
    born = pod.metadata.creation_timestamp.timestamp()
    # The next attempt counts pods created from its resume on (to the second): be past that.
    eventually(lambda: True if time.time() > born + 2.5 else None, "a later second")
    # As a preemption does: the attempt is stopped (the Job suspended), the next resumes it.
    loops.runner.stop(job_id, 1, 0, wait=False)
    member = MemberLaunch(
        job_id, 2, 0, allocation.node, (), (), "", {}, tenant=TEAM_A.name,
        allocation=allocation, kube_job=f"{NS_A}/done-meanwhile",
    )  # fmt: skip
    loops.runner.launch([member])

    exits = eventually(
        lambda: (
            [(e.rank, e.exit_code, e.signal) for e in loops.runner.poll() if e.attempt == 2] or None
        ),
        "the resumed attempt's member reported",
    )

    assert exits == [(0, 0, None)]  # succeeded in the completed Job, not killed
    batch.delete_namespaced_job("done-meanwhile", NS_A, propagation_policy="Background")


def test_a_kubectl_job_outside_a_tenant_namespace_is_refused_and_never_charged(
    loops: Loops, k8s_cluster: K8sCluster, core: client.CoreV1Api, batch: client.BatchV1Api
) -> None:
    # A namespace carrying the tenant label without being the portal's: still not a tenant's.
    k8s_cluster.create_namespace("kj-impostor", labels={SETTINGS.label("tenant"): TEAM_B.name})
    batch.create_namespaced_job("kj-impostor", kubectl_job("sneaky", "kj-impostor", 1, 1))

    report = loops.admission.admit()

    assert report.admitted == ()
    ((where, message),) = report.refused
    assert where == "kj-impostor/sneaky" and "a tenant's namespace" in message
    assert loops.jobs.jobs() == []
    assert used(loops.alloc, TEAM_B.name) == 0
    events = core.list_namespaced_event("kj-impostor").items
    ours = [e for e in events if e.source.component == "gpuportal-binder"]
    assert [(e.reason, e.involved_object.name) for e in ours] == [("GPUJobRefused", "sneaky")]
    batch.delete_namespaced_job("sneaky", "kj-impostor", propagation_policy="Background")


def test_a_restarted_portal_adopts_the_running_attempt_and_sees_it_succeed(
    loops: Loops, allocator: Allocator, api: client.ApiClient, core: client.CoreV1Api
) -> None:
    view = loops.jobs.submit(job_spec(2, 4))
    job_id = view.job.id
    hold_running(core, job_id, 1, 2)
    running = loops.until(lambda: all_running(core, job_id, 1), "both members running")
    loops.until(
        lambda: True if loops.jobs.get(job_id).state is JobState.RUNNING else None, "running"
    )

    # A new controller and runner over the same store and cluster: what a restart builds.
    restarted = Loops(allocator, api)
    assert (job_id, 1) in restarted.runner.adopt()
    restarted.step()
    assert restarted.jobs.get(job_id).state is JobState.RUNNING  # adopted, not lost
    for pod in running:
        core.patch_namespaced_pod(
            pod.metadata.name, NS_A, {"metadata": {"annotations": {RUN_FOR: "0s"}}}
        )
    done = restarted.until(
        lambda: j if (j := restarted.jobs.get(job_id)).state.terminal else None, "the job ending"
    )
    assert done.state is JobState.SUCCEEDED, done.message
    assert [a.exit_reason for a in restarted.jobs.attempts(job_id)] == ["completed"]
    restarted.runner.close()


def test_cancelling_a_running_job_deletes_its_pods_and_job_and_frees_the_gang(
    loops: Loops, core: client.CoreV1Api, batch: client.BatchV1Api
) -> None:
    view = loops.jobs.submit(job_spec(2, 4))
    job_id = view.job.id
    hold_running(core, job_id, 1, 2)
    loops.until(lambda: all_running(core, job_id, 1), "both members running")

    cancelled = loops.jobs.cancel(job_id)

    assert cancelled.job.state is JobState.CANCELLED
    loops.until(lambda: True if not pods_of(core, job_id, 1) else None, "the pods gone")
    name = manifests.job_name(job_id, 1)
    assert name not in {j.metadata.name for j in batch.list_namespaced_job(NS_A).items}
    loops.until(
        lambda: (
            True
            if loops.alloc.status(view.job.workload_id or "").state is WorkloadState.RELEASED
            else None
        ),
        "the gang released once its members ended",
    )
    assert used(loops.alloc, TEAM_A.name) == 0


def test_cancelling_a_kubectl_job_suspends_it_and_leaves_the_object_to_its_owner(
    loops: Loops, core: client.CoreV1Api, batch: client.BatchV1Api
) -> None:
    manifest = kubectl_job("long-kubectl", NS_A, 1, 2)
    manifest["spec"]["template"]["metadata"]["annotations"] = {RUN_FOR: "1h"}
    created = batch.create_namespaced_job(NS_A, manifest)
    job_id = job_id_of(created.metadata.uid)
    loops.admission.admit()
    selector = "batch.kubernetes.io/job-name=long-kubectl"

    def running() -> list[client.V1Pod] | None:
        pods = core.list_namespaced_pod(NS_A, label_selector=selector).items
        return pods if len(pods) == 2 and all(p.status.phase == "Running" for p in pods) else None

    loops.until(running, "both members running")
    assert loops.jobs.get(job_id).state is JobState.RUNNING

    loops.jobs.cancel(job_id)

    assert batch.read_namespaced_job("long-kubectl", NS_A).spec.suspend is True
    loops.until(
        lambda: True if not core.list_namespaced_pod(NS_A, label_selector=selector).items else None,
        "the suspended Job's pods gone",
    )
    assert loops.jobs.get(job_id).state is JobState.CANCELLED
    loops.until(lambda: True if used(loops.alloc, TEAM_A.name) == 0 else None, "the gang freed")
    # Deleting the Job afterwards changes nothing more.
    batch.delete_namespaced_job("long-kubectl", NS_A, propagation_policy="Background")
    assert loops.admission.admit().cancelled == ()


def test_deleting_a_kubectl_job_cancels_its_portal_job(
    loops: Loops, batch: client.BatchV1Api
) -> None:
    manifest = kubectl_job("deleted-kubectl", NS_A, 1, 1)
    manifest["spec"]["template"]["metadata"]["annotations"] = {RUN_FOR: "1h"}
    job_id = job_id_of(batch.create_namespaced_job(NS_A, manifest).metadata.uid)
    loops.admission.admit()
    loops.until(
        lambda: True if loops.jobs.get(job_id).state is JobState.RUNNING else None, "running"
    )

    batch.delete_namespaced_job("deleted-kubectl", NS_A, propagation_policy="Background")
    report = loops.until(
        lambda: r if (r := loops.admission.admit()).cancelled else None, "the deletion seen"
    )

    assert report.cancelled == (job_id,)
    assert loops.jobs.get(job_id).state is JobState.CANCELLED
    loops.until(lambda: True if used(loops.alloc, TEAM_A.name) == 0 else None, "the gang freed")
