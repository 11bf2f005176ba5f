"""Every error gpuportal raises on purpose, and the one table that maps each to an HTTP status
and a CLI exit code.

The root and the errors of the rules themselves (``InvalidRequest``, ``NotFound``,
``Conflict``, ``Forbidden``) live in ``policies.errors``, which has no I/O; the ones added here
are about requests, the hub and the service. The API (``portal.api.errors``) answers with
``http_status_of``, the command line (``portal.cli``) exits with ``exit_code_of``, and the
client (``portal.client.errors``) raises these same classes again from an error answer, so
``except Expired`` works alike on both sides of the API.
"""

from __future__ import annotations

from policies.errors import (
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    PortalError,
    Unavailable,
)

__all__ = [
    "ERRORS",
    "EXIT_USAGE",
    "Conflict",
    "Expired",
    "Forbidden",
    "IdempotencyMismatch",
    "InvalidRequest",
    "NotFound",
    "PortalError",
    "PortalUnreachable",
    "PreconditionFailed",
    "PreconditionRequired",
    "Unauthorized",
    "Unavailable",
    "exit_code_of",
    "http_status_of",
]


class Unauthorized(PortalError):
    """No token, or a token the hub does not know (unknown, expired, revoked)."""

    code = "unauthorized"


class PreconditionFailed(Conflict):
    """``If-Match`` named a version that is no longer current: re-read and retry."""

    code = "precondition_failed"


class PreconditionRequired(PortalError):
    """An edit came without ``If-Match`` (or ``If-None-Match: *`` to create)."""

    code = "precondition_required"


class Expired(PortalError):
    """A change-log position the portal no longer holds (it restarted, or the reader fell too
    far behind): read the full list again."""

    code = "expired"


class IdempotencyMismatch(InvalidRequest):
    """An ``Idempotency-Key`` used before, by the same owner in the same tenant, for a
    different request: a retry must repeat the first request exactly."""

    code = "idempotency_mismatch"


class PortalUnreachable(PortalError):
    """No answer from the portal at all: the connection failed or timed out (client side)."""

    code = "unreachable"

    def __init__(self, url: str, cause: Exception) -> None:
        detail = str(cause) or type(cause).__name__
        super().__init__(f"cannot reach the portal at {url}: {detail}")
        self.url = url


EXIT_USAGE = 2
"""What argparse exits with for a malformed command line; every portal error exits with it too
(the message says what was wrong), so scripts tell "refused" (2) from "failed" (1)."""

ERRORS: tuple[tuple[type[PortalError], int, int], ...] = (
    (IdempotencyMismatch, 422, EXIT_USAGE),
    (InvalidRequest, 422, EXIT_USAGE),
    (Unauthorized, 401, EXIT_USAGE),
    (Forbidden, 403, EXIT_USAGE),
    (NotFound, 404, EXIT_USAGE),
    (PreconditionFailed, 412, EXIT_USAGE),
    (PreconditionRequired, 428, EXIT_USAGE),
    (Conflict, 409, EXIT_USAGE),
    (Expired, 410, EXIT_USAGE),
    (Unavailable, 503, EXIT_USAGE),
    # Never answered by the API (it is the client not reaching it); a gateway would say 502.
    (PortalUnreachable, 502, EXIT_USAGE),
    (PortalError, 400, EXIT_USAGE),
)
"""(class, HTTP status, exit code), checked in order: the first class the error is an instance
of decides, so a subclass comes before its base (``PreconditionFailed`` before ``Conflict``)."""


def _row(exc: PortalError) -> tuple[type[PortalError], int, int]:
    return next(row for row in ERRORS if isinstance(exc, row[0]))


def http_status_of(exc: PortalError) -> int:
    """The HTTP status the API answers ``exc`` with."""
    return _row(exc)[1]


def exit_code_of(exc: PortalError) -> int:
    """The exit code of a ``gpuportal`` command that failed with ``exc``."""
    return _row(exc)[2]
