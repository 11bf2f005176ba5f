"""A portal-created job on the Kubernetes backend preempted by a reclaim, and the tenant's
checkpoint volume, against the real apiserver (Pod Security ``restricted`` enforced in the
tenant namespaces), the real Job controller and kwok GPU nodes.

The loops are stepped by the test as in ``test_kube_jobs.py`` (whose helpers this module
uses); its own tenants and node keep it apart from that module's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from policies.flavors import FlavorKind
from policies.isolation import TenantSpec
from policies.jobs import JobState, RestartPolicy
from policies.preemption import PreemptionPolicy
from policies.requests import DeviceRequest, WorkloadRequest
from portal.allocator import Allocator
from portal.inventory.kubernetes import to_node
from portal.isolation import reconcile
from portal.jobs.checkpoints import mark_complete, step_path
from portal.jobs.kube import manifests
from portal.jobs.spec import JobSpec
from portal.store.records import WorkloadState
from portal.store.writer import Store
from tests.portal.jobs.test_kube_jobs import (
    IMAGE,
    JOB_KEYS,
    SETTINGS,
    Loops,
    add_ready_node,
    env_of,
    eventually,
)
from tests.support.k8s import K8sCluster
from tests.support.k8s_tenants import delete_tenant_namespaces
from tests.support.kwok_stages import RUN_FOR

pytestmark = pytest.mark.k8s

NODE = "kp-h100-a"
BORROWER = TenantSpec(
    name="kpteama", gpu_limits={"H100-80GB": 8}, cpu_millis=8000, memory_mib=8192, pods=10
)
OWNER = TenantSpec(
    name="kpteamb", gpu_limits={"H100-80GB": 8}, cpu_millis=8000, memory_mib=8192, pods=10
)
NS_A = SETTINGS.namespace(BORROWER.name)
NS_B = SETTINGS.namespace(OWNER.name)
JOB_GRACE_S = 7.0
"""The allocator's grace for preempted jobs here: short, and not the runner's stop grace."""


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


@pytest.fixture(scope="module")
def node(k8s_cluster: K8sCluster, api: client.ApiClient, core: client.CoreV1Api) -> Any:
    reconcile([BORROWER, OWNER], SETTINGS, api)
    for namespace in (NS_A, NS_B):
        eventually(
            lambda ns=namespace: (
                True if (q := core.read_namespaced_resource_quota("tenant-quota", ns)).status
                and q.status.hard else None
            ),
            f"ResourceQuota status in {namespace}",
        )  # fmt: skip
    ready = add_ready_node(k8s_cluster, core, NODE)
    yield to_node(api.sanitize_for_serialization(ready))
    for namespace in (NS_A, NS_B):  # Jobs first, or their controller recreates the pods
        for job in batch_of(api).list_namespaced_job(namespace).items:
            batch_of(api).delete_namespaced_job(
                job.metadata.name, namespace, propagation_policy="Background"
            )
    delete_tenant_namespaces(api, SETTINGS, [NS_A, NS_B])


def batch_of(api: client.ApiClient) -> client.BatchV1Api:
    return client.BatchV1Api(api)


@pytest.fixture
def loops(node: Any, api: client.ApiClient, tmp_path: Path) -> Iterator[Loops]:
    """The borrower may use the owner's 8 idle GPUs; the owner's reclaim preempts it."""
    with Store(f"sqlite:///{tmp_path / 'portal.db'}") as store:
        alloc = Allocator(store, preemption=PreemptionPolicy(job_grace_s=JOB_GRACE_S))
        alloc.start([node])
        alloc.set_tenant(BORROWER.name, cohort="kp")
        alloc.set_tenant(OWNER.name, cohort="kp")
        alloc.set_quota(BORROWER.name, "H100-80GB", guaranteed=0, limit=8)
        alloc.set_quota(OWNER.name, "H100-80GB", guaranteed=8, limit=8)
        loops = Loops(alloc, api)
        yield loops
        loops.runner.close()  # its watches
    batch = batch_of(api)
    for job in batch.list_job_for_all_namespaces(label_selector=JOB_KEYS.job).items:
        if job.metadata.namespace in (NS_A, NS_B):
            batch.delete_namespaced_job(
                job.metadata.name, job.metadata.namespace, propagation_policy="Background"
            )


def spec(tenant: str, checkpoints: Path, count: int = 4) -> JobSpec:
    """Two members of ``count`` GPUs; ``max_restarts`` 0, so any counted end would fail it."""
    devices = DeviceRequest(kind=FlavorKind.GPU, count=count, models=frozenset({"H100-80GB"}))
    return JobSpec(
        tenant=tenant,
        owner="alice",
        name="train",
        members=2,
        devices=devices,
        image=IMAGE,
        checkpoint_dir=str(checkpoints),
        restart=RestartPolicy(max_restarts=0, backoff_s=0, backoff_cap_s=0),
    )


def pods_of(core: client.CoreV1Api, namespace: str, job_id: str, attempt: int) -> list[Any]:
    selector = f"{JOB_KEYS.job}={job_id},{JOB_KEYS.attempt}={attempt}"
    return list(core.list_namespaced_pod(namespace, label_selector=selector).items)


def hold(core: client.CoreV1Api, namespace: str, job_id: str, attempt: int) -> list[Any]:
    """Keep the attempt's two pods running (a long training run under kwok)."""
    pods = eventually(
        lambda: p if len(p := pods_of(core, namespace, job_id, attempt)) == 2 else None,
        "the Job controller creating 2 pods (Pod Security admitting them)",
    )
    for pod in pods:
        core.patch_namespaced_pod(
            pod.metadata.name, namespace, {"metadata": {"annotations": {RUN_FOR: "1h"}}}
        )
    return pods


def deletion_graces(
    core: client.CoreV1Api, namespace: str, selector: str, since: str
) -> dict[str, int]:
    """The grace period each pod was deleted with since resource version ``since``, replayed
    from the apiserver's watch history (kwok removes a deleted pod at once: the watch still
    shows the deletion it was asked for)."""
    graces: dict[str, int] = {}
    for event in watch.Watch().stream(
        core.list_namespaced_pod,
        namespace,
        label_selector=selector,
        resource_version=since,
        timeout_seconds=2,
    ):
        meta = event["object"].metadata
        if meta.deletion_timestamp is not None:
            graces.setdefault(meta.name, meta.deletion_grace_period_seconds)
    return graces


def claim_of(pod: Any) -> tuple[str, str, str]:
    """The claim a member pod mounts, where, and which folder of it."""
    (volume,) = [v for v in pod.spec.volumes if v.name == manifests.CHECKPOINT_VOLUME]
    (mount,) = [
        x for x in pod.spec.containers[0].volume_mounts if x.name == manifests.CHECKPOINT_VOLUME
    ]
    return volume.persistent_volume_claim.claim_name, mount.mount_path, mount.sub_path


def test_a_reclaim_stops_the_attempt_with_the_allocators_grace_and_it_resumes_uncounted(
    loops: Loops, core: client.CoreV1Api, batch: client.BatchV1Api, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "ckpt"
    job_id = loops.jobs.submit(spec(BORROWER.name, checkpoints)).job.id
    first_pods = hold(core, NS_A, job_id, 1)
    loops.until(
        lambda: True if loops.jobs.get(job_id).state is JobState.RUNNING else None, "running"
    )
    loops.until(
        lambda: p if (p := pods_of(core, NS_A, job_id, 1)) and all(
            x.status.phase == "Running" for x in p
        ) else None,
        "both members running",
    )  # fmt: skip
    # Every member mounts the tenant's claim at checkpoint_dir, in the job's own folder.
    assert {claim_of(p) for p in pods_of(core, NS_A, job_id, 1)} == {
        (SETTINGS.checkpoint_claim, str(checkpoints), manifests.checkpoint_sub_path(job_id))
    }
    step = step_path(checkpoints, 3)  # what the script wrote (the portal reads it here)
    step.mkdir(parents=True)
    mark_complete(step)
    selector = f"{JOB_KEYS.job}={job_id},{JOB_KEYS.attempt}=1"
    since = core.list_namespaced_pod(NS_A, label_selector=selector).metadata.resource_version

    # The owner reclaims its guarantee: the borrowing attempt is stopped.
    claimant = loops.alloc.request(
        WorkloadRequest(
            OWNER.name,
            "bob",
            "nb",
            DeviceRequest(kind=FlavorKind.GPU, count=8, models=frozenset({"H100-80GB"})),
        )
    )
    loops.until(
        lambda: True if not pods_of(core, NS_A, job_id, 1) else None, "the members' pods gone"
    )
    # Deleted with the allocator's grace for jobs (whole seconds; a second may have passed).
    deleted = deletion_graces(core, NS_A, selector, since)
    graces = {p.metadata.name: deleted.get(p.metadata.name) for p in first_pods}
    assert all(g is not None and JOB_GRACE_S - 1 <= g <= JOB_GRACE_S for g in graces.values()), (
        graces
    )
    name = manifests.job_name(job_id, 1)
    assert name not in {j.metadata.name for j in batch.list_namespaced_job(NS_A).items}
    first = loops.jobs.attempts(job_id)[0]
    assert (first.exit_reason, first.counted) == (f"preempted by {OWNER.name} reclaim", False)
    # Back in the queue behind the claimant, which runs once the members have ended.
    loops.until(
        lambda: True if loops.alloc.status(claimant.id).state is WorkloadState.RUNNING else None,
        "the claimant running",
    )
    job = loops.until(
        lambda: j if (j := loops.jobs.get(job_id)).state is JobState.QUEUED else None, "queued"
    )
    assert (job.attempt, job.restarts, job.preemptions) == (2, 0, 1)

    # The owner is done: attempt 2 runs, resuming from the checkpoint, on the same claim.
    loops.alloc.release(claimant.id)
    second = loops.until(
        lambda: a[1] if len(a := loops.jobs.attempts(job_id)) == 2 and a[1].started_at else None,
        "the second attempt starting",
    )
    assert second.resume_from == str(step)
    env = env_of(batch.read_namespaced_job(manifests.job_name(job_id, 2), NS_A))
    assert env["GPUPORTAL_RESUME_FROM"] == str(step) and env["GPUPORTAL_ATTEMPT"] == "2"
    pods = eventually(
        lambda: p if len(p := pods_of(core, NS_A, job_id, 2)) == 2 else None, "attempt 2's pods"
    )
    assert {claim_of(p)[2] for p in pods} == {manifests.checkpoint_sub_path(job_id)}
    # kwok completes them once bound: with max_restarts 0 it succeeds, the preemption unused.
    done = loops.until(
        lambda: j if (j := loops.jobs.get(job_id)).state.terminal else None, "the job ending"
    )
    assert (done.state, done.restarts, done.preemptions) == (JobState.SUCCEEDED, 0, 1), done.message


def test_each_tenant_mounts_its_own_claim_and_an_existing_one_is_used_as_it_is(
    loops: Loops, core: client.CoreV1Api, tmp_path: Path
) -> None:
    # The owner's admin made the claim already, on storage of their choosing.
    core.create_namespaced_persistent_volume_claim(
        NS_B,
        {
            "metadata": {"name": SETTINGS.checkpoint_claim},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": "3Gi"}},
                "storageClassName": "admins-choice",
            },
        },
    )
    ids = {
        tenant.name: loops.jobs.submit(spec(tenant.name, tmp_path / tenant.name, 2)).job.id
        for tenant in (BORROWER, OWNER)
    }
    by_tenant = {
        tenant.name: hold(core, ns, ids[tenant.name], 1)
        for tenant, ns in ((BORROWER, NS_A), (OWNER, NS_B))
    }
    claims = {
        ns: core.read_namespaced_persistent_volume_claim(SETTINGS.checkpoint_claim, ns)
        for ns in (NS_A, NS_B)
    }
    # The portal made the borrower's with the configured size and left the owner's alone.
    assert claims[NS_A].spec.resources.requests["storage"] == SETTINGS.checkpoint_claim_size
    assert claims[NS_A].metadata.labels[JOB_KEYS.tenant] == BORROWER.name
    assert claims[NS_B].spec.resources.requests["storage"] == "3Gi"
    assert claims[NS_B].spec.storage_class_name == "admins-choice"
    assert claims[NS_A].metadata.uid != claims[NS_B].metadata.uid
    # A pod mounts a claim of its own namespace only: each tenant's pods mount their own,
    # each job its own folder.
    for tenant, ns in ((BORROWER, NS_A), (OWNER, NS_B)):
        for pod in by_tenant[tenant.name]:
            assert pod.metadata.namespace == ns
            assert claim_of(pod) == (
                SETTINGS.checkpoint_claim,
                str(tmp_path / tenant.name),
                manifests.checkpoint_sub_path(ids[tenant.name]),
            )
    for job_id in ids.values():
        loops.jobs.cancel(job_id)
    core.delete_namespaced_persistent_volume_claim(SETTINGS.checkpoint_claim, NS_B)
