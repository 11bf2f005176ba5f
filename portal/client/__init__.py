"""A Python client for the portal's REST API: ``Portal`` (blocking) and ``AsyncPortal``.

In a JupyterHub notebook::

    from portal.client import Portal

    portal = Portal()  # the hub's token and the portal's URL, from the environment
    w = portal.request("team-a", "H100-80GB", count=2)
    print(w.state, w.reason, w.position, w.eta_s)

Both are thin: requests are built and answers read in ``portal.client.core``; every rule
(quota, placement, scopes) stays on the server. The errors are ``portal.errors``' classes, the
same the server raises (an ``ApiError`` mixed in keeps the answer's status and code).
"""

from portal.client.aio import AsyncPortal
from portal.client.config import MissingConfiguration
from portal.client.core import Versioned, WithETag
from portal.client.errors import (
    ApiConflict,
    ApiError,
    ApiForbidden,
    ApiInvalidRequest,
    ApiNotFound,
)
from portal.client.sync import Portal
from portal.errors import (
    Expired,
    PortalUnreachable,
    PreconditionFailed,
    PreconditionRequired,
    Unauthorized,
    Unavailable,
)

__all__ = [
    "ApiConflict",
    "ApiError",
    "ApiForbidden",
    "ApiInvalidRequest",
    "ApiNotFound",
    "AsyncPortal",
    "Expired",
    "MissingConfiguration",
    "Portal",
    "PortalUnreachable",
    "PreconditionFailed",
    "PreconditionRequired",
    "Unauthorized",
    "Unavailable",
    "Versioned",
    "WithETag",
]
