"""The base of every store: read the portal on ``refresh()``, keep the error, and the
bounds and windows the stores share."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

import httpx
import param

from dashboards.sources import Source
from policies.errors import PortalError

MAX_UNITS = 10_000_000  # the API's bound on guaranteed and limit
HEALTH_RULES = ("xid", "throttle", "ecc")  # the alerts about a GPU's health, not its use
USAGE_WINDOW_S = 3600.0  # My work plots the last hour, by the minute
UTILIZATION_WINDOW_S = 300.0  # the heatmap's "now": the last minute measured in 5


class Store(param.Parameterized):
    """Base: the source, when data was last read, and the last read error (a sentence)."""

    updated = param.Date(default=None, allow_None=True, doc="When refresh() last succeeded.")
    error = param.String(default="", doc="Why the last refresh failed; '' when it did not.")

    def __init__(self, source: Source, **params: object) -> None:
        super().__init__(**params)
        self.source = source

    def refresh(self) -> None:
        """Read the data again; a portal error lands in ``error`` instead of raising."""
        try:
            self._read()
        except PortalError as exc:
            self.error = exc.message
            return
        except httpx.HTTPError as exc:
            self.error = f"the portal did not answer ({type(exc).__name__}: {exc}); retrying"
            return
        self.error = ""
        self.updated = datetime.now(UTC)

    def _read(self) -> None:
        raise NotImplementedError

    def _set_changed(self, read: Mapping[str, object]) -> None:
        """Set the parameters of ``read`` whose values differ from the ones held, in one
        batch. param counts a new list of records as changed even when equal, and every
        change re-renders a chart or a table: an unchanged read redraws nothing."""
        self.param.update({k: v for k, v in read.items() if v != getattr(self, k)})
