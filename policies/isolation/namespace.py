"""The tenant's Namespace, ResourceQuota and LimitRange."""

from __future__ import annotations

from collections import Counter

from policies.flavors import MILLI_PER_GPU, Flavor, FlavorKind
from policies.isolation.common import Manifest, cpu_quantity, memory_quantity, metadata
from policies.isolation.spec import IsolationSettings, TenantSpec

WHOLE_GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
DRA_QUOTA_SUFFIX = "deviceclass.resource.k8s.io/devices"
POD_SECURITY_LEVEL = "restricted"
NODE_SELECTOR_ANNOTATION = "scheduler.alpha.kubernetes.io/node-selector"
QUOTA_NAME = "tenant-quota"
LIMIT_RANGE_NAME = "tenant-defaults"


def namespace(spec: TenantSpec, settings: IsolationSettings) -> Manifest:
    """The tenant's namespace, enforcing (and warning on) Pod Security ``restricted``.

    A node pool becomes a label and the ``PodNodeSelector`` annotation: the allocator places
    only on the pool, and clusters with that admission plugin enforce it for any pod.
    """
    meta = metadata(settings, settings.namespace(spec.name), spec.name)
    meta["labels"].update(
        {
            "pod-security.kubernetes.io/enforce": POD_SECURITY_LEVEL,
            "pod-security.kubernetes.io/enforce-version": "latest",
            "pod-security.kubernetes.io/warn": POD_SECURITY_LEVEL,
            "pod-security.kubernetes.io/warn-version": "latest",
        }
    )
    if spec.node_pool is not None:
        pool_label = settings.label("node-pool")
        meta["labels"][pool_label] = spec.node_pool
        meta["annotations"] = {NODE_SELECTOR_ANNOTATION: f"{pool_label}={spec.node_pool}"}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def gpu_resource_limits(spec: TenantSpec, settings: IsolationSettings) -> dict[str, int]:
    """Device-plugin resource name -> the most the tenant's pods may request of it.

    Whole GPUs of every model add up under ``nvidia.com/gpu``: the device plugin's resource
    name does not carry the model, so the per-model limit is the allocator's job and this
    quota only caps the total. MIG profiles map to ``nvidia.com/mig-<profile>`` (the mixed
    strategy; profiles of the same name on different models add up for the same reason).
    Shares map to ``settings.shared_gpu_resource`` in device-plugin replicas, rounded up: the
    backstop must never refuse what the allocator admitted. Resources the tenant has no quota
    for get 0, so that a pod created past the portal cannot take them.
    """
    totals: Counter[str] = Counter({WHOLE_GPU_RESOURCE: 0, settings.shared_gpu_resource: 0})
    for name in settings.flavors or ():
        flavor = Flavor.parse(name)
        if flavor.kind is FlavorKind.MIG:
            totals[f"{MIG_RESOURCE_PREFIX}{flavor.profile}"] += 0
    shared_milli = 0
    for name, limit in spec.gpu_limits.items():
        flavor = Flavor.parse(name)
        if flavor.kind is FlavorKind.GPU:
            totals[WHOLE_GPU_RESOURCE] += limit
        elif flavor.kind is FlavorKind.MIG:
            totals[f"{MIG_RESOURCE_PREFIX}{flavor.profile}"] += limit
        else:
            shared_milli += limit
    replicas = settings.shared_gpu_replicas
    totals[settings.shared_gpu_resource] += -(-shared_milli * replicas // MILLI_PER_GPU)
    return dict(sorted(totals.items()))


def dra_device_limits(spec: TenantSpec, settings: IsolationSettings) -> dict[str, int]:
    """DRA quota name -> the most devices the tenant's ResourceClaims may request of that
    DeviceClass (``<class>.deviceclass.resource.k8s.io/devices``; the apiserver counts a
    claim's requests when it is created). The same totals as the device-plugin resources:
    whole GPUs of every model under the GPU class, every MIG profile under the MIG class.
    Without this, pods whose devices are pinned by a claim ask for no counted GPU resource
    and the quota would not see their GPUs at all."""
    counted = gpu_resource_limits(spec, settings)
    mig = sum(n for res, n in counted.items() if res.startswith(MIG_RESOURCE_PREFIX))
    return {
        f"{settings.dra_gpu_device_class}.{DRA_QUOTA_SUFFIX}": counted[WHOLE_GPU_RESOURCE],
        f"{settings.dra_mig_device_class}.{DRA_QUOTA_SUFFIX}": mig,
    }


def resource_quota(spec: TenantSpec, settings: IsolationSettings) -> Manifest:
    """The apiserver's backstop for the allocator: GPUs per device-plugin resource and per
    DRA device class, CPU, memory and pods. Extended resources only have ``requests.``
    quotas."""
    hard = {f"requests.{res}": str(n) for res, n in gpu_resource_limits(spec, settings).items()}
    hard.update({res: str(n) for res, n in dra_device_limits(spec, settings).items()})
    cpu, memory = cpu_quantity(spec.cpu_millis), memory_quantity(spec.memory_mib)
    hard.update(
        {
            "limits.cpu": cpu,
            "limits.memory": memory,
            "pods": str(spec.pods),
            "requests.cpu": cpu,
            "requests.memory": memory,
        }
    )
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": metadata(settings, QUOTA_NAME, spec.name, settings.namespace(spec.name)),
        "spec": {"hard": dict(sorted(hard.items()))},
    }


def limit_range(spec: TenantSpec, settings: IsolationSettings) -> Manifest:
    """Container defaults: with a CPU/memory quota the apiserver refuses pods that name no
    requests or limits; these defaults let such pods in, counted."""
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": metadata(settings, LIMIT_RANGE_NAME, spec.name, settings.namespace(spec.name)),
        "spec": {
            "limits": [
                {
                    "type": "Container",
                    "defaultRequest": {
                        "cpu": cpu_quantity(settings.default_cpu_request_millis),
                        "memory": memory_quantity(settings.default_memory_request_mib),
                    },
                    "default": {
                        "cpu": cpu_quantity(settings.default_cpu_limit_millis),
                        "memory": memory_quantity(settings.default_memory_limit_mib),
                    },
                }
            ]
        },
    }
