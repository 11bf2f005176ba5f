"""Failover during a burst: two ``gpuportal serve`` replicas (Lease election) on one PostgreSQL
and the test apiserver, GPU pods placed the way the kube spawner places them, the leader
SIGKILLed while requests are in flight. Checked afterwards from the database, the new leader's
API and the pods' Bindings: nothing acknowledged is lost, nothing is allocated twice."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from sqlalchemy import create_engine, text

from portal.api.schemas import AllocationOut
from portal.kube.keys import PodKeys
from spawner.pod import PodPlacement, PodSettings, place_pod
from tests.portal.service.conftest import ROOT, SEED, Service, ServiceFactory, bearer, gpu
from tests.portal.service.test_leader import replicas, status, wait_for
from tests.portal.service.test_writer_guard import assert_nothing_twice_or_above_a_limit
from tests.support import gpu_nodes
from tests.support.k8s import K8sCluster

pytestmark = [pytest.mark.k8s, pytest.mark.postgres, pytest.mark.slow]

PER_TENANT = 6  # of 2 GPUs each, limit 8: four run and two wait in each tenant's queue
ACKED_BEFORE_KILL = 4
REQUEST_DEADLINE_S = 180.0  # per request, across the takeover; the lease is 4 s
SETTINGS = PodSettings()
KEYS = PodKeys.of(SETTINGS.isolation)


@dataclass(frozen=True, slots=True)
class Ack:
    """A request the portal acknowledged (201/202), as the answer said it."""

    key: str
    name: str
    workload_id: str
    tenant: str
    state: str
    allocations: tuple[str, ...]


@pytest.fixture
def tenants(k8s_cluster: K8sCluster) -> Iterator[tuple[str, str]]:
    """Two fresh tenants; their namespaces (made by the service) are deleted at the end."""
    tag = uuid.uuid4().hex[:6]
    made = (f"burst-{tag}-a", f"burst-{tag}-b")
    yield made
    with k8s_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        for tenant in made:
            ns = SETTINGS.isolation.namespace(tenant)
            try:
                core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
                core.delete_namespace(ns)
            except ApiException as exc:
                if exc.status != 404:
                    raise


@pytest.fixture
def nodes(k8s_cluster: K8sCluster) -> Iterator[list[str]]:
    """Two kwok HGX H100 nodes of this test's own (16 GPUs), deleted at the end."""
    tag = uuid.uuid4().hex[:6]
    names = [f"burst-{tag}-{i}" for i in range(2)]
    for name in names:
        k8s_cluster.add_gpu_node(gpu_nodes.h100_nvswitch_node(name))
    yield names
    with k8s_cluster.api_client() as api:
        for name in names:
            client.CoreV1Api(api).delete_node(name)


class Burst:
    """Requests sent as the kube spawner sends them: the workload over the API with an
    Idempotency-Key, then, once it runs, its pod (``schedulerName: gpuportal``) in the tenant's
    namespace. Each send goes to whichever replica answers (as a Service routes to the ready
    one); a 503 or a connection error is sent again with the same key, as the portal client
    does, so every request is acknowledged in the end, and a request the killed leader had
    committed without answering is found by its key, not allocated again."""

    def __init__(self, services: list[Service], core: client.CoreV1Api) -> None:
        self.services = services
        self.core = core
        self.acks: list[Ack] = []
        self.retried = 0
        self.lock = threading.Lock()

    def acked(self) -> int:
        with self.lock:
            return len(self.acks)

    def send(self, tenant: str, name: str) -> Ack:
        key = f"spawn/{name}/{uuid.uuid4().hex}"
        body = gpu(tenant, 2, name, models=["H100-80GB"])
        headers = {**bearer(ROOT), "Idempotency-Key": key}
        deadline = time.monotonic() + REQUEST_DEADLINE_S
        while time.monotonic() < deadline:
            for svc in self.services:
                try:
                    r = httpx.post(
                        f"{svc.url}/api/v1/workloads", json=body, headers=headers, timeout=30
                    )
                except httpx.HTTPError:
                    with self.lock:
                        self.retried += 1
                    continue  # that replica is gone, or went during the call
                if r.status_code == 503:
                    with self.lock:
                        self.retried += 1
                    continue  # a standby
                assert r.status_code in (201, 202), f"{name}: {r.status_code} {r.text}"
                return self.acknowledged(key, r.json())
            time.sleep(0.2)
        pytest.fail(f"{name} not acknowledged in {REQUEST_DEADLINE_S} s")

    def acknowledged(self, key: str, out: dict[str, Any]) -> Ack:
        ack = Ack(
            key=key,
            name=out["name"],
            workload_id=out["id"],
            tenant=out["tenant"],
            state=out["state"],
            allocations=tuple(a["id"] for a in out["allocations"]),
        )
        with self.lock:
            self.acks.append(ack)
        if ack.state == "running":
            (held,) = out["allocations"]
            placement = PodPlacement.of(
                ack.tenant, ack.workload_id, AllocationOut.model_validate(held)
            )
            self.core.create_namespaced_pod(
                SETTINGS.isolation.namespace(ack.tenant),
                place_pod(notebook_pod(out["name"]), placement, SETTINGS),
            )
        return ack


def notebook_pod(name: str) -> dict[str, Any]:
    """KubeSpawner's pod, as far as the placement needs it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"jupyter-{name}"},
        "spec": {"containers": [{"name": "notebook", "image": "registry.invalid/gpuportal/nb:0"}]},
    }


def tenant_pods(core: client.CoreV1Api, tenants: tuple[str, str]) -> list[client.V1Pod]:
    found: list[client.V1Pod] = []
    for tenant in tenants:
        found += core.list_namespaced_pod(SETTINGS.isolation.namespace(tenant)).items
    return found


def seed(tenants: tuple[str, str]) -> dict[str, object]:
    quota = SEED["tenants"]["team-a"]  # type: ignore[index]
    return {"tenants": dict.fromkeys(tenants, quota)}


def database_rows(
    url: str, tenants: tuple[str, str]
) -> tuple[dict[str, tuple[str, str | None]], dict[str, tuple[str, str, list[int]]]]:
    """Workloads (id -> state, idempotency key) and their active allocations (id ->
    workload, node, GPUs), read from the database itself."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            workloads = conn.execute(
                text("SELECT id, state, idempotency_key FROM workloads WHERE tenant IN (:a, :b)"),
                {"a": tenants[0], "b": tenants[1]},
            ).all()
            allocations = conn.execute(
                text(
                    "SELECT a.id, a.workload_id, a.node, a.gpus FROM allocations a JOIN "
                    "workloads w ON w.id = a.workload_id WHERE a.released_at IS NULL AND "
                    "w.tenant IN (:a, :b)"
                ),
                {"a": tenants[0], "b": tenants[1]},
            ).all()
    finally:
        engine.dispose()
    return (
        {w: (s, k) for w, s, k in workloads},
        {
            a: (w, node, list(gpus if isinstance(gpus, list) else yaml.safe_load(gpus)))
            for a, w, node, gpus in allocations
        },
    )


def test_the_leader_killed_mid_burst_loses_nothing_acknowledged_and_places_nothing_twice(
    k8s_cluster: K8sCluster,
    service_factory: ServiceFactory,
    postgres_url: str,
    tmp_path: Path,
    tenants: tuple[str, str],
    nodes: list[str],
) -> None:
    def on_kubernetes(**kw: Any) -> Service:
        return service_factory(inventory="kubernetes", **kw)

    first, second = replicas(k8s_cluster, on_kubernetes, postgres_url, tmp_path)
    first.start(seed=seed(tenants))
    second.start(seed=seed(tenants), wait_for="/health")
    assert status(second, "/ready") == 503

    with k8s_cluster.api_client() as api, first.client() as ops:
        core = client.CoreV1Api(api)

        def listed() -> bool:
            found = {
                n["name"] for n in ops.get("/api/v1/nodes", params={"limit": 500}).json()["items"]
            }
            return set(nodes) <= found

        def namespaces_ready() -> bool:
            for tenant in tenants:
                ns = SETTINGS.isolation.namespace(tenant)
                try:
                    quota = core.read_namespaced_resource_quota("tenant-quota", ns)
                except ApiException:
                    return False
                if not (quota.status and quota.status.hard):
                    return False
            return True

        wait_for(listed, 120, "the leader listing this test's nodes")
        wait_for(namespaces_ready, 120, "the isolation loop making the tenants' namespaces")

        burst = Burst([first, second], core)
        names = [(t, f"{t}-{i}") for i in range(PER_TENANT) for t in tenants]
        with ThreadPoolExecutor(max_workers=3) as pool:
            futures = [pool.submit(burst.send, t, n) for t, n in names]
            wait_for(lambda: burst.acked() >= ACKED_BEFORE_KILL, 120, "the first answers")
            assert first.process is not None
            first.process.kill()  # SIGKILL, with requests in flight and more to come
            first.process.wait(15)
            killed_after = burst.acked()
            bound_at_kill = sum(1 for p in tenant_pods(core, tenants) if p.spec.node_name)
            acks = {f.result().key: f.result() for f in futures}
        assert killed_after < len(names), "the burst ended before the kill: nothing in flight"
        wait_for(lambda: status(second, "/ready") == 200, 120, "the standby leading")

        # Every request acknowledged, each once, and the database agrees with every answer.
        assert len(acks) == len(names)
        workloads, allocations = database_rows(postgres_url, tenants)
        by_key = {k: w for w, (_s, k) in workloads.items()}
        assert len(by_key) == len(workloads) == len(names), workloads
        for ack in acks.values():
            assert by_key[ack.key] == ack.workload_id
            state, _key = workloads[ack.workload_id]
            assert state == ack.state, (ack, state)
            held = {a for a, (w, _n, _g) in allocations.items() if w == ack.workload_id}
            assert held == set(ack.allocations), (ack, held)
            assert (state == "running") == bool(held)
        assert [a.state for a in acks.values()].count("queued") == 2 * len(tenants)
        assert_nothing_twice_or_above_a_limit(postgres_url)

        # The new leader's API says the same.
        with second.client() as c:
            for ack in acks.values():
                out = c.get(f"/api/v1/workloads/{ack.workload_id}").json()
                assert (out["state"], tuple(a["id"] for a in out["allocations"])) == (
                    ack.state,
                    ack.allocations,
                )

        # The Bindings: every running workload's pod bound (by whichever leader) to its
        # allocation's node, no GPU held by two bound pods, no pod of a queued one bound.
        running = {a.workload_id for a in acks.values() if a.state == "running"}
        queued = {a.workload_id for a in acks.values() if a.state == "queued"}

        def pods() -> list[client.V1Pod]:
            return tenant_pods(core, tenants)

        def all_bound() -> bool:
            bound = {p.metadata.labels[KEYS.workload] for p in pods() if p.spec.node_name}
            return running <= bound

        wait_for(all_bound, 120, "the new leader binding every running workload's pod")
        devices: dict[tuple[str, int], str] = {}
        for pod in pods():
            workload = pod.metadata.labels[KEYS.workload]
            assert workload not in queued, pod.metadata.name
            allocation = pod.metadata.labels[KEYS.allocation]
            owner, node, gpus = allocations[allocation]
            assert owner == workload
            assert pod.spec.node_name == node, (pod.metadata.name, pod.spec.node_name, node)
            assert [int(g) for g in pod.metadata.annotations[KEYS.gpus].split(",")] == gpus
            for g in gpus:
                taken = devices.setdefault((node, g), pod.metadata.name)
                assert taken == pod.metadata.name, f"GPU {g} on {node}: {taken} and {pod}"
        assert len({p.metadata.labels[KEYS.workload] for p in pods()}) == len(running)

        # New writes after the takeover: an old key finds its workload, a new one allocates.
        with second.client() as c:
            old = next(iter(acks.values()))
            again = c.post(
                "/api/v1/workloads",
                json=gpu(old.tenant, 2, old.name, models=["H100-80GB"]),
                headers={"Idempotency-Key": old.key},
            )
            assert again.status_code in (201, 202) and again.json()["id"] == old.workload_id
            done = c.delete(f"/api/v1/workloads/{sorted(running)[0]}")
            assert done.status_code in (200, 204), done.text
            fresh = c.post("/api/v1/workloads", json=gpu(tenants[1], 1, "after-takeover"))
            assert fresh.status_code in (201, 202), fresh.text
    assert_nothing_twice_or_above_a_limit(postgres_url)
    assert "Traceback" not in second.tail(500)
    print(
        f"acknowledged before the kill: {killed_after}/{len(names)}, pods bound then: "
        f"{bound_at_kill}/{len(running)}; sends repeated: {burst.retried}"
    )
