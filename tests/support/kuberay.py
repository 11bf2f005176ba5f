"""The real KubeRay operator against the test apiserver, for the tests that need it.

``kuberay_operator`` (session scope, started only when a test asks for it) installs the
operator's CRDs (RayCluster, RayJob, RayService: it runs a controller for each and will not
start without all three) from the bin folder that ``scripts/build-k8s-tools`` fills from the
pinned module, then runs ``kuberay-operator`` with the admin kubeconfig, leader election off
and its metrics and health endpoints on free loopback ports. It is stopped (its process group,
SIGTERM then SIGKILL) at the end of the session, also when the session dies (parent-death
signal, like the control plane's components).
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from tests.support.k8s import (
    READY_TIMEOUT_S,
    Component,
    K8sCluster,
    http_ok,
    log_tail,
    start_component,
)
from tests.support.ports import LOOPBACK, free_port

OPERATOR = "kuberay-operator"
CRDS = ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml")


@dataclass
class KubeRayOperator:
    """A running operator: its process (``component``) and its health endpoint."""

    component: Component
    health: str

    def running(self) -> bool:
        return self.component.running()

    def stop(self) -> None:
        self.component.stop()


def _load_crd(path: Path) -> dict[str, Any]:
    # The CRDs are megabytes of YAML: the C loader reads them in a fraction of the time.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open() as f:
        return cast(dict[str, Any], yaml.load(f, Loader=loader))


def install_crds(cluster: K8sCluster, timeout_s: float = 30.0) -> None:
    """Create the operator's CRDs (an existing one is kept) and wait until each is served."""
    missing = [c for c in CRDS if not (cluster.bin_dir / c).is_file()]
    if missing:
        pytest.fail(
            f"KubeRay CRDs {', '.join(missing)} missing in {cluster.bin_dir}: run "
            "scripts/build-k8s-tools (it copies them from the pinned module)",
            pytrace=False,
        )
    with cluster.api_client() as api:
        ext = k8s_client.ApiextensionsV1Api(api)
        names = []
        for crd_file in CRDS:
            crd = _load_crd(cluster.bin_dir / crd_file)
            names.append(crd["metadata"]["name"])
            try:
                ext.create_custom_resource_definition(cast(Any, crd), _preload_content=False)
            except ApiException as e:
                if e.status != 409:
                    raise
        deadline = time.monotonic() + timeout_s
        for name in names:
            while True:
                status: Any = ext.read_custom_resource_definition_status(name).status
                conditions = (status.conditions if status else None) or []
                if any(c.type == "Established" and c.status == "True" for c in conditions):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"CRD {name} not Established after {timeout_s} s")
                time.sleep(0.1)


def start_operator(cluster: K8sCluster) -> KubeRayOperator:
    """Install the CRDs and start the operator; returns once it reports ready."""
    binary = cluster.bin_dir / OPERATOR
    if not os.access(binary, os.X_OK):
        pytest.fail(
            f"{OPERATOR} missing in {cluster.bin_dir}: run scripts/build-k8s-tools (it builds "
            "the operator from tools/kuberay/go.mod)",
            pytrace=False,
        )
    install_crds(cluster)
    probe = f"{LOOPBACK}:{free_port()}"
    argv = [
        str(binary),
        "--enable-leader-election=false",
        f"--metrics-addr={LOOPBACK}:{free_port()}",
        f"--health-probe-bind-address={probe}",
        "--log-stdout-encoder=console",
    ]
    component = start_component(
        OPERATOR, argv, cluster.log_dir, env={"KUBECONFIG": str(cluster.admin_kubeconfig)}
    )
    operator = KubeRayOperator(component, f"http://{probe}/readyz")
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not _ready(operator.health):
        if not operator.running() or time.monotonic() > deadline:
            operator.stop()
            raise RuntimeError(
                f"{OPERATOR} did not become ready; its log:\n{log_tail(component.log)}"
            )
        time.sleep(0.1)
    return operator


def _ready(url: str) -> bool:
    try:
        return http_ok(url)
    except OSError:  # not listening yet
        return False


@pytest.fixture(scope="session")
def kuberay_operator(k8s_cluster: K8sCluster) -> Iterator[KubeRayOperator]:
    """The KubeRay operator running against the session's apiserver."""
    operator = start_operator(k8s_cluster)
    atexit.register(operator.stop)
    try:
        yield operator
    finally:
        operator.stop()
        atexit.unregister(operator.stop)
