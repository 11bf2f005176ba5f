"""A replica's pod and its service's headless Service as built, against golden files (the
cluster's side, Pod Security admitting the pod and the binder binding it, is in
``test_kube_services.py``); and what the runner reads back from a pod."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from policies.flavors import FlavorKind
from policies.isolation import IsolationSettings
from policies.requests import DeviceRequest
from policies.services import ModelRef, Replicas
from portal.inference import kubeobjects as ko
from portal.inference.backend import ServiceBackend, replica_launch
from portal.inference.kube import KubeReplicas
from portal.inference.spec import Backend, Engine, Preset, ServiceSpec
from portal.store.records import AllocationRecord

GOLDEN = Path(__file__).parent / "golden"
SETTINGS = IsolationSettings()
SERVICE_ID = "0123456789abcdef0123456789abcdef"
ALLOCATION = AllocationRecord(
    id="a-7",
    workload_id="w-7",
    member=0,
    node="node-1",
    flavor="H100-80GB",
    amount=2,
    gpu_equivalent=2.0,
    gpus=(4, 5),
    gpu_uuids=("GPU-4", "GPU-5"),
    milli=1000,
    cpu_milli=8000,
    memory_mib=32768,
)
SPEC = ServiceSpec(
    tenant="team-a",
    owner="alice",
    name="chat",
    engine=Engine(preset=Preset.VLLM, args=("--max-model-len", "4096")),
    model=ModelRef("hf://org/tiny-llm", "sha256:" + "ab" * 32),
    devices=DeviceRequest(kind=FlavorKind.GPU, count=2),
    replicas=Replicas(min=1, max=2),
)


def golden(name: str) -> Any:
    return yaml.safe_load((GOLDEN / name).read_text())


def pod_manifest() -> dict[str, Any]:
    """Replica 3's pod, from the launch the controller makes with the Kubernetes backend."""
    backend = ServiceBackend(
        Backend.KUBERNETES,
        KubeReplicas(client.ApiClient(), SETTINGS),  # never called: only the launch is built
        Path("unused"),
        port=SETTINGS.inference_port,
        bind=ko.BIND_ALL,
    )
    launch, port = replica_launch(backend, SERVICE_ID, 3, SPEC, ALLOCATION)
    assert port == SETTINGS.inference_port
    assert launch.image == SPEC.engine.resolved.image and launch.tenant == "team-a"
    objects = ko.ReplicaObjects(
        service_id=SERVICE_ID,
        tenant="team-a",
        number=3,
        workload_id=ALLOCATION.workload_id,
        allocation=ALLOCATION,
        image=launch.image,
        command=launch.command,
        env=launch.env,
        health_path=SPEC.engine.resolved.health_path,
    )
    return ko.replica_pod(objects, SETTINGS)


def test_the_replica_pod_matches_the_golden_file() -> None:
    assert pod_manifest() == golden("replica-pod.yaml")


def test_the_headless_service_matches_the_golden_file() -> None:
    built = ko.headless_service(SERVICE_ID, "team-a", SETTINGS)
    assert built == golden("replica-service.yaml")
    # It selects the service's replica pods, and the pods name it as their subdomain.
    labels = pod_manifest()["metadata"]["labels"]
    assert built["spec"]["selector"].items() <= labels.items()
    assert pod_manifest()["spec"]["subdomain"] == built["metadata"]["name"]


def test_the_runner_reads_a_replica_and_its_readiness_from_the_pod() -> None:
    pod = pod_manifest()
    pod["metadata"]["uid"] = "u-1"
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    view = ko.replica_pod_view(pod, SETTINGS)
    assert view is not None
    assert (view.service_id, view.number, view.namespace, view.ready) == (
        SERVICE_ID,
        3,
        "gp-team-a",
        True,
    )
    pod["status"] = {
        "phase": "Failed",
        "containerStatuses": [{"name": "engine", "state": {"terminated": {"exitCode": 3}}}],
    }
    failed = ko.replica_pod_view(pod, SETTINGS)
    assert failed is not None and (failed.finished, failed.exit_code, failed.ready) == (
        True,
        3,
        False,
    )
    # A pod without the service's labels is not a replica.
    del pod["metadata"]["labels"][SETTINGS.label("replica")]
    assert ko.replica_pod_view(pod, SETTINGS) is None
