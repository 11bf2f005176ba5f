"""Which views and tenants a viewer may see, from their scopes."""

from __future__ import annotations

from portal.api.auth import Caller, Scope
from portal.dashboard_views import DASHBOARD_VIEWS, DashboardView


def views_for(viewer: Caller) -> list[DashboardView]:
    """The views ``viewer``'s scopes open, in the landing page's order. Only a hint: every
    request is still checked by the portal with the viewer's token."""
    return [view for view in DASHBOARD_VIEWS if view.opens_for(viewer)]


def tenants_for(viewer: Caller, scope: Scope) -> list[str]:
    """Tenants ``viewer`` holds ``scope`` for by a group filter or as a member, sorted.
    Unfiltered holders see every tenant: read those from the portal instead."""
    named = set(viewer.tenants_for(scope))
    if viewer.can_everywhere(scope):
        named |= set(viewer.groups)
    return sorted(named)
