"""The base of every store: read the portal on ``refresh()``, keep the error, and the
bounds and windows the stores share."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime

import httpx
import param

from dashboards.sources import Source
from policies.errors import Forbidden, PortalError
from portal.api.auth import SCOPE_HELP, Scope

MAX_UNITS = 10_000_000  # the API's bound on guaranteed and limit
HEALTH_RULES = ("xid", "throttle", "ecc")  # the alerts about a GPU's health, not its use
USAGE_WINDOW_S = 3600.0  # My work plots the last hour, by the minute
UTILIZATION_WINDOW_S = 300.0  # the heatmap's "now": the last minute measured in 5


# What each scope lets a person do, as the dashboards say it (the hub's descriptions,
# ``SCOPE_HELP``, are written for its consent page; they serve scopes not named here).
_DOING = {
    Scope.QUOTAS_READ: "read quotas",
    Scope.QUOTAS_WRITE: "change quotas",
    Scope.QUEUE_READ: "read the queue",
    Scope.WORKLOADS_READ: "read workloads and their alerts",
    Scope.WORKLOADS_WRITE: "start and stop workloads",
    Scope.USAGE_READ: "read quota and GPU usage",
    Scope.COST_READ: "read cost",
    Scope.INVENTORY_READ: "read the cluster's nodes and GPUs",
}
# Longest first: a scope whose name holds another's is found before it.
_BY_LENGTH = sorted(Scope, key=lambda s: len(s.value), reverse=True)
_FOR_TENANT = re.compile(r"for tenant ([a-z0-9-]+)")


def may_not(scope: Scope, tenant: str | None = None) -> str:
    """``your roles do not let you read cost (of team-b)``."""
    doing = _DOING.get(scope) or SCOPE_HELP[scope]
    return f"your roles do not let you {doing}" + (f" of {tenant}" if tenant else "")


def in_words(exc: PortalError) -> str:
    """Why the portal said no, for people: a refusal says what the viewer's roles do not let
    them do, not the scope's raw name the API's message carries; other errors keep the
    portal's message."""
    if not isinstance(exc, Forbidden):
        return exc.message
    scope = next((s for s in _BY_LENGTH if s.value in exc.message), None)
    if scope is None:
        return exc.message
    tenant = _FOR_TENANT.search(exc.message)
    return may_not(scope, tenant.group(1) if tenant else None)


def not_shown(what: str, exc: PortalError) -> str:
    """The note for a part of a page that could not be read: ``not shown: <what> (<why>)``."""
    return f"not shown: {what} ({in_words(exc)})"


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
            self.error = in_words(exc)
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
