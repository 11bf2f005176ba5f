"""The rendered chart against the real kube-apiserver: every object accepted, every pod admitted
at the Pod Security level it claims, and the agent held to its own Node by the chart's
ValidatingAdmissionPolicy."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from tests.helm.chart import CHART, PRODUCTION_VALUES, Helm, Manifest, named, pod_templates
from tests.support import gpu_nodes
from tests.support.k8s import K8sCluster

pytestmark = pytest.mark.k8s

FIELD_MANAGER = "gpuportal-chart-test"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
PRIVILEGED = {"pod-security.kubernetes.io/enforce": "privileged"}
RUNTIME_CLASS = "nvidia"
# Values that give the chart's Secrets something to hold, as an installation would.
TOKENS = {
    "tokens.portal": '"portal-token"',
    "tokens.agent": '"agent-token"',
    "tokens.dashboards": '"dashboards-token"',
}


def status_message(error: ApiException) -> str:
    return str(json.loads(error.body or "{}").get("message", error.body))


def apply(dyn: DynamicClient, obj: Manifest, namespace: str, dry_run: bool = False) -> Any:
    """Server-side apply, as `kubectl apply --server-side` (and the portal's reconciler) do."""
    resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    kwargs: dict[str, Any] = {"field_manager": FIELD_MANAGER, "force_conflicts": True}
    if dry_run:
        kwargs["dry_run"] = "All"
    return resource.server_side_apply(
        body=obj, namespace=namespace if resource.namespaced else None, **kwargs
    )


def as_pod(name: str, template: Manifest, namespace: str) -> Manifest:
    """A Pod from a workload's pod template: Pod Security enforces on pods, not workloads."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": name, "namespace": namespace},
        "spec": template["spec"],
    }


@dataclass
class Installed:
    """The chart applied for real in ``namespace`` (release ``gpuportal``)."""

    namespace: str
    objects: list[Manifest]
    dyn: DynamicClient
    # CoreV1Api; typed Any because its hints want models and we send plain dicts.
    core: Any


@pytest.fixture(scope="module")
def installed(k8s_cluster: K8sCluster, helm: Helm) -> Iterator[Installed]:
    namespace = f"chart-{uuid.uuid4().hex[:6]}"
    k8s_cluster.create_namespace(namespace, RESTRICTED)
    sets = {
        **TOKENS,
        # Without hostPID every pod of this release claims "restricted".
        "agent.hostPID": "false",
        # Keep the DaemonSet's pods off the GPU nodes other tests of the session count pods on.
        "agent.nodeSelector": json.dumps({"gpuportal.io/chart-test": namespace}),
    }
    objects = helm.render(namespace=namespace, sets=sets)
    with k8s_cluster.api_client() as api:
        dyn = DynamicClient(api)  # type: ignore[no-untyped-call]
        node_api: Any = client.NodeV1Api(api)
        # The GPU Operator's RuntimeClass, which the agent's pods name.
        made_runtime_class = False
        try:
            node_api.read_runtime_class(RUNTIME_CLASS)
        except ApiException as missing:
            assert missing.status == 404
            node_api.create_runtime_class(
                {
                    "apiVersion": "node.k8s.io/v1",
                    "kind": "RuntimeClass",
                    "metadata": {"name": RUNTIME_CLASS},
                    "handler": RUNTIME_CLASS,
                }
            )
            made_runtime_class = True
        try:
            for obj in objects:
                apply(dyn, obj, namespace)
            yield Installed(namespace, objects, dyn, client.CoreV1Api(api))
        finally:
            for obj in reversed(objects):
                resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
                if not resource.namespaced:
                    resource.delete(name=obj["metadata"]["name"])
            client.CoreV1Api(api).delete_namespace(namespace)
            if made_runtime_class:
                node_api.delete_runtime_class(RUNTIME_CLASS)


def test_every_rendered_object_is_created_by_the_apiserver(installed: Installed) -> None:
    for obj in installed.objects:
        resource = installed.dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        namespace = installed.namespace if resource.namespaced else None
        live = resource.get(name=obj["metadata"]["name"], namespace=namespace)
        assert live.metadata.labels["app.kubernetes.io/instance"] == "gpuportal"
    live_role = installed.dyn.resources.get(
        api_version="rbac.authorization.k8s.io/v1", kind="ClusterRole"
    ).get(name="gpuportal")
    assert (
        live_role.to_dict()["rules"]
        == named(installed.objects, "ClusterRole", "gpuportal")["rules"]
    )


def test_production_values_are_accepted_with_server_side_dry_run(
    k8s_cluster: K8sCluster, helm: Helm, installed: Installed
) -> None:
    namespace = f"chart-prod-{uuid.uuid4().hex[:6]}"
    k8s_cluster.create_namespace(namespace, PRIVILEGED)
    try:
        objects = helm.render(release="prod", namespace=namespace, values_files=[PRODUCTION_VALUES])
        for obj in objects:
            answer = apply(installed.dyn, obj, namespace, dry_run=True)
            assert answer.metadata.name == obj["metadata"]["name"]
        # Dry run: nothing was stored.
        with pytest.raises(ApiException) as missing:
            installed.core.read_namespaced_service("prod-gpuportal", namespace)
        assert missing.value.status == 404
    finally:
        installed.core.delete_namespace(namespace)


def test_every_pod_is_admitted_in_a_restricted_namespace(installed: Installed) -> None:
    templates = pod_templates(installed.objects)
    assert set(templates) == {"gpuportal", "gpuportal-agent", "gpuportal-dashboards"}
    for name, template in templates.items():
        pod = as_pod(f"{name}-probe", template, installed.namespace)
        created = installed.core.create_namespaced_pod(installed.namespace, pod, dry_run="All")
        assert created.metadata.name == f"{name}-probe"


def test_a_pod_that_breaks_restricted_is_refused_there(installed: Installed) -> None:
    # The check above can fail: the same portal pod, running as root, is refused.
    template = pod_templates(installed.objects)["gpuportal"]
    spec = {**template["spec"], "securityContext": {"runAsNonRoot": False, "runAsUser": 0}}
    pod = as_pod("root-probe", {**template, "spec": spec}, installed.namespace)
    with pytest.raises(ApiException) as refused:
        installed.core.create_namespaced_pod(installed.namespace, pod, dry_run="All")
    assert refused.value.status == 403
    assert 'violates PodSecurity "restricted:latest"' in status_message(refused.value)


def test_the_hostpid_agent_needs_a_privileged_namespace(
    k8s_cluster: K8sCluster, helm: Helm, installed: Installed
) -> None:
    objects = helm.render(namespace=installed.namespace)  # agent.hostPID defaults to true
    template = pod_templates(objects)["gpuportal-agent"]
    with pytest.raises(ApiException) as refused:
        installed.core.create_namespaced_pod(
            installed.namespace, as_pod("agent-probe", template, installed.namespace), dry_run="All"
        )
    assert refused.value.status == 403
    assert "hostPID=true" in status_message(refused.value)

    privileged = f"chart-agent-{uuid.uuid4().hex[:6]}"
    k8s_cluster.create_namespace(privileged, PRIVILEGED)
    try:
        spec = {**template["spec"], "serviceAccountName": "default"}
        pod = as_pod("agent-probe", {**template, "spec": spec}, privileged)
        created = installed.core.create_namespaced_pod(privileged, pod, dry_run="All")
        assert created.spec.host_pid is True
    finally:
        installed.core.delete_namespace(privileged)


# --- the agent and its own Node ---------------------------------------------------------------


def agent_client(k8s_cluster: K8sCluster, token: str) -> client.ApiClient:
    config = client.Configuration()
    config.host = k8s_cluster.server
    config.ssl_ca_cert = str(k8s_cluster.ca_path)
    config.api_key = {"authorization": token}
    config.api_key_prefix = {"authorization": "Bearer"}
    config.proxy = None
    return client.ApiClient(config)


def annotate(core: Any, node: str, key: str, value: str) -> None:
    core.patch_node(node, {"metadata": {"annotations": {key: value}}})


def wait_for_policy(agent: Any, other_node: str, timeout_s: float = 30.0) -> None:
    """Until the apiserver enforces the agent's ValidatingAdmissionPolicy: it loads new
    policies asynchronously, so a request right after the chart is applied may pass unchecked.
    Probed with a dry run, which admission sees and nothing stores."""
    body = {"metadata": {"annotations": {"gpuportal.io/topology": "{}"}}}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            agent.patch_node(other_node, body, dry_run="All")
        except ApiException as refused:
            if "only the Node its own pod runs on" in status_message(refused):
                return
        assert time.monotonic() < deadline, "the agent's admission policy never took effect"
        time.sleep(0.2)


def test_the_agent_may_annotate_only_its_own_node(
    k8s_cluster: K8sCluster, installed: Installed
) -> None:
    suffix = uuid.uuid4().hex[:6]
    own, other = f"chart-gpu-a-{suffix}", f"chart-gpu-b-{suffix}"
    for name in (own, other):
        k8s_cluster.add_gpu_node(gpu_nodes.t4_pcie_node(name))
    try:
        # A pod of the agent's ServiceAccount on `own`; its bound token names that node.
        template = pod_templates(installed.objects)["gpuportal-agent"]
        spec = {**template["spec"], "nodeName": own}
        # Labels of its own: with the DaemonSet's, its controller would adopt and delete it.
        probe = {"metadata": {"labels": {"probe": "agent-own"}}, "spec": spec}
        agent_pod = as_pod("agent-own", probe, installed.namespace)
        pod = installed.core.create_namespaced_pod(installed.namespace, agent_pod)
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[],
                expiration_seconds=600,
                bound_object_ref=client.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name="agent-own", uid=pod.metadata.uid
                ),
            )
        )
        token = installed.core.create_namespaced_service_account_token(
            "gpuportal-agent", installed.namespace, request
        ).status.token

        with agent_client(k8s_cluster, token) as api:
            agent: Any = client.CoreV1Api(api)
            wait_for_policy(agent, other)
            annotate(agent, own, "gpuportal.io/topology", '{"v":1}')
            assert (
                installed.core.read_node(own).metadata.annotations["gpuportal.io/topology"]
                == '{"v":1}'
            )

            with pytest.raises(ApiException) as other_node:
                annotate(agent, other, "gpuportal.io/topology", '{"v":1}')
            assert other_node.value.status in (403, 422)
            assert "only the Node its own pod runs on" in status_message(other_node.value)

            with pytest.raises(ApiException) as other_key:
                annotate(agent, own, "example.com/owner", "agent")
            assert "only the gpuportal.io/topology annotation" in status_message(other_key.value)

            with pytest.raises(ApiException) as label:
                agent.patch_node(own, {"metadata": {"labels": {"nvidia.com/gpu.present": "no"}}})
            assert "only the gpuportal.io/topology annotation" in status_message(label.value)

            with pytest.raises(ApiException) as unschedulable:
                agent.patch_node(own, {"spec": {"unschedulable": True}})
            assert "only the gpuportal.io/topology annotation" in status_message(
                unschedulable.value
            )

            # RBAC: nothing beyond patching nodes and listing pods.
            with pytest.raises(ApiException) as read:
                agent.read_node(own)
            assert read.value.status == 403
            pods = agent.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={own}")
            assert [p.metadata.name for p in pods.items] == ["agent-own"]

        # Others (the admin here) are not bound by the agent's policy.
        annotate(installed.core, other, "example.com/owner", "ops")
    finally:
        for name in (own, other):
            installed.core.delete_node(name)


# --- helm itself against the apiserver ----------------------------------------------------------


def test_helm_installs_and_uninstalls_the_release(
    k8s_cluster: K8sCluster, helm: Helm, installed: Installed
) -> None:
    namespace = f"chart-helm-{uuid.uuid4().hex[:6]}"
    k8s_cluster.create_namespace(namespace, PRIVILEGED)
    kubeconfig = ["--kubeconfig", str(k8s_cluster.admin_kubeconfig), "--namespace", namespace]
    try:
        done = helm.run("install", "nb", str(CHART), *kubeconfig)
        assert done.returncode == 0, done.stdout + done.stderr
        # NOTES.txt: where the portal is, and what the default values leave to the operator.
        assert f"http://nb-gpuportal.{namespace}.svc:8000/services/gpuportal" in done.stdout
        assert "which is LOST when the pod is replaced" in done.stdout
        assert "the namespace\n" + namespace in done.stdout  # the hostPID warning names it
        listed = helm.run("list", "--output", "json", *kubeconfig)
        assert [r["status"] for r in json.loads(listed.stdout)] == ["deployed"]
        assert installed.core.read_namespaced_service("nb-gpuportal", namespace)

        gone = helm.run("uninstall", "nb", *kubeconfig)
        assert gone.returncode == 0, gone.stdout + gone.stderr
        roles = installed.dyn.resources.get(
            api_version="rbac.authorization.k8s.io/v1", kind="ClusterRole"
        )
        assert not [r for r in roles.get().items if r.metadata.name.startswith("nb-gpuportal")]
    finally:
        helm.run("uninstall", "nb", "--ignore-not-found", *kubeconfig)
        installed.core.delete_namespace(namespace)
