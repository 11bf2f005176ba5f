"""Which views and tenants a viewer may see, from their scopes."""

from __future__ import annotations

from dataclasses import dataclass

from portal.api.auth import Caller, Scope


@dataclass(frozen=True, slots=True)
class Link:
    view: str
    title: str
    why: str


def views_for(viewer: Caller) -> list[Link]:
    """The views ``viewer``'s scopes open, in the landing page's order. Only a hint: every
    request is still checked by the portal with the viewer's token."""
    out: list[Link] = []
    if viewer.holds_any(Scope.WORKLOADS_READ) or viewer.holds_any(Scope.WORKLOADS_WRITE):
        out.append(Link("my_work", "My work", "your servers, jobs and services"))
    tenants = tenants_for(viewer, Scope.QUOTAS_READ)
    if tenants or viewer.can_everywhere(Scope.QUOTAS_READ):
        out.append(Link("tenant", "Tenant", "quota, queue and quota editor per tenant"))
    if viewer.holds_any(Scope.INVENTORY_READ):
        out.append(Link("cluster", "Cluster", "nodes, GPUs, MIG layouts, topology"))
    if viewer.holds_any(Scope.COST_READ):
        out.append(Link("cost", "Cost", "GPU-hours and money by tenant"))
    return out


def tenants_for(viewer: Caller, scope: Scope) -> list[str]:
    """Tenants ``viewer`` holds ``scope`` for by a group filter or as a member, sorted.
    Unfiltered holders see every tenant: read those from the portal instead."""
    named = set(viewer.tenants_for(scope))
    if viewer.can_everywhere(scope):
        named |= set(viewer.groups)
    return sorted(named)
