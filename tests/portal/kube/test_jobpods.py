"""The binder's decisions for pods of training jobs, and the sweep leaving jobs alone, on typed
views without a cluster: a real allocator on SQLite answers."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from policies.flavors import FlavorKind
from policies.isolation import IsolationSettings
from policies.requests import DeviceRequest, WorkloadKind, WorkloadRequest
from portal.allocator import Allocator, WorkloadStatus
from portal.inventory.kubernetes import to_node
from portal.jobs.kube.manifests import COMPLETION_INDEX, JOB_NAME_LABEL, JOB_UID_LABEL, JobKeys
from portal.kube.jobpods import JobHold, JobPlacement, JobRef, is_job_pod, place_job_pod
from portal.kube.keys import SCHEDULER_NAME, PodKeys
from portal.kube.sweep import gone
from portal.kube.views import PodView
from portal.store.writer import Store
from tests.support import gpu_nodes

SETTINGS = IsolationSettings()
KEYS = PodKeys.of(SETTINGS)
RANK = JobKeys.of(SETTINGS).rank


@pytest.fixture
def allocator(tmp_path: Path) -> Iterator[Allocator]:
    with Store(f"sqlite:///{tmp_path / 'portal.db'}") as store:
        alloc = Allocator(store)
        alloc.start([to_node(gpu_nodes.h100_nvswitch_node(n)) for n in ("h100-0", "h100-1")])
        for tenant, guaranteed in (("vision", 16), ("audit", 0)):
            alloc.set_tenant(tenant)
            alloc.set_quota(tenant, "H100-80GB", guaranteed=guaranteed, limit=16)
        yield alloc


def gang(alloc: Allocator, members: int, gpus: int, tenant: str = "vision") -> WorkloadStatus:
    devices = DeviceRequest(kind=FlavorKind.GPU, count=gpus, models=frozenset({"H100-80GB"}))
    request = WorkloadRequest(
        tenant, "alice", "train", devices, kind=WorkloadKind.JOB, gang_size=members
    )
    return alloc.request(request)


def job_pod(index: int, *, namespace: str = "gp-vision", uid: str = "") -> PodView:
    return PodView(
        namespace=namespace,
        name=f"train-{index}-x",
        uid=uid or f"pod-{index}",
        scheduler_name=SCHEDULER_NAME,
        node_name=None,
        phase="Pending",
        labels={JOB_NAME_LABEL: "train", JOB_UID_LABEL: "job-uid", COMPLETION_INDEX: str(index)},
        annotations={COMPLETION_INDEX: str(index)},
    )


def test_each_index_goes_to_its_ranks_node_contiguous_per_node(allocator: Allocator) -> None:
    # 4 members of 4 GPUs on two 8-GPU nodes: two per node.
    status = gang(allocator, 4, 4)
    refs = {("gp-vision", "train"): JobRef("job-uid", status.id)}
    placed = [place_job_pod(job_pod(i), refs, allocator, SETTINGS, {}) for i in range(4)]

    assert all(isinstance(p, JobPlacement) for p in placed)
    nodes = [p.node for p in placed if isinstance(p, JobPlacement)]
    # Ranks 0,1 on the node of the lowest member, 2,3 on the other: one block per node.
    assert nodes[0] == nodes[1] != nodes[2] == nodes[3]
    by_id = {a.id: a for a in status.allocations}
    for rank, p in enumerate(placed):
        assert isinstance(p, JobPlacement)
        allocation = by_id[p.annotations[KEYS.allocation]]
        assert allocation.node == p.node and p.labels[KEYS.allocation] == allocation.id
        assert p.annotations[RANK["LOCAL_RANK"]] == str(rank % 2)
        assert p.annotations[RANK["NODE_RANK"]] == str(rank // 2)
        assert p.annotations[RANK["LOCAL_WORLD_SIZE"]] == "2"
    assert len({p.annotations[KEYS.allocation] for p in placed if isinstance(p, JobPlacement)}) == 4


def test_job_pods_wait_or_are_refused_as_their_gang_stands(allocator: Allocator) -> None:
    running = gang(allocator, 2, 8)
    queued = gang(allocator, 2, 8, tenant="vision")
    refs = {
        ("gp-vision", "train"): JobRef("job-uid", running.id),
        ("gp-vision", "waiting"): JobRef("uid-w", queued.id),
        ("gp-audit", "train"): JobRef("job-uid", running.id),
    }

    def hold(pod: PodView, holders: dict[str, PodView] | None = None) -> str:
        decision = place_job_pod(pod, refs, allocator, SETTINGS, holders or {})
        assert isinstance(decision, JobHold), decision
        return decision.reason

    waiting = replace(
        job_pod(0), labels={**job_pod(0).labels, JOB_NAME_LABEL: "waiting", JOB_UID_LABEL: "uid-w"}
    )
    assert hold(waiting) == "GPUAllocationQueued"
    # A Job the portal did not admit, or another Job re-created under an admitted one's name.
    unknown = replace(job_pod(0), labels={**job_pod(0).labels, JOB_NAME_LABEL: "other"})
    assert hold(unknown) == "GPUJobNotAdmitted"
    reborn = replace(job_pod(0), labels={**job_pod(0).labels, JOB_UID_LABEL: "new-uid"})
    assert hold(reborn) == "GPUJobNotAdmitted"
    # Another tenant's namespace naming this gang's workload.
    assert hold(job_pod(0, namespace="gp-audit")) == "GPUAllocationOfAnotherTenant"
    assert hold(job_pod(5)) == "UnknownGPUAllocation"
    first = place_job_pod(job_pod(0), refs, allocator, SETTINGS, {})
    assert isinstance(first, JobPlacement)
    holders = {first.annotations[KEYS.allocation]: job_pod(0, uid="earlier")}
    assert hold(job_pod(0), holders) == "GPUAllocationInUse"
    allocator.release(running.id)
    assert hold(job_pod(1)) == "GPUAllocationEnded"


def test_only_indexed_job_pods_without_an_allocation_are_job_pods() -> None:
    assert is_job_pod(job_pod(0), KEYS)
    notebook = replace(job_pod(0), labels={}, annotations={})
    assert not is_job_pod(notebook, KEYS)
    bound_before = replace(job_pod(0), annotations={KEYS.allocation: "a", COMPLETION_INDEX: "0"})
    assert not is_job_pod(bound_before, KEYS)


def test_the_sweep_leaves_job_workloads_to_the_job_controller(allocator: Allocator) -> None:
    status = gang(allocator, 2, 4)
    seen = {status.id}
    # Its pods finished (or are gone): the job controller, not the sweep, ends the attempt.
    assert gone([], [status], seen, KEYS, status.created_at, grace_s=0) == []
