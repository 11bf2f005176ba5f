"""The API's error body, turned back into the portal's exceptions.

An answer with the error body ``{"status", "code", "message", "field"?, "valid"?}`` becomes the
``policies.errors`` class its ``code`` names (so ``except Forbidden`` works the same on both
sides of the API), mixed with ``ApiError``, which keeps the status, code, field, valid and the
server's message intact. Connection failures become ``PortalUnreachable``, naming the URL.
"""

from __future__ import annotations

from typing import Any

import httpx

from policies.errors import Conflict, Forbidden, InvalidRequest, NotFound, PortalError


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


class ApiForbidden(ApiError, Forbidden):
    """403 ``forbidden``: the token lacks the scope, or the user is not in the tenant."""


class ApiNotFound(ApiError, NotFound):
    """404 ``not_found``: no such tenant, flavor, quota, workload or node."""

    kind = ""
    name = ""


class ApiConflict(ApiError, Conflict):
    """409 ``conflict``: the change conflicts with the current state."""


class PreconditionFailed(ApiConflict):
    """412 ``precondition_failed``: the ETag sent is stale; read again and reapply."""


class PreconditionRequired(ApiError):
    """428 ``precondition_required``: an edit came without ``If-Match`` (or create)."""


class Expired(ApiError):
    """410 ``expired``: a change-log position the portal no longer holds; list again."""


class Unauthorized(ApiError):
    """401 ``unauthorized``: no token, or one the hub does not know (expired, revoked)."""


class Unavailable(ApiError):
    """503 ``unavailable``: the portal or the hub behind it is not ready; retry later."""


class PortalUnreachable(PortalError):
    """No answer at all: the connection failed or timed out."""

    code = "unreachable"

    def __init__(self, url: str, cause: Exception) -> None:
        detail = str(cause) or type(cause).__name__
        super().__init__(f"cannot reach the portal at {url}: {detail}")
        self.url = url


BY_CODE: dict[str, type[ApiError]] = {
    "invalid": ApiInvalidRequest,
    "idempotency_mismatch": ApiInvalidRequest,
    "forbidden": ApiForbidden,
    "not_found": ApiNotFound,
    "conflict": ApiConflict,
    "precondition_failed": PreconditionFailed,
    "precondition_required": PreconditionRequired,
    "unauthorized": Unauthorized,
    "unavailable": Unavailable,
    "expired": Expired,
}
"""The class for each ``code`` of the error body; other codes become a plain ``ApiError``."""

_BY_STATUS = {
    401: Unauthorized,
    403: ApiForbidden,
    404: ApiNotFound,
    409: ApiConflict,
    410: Expired,
    412: PreconditionFailed,
    428: PreconditionRequired,
    503: Unavailable,
}


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
