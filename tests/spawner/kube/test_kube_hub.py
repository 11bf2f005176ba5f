"""End to end on Kubernetes: a real JupyterHub with ``GPUKubeSpawner``, the real portal
(``gpuportal serve`` on the cluster's inventory, running the isolation reconciler and the binder)
and the real apiserver with kwok GPU nodes.

kwok runs no containers: when a notebook pod reaches Running, the test serves a stand-in
single-user server at the pod's own IP (kwok hands out 127.100.x.y) on the notebook port, where
the hub checks it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client, utils
from kubernetes.client.exceptions import ApiException

from policies.isolation import IsolationSettings, TenantSpec, tenant_manifests
from portal.hubroles import HubRolesSpec, custom_scopes, load_roles
from portal.isolation.loop import TenantDefaults
from spawner import hubconfig
from tests.spawner.conftest import ADMIN_TOKEN, GPUPORTAL, PASSWORD, SPAWNER_TOKEN, PortalHub
from tests.spawner.tiny_server import Handler
from tests.support import gpu_nodes
from tests.support.hub import HubFactory, HubPorts
from tests.support.k8s import K8sCluster
from tests.support.ports import free_port

pytestmark = [pytest.mark.k8s, pytest.mark.hub, pytest.mark.slow]

IMAGE = "registry.invalid/gpuportal/notebook:0"  # kwok pulls nothing
NOTEBOOK_PORT = 8888
NODES = ("hub-h100-a", "hub-h100-b")
GROUPS = {"team-k": ["alice", "anna"]}
SEED = """\
tenants:
  team-k:
    quotas:
      H100-80GB: {guaranteed: 1, limit: 1}
"""
H100 = {"tenant": "team-k", "option": "gpu:H100-80GB:1"}
SETTINGS = IsolationSettings()
NAMESPACE = SETTINGS.namespace("team-k")
DEFAULTS = TenantDefaults()


class StandIns:
    """Serves a stand-in notebook at the IP of every Running pod in ``namespace``."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self._core = core
        self._namespace = namespace
        self._servers: dict[str, ThreadingHTTPServer] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stand-ins", daemon=True)

    def __enter__(self) -> StandIns:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for server in self._servers.values():
            server.shutdown()
            server.server_close()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            with contextlib.suppress(ApiException):
                for pod in self._core.list_namespaced_pod(self._namespace).items:
                    ip = pod.status.pod_ip if pod.status else None
                    if pod.status.phase == "Running" and ip and ip not in self._servers:
                        server = ThreadingHTTPServer((ip, NOTEBOOK_PORT), Handler)
                        threading.Thread(target=server.serve_forever, daemon=True).start()
                        self._servers[ip] = server


def prepare_cluster(k8s_cluster: K8sCluster, core: client.CoreV1Api) -> None:
    """Two kwok H100 nodes, and team-k's namespace as the portal's reconciler makes it (made
    here too, so that the hub never races the portal's first reconcile)."""
    for name in NODES:
        with contextlib.suppress(ApiException):  # a rerun in the same session
            k8s_cluster.add_gpu_node(gpu_nodes.h100_nvswitch_node(name, rack=f"rack-{name}"))
    deadline = time.monotonic() + 60
    # The node lifecycle controller taints a new node not-ready until it has seen it Ready.
    while any(core.read_node(n).spec.taints for n in NODES):
        assert time.monotonic() < deadline, "the not-ready taints did not leave the nodes"
        time.sleep(0.2)
    spec = TenantSpec(
        "team-k",
        {"H100-80GB": 1},
        cpu_millis=DEFAULTS.cpu_millis,
        memory_mib=DEFAULTS.memory_mib,
        pods=DEFAULTS.pods,
    )
    with k8s_cluster.api_client() as api:
        for manifest in tenant_manifests(spec, SETTINGS):
            try:
                utils.create_from_dict(api, manifest)
            except utils.FailToCreateError as e:
                if any(x.status != 409 for x in e.api_exceptions):
                    raise
    deadline = time.monotonic() + 60
    while not (core.read_namespaced_resource_quota("tenant-quota", NAMESPACE).status.hard):
        assert time.monotonic() < deadline, "the ResourceQuota status was not published"
        time.sleep(0.2)


def hub_config(directory: Path, portal_port: int, kubeconfig: Path) -> str:
    (directory / "seed.yaml").write_text(SEED)
    portal = hubconfig.portal_service(
        f"http://127.0.0.1:{portal_port}",
        [str(GPUPORTAL), "serve", "--seed", str(directory / "seed.yaml")],
        environment={
            "GPUPORTAL_DATABASE_URL": f"sqlite:///{directory / 'portal.sqlite'}",
            "GPUPORTAL_INVENTORY": "kubernetes",
            "GPUPORTAL_STATE_DIR": str(directory / "portal-state"),
            "GPUPORTAL_TICK_INTERVAL_S": "0.5",
            "KUBECONFIG": str(kubeconfig),
            "NO_PROXY": "*",
        },
        cwd=directory,
    )
    admin = {"name": "test-admin", "api_token": ADMIN_TOKEN}
    admin_role = {
        "name": "test-admin",
        "services": ["test-admin"],
        "scopes": ["admin:users", "admin:servers", "custom:gpuportal:admin"],
    }
    settings: dict[str, object] = {
        "JupyterHub.authenticator_class": "dummy",
        "DummyAuthenticator.password": PASSWORD,
        "Authenticator.allowed_users": {u for m in GROUPS.values() for u in m},
        "JupyterHub.load_groups": {g: {"users": m} for g, m in GROUPS.items()},
        "JupyterHub.custom_scopes": custom_scopes(),
        "JupyterHub.load_roles": [
            *load_roles(HubRolesSpec(tenants=tuple(GROUPS))),
            hubconfig.spawner_role(),
            admin_role,
        ],
        "JupyterHub.services": [portal, hubconfig.spawner_service(SPAWNER_TOKEN), admin],
        "JupyterHub.spawner_class": "gpuportal-kube",
        "KubeSpawner.image": IMAGE,
        "KubeSpawner.port": NOTEBOOK_PORT,
        "KubeSpawner.start_timeout": 60,
        "KubeSpawner.http_timeout": 60,
        "GPUPortalMixin.queue_poll_interval": 0.3,
        # The hub notices a pod deleted behind its back at its next poll.
        "KubeSpawner.poll_interval": 2,
        "JupyterHub.cleanup_servers": False,
    }
    return "".join(f"c.{k} = {v!r}\n" for k, v in settings.items())


@pytest.fixture
def core(k8s_cluster: K8sCluster) -> Iterator[client.CoreV1Api]:
    with k8s_cluster.api_client() as api:
        yield client.CoreV1Api(api)


@pytest.fixture
def kube_hub(
    hub_factory: HubFactory, tmp_path: Path, k8s_cluster: K8sCluster, core: client.CoreV1Api
) -> Iterator[PortalHub]:
    prepare_cluster(k8s_cluster, core)
    directory = tmp_path / "kube-hub"
    directory.mkdir()
    portal_port = free_port()
    kubeconfig = k8s_cluster.admin_kubeconfig

    def config(_ports: HubPorts) -> str:
        return hub_config(directory, portal_port, kubeconfig)

    env = {"KUBECONFIG": str(kubeconfig), "NO_PROXY": "*", "no_proxy": "*"}
    with StandIns(core, NAMESPACE):
        hub = hub_factory(config, env=env, name=directory.name)
        ph = PortalHub(hub, f"http://127.0.0.1:{portal_port}/services/gpuportal/", directory)
        ph.wait(lambda: _ready(ph), "the portal service", timeout_s=90)
        try:
            yield ph
        finally:
            # cleanup_servers is off: the pods outlive the hub unless deleted here.
            for pod in core.list_namespaced_pod(NAMESPACE).items:
                with contextlib.suppress(ApiException):
                    core.delete_namespaced_pod(pod.metadata.name, NAMESPACE, grace_period_seconds=0)


def _ready(ph: PortalHub) -> bool:
    try:
        return httpx.get(f"{ph.portal_url}ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def running_workloads(ph: PortalHub) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = ph.portal("/workloads?state=running")["items"]
    return items


def test_spawn_binds_to_the_allocators_node_queues_and_starts_the_next_on_stop(
    kube_hub: PortalHub, core: client.CoreV1Api
) -> None:
    ph = kube_hub
    # 1. alice's server: a pod in team-k's namespace, bound by the portal to the chosen node.
    r = ph.spawn("alice", H100)
    assert r.status_code in (201, 202), r.text
    ph.wait_ready("alice")
    (workload,) = running_workloads(ph)
    (allocation,) = workload["allocations"]
    pod = core.read_namespaced_pod("jupyter-alice", NAMESPACE)
    assert pod.spec.node_name == allocation["node"]
    assert pod.spec.scheduler_name == "gpuportal"
    assert pod.status.phase == "Running"
    notebook = pod.spec.containers[0]
    assert notebook.resources.limits["nvidia.com/gpu"] == "1"
    assert notebook.resources.requests["nvidia.com/gpu"] == "1"
    assert notebook.security_context.allow_privilege_escalation is False
    assert notebook.security_context.capabilities.drop == ["ALL"]
    assert pod.spec.security_context.run_as_non_root is True
    assert pod.spec.security_context.seccomp_profile.type == "RuntimeDefault"
    assert pod.spec.automount_service_account_token is False
    assert pod.spec.service_account_name == "tenant-jobs"
    labels = pod.metadata.labels
    assert labels["gpuportal.io/tenant"] == "team-k"
    assert labels["gpuportal.io/workload"] == workload["id"]
    assert labels["gpuportal.io/allocation"] == allocation["id"]
    env = {e.name: e.value for e in notebook.env}
    assert env["GPUPORTAL_WORKLOAD_ID"] == workload["id"]
    assert env["GPUPORTAL_NODE"] == allocation["node"]

    # 2. anna, same tenant: the quota is used, so her spawn waits with position and reason.
    r = ph.spawn("anna", H100)
    assert r.status_code in (201, 202), r.text
    assert ph.wait(lambda: ph.server("anna").get("pending") == "queued", "anna queued")
    with ph.progress("anna") as events:
        queued = next(e for e in events if "Queued" in e.get("message", ""))
    assert queued["message"].startswith("Queued 1st in team-k for 1 × H100-80GB: ")
    assert "team-k quota for H100-80GB: 1/1 gpus in use" in queued["message"]
    assert _pods(core) == ["jupyter-alice"]  # no pod before the allocation

    # 3. Stopping alice's server deletes her pod and releases her GPU; anna's pod starts.
    ph.stop("alice")
    ph.wait_ready("anna")
    (workload,) = running_workloads(ph)
    assert workload["owner"] == "anna"
    anna = core.read_namespaced_pod("jupyter-anna", NAMESPACE)
    assert anna.spec.node_name == workload["allocations"][0]["node"]
    assert _pods(core) == ["jupyter-anna"]

    ph.stop("anna")
    assert running_workloads(ph) == []
    ph.wait(lambda: _pods(core) == [], "anna's pod to go")


def test_restart_keeps_the_pod_and_a_pod_deleted_behind_the_hubs_back_frees_its_gpu(
    kube_hub: PortalHub, core: client.CoreV1Api
) -> None:
    ph = kube_hub
    # A REST spawn with an option the form would not offer is refused; nothing is allocated.
    r = ph.spawn("alice", {"tenant": "team-k", "option": "gpu:H100-80GB:8"})
    assert r.status_code == 403, r.text
    assert r.json()["message"] == (
        "8 × H100-80GB is not allowed for team-k: 8 × H100-80GB needs 8 gpus of H100-80GB; "
        "team-k's limit is 1"
    )
    assert ph.server("alice") == {} and running_workloads(ph) == []

    assert ph.spawn("alice", H100).status_code in (201, 202)
    ph.wait_ready("alice")
    (before,) = running_workloads(ph)
    uid = core.read_namespaced_pod("jupyter-alice", NAMESPACE).metadata.uid
    # anna queues, then cancels: her queue entry goes, nothing else changes.
    assert ph.spawn("anna", H100).status_code in (201, 202)
    ph.wait(lambda: ph.portal("/queue")["total"] == 1, "anna queued")
    ph.stop("anna")
    assert ph.portal("/queue")["total"] == 0

    # The hub and its portal restart; alice's pod keeps running and keeps its allocation. The
    # restarted spawner watches the tenant namespace again from its saved state.
    ph.hub.restart()
    ph.wait(lambda: ph.server("alice").get("ready"), "alice's server after the restart")
    ph.wait(lambda: _ready(ph), "the portal after the restart")
    (after,) = running_workloads(ph)
    assert (after["id"], after["allocations"]) == (before["id"], before["allocations"])
    assert core.read_namespaced_pod("jupyter-alice", NAMESPACE).metadata.uid == uid

    # Someone deletes the pod with kubectl: the hub's poll notices and the GPU is released.
    core.delete_namespaced_pod("jupyter-alice", NAMESPACE, grace_period_seconds=0)
    ph.wait(lambda: not ph.server("alice"), "the hub noticing alice's pod is gone")
    ph.wait(lambda: running_workloads(ph) == [], "alice's GPU released")
    assert ph.portal(f"/workloads/{before['id']}")["state"] == "released"
    # The quota holds one GPU: anna getting it proves it was given back.
    assert ph.spawn("anna", H100).status_code in (201, 202)
    ph.wait_ready("anna")
    assert [w["owner"] for w in running_workloads(ph)] == ["anna"]
    ph.stop("anna")


def _pods(core: client.CoreV1Api) -> list[str]:
    return sorted(
        p.metadata.name
        for p in core.list_namespaced_pod(NAMESPACE).items
        if p.metadata.deletion_timestamp is None
    )
