"""Tenant isolation on Kubernetes: applies ``policies.isolation`` manifests to a cluster."""

from portal.isolation.reconciler import (
    ObjectRef,
    ReconcileResult,
    TenantHasPods,
    reconcile,
)

__all__ = ["ObjectRef", "ReconcileResult", "TenantHasPods", "reconcile"]
