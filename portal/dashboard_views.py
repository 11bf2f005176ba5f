"""The dashboards' views, once: each view's path, title, what it shows, the scopes that open it
and the scopes its pages read and write with.

The dashboards app (its routes and page titles), its landing page, the hub's configuration of
the dashboards service (the scopes its OAuth token may carry, ``portal.demo``) and the tests
all read this tuple. It lives in ``portal`` because that service configuration does, and
dependencies point dashboards → portal, never back.
"""

from __future__ import annotations

from dataclasses import dataclass

from portal.api.auth import Caller, Scope


@dataclass(frozen=True, slots=True)
class DashboardView:
    """``name`` is the view's path (``/my_work``); the landing page shows ``title`` and ``why``
    to a viewer holding any of ``opens_with`` in any form (for any tenant)."""

    name: str
    title: str
    why: str
    opens_with: tuple[Scope, ...]
    uses: tuple[Scope, ...]

    def opens_for(self, viewer: Caller) -> bool:
        """Only a hint: every request is still checked by the portal with the viewer's token."""
        return any(viewer.holds_any(scope) for scope in self.opens_with)


LANDING_TITLE = "Home"
"""The title of ``/``, the landing page that links the views."""

DASHBOARD_VIEWS: tuple[DashboardView, ...] = (
    DashboardView(
        "my_work",
        "My work",
        "your servers, jobs and services",
        opens_with=(Scope.WORKLOADS_READ, Scope.WORKLOADS_WRITE),
        # Cost: the Services section's GPU-hours serving and warm.
        uses=(Scope.WORKLOADS_READ, Scope.WORKLOADS_WRITE, Scope.COST_READ),
    ),
    DashboardView(
        "tenant",
        "Tenant",
        "quota, queue, services and quota editor per tenant",
        opens_with=(Scope.QUOTAS_READ,),
        uses=(
            Scope.QUOTAS_READ,
            Scope.QUOTAS_WRITE,
            Scope.QUEUE_READ,
            Scope.USAGE_READ,
            Scope.WORKLOADS_READ,  # members' workloads, alerts, services
            Scope.COST_READ,  # members' GPU-hours, services' GPU-hours
        ),
    ),
    DashboardView(
        "cluster",
        "Cluster",
        "nodes, GPUs, MIG layouts, topology",
        opens_with=(Scope.INVENTORY_READ,),
        # Platform-wide alerts for a viewer who reads every tenant's workloads.
        uses=(Scope.INVENTORY_READ, Scope.WORKLOADS_READ),
    ),
    DashboardView(
        "cost",
        "Cost",
        "GPU-hours and money by tenant",
        opens_with=(Scope.COST_READ,),
        uses=(Scope.COST_READ,),
    ),
)
"""In the landing page's order."""

DASHBOARDS_OAUTH_SCOPES: tuple[Scope, ...] = tuple(
    dict.fromkeys(scope for view in DASHBOARD_VIEWS for scope in view.uses)
)
"""The portal scopes a viewer's OAuth token for the dashboards may carry: what the views use.
The hub intersects them with the viewer's own (group filters included), so nobody gains
anything by them."""
