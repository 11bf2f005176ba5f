"""The API's error body, turned back into the portal's exceptions.

An answer with the error body ``{"status", "code", "message", "field"?, "valid"?}`` becomes the
``portal.errors`` class its ``code`` names (so ``except Forbidden`` or ``except Expired`` works
the same on both sides of the API), mixed with ``ApiError``, which keeps the status, code,
field, valid and the server's message intact. Connection failures become
``PortalUnreachable``, naming the URL.
"""

from __future__ import annotations

from typing import Any

import httpx

from portal.errors import (
    ERRORS,
    Conflict,
    Expired,
    Forbidden,
    IdempotencyMismatch,
    InvalidRequest,
    NotFound,
    PortalError,
    PreconditionFailed,
    PreconditionRequired,
    Unauthorized,
    Unavailable,
)


class ApiError(PortalError):
    """An error answer of the portal API. ``message`` is the server's, unchanged."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        valid: str | None = None,
        url: str = "",
    ) -> None:
        # Not super().__init__: the policies classes mixed in below build their message from
        # parts; here the server already wrote it.
        PortalError.__init__(self, message)
        self.status = status
        self.code = code
        # '' when no single input is to blame (the same type as InvalidRequest's).
        self.field = field or ""
        self.valid = valid or ""
        self.url = url


class ApiInvalidRequest(ApiError, InvalidRequest):
    """422 ``invalid``: ``field`` names the input, ``valid`` what it may be."""

    value: object = None


class ApiIdempotencyMismatch(ApiInvalidRequest, IdempotencyMismatch):
    """422 ``idempotency_mismatch``: the key was used before for a different request."""


class ApiForbidden(ApiError, Forbidden):
    """403 ``forbidden``: the token lacks the scope, or the user is not in the tenant."""


class ApiNotFound(ApiError, NotFound):
    """404 ``not_found``: no such tenant, flavor, quota, workload or node."""

    kind = ""
    name = ""


class ApiConflict(ApiError, Conflict):
    """409 ``conflict``: the change conflicts with the current state."""


class ApiPreconditionFailed(ApiConflict, PreconditionFailed):
    """412 ``precondition_failed``: the ETag sent is stale; read again and reapply."""


class ApiPreconditionRequired(ApiError, PreconditionRequired):
    """428 ``precondition_required``: an edit came without ``If-Match`` (or create)."""


class ApiExpired(ApiError, Expired):
    """410 ``expired``: a change-log position the portal no longer holds; list again."""


class ApiUnauthorized(ApiError, Unauthorized):
    """401 ``unauthorized``: no token, or one the hub does not know (expired, revoked)."""


class ApiUnavailable(ApiError, Unavailable):
    """503 ``unavailable``: the portal or the hub behind it is not ready; retry later."""


BY_CODE: dict[str, type[ApiError]] = {
    cls.code: cls
    for cls in (
        ApiInvalidRequest,
        ApiIdempotencyMismatch,
        ApiForbidden,
        ApiNotFound,
        ApiConflict,
        ApiPreconditionFailed,
        ApiPreconditionRequired,
        ApiUnauthorized,
        ApiUnavailable,
        ApiExpired,
    )
}
"""The class for each ``code`` of the error body; other codes become a plain ``ApiError``."""


def _status(cls: type[ApiError]) -> int:
    return next(status for shared, status, _exit in ERRORS if issubclass(cls, shared))


_BY_STATUS = {
    _status(cls): cls
    for cls in (
        ApiUnauthorized,
        ApiForbidden,
        ApiNotFound,
        ApiConflict,
        ApiExpired,
        ApiPreconditionFailed,
        ApiPreconditionRequired,
        ApiUnavailable,
    )
}
"""An answer without the error body (a proxy's, the hub's) raises the class of its status, as
``portal.errors.ERRORS`` maps them; a 422 without it is not an input error of ours."""


def error_from_response(response: httpx.Response) -> ApiError:
    """The exception for an error answer (status >= 400)."""
    url = str(response.request.url)
    body = _error_body(response)
    if body is None:
        # Not the portal speaking (a proxy, the hub, a wrong URL): say so, with a hint.
        text = " ".join(response.text.split())[:200]
        cls = _BY_STATUS.get(response.status_code, ApiError)
        return cls(
            response.status_code,
            "error",
            f"{response.request.method} {url} answered {response.status_code} "
            f"{response.reason_phrase} without the portal's error body (is the portal URL "
            f"right?){': ' + text if text else ''}",
            url=url,
        )
    code = str(body["code"])
    return BY_CODE.get(code, ApiError)(
        response.status_code,
        code,
        str(body["message"]),
        field=_opt_str(body.get("field")),
        valid=_opt_str(body.get("valid")),
        url=url,
    )


def _error_body(response: httpx.Response) -> dict[str, Any] | None:
    try:
        body = response.json()
    except ValueError:
        return None
    if isinstance(body, dict) and isinstance(body.get("code"), str) and "message" in body:
        return body
    return None


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)
