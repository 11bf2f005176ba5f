"""Data stores of the dashboards: ``param.Parameterized`` objects that own data, no widgets.

Each store reads one ``Source`` (the portal API as the viewer) in ``refresh()`` and exposes
the numbers its view draws as plain methods, so tests check the numbers without a browser and
views only lay them out. ``refresh()`` replaces the data parameters; views that depend on them
re-render in place (live updates without page reloads).
"""

from dashboards.stores.access import tenants_for, views_for
from dashboards.stores.base import Store
from dashboards.stores.cluster import ClusterStore, FreeCapacity
from dashboards.stores.cost import CostStore
from dashboards.stores.forecast import CapacityForecastStore
from dashboards.stores.jobs import JobsStore
from dashboards.stores.my_work import MyWorkStore
from dashboards.stores.ray import RayStore
from dashboards.stores.services import ServicesStore
from dashboards.stores.tenant import Member, QuotaDraft, TenantStore

__all__ = [
    "CapacityForecastStore",
    "ClusterStore",
    "CostStore",
    "FreeCapacity",
    "JobsStore",
    "Member",
    "MyWorkStore",
    "QuotaDraft",
    "RayStore",
    "ServicesStore",
    "Store",
    "TenantStore",
    "tenants_for",
    "views_for",
]
