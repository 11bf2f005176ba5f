"""Inference services on Kubernetes, against the real apiserver and kwok GPU nodes.

The service controller runs over a real allocator (SQLite) with the Kubernetes backend
(``portal.inference.kube``); the portal's binder binds the replica pods; nothing else
schedules pods. kwok marks a bound pod Running and Ready, which is what readiness is read from
(the gateway cannot reach kwok pods, so the first tests proxy no request). The test drives the
loops itself (allocator tick, controller step, binder pass), so every step happens in the order
it reads.

STAND-IN ENGINES (the warm pool's test only): kwok runs no container, so
``tests.support.pod_engines`` gives the backend where each replica pod's engine is (its
``reach``): a real test-engine process on this host per pod, with the engine's health joined
to the pod's readiness. Everything above that boundary (the controller, the warm pool's sleep
and wake calls, the gateway) is the real code.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fastapi.testclient import TestClient
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from policies.flavors import FlavorKind
from policies.isolation import IsolationSettings, TenantSpec
from policies.requests import DeviceRequest, WorkloadRequest
from policies.services import ModelRef, Replicas, ReplicaState
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from portal.inference import kubeobjects as ko
from portal.inference import kubeweights as kw
from portal.inference.controller import ServiceController
from portal.inference.kube import kube_backend
from portal.inference.kubecache import KubeWeights
from portal.inference.kubeweights import CacheConfig
from portal.inference.spec import Engine, Preset, ServiceSpec
from portal.inference.testengine import reply_words
from portal.inference.warm import WARM_PRIORITY, gpu_hours
from portal.inventory.kubernetes import to_node
from portal.isolation import reconcile
from portal.kube.binder import Binder
from portal.kube.keys import SCHEDULER_NAME, PodKeys
from portal.store import services as stored
from portal.store.records import WorkloadState
from portal.store.writer import Store
from tests.portal.api.conftest import auth, member_of, user
from tests.support import gpu_nodes
from tests.support.k8s import K8sCluster
from tests.support.k8s_tenants import delete_tenant_namespaces
from tests.support.kwok_stages import EXIT_CODE, RUN_FOR
from tests.support.pod_engines import PodEngines
from tests.support.waiting import eventually

pytestmark = pytest.mark.k8s

T = TypeVar("T")
SETTINGS = IsolationSettings()
KEYS = PodKeys.of(SETTINGS)
RKEYS = ko.ReplicaKeys.of(SETTINGS)
NODE = "ks-h100-a"
TEAM_A = TenantSpec(
    name="ksteama", gpu_limits={"H100-80GB": 8}, cpu_millis=32000, memory_mib=65536, pods=20
)
TEAM_B = TenantSpec(
    name="ksteamb", gpu_limits={"H100-80GB": 8}, cpu_millis=32000, memory_mib=65536, pods=20
)
NS_A = SETTINGS.namespace(TEAM_A.name)
H100 = DeviceRequest(kind=FlavorKind.GPU, count=1, models=frozenset({"H100-80GB"}))
TOKENS = {
    "alice": user("alice", {TEAM_A.name}, *member_of(TEAM_A.name)),
    "bob": user("bob", {TEAM_B.name}, *member_of(TEAM_B.name)),
}
DIGEST = "sha256:" + "ab" * 32
BODY: dict[str, Any] = {
    "engine": {"preset": "vllm"},
    "model": {"uri": "hf://org/tiny-llm", "digest": DIGEST},
    "devices": {"kind": "gpu", "count": 1, "models": ["H100-80GB"]},
    "replicas": {"min": 2, "max": 4},
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
    k8s_cluster: K8sCluster, api: client.ApiClient, core: client.CoreV1Api
) -> Iterator[list[Any]]:
    """Two tenants reconciled and one kwok node of 8 H100s, as the allocator sees it. At the
    end the tenants' namespaces are deleted, pods first, so later modules reconciling their
    own tenants on the same cluster find nothing of these."""
    reconcile([TEAM_A, TEAM_B], SETTINGS, api)
    k8s_cluster.add_gpu_node(gpu_nodes.h100_nvswitch_node(NODE, rack="rack-ks"))
    ready = eventually(
        lambda: n if not (n := core.read_node(NODE)).spec.taints else None,
        f"the not-ready taint leaving {NODE}",
    )
    yield [to_node(api.sanitize_for_serialization(ready))]
    delete_tenant_namespaces(api, SETTINGS, [SETTINGS.namespace(t.name) for t in (TEAM_A, TEAM_B)])


class Rig:
    """The service's loops over one allocator, stepped by the test."""

    def __init__(self, alloc: Allocator, api: client.ApiClient, workdir: Path) -> None:
        self.alloc = alloc
        self.api = api
        self.workdir = workdir
        self.services = self.controller()
        self.binder = Binder(api, alloc, SETTINGS)
        self.core = client.CoreV1Api(api)

    def controller(self, weights: CacheConfig | None = None) -> ServiceController:
        """A controller with a new runner (what a restarted portal builds)."""
        backend = kube_backend(self.api, SETTINGS, self.workdir, weights)
        c = ServiceController(self.alloc, backend=backend, stop_grace_s=0)
        c.start()
        return c

    def step(self) -> None:
        self.alloc.tick()
        self.services.step()
        self.binder.bind_pending()

    def until(self, probe: Callable[[], T | None], what: str, timeout_s: float = 30.0) -> T:
        def stepped() -> T | None:
            self.step()
            return probe()

        return eventually(stepped, what, timeout_s)

    def pods(self, service_id: str) -> list[client.V1Pod]:
        found = self.core.list_namespaced_pod(
            NS_A, label_selector=f"{RKEYS.service}={service_id}"
        ).items
        live = [p for p in found if p.metadata.deletion_timestamp is None]
        return sorted(live, key=lambda p: p.metadata.name)

    def ready(self, service_id: str, n: int) -> list[int] | None:
        """The numbers of the service's ready replicas, once there are ``n``."""
        reps = stored.replicas(self.alloc.store, service_id, live=True)
        ready = [r.number for r in reps if r.state is ReplicaState.READY]
        return ready if len(ready) == n else None


@pytest.fixture
def rig(nodes: list[Any], api: client.ApiClient, tmp_path: Path) -> Iterator[Rig]:
    with Store(f"sqlite:///{tmp_path / 'portal.db'}") as store:
        alloc = Allocator(store)
        alloc.start(nodes)
        for tenant in (TEAM_A, TEAM_B):
            alloc.set_tenant(tenant.name)
            alloc.set_quota(tenant.name, "H100-80GB", guaranteed=0, limit=3)
        rig = Rig(alloc, api, tmp_path)
        yield rig
        for view in rig.services.services():
            rig.services.delete(view.service.id)
        with contextlib.suppress(AssertionError):
            rig.until(lambda: True if not rig.core.list_namespaced_pod(NS_A).items else None, "")


def deploy(rig: Rig, name: str = "llm") -> str:
    spec = ServiceSpec(
        tenant=TEAM_A.name,
        owner="alice",
        name=name,
        engine=Engine(preset=Preset.VLLM),
        model=ModelRef("hf://org/tiny-llm", DIGEST),
        devices=H100,
        replicas=Replicas(min=2, max=4),
    )
    return rig.services.deploy(spec).service.id


def test_replicas_are_pods_bound_where_the_allocator_placed_them_within_quota(rig: Rig) -> None:
    sid = deploy(rig)
    assert rig.until(lambda: rig.ready(sid, 2), "2 replicas ready") == [1, 2]
    pods = rig.pods(sid)
    assert [p.metadata.name for p in pods] == [ko.pod_name(sid, 1), ko.pod_name(sid, 2)]
    for r, pod in zip(stored.replicas(rig.alloc.store, sid, live=True), pods, strict=True):
        placed = rig.alloc.status(r.workload_id)
        (allocation,) = placed.allocations
        assert pod.metadata.annotations[KEYS.allocation] == allocation.id
        assert pod.spec.node_name == allocation.node == NODE
        assert pod.metadata.annotations[KEYS.gpus] == ",".join(map(str, allocation.gpus))
        assert pod.spec.scheduler_name == SCHEDULER_NAME
        assert pod.status.phase == "Running"
        # Restricted Pod Security (the namespace enforces it: the pod was admitted).
        ctx = pod.spec.containers[0].security_context
        assert pod.spec.security_context.run_as_non_root is True
        assert (ctx.allow_privilege_escalation, ctx.read_only_root_filesystem) == (False, True)
        assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    # Each replica has a stable name under the service's headless Service.
    headless = rig.core.read_namespaced_service(ko.service_name(sid), NS_A)
    assert headless.spec.cluster_ip == "None"
    assert rig.services.ready_urls(sid) == tuple(
        f"http://r{n}.{ko.service_name(sid)}.{NS_A}.svc:{SETTINGS.inference_port}" for n in (1, 2)
    )

    # 3 fit the quota (3 GPUs); a 4th waits with the allocator's reason and gets no pod.
    rig.services.scale(sid, replicas=Replicas(min=4, max=4))
    rig.until(lambda: rig.ready(sid, 3), "3 replicas ready")
    for _ in range(3):
        rig.step()
    live = stored.replicas(rig.alloc.store, sid, live=True)
    queued = [r for r in live if r.state is ReplicaState.QUEUED]
    assert [r.number for r in queued] == [4]
    assert rig.alloc.status(queued[0].workload_id).reason == "quota"
    assert len(rig.pods(sid)) == 3

    # A portal restart: a new runner finds the pods again; nothing ends or is re-created.
    uids = {p.metadata.uid for p in rig.pods(sid)}
    rig.services = rig.controller()
    rig.step()
    assert rig.ready(sid, 3) == [1, 2, 3]
    assert {p.metadata.uid for p in rig.pods(sid)} == uids

    # A pod deleted from outside: its replica ends and releases its GPU, which the queued 4th
    # takes; the replacement waits for quota. Never more than 3 pods.
    rig.core.delete_namespaced_pod(ko.pod_name(sid, 1), NS_A, grace_period_seconds=0)
    rig.until(lambda: rig.ready(sid, 3), "3 replicas ready again")
    now = {r.number: r for r in stored.replicas(rig.alloc.store, sid, live=True)}
    assert sorted(n for n, r in now.items() if r.state is ReplicaState.READY) == [2, 3, 4]
    assert [r.state for n, r in now.items() if n > 4] == [ReplicaState.QUEUED]
    assert len(rig.pods(sid)) == 3
    assert len([w for w in rig.alloc.workloads(TEAM_A.name) if w.allocations]) == 3

    # Deleted: every pod and the Service go, and the quota is free again.
    rig.services.delete(sid)
    rig.until(lambda: True if not rig.pods(sid) else None, "the service's pods gone")
    rig.until(lambda: True if rig.alloc.workloads(TEAM_A.name) == [] else None, "quota released")
    with pytest.raises(ApiException) as gone:
        rig.core.read_namespaced_service(ko.service_name(sid), NS_A)
    assert gone.value.status == 404


def test_another_tenant_gets_403_and_bad_input_changes_nothing(rig: Rig) -> None:
    app = create_app(rig.alloc, StaticAuthenticator(TOKENS), service_controller=rig.services)
    body = {"tenant": TEAM_A.name, "name": "chat", **BODY, "replicas": {"min": 1, "max": 2}}
    with TestClient(app) as http:
        # A bad warm pool size: a 422 naming the field, and no pod made.
        warm = {**body, "replicas": {"min": 1, "max": 2, "warm": -1}}
        bad = http.post("/api/v1/services", json=warm, headers=auth("alice"))
        assert (bad.status_code, bad.json()["field"]) == (422, "replicas.warm"), bad.text
        rig.step()
        assert rig.core.list_namespaced_pod(NS_A).items == []
        assert rig.services.services() == []

        r = http.post("/api/v1/services", json=body, headers=auth("alice"))
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        rig.until(lambda: rig.ready(sid, 1), "the replica ready")
        pod = ko.pod_name(sid, 1)
        for method, path, payload in [
            ("GET", f"/api/v1/services/{sid}", None),
            ("GET", f"/api/v1/services/{sid}/logs?replica=1", None),
            ("PATCH", f"/api/v1/services/{sid}", {"replicas": {"min": 2, "max": 2}}),
            ("DELETE", f"/api/v1/services/{sid}", None),
            ("POST", f"/gateway/{TEAM_A.name}/chat/v1/chat/completions", {"model": "chat"}),
        ]:
            r = http.request(method, path, json=payload, headers=auth("bob"))
            assert r.status_code == 403, (method, path, r.text)
        # Bad input from the owner: a 422, and the service as it was.
        r = http.patch(
            f"/api/v1/services/{sid}",
            json={"replicas": {"min": 1, "max": 2, "warm": -1}},
            headers=auth("alice"),
        )
        assert (r.status_code, r.json()["field"]) == (422, "replicas.warm"), r.text
        rig.step()
        assert [p.metadata.name for p in rig.pods(sid)] == [pod]
        assert rig.services.get(sid).desired == 1
        # The owner reads the pod's log through the API (kwok serves none: empty).
        logs = http.get(f"/api/v1/services/{sid}/logs?replica=1", headers=auth("alice"))
        assert logs.status_code == 200, logs.text

        r = http.delete(f"/api/v1/services/{sid}", headers=auth("alice"))
        assert r.status_code == 200, r.text
        rig.until(lambda: True if not rig.pods(sid) else None, "the replica's pod gone")
        held = [w for w in rig.alloc.workloads(TEAM_A.name) if w.state is WorkloadState.RUNNING]
        assert held == []


CACHE = CacheConfig("/var/lib/gpuportal/weights", "registry.invalid/gpuportal:0", 10**9)
CACHED_URI = "https://models.invalid/tiny.safetensors"


def fetch_jobs(batch: client.BatchV1Api) -> list[client.V1Job]:
    selector = f"{SETTINGS.label('component')}={kw.FETCH_COMPONENT}"
    return batch.list_namespaced_job(NS_A, label_selector=selector).items


def slow_fetch(batch: client.BatchV1Api, model: ModelRef, annotations: dict[str, str]) -> None:
    """The portal's own fetch Job, made ahead with kwok's stand-in for what its container
    does (a download that lasts, or an exit code): the portal finds it and waits on it."""
    job: Any = kw.fetch_job(NODE, TEAM_A.name, model, CACHE, SETTINGS)
    job["spec"]["template"]["metadata"]["annotations"].update(annotations)
    batch.create_namespaced_job(NS_A, job)


def test_replicas_wait_for_one_fetch_per_node_and_mount_it_read_only(
    rig: Rig, k8s_cluster: K8sCluster
) -> None:
    batch = client.BatchV1Api(rig.api)
    model = ModelRef(CACHED_URI, "sha256:" + "cd" * 32)
    rig.services = rig.controller(CACHE)
    other = "ks-h100-b"
    try:
        slow_fetch(batch, model, {RUN_FOR: "1h"})
        spec = ServiceSpec(tenant=TEAM_A.name, owner="alice", name="cached",
                           engine=Engine(preset=Preset.VLLM), model=model, devices=H100,
                           replicas=Replicas(min=3, max=3))  # fmt: skip
        sid = rig.services.deploy(spec).service.id
        for _ in range(3):
            rig.step()
        # Placed, holding their GPUs, but no pod while the node's one fetch runs.
        live = stored.replicas(rig.alloc.store, sid, live=True)
        assert [r.state for r in live] == [ReplicaState.QUEUED] * 3
        assert all(rig.alloc.status(r.workload_id).state is WorkloadState.RUNNING for r in live)
        assert rig.pods(sid) == [] and len(fetch_jobs(batch)) == 1
        (fetcher,) = rig.core.list_namespaced_pod(
            NS_A, label_selector=f"job-name={kw.fetch_job_name(NODE, model.digest)}"
        ).items
        assert fetcher.spec.node_name == NODE and not fetcher.spec.containers[
            0
        ].resources.limits.get("nvidia.com/gpu")
        # The tenant's claim of its cache on the node, pre-bound to a local volume there.
        claim = rig.core.read_namespaced_persistent_volume_claim(kw.claim_name(NODE), NS_A)
        volume = rig.core.read_persistent_volume(claim.spec.volume_name)
        assert volume.spec.local.path == f"{CACHE.node_path}/{NS_A}"
        assert volume.spec.node_affinity.required.node_selector_terms[0].match_expressions[
            0
        ].values == [NODE]

        # The fetch ends: the replicas start, each mounting the entry read-only.
        rig.core.patch_namespaced_pod(fetcher.metadata.name, NS_A,
                                      {"metadata": {"annotations": {RUN_FOR: "0s"}}})  # fmt: skip
        assert rig.until(lambda: rig.ready(sid, 3), "3 replicas ready") == [1, 2, 3]
        for pod in rig.pods(sid):
            (vol,) = [v for v in pod.spec.volumes if v.name == "weights"]
            assert vol.persistent_volume_claim.claim_name == kw.claim_name(NODE)
            assert vol.persistent_volume_claim.read_only is True
            (mount,) = [m for m in pod.spec.containers[0].volume_mounts if m.name == "weights"]
            assert (mount.mount_path, mount.sub_path, mount.read_only) == (
                kw.MOUNT,
                "cd" * 32,
                True,
            )
            assert kw.MOUNT in pod.spec.containers[0].command
        assert len(fetch_jobs(batch)) == 1
        cache = rig.services.backend.weights if rig.services.backend else None
        assert isinstance(cache, KubeWeights)
        rows = cache.entries(())
        assert [(e.node, e.tenant, e.digest) for e in rows] == [(NODE, TEAM_A.name, model.digest)]
        later = rows[0].last_used + timedelta(minutes=2)
        assert not cache.ensure(NODE, TEAM_A.name, model, (), later).cold
        starts = [
            e.message for e in rig.services.events(sid) if e.kind == "service.replica_started"
        ]
        assert starts and all("cold: first replica" in m for m in starts), starts

        # A second node: one more fetch there, whatever the replicas; the first's is reused.
        k8s_cluster.add_gpu_node(gpu_nodes.h100_nvswitch_node(other, rack="rack-ks"))
        for _ in range(3):
            cache.ensure(other, TEAM_A.name, model, (), rows[0].last_used)
        assert len(fetch_jobs(batch)) == 2
        eventually(lambda: True if len(cache.entries((), [TEAM_A.name])) == 2 else None,
                   "the second node's fetch done")  # fmt: skip
        assert cache.ensure(other, TEAM_A.name, model, (), rows[0].last_used).ready
    finally:
        batch.delete_collection_namespaced_job(NS_A, propagation_policy="Background")
        with contextlib.suppress(ApiException):
            rig.core.delete_node(other)
        for pv in (kw.volume_name(NODE, NS_A), kw.volume_name(other, NS_A)):
            with contextlib.suppress(ApiException):
                rig.core.delete_persistent_volume(pv)


def test_a_digest_mismatch_refuses_the_replicas_and_mounts_nothing(rig: Rig) -> None:
    batch = client.BatchV1Api(rig.api)
    model = ModelRef(CACHED_URI, "sha256:" + "ef" * 32)
    rig.services = rig.controller(CACHE)
    try:
        slow_fetch(batch, model, {EXIT_CODE: "3"})  # what the fetch module exits with
        spec = ServiceSpec(tenant=TEAM_A.name, owner="alice", name="mismatch",
                           engine=Engine(preset=Preset.VLLM), model=model, devices=H100,
                           replicas=Replicas(min=1, max=1))  # fmt: skip

        sid = rig.services.deploy(spec).service.id
        ended = rig.until(
            lambda: [r for r in stored.replicas(rig.alloc.store, sid) if r.reason] or None,
            "the replica refused",
        )
        assert (
            "weights refused" in ended[0].reason and "do not match model.digest" in ended[0].reason
        )
        assert rig.pods(sid) == []
        assert len(fetch_jobs(batch)) == 1  # refused again without fetching again
    finally:
        batch.delete_collection_namespaced_job(NS_A, propagation_policy="Background")
        with contextlib.suppress(ApiException):
            rig.core.delete_persistent_volume(kw.volume_name(NODE, NS_A))


LOAD_S = 2.0
"""The engines' load time: a cold start answers no sooner; a woken warm pod well within."""


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[PodEngines]:
    model = tmp_path / "tiny-llm"
    model.mkdir()
    (model / "config.json").write_text('{"layers": 2}')
    found = PodEngines(model, "chat", LOAD_S)
    yield found
    found.close()


def replicas_in(rig: Rig, sid: str, **states: int) -> dict[int, Any] | None:
    """The service's live replicas by number, once as many are in each named state."""
    live = {r.number: r for r in stored.replicas(rig.alloc.store, sid, live=True)}
    for state, n in states.items():
        if sum(r.state is ReplicaState(state) for r in live.values()) != n:
            return None
    return live


def test_a_warm_pod_sleeps_wakes_for_a_request_from_zero_and_goes_first_in_a_reclaim(
    rig: Rig, engines: PodEngines
) -> None:
    backend = engines.backend(kube_backend(rig.api, SETTINGS, rig.workdir, reach=engines.reach))
    rig.services = ServiceController(rig.alloc, backend=backend, stop_grace_s=0)
    rig.services.start()
    # team-a borrows from team-b's guarantee, which team-b may reclaim.
    for tenant, guaranteed in ((TEAM_A, 0), (TEAM_B, 7)):
        rig.alloc.set_tenant(tenant.name, cohort="ks")
        rig.alloc.set_quota(tenant.name, "H100-80GB", guaranteed=guaranteed, limit=8)
    spec = ServiceSpec(
        tenant=TEAM_A.name,
        owner="alice",
        name="chat",
        engine=Engine(preset=Preset.TEST),
        model=ModelRef("hf://org/tiny-llm", DIGEST),
        devices=H100,
        replicas=Replicas(min=0, max=2, warm=1),
    )
    sid = rig.services.deploy(spec).service.id

    # One pod bound where the allocator placed it, at the warm priority, loaded then asleep;
    # nothing serves.
    one = rig.until(lambda: replicas_in(rig, sid, asleep=1), "the warm replica asleep")[1]
    (pod,) = rig.pods(sid)
    (allocation,) = rig.alloc.status(one.workload_id).allocations
    assert pod.spec.node_name == allocation.node == NODE
    assert pod.metadata.annotations[KEYS.allocation] == allocation.id
    assert rig.alloc.store.workload(one.workload_id).priority == WARM_PRIORITY  # type: ignore[union-attr]
    assert one.pooled and engines.sleeping(sid, 1)
    assert rig.services.ready_urls(sid) == () and rig.services.get(sid).desired == 0

    app = create_app(rig.alloc, StaticAuthenticator(TOKENS), service_controller=rig.services)
    chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    gateway = f"/gateway/{TEAM_A.name}/chat/v1/chat/completions"
    with TestClient(app) as http:
        # Another tenant wakes nothing.
        assert http.post(gateway, json=chat, headers=auth("bob")).status_code == 403
        assert replicas_in(rig, sid, asleep=1) is not None
        # A request from zero wakes the asleep pod: answered in well under its load time.
        started = time.monotonic()
        r = http.post(gateway, json=chat, headers=auth("alice"))
        took = time.monotonic() - started
    assert r.status_code == 200, r.text
    assert took <= 1.0 < LOAD_S, took
    assert r.json()["choices"][0]["message"]["content"] == " ".join(reply_words("user: hi", 1))
    woken = stored.replica(rig.alloc.store, sid, 1)
    assert woken is not None and woken.state is ReplicaState.READY and woken.woken_at
    assert not engines.sleeping(sid, 1)
    assert [p.metadata.uid for p in rig.pods(sid)] == [pod.metadata.uid]  # the same pod
    assert rig.alloc.store.workload(one.workload_id).priority == spec.priority  # type: ignore[union-attr]

    # The pool refills within one evaluation: a new warm replica, its pod created and bound.
    rig.step()
    two = stored.replica(rig.alloc.store, sid, 2)
    assert two is not None and two.pooled
    assert rig.core.read_namespaced_pod(ko.pod_name(sid, 2), NS_A).spec.node_name == NODE

    # Charged: the warm pool's GPU time apart from the serving time.
    svc, now = rig.services.get(sid), rig.alloc.clock()
    (hours,) = gpu_hours(rig.alloc.store, [svc], svc.created_at, now, now)
    assert hours.warm_gpu_hours > 0 and hours.serving_gpu_hours > 0

    # team-b fills the node, then takes back one GPU of its guarantee: the warm pod goes, the
    # serving one stays (the warm one is taken loading or asleep alike); the pool asks again
    # and waits, holding nothing.
    rig.alloc.request(WorkloadRequest(TEAM_B.name, "bob", "fill", replace(H100, count=6)))
    claim = rig.alloc.request(WorkloadRequest(TEAM_B.name, "bob", "claim", H100))
    assert claim.state is WorkloadState.QUEUED
    running = WorkloadState.RUNNING
    rig.until(lambda: True if rig.alloc.status(claim.id).state is running else None, "reclaim")
    ended = stored.replica(rig.alloc.store, sid, 2)
    assert ended is not None and ended.state is ReplicaState.ENDED
    assert ended.reason is not None and ended.reason.startswith("preempted"), ended.reason
    live = replicas_in(rig, sid, ready=1)
    assert live is not None and live[1].state is ReplicaState.READY
    assert [p.metadata.uid for p in rig.pods(sid)] == [pod.metadata.uid]
    assert [r.state for r in live.values() if r.pooled] == [ReplicaState.QUEUED]
