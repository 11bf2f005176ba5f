"""Tenant isolation on Kubernetes as pure manifest builders (no I/O).

``tenant_manifests`` gives everything one tenant needs, namespace first; ``portal_manifests``
gives the portal's own ServiceAccount, ClusterRole and binding (installed by the chart, since
the portal cannot grant itself its permissions). Builders take frozen inputs, never mutate
them and return plain dicts, the JSON the apiserver accepts. See docs/isolation.md.
"""

from __future__ import annotations

from policies.isolation.common import MANAGER, Manifest, managed_labels
from policies.isolation.config import isolation_settings
from policies.isolation.namespace import (
    dra_device_limits,
    gpu_resource_limits,
    limit_range,
    namespace,
    resource_quota,
)
from policies.isolation.network import internet_except, network_policies
from policies.isolation.rbac import (
    jobs_service_account,
    portal_cluster_role,
    portal_cluster_role_binding,
    portal_service_account,
    tenant_admin_binding,
    tenant_admin_role,
)
from policies.isolation.spec import IsolationSettings, TenantSpec


def tenant_manifests(spec: TenantSpec, settings: IsolationSettings) -> list[Manifest]:
    """Every object of one tenant, namespace first (the others live in it)."""
    settings.check_flavors(spec)
    return [
        namespace(spec, settings),
        resource_quota(spec, settings),
        limit_range(spec, settings),
        *network_policies(spec, settings),
        tenant_admin_role(spec, settings),
        tenant_admin_binding(spec, settings),
        jobs_service_account(spec, settings),
    ]


def portal_manifests(settings: IsolationSettings) -> list[Manifest]:
    """The portal's own identity and cluster permissions."""
    return [
        portal_service_account(settings),
        portal_cluster_role(settings),
        portal_cluster_role_binding(settings),
    ]


__all__ = [
    "MANAGER",
    "IsolationSettings",
    "Manifest",
    "TenantSpec",
    "dra_device_limits",
    "gpu_resource_limits",
    "internet_except",
    "isolation_settings",
    "jobs_service_account",
    "limit_range",
    "managed_labels",
    "namespace",
    "network_policies",
    "portal_cluster_role",
    "portal_cluster_role_binding",
    "portal_manifests",
    "portal_service_account",
    "resource_quota",
    "tenant_admin_binding",
    "tenant_admin_role",
    "tenant_manifests",
]
