"""GPU pods from an allocation: pure builders over frozen inputs (no I/O, no mutation).

``place_pod`` turns the pod KubeSpawner would create into the pod the allocator decided on:

- in the tenant's namespace (``IsolationSettings.namespace``), running as the tenant's
  token-less ServiceAccount with ``automountServiceAccountToken: false``;
- placed by the portal: ``schedulerName: gpuportal``, no ``nodeName`` (the binder binds it to
  the allocator's node through the Binding API);
- asking for exactly the allocated devices under the NVIDIA device plugin's names:
  ``nvidia.com/gpu: N`` for whole GPUs, ``nvidia.com/mig-<profile>: 1`` for a MIG instance
  (the plugin's ``mixed`` strategy), the shared resource in replicas for a fractional share;
- labelled with tenant, workload and allocation ids (the binder and the sweep select on them),
  annotated with the node, flavor and devices;
- under the Pod Security ``restricted`` profile: non-root, seccomp ``RuntimeDefault``, no
  privilege escalation, every capability dropped, in every container.

With ``PodSettings.dra`` set (clusters serving ``resource.k8s.io/v1`` with NVIDIA's DRA
driver), whole GPUs and MIG instances are pinned instead by a ResourceClaim (``resource_claim``)
whose CEL selectors name the allocated devices by UUID, and the pod keeps the default
scheduler with a required node affinity to the allocator's node: the kube-scheduler's DRA plugin
then writes the claim's allocation, which can only be those devices. Shares have no DRA form and
always use the counted resource. See docs/kubernetes.md.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from policies.errors import InvalidRequest
from policies.flavors import MILLI_PER_GPU, Flavor, FlavorKind
from policies.isolation import IsolationSettings, Manifest
from policies.isolation.podsecurity import RUNTIME_DEFAULT_SECCOMP, restricted_container_context
from policies.quota import validate_tenant_name
from portal.kube.keys import SCHEDULER_NAME, PodKeys

WHOLE_GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
GPU_RESOURCE_PREFIX = "nvidia.com/"
CLAIM_REFERENCE = "gpus"
"""Name of the pod's ``resourceClaims`` entry (and the container's claim reference)."""

_ID_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_ID_VALID = "1 to 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric"
_UUID_RE = re.compile(r"(GPU|MIG)-[A-Za-z0-9-]{1,64}")
_NODE_RE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def _label_value(what: str, value: object) -> str:
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise InvalidRequest(what, repr(value), _ID_VALID)
    return value


class AllocationLike(Protocol):
    """An allocation's fields a pod needs (``AllocationRecord``, the API's ``AllocationOut``)."""

    @property
    def id(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def flavor(self) -> str: ...
    @property
    def gpus(self) -> Sequence[int]: ...
    @property
    def gpu_uuids(self) -> Sequence[str]: ...
    @property
    def milli(self) -> int: ...


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """One allocation (one gang member's devices on one node), as a pod needs it.

    Attributes:
        tenant: the tenant charged; decides the namespace.
        workload_id: the allocator's workload id.
        allocation_id: the allocation this pod uses.
        node: the node the allocator chose.
        flavor: the canonical flavor name (``H100-80GB``, ``A100-80GB/3g.40gb``, ``T4/share``).
        gpus: GPU indices on the node.
        gpu_uuids: the GPUs' UUIDs, in the order of ``gpus`` (empty when unknown; DRA needs
            them).
        milli: for a share, the milli-GPU on its one GPU; 1000 otherwise.
    """

    tenant: str
    workload_id: str
    allocation_id: str
    node: str
    flavor: str
    gpus: tuple[int, ...]
    gpu_uuids: tuple[str, ...] = ()
    milli: int = MILLI_PER_GPU
    kind: FlavorKind = field(init=False)
    mig_profile: str | None = field(init=False)

    def __post_init__(self) -> None:
        validate_tenant_name(self.tenant)
        _label_value("workload id", self.workload_id)
        _label_value("allocation id", self.allocation_id)
        if not isinstance(self.node, str) or not _NODE_RE.fullmatch(self.node):
            raise InvalidRequest("node", repr(self.node), "a Kubernetes node name")
        parsed = Flavor.parse(self.flavor)
        gpus = tuple(self.gpus)
        uuids = tuple(self.gpu_uuids)
        if not gpus or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpus):
            raise InvalidRequest("gpus", repr(self.gpus), "one or more GPU indices (>= 0)")
        if len(set(gpus)) != len(gpus):
            raise InvalidRequest("gpus", repr(self.gpus), "distinct GPU indices")
        if uuids and len(uuids) != len(gpus):
            raise InvalidRequest(
                "gpu_uuids", repr(self.gpu_uuids), f"{len(gpus)} UUIDs (one per GPU) or none"
            )
        for uuid in uuids:
            if not isinstance(uuid, str) or not _UUID_RE.fullmatch(uuid):
                raise InvalidRequest("GPU UUID", repr(uuid), "'GPU-…' or 'MIG-…' as NVML names it")
        if parsed.kind is not FlavorKind.GPU and len(gpus) != 1:
            raise InvalidRequest(
                "gpus", repr(self.gpus), f"exactly one GPU for a {parsed.kind.value} flavor"
            )
        if parsed.kind is FlavorKind.SHARE:
            if not 0 < self.milli < MILLI_PER_GPU:
                raise InvalidRequest(
                    "milli", self.milli, f"1 to {MILLI_PER_GPU - 1} for a share of one GPU"
                )
        elif self.milli != MILLI_PER_GPU:
            raise InvalidRequest("milli", self.milli, f"{MILLI_PER_GPU} for a whole GPU or MIG")
        object.__setattr__(self, "gpus", gpus)
        object.__setattr__(self, "gpu_uuids", uuids)
        object.__setattr__(self, "kind", parsed.kind)
        object.__setattr__(self, "mig_profile", parsed.profile)

    @staticmethod
    def of(tenant: str, workload_id: str, allocation: AllocationLike) -> PodPlacement:
        """From an allocation as the allocator or the portal API gives it. UUIDs count only
        when every GPU has one (inventories built from node labels know none)."""
        uuids = tuple(allocation.gpu_uuids)
        # The allocator records milli for shares only (MIG allocations carry 0).
        share = Flavor.parse(allocation.flavor).kind is FlavorKind.SHARE
        return PodPlacement(
            tenant=tenant,
            workload_id=workload_id,
            allocation_id=allocation.id,
            node=allocation.node,
            flavor=allocation.flavor,
            gpus=tuple(allocation.gpus),
            gpu_uuids=uuids if uuids and all(uuids) else (),
            milli=allocation.milli if share else MILLI_PER_GPU,
        )


@dataclass(frozen=True, slots=True)
class DraSettings:
    """How to pin devices with DRA (NVIDIA's DRA driver names by default).

    Attributes:
        driver: the driver whose device attributes the selectors read (``uuid``,
            ``parentUUID``, ``profile``).
        gpu_device_class: DeviceClass of whole GPUs.
        mig_device_class: DeviceClass of MIG devices.
    """

    driver: str = "gpu.nvidia.com"
    gpu_device_class: str = "gpu.nvidia.com"
    mig_device_class: str = "mig.nvidia.com"


@dataclass(frozen=True, slots=True)
class PodSettings:
    """Cluster-wide settings of GPU pods.

    Attributes:
        isolation: the tenant isolation settings (namespace and label naming, the shared GPU
            resource and its replicas, the tenant ServiceAccount).
        container: the container that gets the devices (KubeSpawner's is ``notebook``).
        run_as_user, run_as_group, fs_group: the pod's identity when the pod names none
            (``jovyan`` of the Jupyter images: 1000, group 100).
        dra: pin whole GPUs and MIG instances with a ResourceClaim; ``None``: counted
            device-plugin resources and the portal's scheduler name.
    """

    isolation: IsolationSettings = field(default_factory=IsolationSettings)
    container: str = "notebook"
    run_as_user: int = 1000
    run_as_group: int = 100
    fs_group: int = 100
    dra: DraSettings | None = None

    def __post_init__(self) -> None:
        _label_value("container", self.container)
        for what in ("run_as_user", "run_as_group", "fs_group"):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**31:
                raise InvalidRequest(what, repr(value), "a non-root id from 1 to 2147483647")

    def uses_dra(self, placement: PodPlacement) -> bool:
        """Whether ``placement`` is pinned by a ResourceClaim (never for shares)."""
        return self.dra is not None and placement.kind is not FlavorKind.SHARE


def gpu_resources(placement: PodPlacement, settings: PodSettings) -> dict[str, str]:
    """The device-plugin resource and quantity that counts ``placement``'s devices.

    A share asks for the shared resource in device-plugin replicas, rounded up, as the tenant's
    ResourceQuota counts it (``policies.isolation.gpu_resource_limits``).
    """
    if placement.kind is FlavorKind.GPU:
        return {WHOLE_GPU_RESOURCE: str(len(placement.gpus))}
    if placement.kind is FlavorKind.MIG:
        return {f"{MIG_RESOURCE_PREFIX}{placement.mig_profile}": "1"}
    replicas = settings.isolation.shared_gpu_replicas
    return {settings.isolation.shared_gpu_resource: str(-(-placement.milli * replicas // 1000))}


def claim_name(placement: PodPlacement) -> str:
    """The ResourceClaim's name: one claim per allocation."""
    return f"gpus-{placement.allocation_id}".lower()[:63].rstrip("-.")


def pod_labels(placement: PodPlacement, settings: PodSettings) -> dict[str, str]:
    keys = PodKeys.of(settings.isolation)
    return {
        keys.tenant: placement.tenant,
        keys.workload: placement.workload_id,
        keys.allocation: placement.allocation_id,
    }


def pod_annotations(placement: PodPlacement, settings: PodSettings) -> dict[str, str]:
    keys = PodKeys.of(settings.isolation)
    annotations = {
        keys.workload: placement.workload_id,
        keys.allocation: placement.allocation_id,
        keys.node: placement.node,
        keys.flavor: placement.flavor,
        keys.gpus: ",".join(str(g) for g in placement.gpus),
    }
    if placement.gpu_uuids:
        annotations[keys.gpu_uuids] = ",".join(placement.gpu_uuids)
    return annotations


def _is_gpu_resource(name: str, settings: PodSettings) -> bool:
    return name.startswith(GPU_RESOURCE_PREFIX) or name == settings.isolation.shared_gpu_resource


def _restricted_container(container: dict[str, Any]) -> None:
    """Pod Security ``restricted`` for one container (edits the copy in place)."""
    context = {**(container.get("securityContext") or {}), **restricted_container_context()}
    if context.get("runAsUser") == 0:
        del context["runAsUser"]
    if context.get("runAsNonRoot") is False:
        del context["runAsNonRoot"]
    container["securityContext"] = context


def _pin_to_node(spec: dict[str, Any], node: str) -> None:
    """Required node affinity to ``node``, ANDed into every existing term (terms are ORed)."""
    affinity = spec.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    required["nodeSelectorTerms"] = [
        {**term, "matchFields": [*(term.get("matchFields") or []), pin]} for term in terms
    ]


def _isolate(
    out: Manifest,
    tenant: str,
    labels: dict[str, str],
    settings: PodSettings,
    gpu_container: str | None,
) -> dict[str, Any]:
    """Namespace, labels, identity and restricted security of ``out`` (edited in place); GPU
    resources refused in every container but ``gpu_container``. Returns the spec."""
    iso = settings.isolation
    meta = out.setdefault("metadata", {})
    meta["namespace"] = iso.namespace(tenant)
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    spec: dict[str, Any] = out.setdefault("spec", {})
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = container.get("resources") or {}
        if container.get("name") != gpu_container:
            asked = sorted(
                r
                for part in ("limits", "requests")
                for r in resources.get(part) or {}
                if _is_gpu_resource(r, settings)
            )
            if asked:
                valid = (
                    f"no GPU resources outside container {gpu_container!r}, the one the "
                    "allocation is for"
                    if gpu_container is not None
                    else "no GPU resources in a pod without a GPU allocation"
                )
                raise InvalidRequest(
                    f"resources of container {container.get('name')!r}", ", ".join(asked), valid
                )
        _restricted_container(container)
    context = dict(spec.get("securityContext") or {})
    if not context.get("runAsUser"):
        context["runAsUser"] = settings.run_as_user
    context.setdefault("runAsGroup", settings.run_as_group)
    context.setdefault("fsGroup", settings.fs_group)
    context["runAsNonRoot"] = True
    context["seccompProfile"] = dict(RUNTIME_DEFAULT_SECCOMP)
    spec["securityContext"] = context
    spec["serviceAccountName"] = iso.jobs_service_account
    spec.pop("serviceAccount", None)  # the deprecated alias would contradict the name above
    spec["automountServiceAccountToken"] = False
    return spec


def tenant_pod(pod: Manifest, tenant: str, settings: PodSettings) -> Manifest:
    """A pod without GPUs (a CPU-only server) of ``tenant``: its namespace, ServiceAccount and
    the restricted security context, placed by the default scheduler. ``pod`` is unchanged.

    Raises ``InvalidRequest`` when a container asks for GPU resources.
    """
    out = copy.deepcopy(pod)
    labels = {PodKeys.of(settings.isolation).tenant: validate_tenant_name(tenant)}
    _isolate(out, tenant, labels, settings, gpu_container=None)
    return out


def place_pod(pod: Manifest, placement: PodPlacement, settings: PodSettings) -> Manifest:
    """The pod ``pod`` becomes under ``placement`` (see the module doc); ``pod`` is unchanged.

    Raises ``InvalidRequest`` when the pod has no container named ``settings.container``, or
    another container asks for GPU resources (the allocation covers one container).
    """
    out = copy.deepcopy(pod)
    containers = (out.get("spec") or {}).get("containers") or []
    names = [c.get("name") for c in containers]
    if settings.container not in names:
        raise InvalidRequest(
            "GPU container",
            repr(settings.container),
            "the name of one of the pod's containers: " + (", ".join(map(str, names)) or "none"),
        )
    spec = _isolate(
        out, placement.tenant, pod_labels(placement, settings), settings, settings.container
    )
    meta = out["metadata"]
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        **pod_annotations(placement, settings),
    }

    gpu_container = containers[names.index(settings.container)]
    resources = dict(gpu_container.get("resources") or {})
    for part in ("limits", "requests"):
        current = resources.get(part) or {}
        kept = {k: v for k, v in current.items() if not _is_gpu_resource(k, settings)}
        if not settings.uses_dra(placement):
            # Extended resources cannot be overcommitted: requests must equal limits.
            kept.update(gpu_resources(placement, settings))
        resources[part] = kept
    spec.pop("nodeName", None)  # the binder (or, with DRA, the kube-scheduler) picks the node
    if settings.uses_dra(placement):
        claims = [c for c in resources.get("claims") or [] if c.get("name") != CLAIM_REFERENCE]
        resources["claims"] = [*claims, {"name": CLAIM_REFERENCE}]
        pod_claims = [c for c in spec.get("resourceClaims") or [] if c["name"] != CLAIM_REFERENCE]
        spec["resourceClaims"] = [
            *pod_claims,
            {"name": CLAIM_REFERENCE, "resourceClaimName": claim_name(placement)},
        ]
        spec.pop("schedulerName", None)
        _pin_to_node(spec, placement.node)
    else:
        spec["schedulerName"] = SCHEDULER_NAME
    gpu_container["resources"] = resources
    return out


def resource_claim(placement: PodPlacement, settings: PodSettings) -> Manifest:
    """The ResourceClaim (``resource.k8s.io/v1``) pinning ``placement``'s devices by UUID.

    Whole GPUs: one request per GPU selecting its ``uuid``. MIG: one request selecting an
    instance of the profile on the allocated GPU (``parentUUID``): the slot inside the GPU is
    the driver's choice, since a MIG instance's own UUID exists only once it is created.
    Raises ``InvalidRequest`` without DRA settings, for shares, or without GPU UUIDs.
    """
    dra = settings.dra
    if dra is None or placement.kind is FlavorKind.SHARE:
        raise InvalidRequest(
            "DRA claim",
            f"flavor {placement.flavor}",
            "DRA settings and a whole-GPU or MIG flavor (shares use the counted resource)",
        )
    if not placement.gpu_uuids:
        raise InvalidRequest(
            "gpu_uuids", "()", "the allocated GPUs' UUIDs: DRA selectors pin devices by UUID"
        )
    attributes = f'device.attributes["{dra.driver}"]'
    requests: list[dict[str, Any]] = []
    if placement.kind is FlavorKind.GPU:
        for i, uuid in enumerate(placement.gpu_uuids):
            expression = f'{attributes}.uuid == "{uuid}"'
            requests.append(_claim_request(f"gpu-{i}", dra.gpu_device_class, expression))
    else:
        expression = (
            f'{attributes}.parentUUID == "{placement.gpu_uuids[0]}" && '
            f'{attributes}.profile == "{placement.mig_profile}"'
        )
        requests.append(_claim_request("mig", dra.mig_device_class, expression))
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": claim_name(placement),
            "namespace": settings.isolation.namespace(placement.tenant),
            "labels": pod_labels(placement, settings),
            "annotations": pod_annotations(placement, settings),
        },
        "spec": {"devices": {"requests": requests}},
    }


def _claim_request(name: str, device_class: str, expression: str) -> dict[str, Any]:
    return {
        "name": name,
        "exactly": {
            "deviceClassName": device_class,
            "allocationMode": "ExactCount",
            "count": 1,
            "selectors": [{"cel": {"expression": expression}}],
        },
    }
