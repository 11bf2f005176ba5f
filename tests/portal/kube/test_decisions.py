"""The binder's decisions and the sweep's verdicts on typed views, without a cluster: a real
allocator on SQLite answers, pods are literal views."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from policies.flavors import FlavorKind
from policies.isolation import IsolationSettings
from policies.requests import DeviceRequest, WorkloadRequest
from portal.allocator import Allocator, WorkloadStatus
from portal.inventory.kubernetes import to_node
from portal.kube.binder import Bind, Binder, Hold, HoldReason, decide, in_use
from portal.kube.keys import SCHEDULER_NAME, PodKeys
from portal.kube.sweep import gone
from portal.kube.views import PodView, pod_view
from portal.store.records import AllocationRecord, WorkloadState
from portal.store.writer import Store
from tests.support import gpu_nodes

SETTINGS = IsolationSettings()
KEYS = PodKeys.of(SETTINGS)


@pytest.fixture
def allocator(tmp_path: Path) -> Iterator[Allocator]:
    with Store(f"sqlite:///{tmp_path / 'portal.db'}") as store:
        alloc = Allocator(store)
        alloc.start([to_node(gpu_nodes.h100_nvswitch_node("h100-0"))])
        alloc.set_tenant("vision")
        alloc.set_quota("vision", "H100-80GB", guaranteed=1, limit=1)
        yield alloc


def ask(alloc: Allocator, name: str) -> WorkloadStatus:
    devices = DeviceRequest(kind=FlavorKind.GPU, count=1, models=frozenset({"H100-80GB"}))
    return alloc.request(WorkloadRequest("vision", "alice", name, devices))


def pod(
    workload: str | None,
    allocation: str | None,
    *,
    namespace: str = "gp-vision",
    name: str = "nb",
    uid: str = "uid-1",
    node: str | None = None,
    phase: str = "Pending",
) -> PodView:
    annotations = {}
    if workload is not None:
        annotations[KEYS.workload] = workload
    if allocation is not None:
        annotations[KEYS.allocation] = allocation
    return PodView(
        namespace=namespace,
        name=name,
        uid=uid,
        scheduler_name=SCHEDULER_NAME,
        node_name=node,
        phase=phase,
        labels={KEYS.workload: workload} if workload else {},
        annotations=annotations,
    )


def test_a_running_allocation_binds_to_its_node(allocator: Allocator) -> None:
    status = ask(allocator, "a")
    allocation = status.allocations[0]
    assert decide(pod(status.id, allocation.id), allocator, SETTINGS, {}) == Bind(
        pod(status.id, allocation.id), "h100-0", status.id
    )


def test_a_queued_allocation_waits_with_the_queue_message(allocator: Allocator) -> None:
    ask(allocator, "first")
    queued = ask(allocator, "second")
    assert queued.state is WorkloadState.QUEUED
    decision = decide(pod(queued.id, "any"), allocator, SETTINGS, {})
    assert isinstance(decision, Hold)
    assert decision.reason is HoldReason.ALLOCATION_QUEUED
    assert decision.reason.event_type == "Normal"
    assert decision.message.startswith(f"workload {queued.id} is queued (")
    assert decision.message.endswith("); the pod is bound once it is allocated")


@pytest.mark.parametrize(
    ("workload", "allocation", "reason"),
    [
        (None, None, HoldReason.NO_ALLOCATION),
        ("w", None, HoldReason.NO_ALLOCATION),
        ("no-such-workload", "a", HoldReason.UNKNOWN_ALLOCATION),
    ],
)
def test_pods_without_a_known_allocation_are_held(
    allocator: Allocator, workload: str | None, allocation: str | None, reason: HoldReason
) -> None:
    decision = decide(pod(workload, allocation), allocator, SETTINGS, {})
    assert isinstance(decision, Hold) and decision.reason is reason
    assert decision.reason.event_type == "Warning"


def test_an_allocation_the_workload_does_not_hold_is_held(allocator: Allocator) -> None:
    status = ask(allocator, "a")
    decision = decide(pod(status.id, "not-mine"), allocator, SETTINGS, {})
    assert isinstance(decision, Hold)
    assert decision.reason is HoldReason.UNKNOWN_ALLOCATION
    assert decision.message == (
        f"workload {status.id} has no allocation not-mine (it holds: "
        f"{status.allocations[0].id}); pod gp-vision/nb will not be bound"
    )


def test_an_allocation_in_use_by_another_bound_pod_is_held(allocator: Allocator) -> None:
    status = ask(allocator, "a")
    aid = status.allocations[0].id
    bound = pod(status.id, aid, name="first", uid="uid-0", node="h100-0", phase="Running")
    holders = in_use([bound], KEYS)
    decision = decide(pod(status.id, aid), allocator, SETTINGS, holders)
    assert isinstance(decision, Hold) and decision.reason is HoldReason.ALLOCATION_IN_USE
    # The holder itself (a stale view of it) is not in conflict with itself.
    assert isinstance(decide(bound, allocator, SETTINGS, holders), Bind)
    # Finished or deleted pods hold nothing.
    assert in_use([pod(status.id, aid, node="h100-0", phase="Succeeded")], KEYS) == {}


def test_pod_view_reads_the_dict_and_model_forms_alike() -> None:
    data: dict[str, Any] = {
        "metadata": {
            "namespace": "gp-vision",
            "name": "nb",
            "uid": "u",
            "labels": {"a": "b"},
            "annotations": {"c": "d"},
            "deletionTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "schedulerName": "gpuportal",
            "nodeName": "n1",
            "containers": [{"name": "notebook"}],
        },
        "status": {"phase": "Running"},
    }
    model = client.V1Pod.from_dict(data)
    assert (
        pod_view(data)
        == pod_view(model)
        == PodView(
            "gp-vision", "nb", "u", "gpuportal", "n1", "Running", {"a": "b"}, {"c": "d"}, True
        )
    )


# ---- the sweep's verdict ---------------------------------------------------------------------

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def workload(wid: str, state: WorkloadState, started_s_ago: float) -> WorkloadStatus:
    started = NOW - timedelta(seconds=started_s_ago)
    held = (AllocationRecord(f"a-{wid}", wid, 0, "h100-0", "H100-80GB", 1, 1.0, gpus=(0,)),)
    return WorkloadStatus(
        id=wid,
        tenant="vision",
        owner="alice",
        name=wid,
        kind="notebook",
        state=state,
        reason="",
        message="",
        created_at=started,
        started_at=started,
        ended_at=None,
        allocations=held if state is not WorkloadState.QUEUED else (),
    )


def test_gone_releases_seen_workloads_at_once_and_unseen_ones_after_the_grace() -> None:
    live = [
        workload("has-pod", WorkloadState.RUNNING, 1000),
        workload("pod-finished", WorkloadState.RUNNING, 1000),
        workload("seen-then-deleted", WorkloadState.RUNNING, 5),
        workload("young-no-pod", WorkloadState.RUNNING, 5),
        workload("old-no-pod", WorkloadState.RUNNING, 301),
        workload("preempted-pod-deleted", WorkloadState.PREEMPTING, 1000),
        workload("queued", WorkloadState.QUEUED, 1000),
    ]
    pods = [
        pod("has-pod", "a", phase="Running", node="h100-0"),
        pod("pod-finished", "a", phase="Failed", node="h100-0"),
        # Pending and unbound still counts: the binder may be holding it.
        pod("pending-elsewhere", "a"),
    ]
    seen = {"seen-then-deleted"}
    # Arithmetic: grace 300 s; "young-no-pod" started 5 s ago (kept), "old-no-pod" 301 s ago.
    assert gone(pods, live, seen, KEYS, NOW, grace_s=300) == [
        "old-no-pod",
        "pod-finished",
        "preempted-pod-deleted",
        "seen-then-deleted",
    ]
    assert {"has-pod", "pending-elsewhere"} <= seen
    # Once seen, a workload whose pod vanishes goes at the next sweep, grace or not.
    assert gone([], [live[0]], seen, KEYS, NOW, grace_s=300) == ["has-pod"]


def test_a_preempted_workloads_new_pod_is_not_bound(tmp_path: Path) -> None:
    with Store(f"sqlite:///{tmp_path / 'preempt.db'}") as store:
        alloc = Allocator(store)
        alloc.start([to_node(gpu_nodes.t4_pcie_node("t4-0"))])
        alloc.set_tenant("borrower", cohort="c")
        alloc.set_tenant("owner", cohort="c")
        alloc.set_quota("borrower", "T4", guaranteed=0, limit=2)
        alloc.set_quota("owner", "T4", guaranteed=2, limit=2)
        two = DeviceRequest(kind=FlavorKind.GPU, count=2, models=frozenset({"T4"}))
        borrowed = alloc.request(WorkloadRequest("borrower", "bob", "b", two))
        # The owner wants its guaranteed GPUs back: the borrower is told to stop.
        alloc.request(WorkloadRequest("owner", "olga", "o", two))
        assert alloc.status(borrowed.id).state is WorkloadState.PREEMPTING
        view = pod(borrowed.id, borrowed.allocations[0].id, namespace="gp-borrower")
        decision = decide(view, alloc, SETTINGS, {})
    assert isinstance(decision, Hold) and decision.reason is HoldReason.ALLOCATION_ENDED
    assert decision.message == (
        f"workload {borrowed.id} is being preempted (preempted); its devices are being taken "
        "back, so pod gp-borrower/nb will not be bound"
    )


def test_a_binder_with_no_workers_is_refused_with_the_value(allocator: Allocator) -> None:
    with pytest.raises(ValueError, match="act_workers must be at least 1, not 0"):
        Binder(client.ApiClient(), allocator, SETTINGS, act_workers=0)
