"""Demand forecasts from the store's workload history (``docs/forecast.md``)."""

from portal.forecast.capacity import CapacityOutlook, FlavorOutlook, WeekOutlook, capacity_outlook
from portal.forecast.series import DemandSeries, demand_series

__all__ = [
    "CapacityOutlook",
    "DemandSeries",
    "FlavorOutlook",
    "WeekOutlook",
    "capacity_outlook",
    "demand_series",
]
