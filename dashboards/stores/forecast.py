"""The capacity forecast for the Cost view (leadership, platform admins): forecast demand per
flavor for the next weeks against capacity and guarantees (``/api/v1/forecast/capacity``)."""

from __future__ import annotations

import time
from collections.abc import Callable

import param

from dashboards.sources import Source
from dashboards.stores.base import Store
from portal.api.forecast import CapacityForecastOut

FORECAST_REFRESH_S = 900.0
"""A forecast of weeks ahead moves little in minutes, and each read refits the models on the
server: the page's 10 s live updates read it again only this often."""


class CapacityForecastStore(Store):
    """The portal's capacity forecast, re-read at most every ``FORECAST_REFRESH_S``."""

    forecast = param.ClassSelector(class_=CapacityForecastOut, default=None, allow_None=True)

    def __init__(
        self,
        source: Source,
        *,
        weeks: int = 4,
        clock: Callable[[], float] = time.monotonic,
        **params: object,
    ) -> None:
        super().__init__(source, **params)
        self.weeks = weeks
        self._clock = clock
        self._read_at: float | None = None

    def _read(self) -> None:
        now = self._clock()
        if self._read_at is not None and now - self._read_at < FORECAST_REFRESH_S:
            return
        self._set_changed({"forecast": self.source.capacity_forecast(weeks=self.weeks)})
        self._read_at = now

    def rows(self) -> list[tuple[str, str, float, float, float, float]]:
        """(flavor, week start "MM-DD", forecast GPU-hours, peak GPUs, capacity GPUs,
        guaranteed GPUs) per flavor and week: the table."""
        f = self.forecast
        if f is None:
            return []
        return [
            (
                fl.flavor,
                w.start.strftime("%m-%d"),
                w.gpu_hours,
                w.peak_gpus,
                fl.capacity_gpus,
                fl.guaranteed_gpus,
            )
            for fl in f.flavors
            for w in fl.weeks
        ]

    def peak_share(self) -> list[tuple[str, str, float]]:
        """(week start, flavor, peak forecast as % of capacity) for flavors with capacity and
        forecast demand: the chart. The others (idle capacity, demand without capacity) are in
        the table, not here: a chart of every MIG profile at 0 % is unreadable."""
        return [
            (week, flavor, 100.0 * peak / capacity)
            for flavor, week, _, peak, capacity, _ in self.rows()
            if capacity > 0 and peak > 0
        ]
