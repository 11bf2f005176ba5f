"""The chart's NetworkPolicies together with the tenant isolation policies, checked by an
independent analyser (network-config-analyzer, see tests/portal/isolation/test_connectivity.py
for how it is installed): the chart's pods plus z2jh's hub and proxy in the release namespace, a
tenant notebook and inference replica, a stranger in another namespace and DNS; the assertions
are on the connections nca computes, not on the YAML."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.isolation import TenantSpec, tenant_manifests
from policies.isolation.network import replica_selector
from tests.helm.chart import CHART as CHART_DIR
from tests.helm.chart import Helm, isolation_of, load_yaml
from tests.portal.isolation.test_connectivity import nca_executable

NAMESPACE = "gpuportal"
VALUES = load_yaml(CHART_DIR / "values.yaml")
TENANT = TenantSpec("team-a", {}, cpu_millis=1, memory_mib=1, pods=1)
TENANT_NS = "gp-team-a"
_LINE = re.compile(r"(?P<src>\S+) => (?P<dst>\S+) : (?P<conn>.+)")


def _namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    all_labels = {"kubernetes.io/metadata.name": name, **(labels or {})}
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": all_labels},
    }


def _pod(name: str, namespace: str, labels: dict[str, str], port: int) -> dict[str, Any]:
    container = {"name": "main", "image": "x", "ports": [{"containerPort": port}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [container]},
    }


def _component(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "gpuportal",
        "app.kubernetes.io/instance": "gpuportal",
        "app.kubernetes.io/component": name,
    }


def cluster_objects(helm: Helm) -> list[dict[str, Any]]:
    rendered = helm.render(namespace=NAMESPACE)
    objects = [o for o in rendered if o["kind"] == "NetworkPolicy"]
    assert objects, "the chart rendered no NetworkPolicy"
    # The tenant policies as the chart's portal builds them, for a hub installed by z2jh.
    settings = isolation_of(rendered)
    assert settings.namespace(TENANT.name) == TENANT_NS
    for manifest in tenant_manifests(TENANT, settings):
        if manifest["kind"] == "Namespace":
            name = manifest["metadata"]["name"]
            manifest["metadata"]["labels"]["kubernetes.io/metadata.name"] = name
        if manifest["kind"] in ("Namespace", "NetworkPolicy"):
            objects.append(manifest)
    objects += [
        _namespace(NAMESPACE),
        _namespace("kube-system"),
        _namespace("elsewhere"),
        _pod("portal", NAMESPACE, _component("portal"), 8000),
        _pod("dashboards", NAMESPACE, _component("dashboards"), 10102),
        _pod("agent", NAMESPACE, _component("agent"), 9999),
        _pod("hub", NAMESPACE, VALUES["hub"]["podLabels"], 8081),
        _pod("proxy", NAMESPACE, VALUES["hub"]["proxyPodLabels"], 8000),
        _pod("notebook", TENANT_NS, {"app": "notebook"}, settings.notebook_port),
        _pod("replica", TENANT_NS, replica_selector(settings), settings.inference_port),
        _pod("stranger", "elsewhere", {"app": "stranger"}, 8080),
        _pod("dns", "kube-system", {"k8s-app": "kube-dns"}, 53),
    ]
    return objects


@dataclass(frozen=True)
class Connection:
    src: str
    dst: str
    conn: str


@pytest.fixture(scope="module")
def connections(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> list[Connection]:
    nca = nca_executable()
    if nca is None:
        pytest.fail(
            "network-config-analyzer is not installed: run scripts/bootstrap test "
            "(see tests/portal/isolation/test_connectivity.py)"
        )
    folder = tmp_path_factory.mktemp("nca-chart")
    Path(folder / "cluster.yaml").write_text(yaml.safe_dump_all(cluster_objects(helm)))
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


def pod(name: str, namespace: str = NAMESPACE) -> str:
    return f"{namespace}/{name}[Pod]"


def tcp(port: int) -> str:
    return f"{{protocols:TCP,dst_ports:{port}}}"


def into(connections: list[Connection], dst: str) -> dict[str, str]:
    """Pods that may connect to ``dst``, with what they may use."""
    return {c.src: c.conn for c in connections if c.dst == dst and c.src.endswith("[Pod]")}


def test_the_portal_is_reached_by_hub_proxy_chart_pods_and_tenant_notebooks_only(
    connections: list[Connection],
) -> None:
    assert into(connections, pod("portal")) == {
        pod("hub"): tcp(8000),
        pod("proxy"): tcp(8000),
        pod("dashboards"): tcp(8000),
        pod("agent"): tcp(8000),
        pod("notebook", TENANT_NS): tcp(8000),
        pod("replica", TENANT_NS): tcp(8000),  # a tenant pod like any other
    }
    # Nor from outside the cluster.
    assert all(c.src.endswith("[Pod]") for c in connections if c.dst == pod("portal"))


def test_the_dashboards_are_reached_through_the_proxy_only(
    connections: list[Connection],
) -> None:
    assert into(connections, pod("dashboards")) == {pod("proxy"): tcp(10102)}
    assert all(c.src.endswith("[Pod]") for c in connections if c.dst == pod("dashboards"))


def test_the_dashboards_reach_dns_the_hub_and_the_portal_only(
    connections: list[Connection],
) -> None:
    reached = {c.dst: c.conn for c in connections if c.src == pod("dashboards")}
    assert reached == {
        pod("dns", "kube-system"): "{protocols:TCP, UDP,dst_ports:53}",
        pod("hub"): tcp(8081),
        pod("portal"): tcp(8000),
    }


def test_the_portal_reaches_dns_and_the_hub_api_among_pods(
    connections: list[Connection],
) -> None:
    to_pods = {
        c.dst: c.conn for c in connections if c.src == pod("portal") and c.dst.endswith("[Pod]")
    }
    assert to_pods == {
        pod("dns", "kube-system"): "{protocols:TCP, UDP,dst_ports:53}",
        pod("hub"): tcp(8081),
        # The gateway: a tenant's inference replica, on its serving port only.
        pod("replica", TENANT_NS): tcp(8080),
    }
