"""Ray clusters on Kubernetes, against the real apiserver, the real KubeRay operator (built from
its pinned module) and kwok GPU nodes.

The Ray controller runs over a real allocator (SQLite) with no process backend; ``KubeRay``
writes the RayCluster and marks the operator's worker pods; the portal's binder binds them;
nothing else schedules pods. The test drives the loops itself (allocator tick, controller
step, sync, binder pass), so every step happens in the order it reads.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fastapi.testclient import TestClient
from kubernetes import client

from policies.flavors import FlavorKind
from policies.isolation import IsolationSettings, TenantSpec
from policies.requests import DeviceRequest, WorkloadRequest
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from portal.inventory.kubernetes import to_node
from portal.isolation import reconcile
from portal.kube.binder import Binder, HoldReason
from portal.kube.keys import PodKeys
from portal.ray import kubeobjects as ko
from portal.ray.controller import RayController
from portal.ray.drivers import DriverRun
from portal.ray.jobs import RayJobs
from portal.ray.jobspec import RayJobSpec
from portal.ray.kube import KubeRay
from portal.ray.kubedrivers import KubeDrivers
from portal.ray.spec import RaySpec
from portal.ray.tokens import RayTokens
from portal.store.records import WorkloadState
from portal.store.writer import Store
from tests.portal.api.conftest import auth, member_of, user
from tests.support import gpu_nodes
from tests.support.k8s import K8sCluster
from tests.support.k8s_tenants import delete_tenant_namespaces
from tests.support.kuberay import KubeRayOperator
from tests.support.kwok_stages import EXIT_CODE, RUN_FOR
from tests.support.waiting import eventually

pytestmark = pytest.mark.k8s

T = TypeVar("T")
SETTINGS = IsolationSettings()
KEYS = PodKeys.of(SETTINGS)
RAY = "2.60.0"
NODE = "kr-h100-a"
IMAGE = "registry.invalid/ray:2.60.0"  # kwok runs no containers
TEAM_A = TenantSpec(
    name="krteama", gpu_limits={"H100-80GB": 8}, cpu_millis=32000, memory_mib=65536, pods=20
)
TEAM_B = TenantSpec(
    name="krteamb", gpu_limits={"H100-80GB": 8}, cpu_millis=32000, memory_mib=65536, pods=20
)
NS_A = SETTINGS.namespace(TEAM_A.name)
H100 = DeviceRequest(kind=FlavorKind.GPU, count=1, models=frozenset({"H100-80GB"}))
RAY_TOKENS = RayTokens("the portal's key in the Kubernetes Ray tests (32+ characters)")
TOKENS = {
    "alice": user("alice", {TEAM_A.name}, *member_of(TEAM_A.name)),
    "bob": user("bob", {TEAM_B.name}, *member_of(TEAM_B.name)),
}


@pytest.fixture(scope="module")
def api(k8s_cluster: K8sCluster) -> Iterator[client.ApiClient]:
    with k8s_cluster.api_client() as api_client:
        yield api_client


@pytest.fixture(scope="module")
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture(scope="module")
def nodes(
    k8s_cluster: K8sCluster,
    kuberay_operator: KubeRayOperator,
    api: client.ApiClient,
    core: client.CoreV1Api,
) -> Iterator[list[Any]]:
    """Two tenants reconciled and one kwok node of 8 H100s, as the allocator sees it. At the
    end no RayCluster, pod or tenant namespace is left (other modules reconcile their own
    tenants)."""
    reconcile([TEAM_A, TEAM_B], SETTINGS, api)
    k8s_cluster.add_gpu_node(gpu_nodes.h100_nvswitch_node(NODE, rack="rack-kr"))
    ready = eventually(
        lambda: n if not (n := core.read_node(NODE)).spec.taints else None,
        f"the not-ready taint leaving {NODE}",
    )
    yield [to_node(api.sanitize_for_serialization(ready))]
    custom = client.CustomObjectsApi(api)
    batch = client.BatchV1Api(api)
    namespaces = [SETTINGS.namespace(t.name) for t in (TEAM_A, TEAM_B)]
    for namespace in namespaces:
        for job in batch.list_namespaced_job(namespace).items:  # Ray job drivers
            batch.delete_namespaced_job(
                job.metadata.name, namespace, propagation_policy="Background"
            )
        found: Any = custom.list_namespaced_custom_object(
            ko.GROUP, ko.VERSION, namespace, ko.PLURAL
        )
        for item in found["items"]:
            custom.delete_namespaced_custom_object(
                ko.GROUP, ko.VERSION, namespace, ko.PLURAL, item["metadata"]["name"]
            )
    delete_tenant_namespaces(api, SETTINGS, namespaces)


class Rig:
    """The service's loops over one allocator, stepped by the test: the controller given
    (one that reads heads), or one that reads none; pods are looked up in ``namespace``."""

    def __init__(
        self,
        alloc: Allocator,
        api: client.ApiClient,
        ray: RayController | None = None,
        namespace: str = NS_A,
    ) -> None:
        self.alloc = alloc
        self.namespace = namespace
        self.ray = ray or RayController(alloc, installed=RAY)
        self.kube = KubeRay(api, self.ray, SETTINGS, RAY_TOKENS, image=IMAGE)
        self.jobs = RayJobs(self.ray, drivers=KubeDrivers(api, SETTINGS, image=IMAGE))
        self.batch = client.BatchV1Api(api)
        self.binder = Binder(api, alloc, SETTINGS)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def step(self) -> None:
        self.alloc.tick()
        self.ray.step()
        self.kube.sync()
        self.jobs.step()
        self.binder.bind_pending()

    def until(self, probe: Callable[[], T | None], what: str, timeout_s: float = 30.0) -> T:
        def stepped() -> T | None:
            self.step()
            return probe()

        return eventually(stepped, what, timeout_s)

    def pods(self, cluster_id: str, kind: str | None = None) -> list[client.V1Pod]:
        selector = f"{ko.CLUSTER_LABEL}={ko.cluster_name(cluster_id)}"
        if kind:
            selector += f",{ko.NODE_TYPE_LABEL}={kind}"
        found = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        return [p for p in found if p.metadata.deletion_timestamp is None]

    def raycluster(self, cluster_id: str) -> dict[str, Any]:
        found: Any = self.custom.get_namespaced_custom_object(
            ko.GROUP, ko.VERSION, self.namespace, ko.PLURAL, ko.cluster_name(cluster_id)
        )
        return dict(found)


@pytest.fixture
def rig(nodes: list[Any], api: client.ApiClient, tmp_path: Path) -> Iterator[Rig]:
    with Store(f"sqlite:///{tmp_path / 'portal.db'}") as store:
        alloc = Allocator(store)
        alloc.start(nodes)
        for tenant in (TEAM_A, TEAM_B):
            alloc.set_tenant(tenant.name)
            alloc.set_quota(tenant.name, "H100-80GB", guaranteed=0, limit=8)
        rig = Rig(alloc, api)
        yield rig
        for view in rig.ray.clusters():
            rig.ray.delete(view.cluster.id)
        rig.kube.sync()


def spec(workers: int = 2, most: int = 4) -> RaySpec:
    return RaySpec(
        tenant=TEAM_A.name,
        owner="alice",
        name="rl",
        devices=H100,
        min_workers=workers,
        max_workers=most,
        workers=workers,
        ray_version=RAY,
    )


def all_running(pods: list[client.V1Pod], n: int) -> list[client.V1Pod] | None:
    running = [p for p in pods if p.spec.node_name and p.status.phase == "Running"]
    return running if len(running) == n else None


def test_the_gang_binds_only_when_head_and_every_worker_fit(rig: Rig) -> None:
    # Another tenant holds 7 of the node's 8 GPUs: room for the head and 1 of 2 workers.
    blocker = rig.alloc.request(
        WorkloadRequest(
            tenant=TEAM_B.name,
            owner="bob",
            name="big",
            devices=DeviceRequest(kind=FlavorKind.GPU, count=7),
        )
    )
    assert blocker.state is WorkloadState.RUNNING
    view = rig.ray.create(spec())
    cid = view.cluster.id
    assert view.cluster.state.value == "queued"

    # The operator makes the head and both workers; the portal binds none of them.
    rig.until(lambda: True if len(rig.pods(cid)) == 3 else None, "the operator's 3 pods")
    for _ in range(5):
        rig.step()
    assert [p.spec.node_name for p in rig.pods(cid)] == [None, None, None]
    workers = rig.pods(cid, "worker")
    assert all(p.metadata.labels.get(KEYS.allocation) == ko.QUEUED_ALLOCATION for p in workers)
    reasons = {
        e.reason
        for e in rig.core.list_namespaced_event(NS_A).items
        if e.involved_object.name in {p.metadata.name for p in workers}
    }
    assert str(HoldReason.ALLOCATION_QUEUED) in reasons
    queued = rig.ray.view(cid)
    assert queued.cluster.state.value == "queued"
    assert queued.slices[0].workload is not None
    # The gang's reason is the cluster's message, as the API shows it.
    assert queued.slices[0].workload.reason in ("capacity", "quota")
    assert queued.cluster.message == queued.slices[0].workload.message

    # Room for the whole gang: head and both workers bound, the cluster running.
    rig.alloc.release(blocker.id)
    running = rig.until(lambda: all_running(rig.pods(cid), 3), "the gang bound and running")
    [gang] = rig.ray.view(cid).slices
    assert gang.workload is not None
    used = {
        p.metadata.labels[KEYS.allocation]
        for p in running
        if p.metadata.labels.get(KEYS.allocation)
    }
    assert used == {a.id for a in gang.workload.allocations}
    assert {p.spec.node_name for p in running} == {NODE}
    done = rig.until(
        lambda: v if (v := rig.ray.view(cid)).cluster.state.value == "running" else None,
        "the cluster running",
    )
    assert done.joined == 2
    assert done.cluster.address == ko.head_address(cid, NS_A)
    # Token authentication: every node reads Ray's token from the cluster's Secret.
    env = {e.name: e for e in running[0].spec.containers[0].env}
    assert env["RAY_AUTH_MODE"].value == "token"
    assert env["RAY_AUTH_TOKEN"].value_from.secret_key_ref.name == ko.token_secret_name(cid)
    # The Secret holds the token derived from the portal's key, which the portal can
    # re-derive without reading the Secret back.
    secret = rig.core.read_namespaced_secret(ko.token_secret_name(cid), NS_A)
    assert base64.b64decode(secret.data[ko.TOKEN_KEY]).decode() == RAY_TOKENS.token(cid)


def test_growing_from_2_to_4_is_a_slice_of_its_own_gated_by_quota(rig: Rig) -> None:
    rig.alloc.set_quota(TEAM_A.name, "H100-80GB", guaranteed=0, limit=3)
    cid = rig.ray.create(spec()).cluster.id
    first = rig.until(lambda: all_running(rig.pods(cid), 3), "the gang bound and running")
    before = {p.metadata.name: p.spec.node_name for p in first}

    # +2 is requested as slice 2; the quota (3) does not allow it: its pods stay Pending.
    grown = rig.ray.scale(cid, 4)
    gang, extra = grown.slices
    assert (extra.slice.number, extra.slice.workers) == (2, 2)
    assert extra.workload is not None and extra.workload.reason == "quota"
    new = rig.until(
        lambda: (
            p
            if len(p := [x for x in rig.pods(cid, "worker") if x.metadata.name not in before]) == 2
            else None
        ),
        "the operator's 2 new worker pods",
    )
    for _ in range(5):
        rig.step()
    assert rig.raycluster(cid)["spec"]["workerGroupSpecs"][0]["replicas"] == 4
    still = {p.metadata.name: p for p in rig.pods(cid)}
    assert all(still[n].spec.node_name is None for n in (p.metadata.name for p in new))
    assert {n: still[n].spec.node_name for n in before} == before  # the 2 keep running
    assert all(still[n].status.phase == "Running" for n in before)
    view = rig.ray.view(cid)
    assert view.cluster.state.value == "running"
    assert "+2 waiting" in view.cluster.message and "quota" in view.cluster.message
    assert view.slices[1].workload is not None and view.slices[1].workload.reason == "quota"

    # Quota raised: slice 2 is placed and its pods bound, charged as their own workload.
    rig.alloc.set_quota(TEAM_A.name, "H100-80GB", guaranteed=0, limit=4)
    rig.until(lambda: all_running(rig.pods(cid), 5), "all 4 workers and the head running")
    placed = rig.ray.view(cid).slices[1]
    assert placed.workload is not None and placed.workload.state is WorkloadState.RUNNING
    assert placed.workload.id != gang.slice.workload_id

    # Back to 2: slice 2 released in the call; the operator drops exactly its pods.
    shrunk = rig.ray.scale(cid, 2)
    assert shrunk.slices[1].slice.state.value == "released"
    assert [w.id for w in rig.alloc.workloads(TEAM_A.name)] == [gang.slice.workload_id]
    left = rig.until(lambda: p if len(p := rig.pods(cid)) == 3 else None, "slice 2's pods deleted")
    assert sorted(p.metadata.name for p in left) == sorted(before)


def test_another_tenant_cannot_list_scale_submit_to_or_delete_a_kube_cluster(
    rig: Rig,
) -> None:
    app = create_app(
        rig.alloc, StaticAuthenticator(TOKENS), ray_controller=rig.ray, ray_tokens=RAY_TOKENS
    )
    body = {
        "tenant": TEAM_A.name,
        "name": "rl",
        "workers": {"devices": {"kind": "gpu", "count": 1}, "min": 1, "max": 2},
    }
    with TestClient(app) as http:
        # Bad input: a 422 naming the field, and no RayCluster made.
        bad = http.post("/api/v1/ray", json={**body, "ray_version": "0.0.1"}, headers=auth("alice"))
        assert (bad.status_code, bad.json()["field"]) == (422, "ray_version"), bad.text
        rig.step()
        found: Any = rig.custom.list_namespaced_custom_object(ko.GROUP, ko.VERSION, NS_A, ko.PLURAL)
        assert found["items"] == []

        r = http.post("/api/v1/ray", json=body, headers=auth("alice"))
        assert r.status_code == 201, r.text
        cid = r.json()["id"]
        rig.until(lambda: all_running(rig.pods(cid), 2), "the cluster's pods running")
        for method, path, payload in [
            ("GET", f"/api/v1/ray?tenant={TEAM_A.name}", None),
            ("GET", f"/api/v1/ray/{cid}", None),
            ("PATCH", f"/api/v1/ray/{cid}", {"workers": 2}),
            ("POST", f"/api/v1/ray/{cid}/jobs", {"entrypoint": "python -c 1"}),
            ("GET", f"/api/v1/ray/{cid}/jobs", None),
            ("GET", f"/api/v1/ray/{cid}/token", None),
            ("DELETE", f"/api/v1/ray/{cid}", None),
        ]:
            r = http.request(method, path, json=payload, headers=auth("bob"))
            assert r.status_code == 403, (method, path, r.text)
        # The owner gets the token the cluster's nodes hold.
        r = http.get(f"/api/v1/ray/{cid}/token", headers=auth("alice"))
        assert r.json()["token"] == RAY_TOKENS.token(cid), r.text
        rig.step()
        assert rig.raycluster(cid)["spec"]["workerGroupSpecs"][0]["replicas"] == 1
        assert len(rig.pods(cid)) == 2

        # Its owner deletes it: the RayCluster and its pods go, every slice released.
        r = http.delete(f"/api/v1/ray/{cid}", headers=auth("alice"))
        assert (r.status_code, r.json()["state"]) == (200, "stopped")
        rig.until(lambda: True if not rig.pods(cid) else None, "the cluster's pods gone")
        assert rig.alloc.workloads(TEAM_A.name) == []


# ---- Ray jobs: a driver Job in the tenant's namespace ---------------------------------------


def driver_pods(rig: Rig, job_id: str) -> list[client.V1Pod]:
    selector = f"{SETTINGS.label('ray-job')}={job_id}"
    return list(rig.core.list_namespaced_pod(NS_A, label_selector=selector).items)


def job_state(http: TestClient, job_id: str, state: str) -> dict[str, Any] | None:
    found = http.get(f"/api/v1/ray/jobs/{job_id}", headers=auth("alice")).json()
    return found if found["state"] == state else None


def test_a_job_on_a_running_cluster_is_a_driver_pod_beside_the_head_and_succeeds(
    rig: Rig,
) -> None:
    app = create_app(
        rig.alloc, StaticAuthenticator(TOKENS), ray_controller=rig.ray, ray_job_controller=rig.jobs
    )
    cid = rig.ray.create(spec(1, 2)).cluster.id
    rig.until(
        lambda: True if rig.ray.view(cid).cluster.state.value == "running" else None,
        "the cluster running",
    )
    address = rig.ray.view(cid).cluster.address
    body = {"entrypoint": "python train.py", "runtime_env": {"env_vars": {"EPOCHS": "3"}}}
    with TestClient(app) as http:
        # Bad input: a 422 naming the field, and no driver made. A directory of the portal's
        # host means nothing in the driver's pod.
        for runtime_env, field in [
            ({"working_dir": "/"}, "runtime_env.working_dir"),
            ({"env_vars": {"RAY_AUTH_TOKEN": "mine"}}, "runtime_env.env_vars.RAY_AUTH_TOKEN"),
        ]:
            r = http.post(
                f"/api/v1/ray/{cid}/jobs",
                json={**body, "runtime_env": runtime_env},
                headers=auth("alice"),
            )
            assert (r.status_code, r.json().get("field")) == (422, field), r.text
        assert rig.batch.list_namespaced_job(NS_A).items == []
        assert rig.jobs.jobs() == []

        r = http.post(f"/api/v1/ray/{cid}/jobs", json=body, headers=auth("alice"))
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        assert r.json()["state"] == "running"  # the cluster runs: attempt 1 started at once

        # Another tenant sees and touches nothing of it.
        for method, path in [
            ("GET", f"/api/v1/ray/jobs/{job_id}"),
            ("GET", f"/api/v1/ray/jobs/{job_id}/logs"),
            ("DELETE", f"/api/v1/ray/jobs/{job_id}"),
        ]:
            assert http.request(method, path, headers=auth("bob")).status_code == 403, path

        # A portal that stopped before recording the attempt starts it again: the same Job.
        assert rig.jobs.drivers is not None
        again = DriverRun(job_id, 1, cid, TEAM_A.name)
        rig.jobs.drivers.start(again, str(address), RayJobSpec("python train.py"))
        # The driver: one Job in the tenant's namespace, the token a Secret reference.
        [driver] = rig.batch.list_namespaced_job(NS_A).items
        labels = driver.metadata.labels
        assert labels[SETTINGS.label("ray-job")] == job_id
        assert labels[SETTINGS.label("ray-cluster")] == cid
        assert labels[SETTINGS.label("tenant")] == TEAM_A.name
        pod = driver.spec.template.spec
        [container] = pod.containers
        env = {e.name: e for e in container.env}
        assert env["RAY_ADDRESS"].value == address == ko.head_address(cid, NS_A)
        assert env["EPOCHS"].value == "3"
        assert '"EPOCHS": "3"' in env["RAY_JOB_CONFIG_JSON_ENV_VAR"].value
        assert env["RAY_AUTH_TOKEN"].value is None
        assert env["RAY_AUTH_TOKEN"].value_from.secret_key_ref.name == ko.token_secret_name(cid)
        assert container.command == ["/bin/sh", "-c", "python train.py"]
        assert pod.security_context.run_as_non_root is True
        assert container.security_context.capabilities.drop == ["ALL"]
        assert not any("nvidia" in k for k in container.resources.limits)

        # kwok runs the pod once the portal binds it beside the head, and completes it.
        done = rig.until(lambda: job_state(http, job_id, "succeeded"), "the job succeeded")
        [attempt] = done["attempts"]
        assert (attempt["number"], attempt["exit_code"], attempt["reason"]) == (1, 0, "completed")
        [head] = rig.pods(cid, "head")
        assert {p.spec.node_name for p in driver_pods(rig, job_id)} == {head.spec.node_name}
        # kwok serves no log: an empty answer that says why, not an error.
        logs = http.get(f"/api/v1/ray/jobs/{job_id}/logs", headers=auth("alice"))
        assert logs.status_code == 200, logs.text
        assert logs.json()["text"] == "" and logs.json()["unavailable"]
        # The cluster is the tenant's: it keeps running, and takes the next job.
        assert rig.ray.view(cid).cluster.state.value == "running"

        # Cancel: a driver that runs on (kwok keeps it running) is deleted with its Job.
        r = http.post(f"/api/v1/ray/{cid}/jobs", json=body, headers=auth("alice"))
        second = r.json()["id"]
        [pod] = eventually(lambda: p if (p := driver_pods(rig, second)) else None, "its pod")
        rig.core.patch_namespaced_pod(
            pod.metadata.name, NS_A, {"metadata": {"annotations": {RUN_FOR: "1h"}}}
        )
        rig.until(
            lambda: True if [p for p in driver_pods(rig, second) if p.spec.node_name] else None,
            "the second driver bound",
        )
        r = http.delete(f"/api/v1/ray/jobs/{second}", headers=auth("alice"))
        assert (r.status_code, r.json()["state"]) == (200, "cancelled"), r.text
        assert r.json()["attempts"][0]["reason"] == "cancelled"
        eventually(
            lambda: True if not driver_pods(rig, second) else None, "the cancelled driver gone"
        )
        jobs = rig.batch.list_namespaced_job(NS_A).items
        assert [j.metadata.labels[SETTINGS.label("ray-job")] for j in jobs] == [job_id]


def test_a_one_off_job_whose_driver_fails_is_failed_and_takes_its_cluster_down(
    rig: Rig,
) -> None:
    app = create_app(
        rig.alloc, StaticAuthenticator(TOKENS), ray_controller=rig.ray, ray_job_controller=rig.jobs
    )
    cluster = {
        "tenant": TEAM_A.name,
        "name": "once",
        "workers": {"devices": {"kind": "gpu", "count": 1}, "min": 1, "max": 1},
        "ray_version": RAY,
    }
    with TestClient(app) as http:
        r = http.post(
            "/api/v1/ray/jobs",
            json={"entrypoint": "python eval.py", "cluster": cluster},
            headers=auth("alice"),
        )
        assert r.status_code == 201, r.text
        job_id, cid = r.json()["id"], r.json()["cluster_id"]
        # Admitted like any cluster; the driver starts once it runs.
        rig.until(lambda: job_state(http, job_id, "running"), "attempt 1 started")
        [pod] = eventually(
            lambda: p if (p := driver_pods(rig, job_id)) else None, "the driver's pod"
        )
        # Stand in for a driver that exits 3 (before the portal binds it: kwok reads it then).
        assert pod.spec.node_name is None
        rig.core.patch_namespaced_pod(
            pod.metadata.name, NS_A, {"metadata": {"annotations": {EXIT_CODE: "3"}}}
        )
        failed = rig.until(lambda: job_state(http, job_id, "failed"), "the job failed")
        [attempt] = failed["attempts"]
        assert (attempt["exit_code"], attempt["reason"]) == (3, "exit code 3")
        assert failed["ended_at"] is not None
        # The one-off cluster went with it: its RayCluster deleted, every slice released.
        assert rig.ray.view(cid).cluster.state.value == "stopped"
        rig.until(lambda: True if not rig.pods(cid) else None, "the cluster's pods gone")
        assert rig.alloc.workloads(TEAM_A.name) == []
