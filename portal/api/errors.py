"""The portal's errors as HTTP answers (statuses from ``portal.errors.ERRORS``), one JSON
error body.

Every error answer, whether raised by the allocator, by auth, or by FastAPI's request
validation, has the body ``{"status", "code", "message", "field"?, "valid"?}``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException

from portal.api import inputs
from portal.api.schemas import ErrorBody
from portal.errors import PortalError, http_status_of
from portal.store.db import database_unavailable, database_unreachable

log = logging.getLogger(__name__)

Responses = dict[int | str, dict[str, Any]]
"""OpenAPI ``responses`` of a route."""

ERROR_RESPONSES: Responses = {
    status: {"model": ErrorBody, "description": description}
    for status, description in (
        (401, "no token, or an unknown or expired one"),
        (403, "the token lacks the route's scope for this tenant"),
        (422, "a request value is malformed or out of range"),
    )
}
"""Error answers every route may give; routes add 404/409/412/428 where they apply."""


def body_of(exc: PortalError) -> ErrorBody:
    return ErrorBody(
        status=http_status_of(exc),
        code=exc.code,
        message=exc.message,
        field=getattr(exc, "field", None),
        valid=getattr(exc, "valid", None),
        retry_after_s=getattr(exc, "retry_after_s", None),
    )


def error_response(body: ErrorBody) -> JSONResponse:
    headers: dict[str, str] = {}
    if body.status == 401:
        headers["WWW-Authenticate"] = "token"
    if body.retry_after_s is not None:
        headers["Retry-After"] = str(body.retry_after_s)
    return JSONResponse(body.model_dump(exclude_none=True), body.status, headers=headers or None)


async def _portal_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, PortalError)
    return error_response(body_of(exc))


STRICT_TYPES = {
    "finite_number": "a finite number (not NaN or infinity)",
    "int_type": "an integer (not true, false, a string or a fraction)",
    "int_from_float": "an integer (not a fraction)",
    "float_type": "a number (not true, false or a string)",
    "bool_type": "true or false",
    "string_type": "a string",
}
"""What bodies take as sent, in words: they are never coerced (``true`` is not a count)."""


async def _database_error(_request: Request, exc: Exception) -> JSONResponse:
    """A database error no route handled: the database is unreachable (503, retry), or
    something unexpected (500); the one error body either way, never a plain-text page."""
    assert isinstance(exc, DBAPIError)
    if database_unreachable(exc):
        return error_response(body_of(database_unavailable(exc)))
    log.error("unexpected database error", exc_info=exc)
    return error_response(
        ErrorBody(
            status=500, code="error", message="internal error: the database refused the request"
        )
    )


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first: Mapping[str, Any] = (
        exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    )
    if first.get("type") == "json_invalid":
        return error_response(_not_json(exc.body, first))
    loc = [str(p) for p in first.get("loc", ())]
    field = ".".join(loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
    ctx = first.get("ctx") or {}
    kind = first.get("type")
    # Our rules and the finite-number check say what is valid, like InvalidRequest; pydantic's
    # other messages are sentences of their own ("Input should be a valid integer").
    if kind == inputs.ERROR_TYPE:
        valid = str(ctx["valid"])
    elif kind in STRICT_TYPES:
        valid = STRICT_TYPES[kind]
    else:
        valid = str(first.get("msg", "a valid value"))
    said = valid if kind not in STRICT_TYPES and kind != inputs.ERROR_TYPE else f"expected {valid}"
    where = f"{loc[0]} " if loc else ""
    value = first.get("input")
    shown = f" {shown_value(value)}" if kind != "missing" and _is_scalar(value) else ""
    message = f"invalid {where}{field or 'request'}{shown}: {said}"
    return error_response(
        ErrorBody(status=422, code="invalid", message=message, field=field or None, valid=valid)
    )


SHOWN_CHARACTERS = 64
"""A longer offending value is cut in messages (a 10,000-character pool name stays readable)."""


def shown_value(value: object) -> str:
    """``value`` as a message shows it: escaped (``'a\\x00b'``), and cut when long."""
    if isinstance(value, str) and len(value) > SHOWN_CHARACTERS:
        return f"{value[:SHOWN_CHARACTERS]!r}… ({len(value)} characters)"
    return repr(value)


def _is_scalar(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _not_json(document: object, error: Mapping[str, Any]) -> ErrorBody:
    """An unparsable body, its position in words (the parser gives a character offset)."""
    loc = tuple(error.get("loc", ()))
    reason = str((error.get("ctx") or {}).get("error", "not JSON"))
    where = ""
    if len(loc) == 2 and isinstance(loc[1], int) and isinstance(document, str):
        pos = loc[1]
        line = document.count("\n", 0, pos) + 1
        column = pos - (document.rfind("\n", 0, pos) + 1) + 1
        where = f" at line {line}, column {column}"
    return ErrorBody(
        status=422,
        code="invalid",
        message=f"invalid body: not JSON: {reason}{where}",
        field="body",
        valid="a JSON object",
    )


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:
        # FastAPI's "error parsing the body" (not JSON, not UTF-8): bad input like any other.
        return error_response(
            ErrorBody(
                status=422,
                code="invalid",
                message=f"invalid body: {exc.detail}",
                field="body",
                valid="a JSON object",
            )
        )
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "error")
    return error_response(ErrorBody(status=exc.status_code, code=code, message=str(exc.detail)))


def install(app: FastAPI) -> None:
    """Register the handlers that turn every error into the one error body."""
    app.add_exception_handler(PortalError, _portal_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(DBAPIError, _database_error)
