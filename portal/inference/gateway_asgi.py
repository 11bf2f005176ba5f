"""The gateway's own path: its three operations served by plain ASGI, ahead of FastAPI.

At hundreds of requests a second, each gateway request's CPU in the portal is what the
budget (2 ms added per request) is spent on, and most of it was FastAPI's and Starlette's
machinery rather than the gateway's work: the request middleware's wrapper and its match of
the path against every documented route, the route walk, dependency solving, a
``StreamingResponse`` with a task group per answer. ``GatewayASGI`` is the outermost
middleware of the app: it recognizes ``GET .../v1/models``, ``POST .../v1/chat/completions``
and ``POST .../v1/completions`` under ``/gateway/{tenant}/{service}`` by splitting the path
and answers them with the same definitions the FastAPI routes use, in the same order:

1. the caller and the ``services:call`` scope (``portal.api.deps.caller_holding``, as
   ``Requires``);
2. the path's tenant and service name by the same rules, a 422 naming the field;
3. ``Gateway.resolve`` (the tenant's scope, the service) and, for the completions,
   ``Gateway.open`` (hold, 503 with ``Retry-After``, the replica) and its ``Relayed`` answer;
4. errors answered by the app's own exception handlers (the one error body), and the
   request's metrics and access line written by ``portal.api.metrics.observe`` under the
   route's template.

Anything else (another method, another path under ``/gateway``, every other route) goes on
to the app unchanged; the FastAPI routes stay, to document the API and answer 404 and 405.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import Annotated, Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from portal.api.auth import Scope as PortalScope
from portal.api.deps import caller_holding
from portal.api.inputs import KEY, Label, bounded
from portal.api.metrics import observe, route_path
from portal.inference.gateway import PREFIX, Gateway, Relayed, models_answer

TENANT = TypeAdapter(Label)
SERVICE = TypeAdapter(Annotated[str, bounded(KEY, 63)])
Handler = Callable[[Request, Any], Response | Awaitable[Response]]


class Operation(Enum):
    """An operation of the gateway: its path at the replica (and after ``PREFIX``)."""

    MODELS = "/v1/models"
    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"

    @property
    def template(self) -> str:
        """The route template its metrics and access line are recorded under."""
        return PREFIX + self.value.removeprefix("/v1")


OPERATIONS: dict[tuple[str, str], Operation] = {
    ("GET", "models"): Operation.MODELS,
    ("POST", "chat/completions"): Operation.CHAT,
    ("POST", "completions"): Operation.COMPLETIONS,
}
"""(method, the path after ``/v1/``) -> operation."""


def operation(scope: Scope) -> tuple[Operation, str, str] | None:
    """The gateway operation a request asks, with its tenant and service as written; None
    for anything else."""
    path = route_path(scope)
    if not path.startswith("/gateway/"):
        return None
    # "", "gateway", tenant, service, "v1", rest
    parts = path.split("/", 5)
    if len(parts) != 6 or parts[4] != "v1" or not parts[2] or not parts[3]:
        return None
    op = OPERATIONS.get((scope["method"], parts[5]))
    return None if op is None else (op, parts[2], parts[3])


class GatewayASGI:
    """ASGI middleware: the gateway's operations, answered without FastAPI's machinery."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        asked = operation(scope) if scope["type"] == "http" else None
        if asked is None:
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        op, tenant, service = asked
        fastapi: FastAPI = scope["app"]
        response: Response | None = None
        status = 500
        try:
            try:
                response = await self._answer(fastapi, scope, receive, op, tenant, service)
                await response(scope, receive, send)
            except Exception as exc:
                if isinstance(response, Relayed) and response.started:
                    raise  # the answer broke off after its head went out: nothing to send
                handler = _handler(fastapi, exc)
                if handler is None:
                    raise  # as for any route: a 500 from the server error middleware
                answer = handler(Request(scope, receive), exc)
                response = await answer if inspect.isawaitable(answer) else answer
                await response(scope, receive, send)
            status = response.status_code
        finally:
            observe(fastapi.state.metrics, scope, op.template, status, time.perf_counter() - began)

    @staticmethod
    async def _answer(
        fastapi: FastAPI, scope: Scope, receive: Receive, op: Operation, tenant: str, service: str
    ) -> Response:
        authorization = content_type = accept = None
        for key, value in scope["headers"]:
            if key == b"authorization":
                authorization = authorization or value.decode("latin-1")
            elif key == b"content-type":
                content_type = value
            elif key == b"accept":
                accept = value
        caller = await caller_holding(
            PortalScope.SERVICES_CALL, authorization, fastapi.state.authenticator, scope
        )
        tenant, service = _checked(tenant, service)
        gateway: Gateway = fastapi.state.gateway
        if op is Operation.MODELS:
            await gateway.resolve(caller, tenant, service)
            return models_answer(tenant, service)
        body = await _body(receive)
        headers = [(b"content-type", content_type)] if content_type is not None else []
        if accept is not None:
            headers.append((b"accept", accept))
        return await gateway.open(caller, tenant, service, op.value, body, headers)


async def _body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _checked(tenant: str, service: str) -> tuple[str, str]:
    """The tenant and service name, or the 422 FastAPI's path validation gives (every
    offending parameter, under ``path``)."""
    errors: list[dict[str, Any]] = []
    out: list[str] = []
    for name, value, adapter in (("tenant", tenant, TENANT), ("service", service, SERVICE)):
        try:
            out.append(adapter.validate_python(value))
        except ValidationError as exc:
            errors += [{**e, "loc": ("path", name, *e["loc"])} for e in exc.errors()]
    if errors:
        raise RequestValidationError(errors)
    return out[0], out[1]


def _handler(fastapi: FastAPI, exc: Exception) -> Handler | None:
    """The app's exception handler for ``exc`` (by its class's MRO, as Starlette looks it
    up), so the gateway's errors get the one error body."""
    handlers: dict[Any, Handler] = fastapi.exception_handlers
    for cls in type(exc).__mro__:
        if cls in handlers:
            return handlers[cls]
    return None
