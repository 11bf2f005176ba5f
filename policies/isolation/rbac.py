"""RBAC: the tenant admins' read-only Role, the tenant's token-less ServiceAccount, and the
portal's own least-privilege ServiceAccount and ClusterRole."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policies.isolation.common import Manifest, metadata
from policies.isolation.spec import IsolationSettings, TenantSpec

RBAC_GROUP = "rbac.authorization.k8s.io"
RBAC_VERSION = f"{RBAC_GROUP}/v1"
TENANT_ADMIN_ROLE = "tenant-admin"
READ = ("get", "list", "watch")
WRITE = ("create", "update", "patch", "delete")


def _rule(groups: list[str], resources: list[str], verbs: Sequence[str]) -> dict[str, Any]:
    # Fresh lists: callers may edit the result without touching other rules.
    return {"apiGroups": list(groups), "resources": list(resources), "verbs": list(verbs)}


def tenant_admin_role(spec: TenantSpec, settings: IsolationSettings) -> Manifest:
    """Read pods, their logs and events in the tenant's namespace; nothing else (no secrets,
    no exec, no writes: admins change the tenant through the portal)."""
    return {
        "apiVersion": RBAC_VERSION,
        "kind": "Role",
        "metadata": metadata(settings, TENANT_ADMIN_ROLE, spec.name, settings.namespace(spec.name)),
        "rules": [
            _rule([""], ["events", "pods"], READ),
            # Logs are read with get only; granting list or watch on them would also need the
            # portal, which creates this Role, to hold them (RBAC refuses to grant more).
            _rule([""], ["pods/log"], ["get"]),
            _rule(["events.k8s.io"], ["events"], READ),
        ],
    }


def tenant_admin_binding(spec: TenantSpec, settings: IsolationSettings) -> Manifest:
    """Grants the tenant-admin Role to the tenant's admin group."""
    return {
        "apiVersion": RBAC_VERSION,
        "kind": "RoleBinding",
        "metadata": metadata(settings, TENANT_ADMIN_ROLE, spec.name, settings.namespace(spec.name)),
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": TENANT_ADMIN_ROLE},
        "subjects": [
            {"apiGroup": RBAC_GROUP, "kind": "Group", "name": settings.admin_group(spec.name)}
        ],
    }


def jobs_service_account(spec: TenantSpec, settings: IsolationSettings) -> Manifest:
    """The identity of the tenant's pods: no token mounted and no Role bound, so code in a
    notebook has no Kubernetes API credentials at all."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(
            settings, settings.jobs_service_account, spec.name, settings.namespace(spec.name)
        ),
        "automountServiceAccountToken": False,
    }


def portal_service_account(settings: IsolationSettings) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(
            settings, settings.portal_service_account, None, settings.hub_namespace
        ),
    }


def portal_cluster_role(settings: IsolationSettings) -> Manifest:
    """The least the portal needs to reconcile tenants and to schedule and run their pods.

    RBAC refuses to create a Role granting more than its creator holds, so the portal also
    holds what the tenant-admin Role grants (``pods/log`` get, events read) rather than the
    ``escalate`` and ``bind`` verbs, which would let it grant anything.
    """
    manage = (*READ, *WRITE)
    return {
        "apiVersion": RBAC_VERSION,
        "kind": "ClusterRole",
        "metadata": metadata(settings, settings.portal_service_account, None),
        "rules": [
            _rule([""], ["limitranges", "namespaces", "resourcequotas", "serviceaccounts"], manage),
            _rule(["networking.k8s.io"], ["networkpolicies"], manage),
            _rule([RBAC_GROUP], ["rolebindings", "roles"], manage),
            # patch: the binder writes a job pod's allocation and rank on it before binding.
            _rule([""], ["pods"], [*READ, "create", "patch", "delete"]),
            _rule([""], ["pods/binding"], ["create"]),
            # Training jobs: an attempt's indexed Job, headless Service and gang Workload
            # (services create and delete their replicas' pods and headless Service too).
            _rule(["batch"], ["jobs"], [*READ, "create", "patch", "delete"]),
            _rule([""], ["services"], ["get", "create", "delete"]),
            _rule(["scheduling.k8s.io"], ["workloads"], ["get", "create", "delete"]),
            # The tenant's checkpoint claim, created when its first job needs it, and its
            # weight cache claims; their local volumes on the nodes (never deleted by it).
            _rule([""], ["persistentvolumeclaims"], ["get", "create"]),
            _rule([""], ["persistentvolumes"], ["get", "create"]),
            _rule([""], ["pods/log"], ["get"]),
            # Ray clusters (portal.ray.kube): the RayClusters the operator runs, and each
            # cluster's token Secret, which the portal writes once and never reads back.
            _rule(["ray.io"], ["rayclusters"], ["get", "list", "create", "patch", "delete"]),
            _rule([""], ["secrets"], ["create", "delete"]),
            _rule([""], ["nodes"], READ),
            _rule([""], ["events"], [*READ, "create", "patch"]),
            _rule(["events.k8s.io"], ["events"], [*READ, "create", "patch"]),
        ],
    }


def portal_cluster_role_binding(settings: IsolationSettings) -> Manifest:
    return {
        "apiVersion": RBAC_VERSION,
        "kind": "ClusterRoleBinding",
        "metadata": metadata(settings, settings.portal_service_account, None),
        "roleRef": {
            "apiGroup": RBAC_GROUP,
            "kind": "ClusterRole",
            "name": settings.portal_service_account,
        },
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": settings.portal_service_account,
                "namespace": settings.hub_namespace,
            }
        ],
    }
