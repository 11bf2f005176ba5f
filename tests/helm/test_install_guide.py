"""The install guide of docs/helm.md ("Install on a GPU cluster") followed on the test cluster,
from GPU nodes as the GPU Operator labels them to a user's first notebook on a GPU.

What the guide does with kubectl and helm, the test does against the real apiserver: the
namespace, the Secrets, the chart rendered with the guide's own values file
(examples/install-values.yaml) and applied. kwok runs no containers, so the portal runs here as
a process with what the rendered Deployment gives its container (tests/helm/rendered_portal.py:
its environment, Secrets, ConfigMaps and the ServiceAccount's token, so its RBAC is the chart's),
and JupyterHub runs from examples/z2jh-values.yaml as z2jh would configure it (its services with
the guide's tokens, then its extraConfig as written), with the hub's ServiceAccount token. It
ends as the guide does: a member of team-a logs in, spawns on one H100, and the notebook pod
runs in gp-team-a on the kwok GPU node the portal bound it to."""

from __future__ import annotations

import contextlib
import re
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from policies.isolation import IsolationSettings
from tests.helm.chart import INSTALL_VALUES, Z2JH_VALUES, Helm, Manifest, named
from tests.helm.rendered_portal import RenderedPortal, service_account_kubeconfig
from tests.helm.test_chart_k8s import PRIVILEGED, RUNTIME_CLASS, apply
from tests.spawner.conftest import ADMIN_TOKEN, PASSWORD, PortalHub
from tests.spawner.kube.test_kube_hub import IMAGE, NOTEBOOK_PORT, StandIns
from tests.support import gpu_nodes
from tests.support.hub import HubFactory, HubPorts
from tests.support.k8s import K8sCluster
from tests.support.ports import free_port

pytestmark = [pytest.mark.k8s, pytest.mark.hub, pytest.mark.postgres, pytest.mark.slow]

NAMESPACE = "gpuportal"  # the guide's; the tenant NetworkPolicies expect the hub there
RELEASE = "gpuportal"
TENANT = "team-a"
USER = "alice"
TENANT_NAMESPACE = IsolationSettings().namespace(TENANT)
PLACEHOLDERS = {
    "<portal token>": "portal",
    "<agent token>": "agent",
    "<dashboards token>": "dashboards",
    "<spawner token>": "spawner",
}


def guide_text() -> str:
    return (Path(__file__).resolve().parents[2] / "docs" / "helm.md").read_text()


def test_the_guide_shows_the_values_file_this_test_installs_with() -> None:
    guide = guide_text()
    section = guide[guide.index("## Install on a GPU cluster") :]
    section = section[: section.index("\n## ")]
    assert "-f helm/gpuportal/examples/install-values.yaml" in section
    assert "helm/gpuportal/examples/z2jh-values.yaml" in section
    for secret in ("gpuportal-database", "gpuportal-tokens"):
        assert f"create secret generic {secret}" in section
    # The values the guide shows are the file's (its comments aside).
    (shown,) = re.findall(r"```yaml\n(.*?)```", section, flags=re.DOTALL)
    values = yaml.safe_load(INSTALL_VALUES.read_text())
    assert yaml.safe_load(shown) == values
    assert values["database"]["existingSecret"] == "gpuportal-database"
    assert values["tokens"]["existingSecret"] == "gpuportal-tokens"


def z2jh_values(tokens: dict[str, str]) -> dict[str, Any]:
    """The z2jh example with its <...> tokens replaced, as the guide's step does."""
    text = Z2JH_VALUES.read_text()
    for placeholder, key in PLACEHOLDERS.items():
        text = text.replace(placeholder, tokens[key])
    assert not re.search(r"<[a-z ]+ token>", text), "a token placeholder the guide leaves"
    values: dict[str, Any] = yaml.safe_load(text)
    return values


def hub_config(z2jh: dict[str, Any], local_urls: dict[str, str]) -> str:
    """Hub configuration as z2jh builds it from ``hub.services`` and ``hub.extraConfig``; the
    services' in-cluster URLs point at the local processes, and the few settings a test hub
    needs (authenticator, notebook image and port, an admin service) are added."""
    hub = z2jh["hub"]
    services: list[dict[str, Any]] = []
    for name, service in hub["services"].items():
        entry: dict[str, Any] = {"name": name}
        for key, value in service.items():
            if key == "apiToken":
                entry["api_token"] = value
            elif key == "url":
                entry["url"] = local_urls[value]
            else:
                entry[key] = value
        services.append(entry)
    admin = {"name": "test-admin", "api_token": ADMIN_TOKEN}
    admin_role = {
        "name": "test-admin",
        "services": ["test-admin"],
        "scopes": ["admin:users", "admin:servers", "tokens", "custom:gpuportal:admin"],
    }
    settings: dict[str, object] = {
        "JupyterHub.services": services,
        "JupyterHub.authenticator_class": "dummy",
        "DummyAuthenticator.password": PASSWORD,
        "Authenticator.allowed_users": {USER},
        "JupyterHub.load_groups": {TENANT: {"users": [USER]}},
        "KubeSpawner.image": IMAGE,
        "KubeSpawner.port": NOTEBOOK_PORT,
        "KubeSpawner.start_timeout": 90,
        "KubeSpawner.http_timeout": 60,
        "GPUPortalMixin.queue_poll_interval": 0.3,
    }
    lines = [f"c.{k} = {v!r}" for k, v in settings.items()]
    # z2jh runs hub.extraConfig after its own configuration, as written in the values.
    lines.append(hub["extraConfig"]["gpuportal"])
    lines.append(f"c.JupyterHub.services.append({admin!r})")
    lines.append(f"c.JupyterHub.load_roles.append({admin_role!r})")
    return "\n".join(lines) + "\n"


class StandInService:
    """An HTTP server on a loopback port answering 200, standing in for a hub service this
    test does not run (the hub checks its external services once at start, and waits long
    for one that does not answer)."""

    def __init__(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Ok)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> StandInService:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def wait_until(check: Any, what: str, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(ApiException):
            got = check()
            if got:
                return got
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.2)


@pytest.fixture
def cluster_objects(k8s_cluster: K8sCluster) -> Iterator[tuple[DynamicClient, Any]]:
    """The admin's clients; at the end everything the guide made is deleted again: the tenant
    namespaces the portal created, the release namespace, the chart's cluster-wide objects,
    the GPU nodes and the GPU Operator's RuntimeClass if this test made it."""
    made: list[tuple[str, str, str]] = []  # (api_version, kind, name) of cluster-wide objects
    with k8s_cluster.api_client() as api:
        dyn = DynamicClient(api)  # type: ignore[no-untyped-call]
        core: Any = client.CoreV1Api(api)
        try:
            yield dyn, made
        finally:
            for namespace in (TENANT_NAMESPACE, IsolationSettings().namespace("team-b"), NAMESPACE):
                with contextlib.suppress(ApiException):
                    core.delete_namespace(namespace)
            for api_version, kind, name in reversed(made):
                with contextlib.suppress(ApiException):
                    dyn.resources.get(api_version=api_version, kind=kind).delete(name=name)
            for namespace in (TENANT_NAMESPACE, NAMESPACE):

                def gone(ns: str = namespace) -> bool:
                    try:
                        core.read_namespace(ns)
                    except ApiException as e:
                        return e.status == 404
                    return False

                wait_until(gone, f"namespace {namespace} deleted", 120)


def test_the_install_guide_ends_with_a_notebook_on_a_gpu(
    k8s_cluster: K8sCluster,
    helm: Helm,
    hub_factory: HubFactory,
    postgres_url: str,
    tmp_path: Path,
    cluster_objects: tuple[DynamicClient, list[tuple[str, str, str]]],
) -> None:
    dyn, made = cluster_objects
    core: Any = client.CoreV1Api(dyn.client)
    suffix = uuid.uuid4().hex[:6]

    # Prerequisite: GPU nodes as the GPU Operator shows them (GPU Feature Discovery's labels,
    # the device plugin's nvidia.com/gpu) and its `nvidia` RuntimeClass.
    nodes = [f"install-h100-{i}-{suffix}" for i in range(2)]
    for i, name in enumerate(nodes):
        k8s_cluster.add_gpu_node(gpu_nodes.h100_nvswitch_node(name, rack=f"install-rack-{i}"))
        made.append(("v1", "Node", name))
    wait_until(
        lambda: not any(core.read_node(n).spec.taints for n in nodes), "nodes without taints"
    )
    with contextlib.suppress(ApiException):
        node_api: Any = client.NodeV1Api(dyn.client)
        node_api.create_runtime_class(
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": RUNTIME_CLASS},
                "handler": RUNTIME_CLASS,
            }
        )
        made.append(("node.k8s.io/v1", "RuntimeClass", RUNTIME_CLASS))

    # 1. The namespace, at the privileged level for the agent's hostPID.
    k8s_cluster.create_namespace(NAMESPACE, PRIVILEGED)

    # 2-3. PostgreSQL's URL and the tokens, as Secrets (the test's PostgreSQL stands in).
    tokens = {k: secrets.token_hex(32) for k in ("portal", "agent", "dashboards", "spawner")}
    core.create_namespaced_secret(
        NAMESPACE,
        {"metadata": {"name": "gpuportal-database"}, "stringData": {"url": postgres_url}},
    )
    core.create_namespaced_secret(
        NAMESPACE,
        {
            "metadata": {"name": "gpuportal-tokens"},
            "stringData": {
                "portal": tokens["portal"],
                "agent": tokens["agent"],
                "dashboards": tokens["dashboards"],
                "dashboards-cookie-secret": secrets.token_hex(32),
                "ray-token-key": secrets.token_hex(32),
            },
        },
    )

    # 4. `helm install` with the guide's values: rendered and applied. The migration Job is a
    # pre-upgrade hook, which an install does not run.
    objects = helm.render(release=RELEASE, namespace=NAMESPACE, values_files=[INSTALL_VALUES])
    installed: list[Manifest] = []
    for obj in objects:
        hooks = obj["metadata"].get("annotations", {}).get("helm.sh/hook", "")
        if hooks and "install" not in hooks.replace("upgrade", ""):
            continue
        live = apply(dyn, obj, NAMESPACE)
        installed.append(obj)
        if not live.metadata.namespace:
            made.append((obj["apiVersion"], obj["kind"], obj["metadata"]["name"]))
    assert ("Job", "gpuportal-migrate") not in {
        (o["kind"], o["metadata"]["name"]) for o in installed
    }
    deployment = named(installed, "Deployment", RELEASE)

    # z2jh's hub ServiceAccount, which the chart's gpuportal-hub ClusterRole is bound to.
    core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": "hub"}})

    # The portal as its pod would run, with its ServiceAccount's token.
    portal = RenderedPortal(deployment, NAMESPACE, tmp_path / "portal")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    portal_kubeconfig = service_account_kubeconfig(
        k8s_cluster, core, NAMESPACE, account, tmp_path / "portal-kubeconfig.yaml"
    )
    hub_kubeconfig = service_account_kubeconfig(
        k8s_cluster, core, NAMESPACE, "hub", tmp_path / "hub-kubeconfig.yaml"
    )

    # 5. JupyterHub from the z2jh values, with the same tokens.
    z2jh = z2jh_values(tokens)
    dashboards = StandInService()  # not part of this walk-through: something that answers
    local_urls = {
        z2jh["hub"]["services"]["gpuportal"]["url"]: f"http://127.0.0.1:{portal.port}",
        z2jh["hub"]["services"]["gpuportal-dashboards"]["url"]: dashboards.url,
    }
    config = hub_config(z2jh, local_urls)

    def start_portal_then_configure(ports: HubPorts) -> str:
        # The guide's order: the portal (step 5) runs before the hub (step 6) starts, which
        # checks its external services once at start; the portal needs only the hub's address.
        (tmp_path / "portal").mkdir()
        portal.start(core, f"http://127.0.0.1:{ports.hub}/hub/api", portal_kubeconfig)
        return config

    env = {"KUBECONFIG": str(hub_kubeconfig), "NO_PROXY": "*", "no_proxy": "*"}
    with StandIns(core, TENANT_NAMESPACE), dashboards:
        try:
            hub = hub_factory(start_portal_then_configure, env=env, name="install-hub")
            ph = PortalHub(hub, portal.url, tmp_path / "portal")

            # 6. The seed: the tenants exist, and the portal made team-a's namespace.
            tenants = {t["name"] for t in ph.portal("/tenants")["items"]}
            assert tenants >= {"team-a", "team-b"}
            wait_until(
                lambda: (
                    core.read_namespaced_resource_quota(
                        "tenant-quota", TENANT_NAMESPACE
                    ).status.hard
                ),
                "the portal making team-a's namespace",
            )
            # What the guide's `kubectl get namespaces -l ...` lists.
            tenant_namespaces = {TENANT_NAMESPACE, IsolationSettings().namespace("team-b")}
            wait_until(
                lambda: (
                    tenant_namespaces
                    <= {
                        n.metadata.name
                        for n in core.list_namespace(
                            label_selector="gpuportal.io/managed-by=gpuportal"
                        ).items
                    }
                ),
                "both tenants' namespaces labelled as the portal's",
            )

            # 7. First login, then a notebook on one H100.
            with httpx.Client(base_url=hub.url, timeout=30) as browser:
                browser.get("/hub/login")
                xsrf = browser.cookies.get("_xsrf")
                login = browser.post(
                    "/hub/login",
                    data={"username": USER, "password": PASSWORD, "_xsrf": xsrf or ""},
                )
                assert login.status_code == 302, login.text
                assert "jupyterhub-hub-login" in browser.cookies
            r = ph.spawn(USER, {"tenant": TENANT, "option": "gpu:H100-80GB:1"})
            assert r.status_code in (201, 202), r.text
            ph.wait_ready(USER)

            (workload,) = ph.portal("/workloads?state=running")["items"]
            (allocation,) = workload["allocations"]
            pod = core.read_namespaced_pod(f"jupyter-{USER}", TENANT_NAMESPACE)
            assert pod.spec.scheduler_name == "gpuportal"
            assert pod.spec.node_name == allocation["node"]
            assert pod.status.phase == "Running"
            node = core.read_node(pod.spec.node_name)
            assert node.metadata.annotations[gpu_nodes.KWOK_ANNOTATION] == "fake"
            assert node.metadata.labels["nvidia.com/gpu.product"].startswith("NVIDIA-H100")
            limits = pod.spec.containers[0].resources.limits
            assert limits["nvidia.com/gpu"] == "1"

            ph.stop(USER)
            ph.wait(lambda: not ph.portal("/workloads?state=running")["items"], "the GPU released")
        finally:
            for p in core.list_namespaced_pod(TENANT_NAMESPACE).items:
                with contextlib.suppress(ApiException):
                    core.delete_namespaced_pod(
                        p.metadata.name, TENANT_NAMESPACE, grace_period_seconds=0
                    )
            code = portal.stop()
    assert code == 0, portal.tail()
    assert "Traceback" not in portal.tail(2000)
