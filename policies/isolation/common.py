"""Names and labels shared by the isolation builders."""

from __future__ import annotations

from typing import Any

from policies.isolation.spec import IsolationSettings

MANAGER = "gpuportal"
"""Value of the ``managed-by`` label and the server-side-apply field manager."""

Manifest = dict[str, Any]


def managed_labels(settings: IsolationSettings, tenant: str | None = None) -> dict[str, str]:
    """Labels on every object we own: ``managed-by`` (the reconciler lists by it) and, for a
    tenant's objects, ``tenant``."""
    labels = {settings.label("managed-by"): MANAGER}
    if tenant is not None:
        labels[settings.label("tenant")] = tenant
    return labels


def metadata(
    settings: IsolationSettings, name: str, tenant: str | None, namespace: str | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = managed_labels(settings, tenant)
    return meta


def cpu_quantity(millis: int) -> str:
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def memory_quantity(mib: int) -> str:
    return f"{mib // 1024}Gi" if mib % 1024 == 0 and mib else f"{mib}Mi"
