"""Idle release, resume and growth on demand of Ray clusters on Kubernetes: the real KubeRay
operator and apiserver, kwok GPU nodes, and the real controller reading a real Ray head.

kwok runs no Ray, so the one boundary faked is where a head is: the controller's head reader
(``portal.ray.kube.head_reader``) is given a resolver that maps the cluster's head Service to
a real ``ray start --head`` this module starts on loopback, with Ray's token authentication on
and the cluster's own token (the one the portal derived and wrote into the cluster's Secret,
read back here from that Secret). The read itself (the child interpreter presenting the
cluster's token and asking the GCS for idle times and pending GPU demand), the decisions (the
controller's, shared with the local backend) and what the operator does with the RayCluster
are all real.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
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
from portal.jobs.launch import free_port
from portal.jobs.runner import MemberLaunch
from portal.ray import kubeobjects as ko
from portal.ray.controller import RayController, RayView
from portal.ray.idle import probe_python
from portal.ray.kube import head_reader
from portal.ray.local import HOST, LocalRay, ray_program
from portal.ray.spec import RaySpec, installed_ray_version
from portal.ray.tokens import RayTokens
from portal.store.records import WorkloadState
from portal.store.writer import Store
from tests.portal.ray.test_kube_ray import H100, RAY, RAY_TOKENS, SETTINGS, Rig
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
NODE_PORTS = (
    "--node-manager-port",
    "--object-manager-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
)

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


class Heads:
    """Real Ray heads with token authentication, one per cluster (a head takes one token);
    every cluster's Service is mapped to its own head while ``reachable``."""

    def __init__(self, root: Path) -> None:
        self.backend = LocalRay(root)
        self.reachable = True
        self._by_service: dict[str, str] = {}
        self._started: list[tuple[str, int, str]] = []  # key, start, temp dir
        self._count = 0  # the runner never reuses a key and start

    def start(self, service: str, token: str) -> str:
        """A head wanting ``token``, its address, and ``service`` mapped to it.
        ``ray start`` gives its node 30 s to register and fails past that on a loaded host:
        a failed start is started again (as the local backend does with a head that ended)."""
        self._count += 1
        key = f"head-{self._count}"
        for start in (1, 2, 3):
            temp = tempfile.mkdtemp(prefix="gp-rt-")  # socket paths: at most 107 bytes
            port = free_port(HOST)
            # Every port the node opens chosen free on loopback, as the local backend does.
            ports = [(flag, str(free_port(HOST))) for flag in NODE_PORTS]
            command = [
                *(ray_program(), "start", "--head", "--block", "--port", str(port)),
                *("--node-ip-address", HOST, "--num-cpus", "1", "--num-gpus", "0"),
                *("--include-dashboard", "false", "--object-store-memory", str(256 * 2**20)),
                *("--temp-dir", temp, "--disable-usage-stats"),
                *(part for pair in ports for part in pair),
            ]
            env = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token"}
            self.backend.runner.launch(
                [
                    MemberLaunch(
                        job_id=key,
                        attempt=start,
                        rank=0,
                        node=HOST,
                        devices=(),
                        command=tuple(command),
                        cwd=temp,
                        env={**env, "RAY_AUTH_TOKEN": token},
                    )
                ]
            )
            self._started.append((key, start, temp))
            if eventually(outcome(self.backend, key, start), "the head up or ended", 120) == "up":
                address = f"{HOST}:{port}"
                self._by_service[service] = address
                return address
        pytest.fail("the Ray head did not start in 3 tries", pytrace=False)

    def resolve(self, service: str) -> str:
        return self._by_service.get(service, UNREACHABLE) if self.reachable else UNREACHABLE

    def stop_all(self) -> None:
        for key, start, temp in self._started:
            self.backend.runner.stop(key, start, 0.0)
            shutil.rmtree(temp, ignore_errors=True)
        self._started.clear()
        self._by_service.clear()


def outcome(backend: LocalRay, key: str, start: int) -> Callable[[], str | None]:
    def check() -> str | None:
        if backend.ready(key, start):
            return "up"
        return "ended" if any(e.key == key for e in backend.poll()) else None

    return check


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Heads]:
    if installed_ray_version() != RAY:
        pytest.skip(f"ray {RAY} is not installed")
    root = tmp_path_factory.mktemp("ray-heads")
    with nodes_end_with_tests(root):
        found = Heads(root)
        try:
            yield found
        finally:
            found.stop_all()


def secret_token(rig: Rig, cid: str) -> str:
    """The token the cluster's nodes get: what the portal wrote into its Secret (the test
    reads it back; the portal never does)."""
    secret = rig.core.read_namespaced_secret(ko.token_secret_name(cid), NAMESPACE)
    return base64.b64decode(secret.data[ko.TOKEN_KEY]).decode()


def head_for(rig: Rig, heads: Heads, cid: str) -> str:
    """Start the cluster's head with the token of its Secret; its address."""
    token = rig.until(lambda: _maybe_token(rig, cid), "the cluster's token Secret")
    return heads.start(ko.head_address(cid, NAMESPACE), token)


def _maybe_token(rig: Rig, cid: str) -> str | None:
    try:
        return secret_token(rig, cid)
    except client.exceptions.ApiException:
        return None


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


def make_rig(
    store: Store, node: Any, api: client.ApiClient, heads: Heads, tokens: RayTokens
) -> Rig:
    """The controller reads heads with ``tokens`` (the portal's key); the RayClusters'
    Secrets hold the tokens of ``RAY_TOKENS``."""
    alloc = Allocator(store)
    alloc.start([node])
    alloc.set_tenant(TEAM.name)
    alloc.set_quota(TEAM.name, "H100-80GB", guaranteed=0, limit=2)
    reads = head_reader(probe_python(ray_program()), tokens, heads.resolve)
    ray = RayController(alloc, installed=RAY, idle_check_s=1.0, heads=reads)
    return Rig(alloc, api, ray, NAMESPACE)


@pytest.fixture
def rig(node: Any, heads: Heads, api: client.ApiClient, tmp_path: Path) -> Iterator[Rig]:
    heads.reachable = True
    with Store(f"sqlite:///{tmp_path / 'portal.db'}") as store:
        rig = make_rig(store, node, api, heads, RAY_TOKENS)
        yield rig
        for view in rig.ray.clusters():
            rig.ray.delete(view.cluster.id)
        rig.kube.sync()
        heads.stop_all()


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
    rig: Rig, heads: Heads
) -> None:
    cid = rig.ray.create(spec(2, 2, idle_s=2.0)).cluster.id
    head_for(rig, heads, cid)
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
    heads.reachable = False  # no further read: the resumed cluster is not released again
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
    rig: Rig, heads: Heads
) -> None:
    cid = rig.ray.create(spec(1, 1, idle_s=2.0, idle_suspend=True)).cluster.id
    head_for(rig, heads, cid)
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

    heads.reachable = False
    rig.ray.resume(cid)
    back = rig.until(running(rig, cid, 1), "the resumed cluster running", timeout_s=60)
    assert group(rig, cid) == (1, 1, False)
    assert back.cluster.address == ko.head_address(cid, NAMESPACE)


def test_pending_gpu_demand_on_the_head_grows_the_raycluster_by_a_slice(
    rig: Rig, heads: Heads, tmp_path: Path
) -> None:
    cid = rig.ray.create(spec(1, 2, autoscale=True)).cluster.id
    address = head_for(rig, heads, cid)
    first = rig.until(running(rig, cid, 1), "the cluster running", timeout_s=60)
    [first_pod] = rig.pods(cid, "worker")

    script = tmp_path / "demand.py"
    script.write_text(DEMAND)
    # The driver is the owner's notebook: the token from the API (the derived one).
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": RAY_TOKENS.token(cid),
    }
    driver = subprocess.Popen(
        [sys.executable, str(script), address],
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


def test_a_head_read_with_a_wrong_token_fails_clearly_and_leaves_the_cluster_as_it_is(
    node: Any,
    heads: Heads,
    api: client.ApiClient,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A portal whose key is not the one the cluster's token came from (say, changed without
    keeping the old one) reads a head that answers: the GCS refuses the read, the portal
    logs why, and the idle cluster is neither released nor failed."""
    heads.reachable = True
    caplog.set_level(logging.INFO, logger="portal.ray.idle")
    with Store(f"sqlite:///{tmp_path / 'portal.db'}") as store:
        wrong = RayTokens("another key than the one the cluster's token came from")
        rig = make_rig(store, node, api, heads, wrong)
        try:
            cid = rig.ray.create(spec(1, 1, idle_s=1.0)).cluster.id
            head_for(rig, heads, cid)
            view = rig.until(running(rig, cid, 1), "the cluster running", timeout_s=60)
            rig.until(
                lambda: True if "refused the portal's token" in caplog.text else None,
                "a read refused",
                timeout_s=90,
            )
            assert "AuthenticationError" in caplog.text
            for _ in range(3):
                rig.step()
            now = rig.ray.view(cid)
            assert now.cluster.state is RayState.RUNNING
            assert [s.slice.state.value for s in now.slices] == ["running"]
            assert [w.id for w in rig.alloc.workloads()] == [view.slices[0].slice.workload_id]
            assert group(rig, cid) == (1, 1, False)
        finally:
            for v in rig.ray.clusters():
                rig.ray.delete(v.cluster.id)
            rig.kube.sync()
            heads.stop_all()
