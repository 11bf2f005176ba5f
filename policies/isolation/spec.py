"""Typed, frozen inputs of the isolation manifest builders: one tenant, and the cluster settings.

Both validate on construction, so a builder never sees a bad value; every error says what was
wrong, with which value, and what would be valid (``policies.errors``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from policies.errors import InvalidRequest, NotFound
from policies.quota import MAX_QUANTITY, validate_flavor_name, validate_tenant_name

MAX_NAMESPACE_LENGTH = 63
_LABEL_KEY_RE = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_LABEL_VALUE_RE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_PREFIX_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,20})?")
_LABEL_PREFIX_RE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,200}[a-z0-9])?/")
_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
# A storage quantity with a binary or decimal suffix: 100Gi, 500G, 1Ti.
_STORAGE_RE = re.compile(r"[1-9][0-9]{0,8}(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?")
_RESOURCE_RE = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[a-z0-9]([-a-z0-9._]*[a-z0-9])?")


def _count(what: str, value: object, low: int = 0, high: int = MAX_QUANTITY) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(what, value, f"an integer from {low} to {high}")
    return value


def _port(what: str, value: object) -> int:
    return _count(what, value, 1, 65535)


def _labels(what: str, labels: object) -> Mapping[str, str]:
    if not isinstance(labels, Mapping) or not labels:
        raise InvalidRequest(what, repr(labels), "a non-empty mapping of label keys to values")
    for key, value in labels.items():
        if not isinstance(key, str) or not _LABEL_KEY_RE.fullmatch(key):
            raise InvalidRequest(f"{what} key", repr(key), "a Kubernetes label key")
        if not isinstance(value, str) or not _LABEL_VALUE_RE.fullmatch(value):
            raise InvalidRequest(f"{what} value", repr(value), "a Kubernetes label value")
    return MappingProxyType(dict(labels))


def _cidr(what: str, value: object) -> str:
    try:
        return str(ipaddress.ip_network(str(value), strict=True))
    except ValueError:
        raise InvalidRequest(
            what, repr(value), "an IPv4 or IPv6 CIDR such as '10.96.0.1/32'"
        ) from None


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """What one tenant may use, as the isolation objects enforce it.

    Attributes:
        name: the tenant (a JupyterHub group); a DNS-1123 label.
        gpu_limits: flavor name -> limit in the flavor's unit (GPUs, MIG instances, milli-GPU),
            usually the tenant's ``FlavorQuota.limit``.
        cpu_millis: total CPU the tenant's pods may request (and be limited to), in milli-CPU.
        memory_mib: total memory the tenant's pods may request (and be limited to), in MiB.
        pods: the most pods the tenant's namespace may hold.
        allow_intra_tenant_traffic: whether the tenant's pods may talk to each other.
        internet_egress: whether the tenant's pods may reach public addresses.
        node_pool: the node pool the tenant's pods are kept on, or ``None`` for any node.
    """

    name: str
    gpu_limits: Mapping[str, int]
    cpu_millis: int
    memory_mib: int
    pods: int
    allow_intra_tenant_traffic: bool = True
    internet_egress: bool = False
    node_pool: str | None = None

    def __post_init__(self) -> None:
        validate_tenant_name(self.name)
        if not isinstance(self.gpu_limits, Mapping):
            raise InvalidRequest("gpu_limits", repr(self.gpu_limits), "a mapping flavor -> limit")
        for flavor, limit in self.gpu_limits.items():
            validate_flavor_name(flavor)
            _count(f"GPU limit for {flavor}", limit)
        _count("cpu_millis", self.cpu_millis)
        _count("memory_mib", self.memory_mib)
        _count("pods", self.pods)
        for flag in ("allow_intra_tenant_traffic", "internet_egress"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidRequest(flag, repr(getattr(self, flag)), "true or false")
        if self.node_pool is not None:
            validate_tenant_name(self.node_pool, "node pool")
        object.__setattr__(self, "gpu_limits", MappingProxyType(dict(self.gpu_limits)))


@dataclass(frozen=True, slots=True)
class IsolationSettings:
    """Cluster-wide settings of the isolation objects (one per installation).

    Attributes:
        hub_namespace: where JupyterHub, its proxy and the portal run (and the portal's
            ServiceAccount lives).
        hub_pod_labels, proxy_pod_labels, portal_pod_labels: labels selecting those pods.
        hub_api_port: JupyterHub's API port (notebooks report activity and authenticate there).
        portal_api_port: the portal service's port (the notebook-side client calls it).
        notebook_port: the port single-user servers listen on; only the hub and proxy reach it.
        inference_port: the port inference replicas' engines listen on; only the portal (its
            gateway) reaches it.
        dns_namespace, dns_pod_labels: the cluster DNS pods (UDP and TCP 53 are allowed there).
        api_server_cidrs: the Kubernetes API's service IP and endpoint addresses, always denied
            to tenant pods (also when they are public).
        metadata_address: the cloud instance-metadata address, always denied.
        private_cidrs: ranges kept out of internet egress (node, pod and service networks).
        namespace_prefix: tenant ``t`` lives in namespace ``<prefix><t>``.
        label_prefix: prefix of our label keys, ending with ``/``.
        admin_group_template: the Kubernetes group of a tenant's admins; ``{tenant}`` is
            replaced by the tenant name.
        jobs_service_account: name of the token-less ServiceAccount tenant pods run as.
        portal_service_account: name of the portal's ServiceAccount (and ClusterRole).
        shared_gpu_resource: the device plugin's resource name for time-sliced GPU shares.
        shared_gpu_replicas: shares per GPU the device plugin advertises (its ``replicas``).
        dra_gpu_device_class, dra_mig_device_class: the DeviceClasses of whole GPUs and MIG
            devices in DRA claims (NVIDIA's DRA driver's names by default); the quota caps the
            devices a tenant's claims request of each.
        flavors: the flavors this cluster offers, or ``None`` not to check tenant flavors
            against a catalogue. With a catalogue, MIG profiles a tenant has no quota for get a
            quota of 0.
        default_cpu_request_millis, default_memory_request_mib, default_cpu_limit_millis,
        default_memory_limit_mib: LimitRange defaults of containers that name none.
        checkpoint_claim: the PersistentVolumeClaim in each tenant namespace that training
            jobs' ``checkpoint_dir`` is mounted from (one sub-path per job); the portal creates
            it when a tenant's first job with a ``checkpoint_dir`` starts, or uses the claim
            of that name an admin made.
        checkpoint_claim_size, checkpoint_storage_class: the size and StorageClass of a claim
            the portal creates (``""``: the cluster's default class). It asks ReadWriteMany:
            a job's members on several nodes write to it at once.
    """

    hub_namespace: str = "gpuportal"
    hub_pod_labels: Mapping[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/component": "hub"}
    )
    proxy_pod_labels: Mapping[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/component": "proxy"}
    )
    portal_pod_labels: Mapping[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/component": "portal"}
    )
    hub_api_port: int = 8081
    portal_api_port: int = 8000
    notebook_port: int = 8888
    inference_port: int = 8080
    dns_namespace: str = "kube-system"
    dns_pod_labels: Mapping[str, str] = field(default_factory=lambda: {"k8s-app": "kube-dns"})
    api_server_cidrs: tuple[str, ...] = ("10.96.0.1/32",)
    metadata_address: str = "169.254.169.254"
    private_cidrs: tuple[str, ...] = (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "169.254.0.0/16",
    )
    namespace_prefix: str = "gp-"
    label_prefix: str = "gpuportal.io/"
    admin_group_template: str = "gpuportal:{tenant}-admins"
    jobs_service_account: str = "tenant-jobs"
    portal_service_account: str = "gpuportal"
    shared_gpu_resource: str = "nvidia.com/gpu.shared"
    shared_gpu_replicas: int = 10
    dra_gpu_device_class: str = "gpu.nvidia.com"
    dra_mig_device_class: str = "mig.nvidia.com"
    flavors: frozenset[str] | None = None
    default_cpu_request_millis: int = 100
    default_memory_request_mib: int = 256
    default_cpu_limit_millis: int = 1000
    default_memory_limit_mib: int = 1024
    checkpoint_claim: str = "gpuportal-checkpoints"
    checkpoint_claim_size: str = "100Gi"
    checkpoint_storage_class: str = ""

    def __post_init__(self) -> None:
        for what in ("hub_namespace", "dns_namespace"):
            validate_tenant_name(getattr(self, what), what)
        for what in ("jobs_service_account", "portal_service_account", "checkpoint_claim"):
            validate_tenant_name(getattr(self, what), what)
        if not isinstance(self.checkpoint_claim_size, str) or not _STORAGE_RE.fullmatch(
            self.checkpoint_claim_size
        ):
            raise InvalidRequest(
                "checkpoint_claim_size",
                repr(self.checkpoint_claim_size),
                "a storage size such as '100Gi' or '500G'",
            )
        if not isinstance(self.checkpoint_storage_class, str) or not (
            self.checkpoint_storage_class == ""
            or _SUBDOMAIN_RE.fullmatch(self.checkpoint_storage_class)
        ):
            raise InvalidRequest(
                "checkpoint_storage_class",
                repr(self.checkpoint_storage_class),
                "a StorageClass name, or '' for the cluster's default",
            )
        for what in ("hub_pod_labels", "proxy_pod_labels", "portal_pod_labels", "dns_pod_labels"):
            object.__setattr__(self, what, _labels(what, getattr(self, what)))
        for what in ("hub_api_port", "portal_api_port", "notebook_port", "inference_port"):
            _port(what, getattr(self, what))
        if not self.api_server_cidrs:
            raise InvalidRequest("api_server_cidrs", "()", "at least the API server's service IP")
        object.__setattr__(
            self,
            "api_server_cidrs",
            tuple(_cidr("api_server_cidrs", c) for c in self.api_server_cidrs),
        )
        object.__setattr__(
            self, "private_cidrs", tuple(_cidr("private_cidrs", c) for c in self.private_cidrs)
        )
        try:
            ipaddress.ip_address(self.metadata_address)
        except ValueError:
            raise InvalidRequest(
                "metadata_address", repr(self.metadata_address), "an IP address"
            ) from None
        if not isinstance(self.namespace_prefix, str) or not _PREFIX_RE.fullmatch(
            self.namespace_prefix
        ):
            raise InvalidRequest(
                "namespace_prefix",
                repr(self.namespace_prefix),
                "up to 21 characters of a-z, 0-9 or '-', starting with a letter or digit",
            )
        if not isinstance(self.label_prefix, str) or not _LABEL_PREFIX_RE.fullmatch(
            self.label_prefix
        ):
            raise InvalidRequest(
                "label_prefix", repr(self.label_prefix), "a DNS subdomain followed by '/'"
            )
        if "{tenant}" not in self.admin_group_template:
            raise InvalidRequest(
                "admin_group_template",
                repr(self.admin_group_template),
                "a group name containing '{tenant}', such as 'gpuportal:{tenant}-admins'",
            )
        if not _RESOURCE_RE.fullmatch(self.shared_gpu_resource):
            raise InvalidRequest(
                "shared_gpu_resource",
                repr(self.shared_gpu_resource),
                "an extended resource name such as 'nvidia.com/gpu.shared'",
            )
        _count("shared_gpu_replicas", self.shared_gpu_replicas, 1, 1000)
        for what in ("dra_gpu_device_class", "dra_mig_device_class"):
            value = getattr(self, what)
            if not isinstance(value, str) or not _SUBDOMAIN_RE.fullmatch(value):
                raise InvalidRequest(
                    what, repr(value), "a DeviceClass name (a DNS subdomain, e.g. 'gpu.nvidia.com')"
                )
        for what in (
            "default_cpu_request_millis",
            "default_memory_request_mib",
            "default_cpu_limit_millis",
            "default_memory_limit_mib",
        ):
            _count(what, getattr(self, what), 1)
        if self.default_cpu_limit_millis < self.default_cpu_request_millis:
            raise InvalidRequest(
                "default_cpu_limit_millis",
                self.default_cpu_limit_millis,
                f"at least default_cpu_request_millis ({self.default_cpu_request_millis})",
            )
        if self.default_memory_limit_mib < self.default_memory_request_mib:
            raise InvalidRequest(
                "default_memory_limit_mib",
                self.default_memory_limit_mib,
                f"at least default_memory_request_mib ({self.default_memory_request_mib})",
            )
        if self.flavors is not None:
            for flavor in self.flavors:
                validate_flavor_name(flavor)
            object.__setattr__(self, "flavors", frozenset(self.flavors))

    def namespace(self, tenant: str) -> str:
        """The tenant's namespace; refuses names that would make it longer than 63 characters."""
        validate_tenant_name(tenant)
        name = f"{self.namespace_prefix}{tenant}"
        if len(name) > MAX_NAMESPACE_LENGTH:
            raise InvalidRequest(
                "tenant",
                repr(tenant),
                f"at most {MAX_NAMESPACE_LENGTH - len(self.namespace_prefix)} characters, so "
                f"that namespace '{self.namespace_prefix}<tenant>' stays within "
                f"{MAX_NAMESPACE_LENGTH}",
            )
        return name

    def label(self, key: str) -> str:
        return f"{self.label_prefix}{key}"

    def admin_group(self, tenant: str) -> str:
        return self.admin_group_template.replace("{tenant}", tenant)

    def check_flavors(self, spec: TenantSpec) -> None:
        """Refuse flavors outside the cluster's catalogue (when it has one)."""
        if self.flavors is None:
            return
        for flavor in spec.gpu_limits:
            if flavor not in self.flavors:
                raise NotFound("flavor", flavor, sorted(self.flavors))
