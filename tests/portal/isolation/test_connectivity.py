"""NetworkPolicy semantics checked by an independent analyser, network-config-analyzer (nca).

The builders' Namespaces and NetworkPolicies for two tenants plus representative pods (two
notebooks per tenant, a Ray cluster's head and worker per tenant as the KubeRay operator labels
them, an inference replica per tenant as the services' backend labels it, the hub, the proxy,
the portal, DNS) go to a folder; ``nca
--connectivity`` computes every allowed connection, and the test asserts on that, not on the
YAML we wrote.

nca pins exact versions of PyYAML and others that conflict with the project's (kubernetes needs
a newer PyYAML), so it lives in its own virtual environment: ``GPUPORTAL_NCA`` names its
executable, else ``nca`` on PATH, else ``.cache/nca-venv/bin/nca`` (``python -m venv
.cache/nca-venv && .cache/nca-venv/bin/pip install network-config-analyzer==2.1.0``).
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.isolation import IsolationSettings, TenantSpec, tenant_manifests
from portal.inference import kubeobjects as replicas
from portal.ray import kubeobjects
from tests.support.k8s import REPO_ROOT

SETTINGS = IsolationSettings(api_server_cidrs=("10.96.0.1/32",))
OPEN = TenantSpec("tenant-a", {}, cpu_millis=1, memory_mib=1, pods=1, internet_egress=True)
CLOSED = TenantSpec(
    "tenant-b", {}, cpu_millis=1, memory_mib=1, pods=1, allow_intra_tenant_traffic=False
)
NS_A, NS_B = SETTINGS.namespace(OPEN.name), SETTINGS.namespace(CLOSED.name)
HUB = SETTINGS.hub_namespace
DENIED = ("169.254.169.254", "10.96.0.1")
_LINE = re.compile(r"(?P<src>\S+) => (?P<dst>\S+) : (?P<conn>.+)")


def nca_executable() -> str | None:
    candidates = [os.environ.get("GPUPORTAL_NCA"), shutil.which("nca")]
    candidates.append(str(REPO_ROOT / ".cache" / "nca-venv" / "bin" / "nca"))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def _namespace(name: str) -> dict[str, Any]:
    labels = {"kubernetes.io/metadata.name": name}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def _pod(name: str, namespace: str, labels: dict[str, str], port: int) -> dict[str, Any]:
    container = {"name": "main", "image": "x", "ports": [{"containerPort": port}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [container]},
    }


RAY_PORTS = (kubeobjects.GCS_PORT, 10001)  # the head's GCS and Ray client server


def _ray_pods(namespace: str, tenant: str) -> list[dict[str, Any]]:
    """A Ray cluster's head and a worker as the operator makes them from the portal's
    RayCluster: the template's labels plus the operator's own."""
    base = kubeobjects.labels("c0ffee", tenant, SETTINGS)
    base[kubeobjects.CLUSTER_LABEL] = kubeobjects.cluster_name("c0ffee")
    return [
        _pod(f"ray-{kind}-{tenant}", namespace, {**base, kubeobjects.NODE_TYPE_LABEL: kind}, port)
        for kind, port in (("head", RAY_PORTS[0]), ("worker", RAY_PORTS[1]))
    ]


def _replica_pod(namespace: str, tenant: str) -> dict[str, Any]:
    """A service's replica pod, with the labels the backend gives it."""
    labels = replicas.service_labels("5e7f1ce", tenant, SETTINGS)
    labels[SETTINGS.label("replica")] = "1"
    return _pod(f"llm-r1-{tenant}", namespace, labels, SETTINGS.inference_port)


def cluster_objects() -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for spec in (OPEN, CLOSED):
        for manifest in tenant_manifests(spec, SETTINGS):
            if manifest["kind"] == "Namespace":
                # The apiserver adds this label to every namespace; nca needs to see it.
                name = manifest["metadata"]["name"]
                manifest["metadata"]["labels"]["kubernetes.io/metadata.name"] = name
            if manifest["kind"] in ("Namespace", "NetworkPolicy"):
                objects.append(manifest)
    nb = {"app": "notebook"}
    objects += [
        _namespace(HUB),
        _namespace(SETTINGS.dns_namespace),
        *(_pod(n, NS_A, nb, SETTINGS.notebook_port) for n in ("nb-a1", "nb-a2")),
        *(_pod(n, NS_B, nb, SETTINGS.notebook_port) for n in ("nb-b1", "nb-b2")),
        *_ray_pods(NS_A, OPEN.name),
        *_ray_pods(NS_B, CLOSED.name),
        _replica_pod(NS_A, OPEN.name),
        _replica_pod(NS_B, CLOSED.name),
        _pod("hub", HUB, dict(SETTINGS.hub_pod_labels), SETTINGS.hub_api_port),
        _pod("proxy", HUB, dict(SETTINGS.proxy_pod_labels), 8000),
        _pod("portal", HUB, dict(SETTINGS.portal_pod_labels), SETTINGS.portal_api_port),
        _pod("dns", SETTINGS.dns_namespace, dict(SETTINGS.dns_pod_labels), 53),
    ]
    return objects


@dataclass(frozen=True)
class Connection:
    src: str
    dst: str
    conn: str


@pytest.fixture(scope="module")
def connections(tmp_path_factory: pytest.TempPathFactory) -> list[Connection]:
    nca = nca_executable()
    if nca is None:
        pytest.fail(
            "network-config-analyzer is not installed: run scripts/bootstrap test "
            "(see this module's docstring)"
        )
    folder = tmp_path_factory.mktemp("nca")
    Path(folder / "cluster.yaml").write_text(yaml.safe_dump_all(cluster_objects()))
    proc = subprocess.run(
        [nca, "--connectivity", "-r", str(folder), "--output_format", "txt_no_fw_rules"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = [
        Connection(**m.groupdict()) for m in map(_LINE.fullmatch, proc.stdout.splitlines()) if m
    ]
    assert found, f"no connections parsed from nca output:\n{proc.stdout}"
    return found


def pod(namespace: str, name: str) -> str:
    return f"{namespace}/{name}[Pod]"


def _tenant_pods() -> list[str]:
    return [pod(NS_A, "nb-a1"), pod(NS_A, "nb-a2"), pod(NS_B, "nb-b1"), pod(NS_B, "nb-b2")]


def _covers(dst: str, address: str) -> bool:
    """Whether an nca IP destination ("a-b" range or CIDR) contains ``address``."""
    if "[" in dst:
        return False
    ip = ipaddress.ip_address(address)
    if "-" in dst:
        low, high = (ipaddress.ip_address(x) for x in dst.split("-"))
        return low <= ip <= high
    return ip in ipaddress.ip_network(dst)


def test_no_connection_between_different_tenants(connections: list[Connection]) -> None:
    tenant_ns = {NS_A, NS_B}
    crossing = [
        c
        for c in connections
        if (src_ns := c.src.split("/")[0]) in tenant_ns
        and (dst_ns := c.dst.split("/")[0]) in tenant_ns
        and src_ns != dst_ns
    ]
    assert crossing == []


def test_another_tenant_has_no_path_to_or_from_a_ray_cluster(
    connections: list[Connection],
) -> None:
    ray_a = {pod(NS_A, f"ray-{k}-{OPEN.name}") for k in ("head", "worker")}
    ray_b = {pod(NS_B, f"ray-{k}-{CLOSED.name}") for k in ("head", "worker")}
    others = {
        (ray, c.src if c.dst == ray else c.dst)
        for c in connections
        for ray in ray_a | ray_b
        if ray in (c.src, c.dst)
    }
    # Each tenant's Ray pods meet only their own namespace's pods, the hub's and DNS.
    for ray, peer in others:
        if "[Pod]" in peer:
            peer_ns = peer.split("/")[0]
            own = NS_A if ray in ray_a else NS_B
            assert peer_ns in (own, HUB, SETTINGS.dns_namespace), (ray, peer)
    # The open tenant's head and worker do reach each other (a cluster works); the closed
    # tenant's do not even inside it, as its notebooks do not.
    pairs = {(c.src, c.dst) for c in connections}
    head_a, worker_a = sorted(ray_a)
    assert (worker_a, head_a) in pairs and (head_a, worker_a) in pairs
    assert not any((x, y) in pairs for x in ray_b for y in ray_b if x != y)


def test_only_the_portal_and_the_tenant_s_own_pods_reach_an_inference_replica(
    connections: list[Connection],
) -> None:
    replica_a, replica_b = pod(NS_A, f"llm-r1-{OPEN.name}"), pod(NS_B, f"llm-r1-{CLOSED.name}")
    into = {(c.src, c.dst): c.conn for c in connections if c.dst in (replica_a, replica_b)}
    serving = f"{{protocols:TCP,dst_ports:{SETTINGS.inference_port}}}"
    # The gateway (in the portal's pods) reaches both, on the serving port only.
    assert into.pop((pod(HUB, "portal"), replica_a)) == serving
    assert into.pop((pod(HUB, "portal"), replica_b)) == serving
    # Besides it, only the open tenant's own pods (its intra-tenant setting): no other
    # tenant's pod, not the hub or proxy (on no port), nothing outside the cluster.
    assert {src.split("/")[0] for src, _ in into} <= {NS_A}
    assert all(dst == replica_a and src.endswith("[Pod]") for src, dst in into)


def test_intra_tenant_traffic_follows_the_tenant_setting(connections: list[Connection]) -> None:
    pairs = {(c.src, c.dst) for c in connections}
    assert (pod(NS_A, "nb-a1"), pod(NS_A, "nb-a2")) in pairs
    assert (pod(NS_B, "nb-b1"), pod(NS_B, "nb-b2")) not in pairs
    assert (pod(NS_B, "nb-b2"), pod(NS_B, "nb-b1")) not in pairs


def test_hub_and_proxy_reach_notebooks_on_the_notebook_port_only(
    connections: list[Connection],
) -> None:
    into = {(c.src, c.dst): c.conn for c in connections if c.dst in _tenant_pods()}
    port_only = f"{{protocols:TCP,dst_ports:{SETTINGS.notebook_port}}}"
    for notebook in _tenant_pods():
        assert into[(pod(HUB, "hub"), notebook)] == port_only
        assert into[(pod(HUB, "proxy"), notebook)] == port_only
        assert (pod(HUB, "portal"), notebook) not in into
        assert (pod(SETTINGS.dns_namespace, "dns"), notebook) not in into
    # Nothing from outside the cluster reaches a notebook either.
    assert all(src.endswith("[Pod]") for src, _ in into)


def test_notebooks_reach_dns_hub_api_and_portal_only_inside_the_cluster(
    connections: list[Connection],
) -> None:
    for notebook in _tenant_pods():
        to_pods = {c.dst: c.conn for c in connections if c.src == notebook and "[Pod]" in c.dst}
        own = {d for d in to_pods if d.split("/")[0] == notebook.split("/")[0]}
        assert {d: to_pods[d] for d in to_pods if d not in own} == {
            pod(SETTINGS.dns_namespace, "dns"): "{protocols:TCP, UDP,dst_ports:53}",
            pod(HUB, "hub"): f"{{protocols:TCP,dst_ports:{SETTINGS.hub_api_port}}}",
            pod(HUB, "portal"): f"{{protocols:TCP,dst_ports:{SETTINGS.portal_api_port}}}",
        }


@pytest.mark.parametrize("address", DENIED, ids=["metadata", "api-server"])
def test_metadata_and_api_server_stay_denied_even_with_internet_egress(
    connections: list[Connection], address: str
) -> None:
    reaching = [c for c in connections if c.src in _tenant_pods() and _covers(c.dst, address)]
    assert reaching == []


def test_internet_egress_follows_the_tenant_setting(connections: list[Connection]) -> None:
    public = "8.8.8.8"
    reach = {c.src for c in connections if _covers(c.dst, public)}
    assert {pod(NS_A, "nb-a1"), pod(NS_A, "nb-a2")} <= reach
    assert not {pod(NS_B, "nb-b1"), pod(NS_B, "nb-b2")} & reach
